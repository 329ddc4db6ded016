"""Durable file writes: bytes on disk before anyone relies on them, files replaced all at once.

:func:`replace_file` writes a ``.tmp`` sibling, fsyncs it, ``os.replace``-s it over the target and
fsyncs the folder, so a process killed at any moment leaves either the old file or the new one,
never a mix. The checkpoints' ``latest`` pointer and the truncated ``metrics.jsonl`` of a resumed
run are written this way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save

__all__ = ["fsync_dir", "fsync_file", "replace_file", "safetensors_bytes", "write_synced"]


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
    """Write ``data`` to ``path`` (replacing it in place) and fsync it.

    Raises:
        OSError: the write failed (a full disk, a read-only file system, …), naming ``path``.
    """
    try:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def safetensors_bytes(
    tensors: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> bytes:
    """``tensors`` in the safetensors format, in memory, so that they reach the disk through
    :func:`write_synced` (whose errors are ``OSError`` naming the file, where safetensors' own
    writer reports a full disk as a ``SafetensorError``).

    A tensor shared by several names is stored once, under the first of its names in sorted
    order (as ``safetensors.torch.save_model`` does; loading with ``load_model`` ties it again).
    """
    first: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for name in sorted(tensors):
        t = tensors[name]
        first.setdefault((t.data_ptr(), t.element_size(), tuple(t.shape)), name)
    kept = {name: tensors[name].contiguous() for name in sorted(first.values())}
    return save(kept, metadata=metadata)


def replace_file(path: Path, data: bytes) -> None:
    """Replace ``path`` by a file holding ``data``, atomically (through ``<name>.tmp``)."""
    tmp = path.with_name(path.name + ".tmp")
    write_synced(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)
