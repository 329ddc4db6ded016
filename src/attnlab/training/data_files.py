"""Fingerprints of a run's data files, so that a resumed run notices when its data changed.

A run remembers the files it read — the ``--data`` text of a language model, the parallel files
of a translation task — as their size and SHA-256 in ``config.json``::

    "data_files": {"--data": {"path": "input.txt", "size": 1115394, "sha256": "86c4…"}}

Resuming compares them with the files as they are now (:func:`data_change`): a text that changed
would silently give every token a new id (a character vocabulary, a BPE trained again), so the
trainer refuses, naming the file, unless told to go on (``allow_data_change``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnlab.training.manifest import sha256_file

__all__ = ["DATA_FILES_KEY", "data_change", "fingerprint_files"]

#: the key of ``config.json`` that holds the fingerprints
DATA_FILES_KEY = "data_files"


def fingerprint_files(files: Mapping[str, str | os.PathLike[str]]) -> dict[str, dict[str, Any]]:
    """``{name: {"path", "size", "sha256"}}`` of every file.

    Args:
        files: what the run calls each file (its option, e.g. ``"--data"``) -> its path.

    Returns:
        Name → ``{"path": the path as given, "size": bytes, "sha256": hex digest}``.

    Raises:
        FileNotFoundError / OSError: a file cannot be read.
    """
    out = {}
    for name, path in files.items():
        p = Path(path)
        out[str(name)] = {"path": str(p), "size": p.stat().st_size, "sha256": sha256_file(p)}
    return out


def _describe(entry: Mapping[str, Any]) -> str:
    return f"{entry.get('size')} bytes, SHA-256 {str(entry.get('sha256'))[:12]}…"


def data_change(saved: object, current: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The first data file that differs from its fingerprint in a checkpoint, or None.

    Args:
        saved: the checkpoint's ``"data_files"`` (``None`` for a run saved before fingerprints
            existed: nothing to compare).
        current: :func:`fingerprint_files` of the files now.

    Returns:
        ``"the --data file input.txt changed (… when saved; … now)"``, or None when every file
        has the size and SHA-256 it had.
    """
    if saved is None:
        return None
    if not isinstance(saved, Mapping) or not all(isinstance(v, Mapping) for v in saved.values()):
        return f"its {DATA_FILES_KEY} entry is not a mapping of fingerprints"
    for name in sorted(set(saved) | set(current)):
        old, new = saved.get(name), current.get(name)
        if old is None or new is None:
            return f"the {name} file is {'new' if old is None else 'gone'} since the checkpoint"
        if (old.get("size"), old.get("sha256")) != (new.get("size"), new.get("sha256")):
            return (
                f"the {name} file {new.get('path')} changed since the checkpoint "
                f"({_describe(old)} then; {_describe(new)} now)"
            )
    return None
