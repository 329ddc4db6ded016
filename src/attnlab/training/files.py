"""Durable file writes: bytes on disk before anyone relies on them, files replaced all at once.

:func:`replace_file` writes a ``.tmp`` sibling, fsyncs it, ``os.replace``-s it over the target and
fsyncs the folder, so a process killed at any moment leaves either the old file or the new one,
never a mix. The checkpoints' ``latest`` pointer and the truncated ``metrics.jsonl`` of a resumed
run are written this way.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "fsync_file", "replace_file", "write_synced"]


def fsync_file(path: Path) -> None:
    """Flush a written file's data to the disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (new, renamed or deleted names) to the disk, where supported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (replacing it in place) and fsync it."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace_file(path: Path, data: bytes) -> None:
    """Replace ``path`` by a file holding ``data``, atomically (through ``<name>.tmp``)."""
    tmp = path.with_name(path.name + ".tmp")
    write_synced(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)
