"""Durable file writes: bytes on disk before anyone relies on them, files replaced all at once.

:func:`replace_with` writes a temporary sibling, fsyncs it, ``os.replace``-s it over the target
and fsyncs the folder, so a process killed at any moment leaves either the old file or the new one,
never a mix. The checkpoints' ``latest`` pointer and the truncated ``metrics.jsonl`` of a resumed
run are written this way.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import torch
from safetensors.torch import save

__all__ = [
    "fsync_dir",
    "fsync_file",
    "naming",
    "replace_file",
    "replace_with",
    "safetensors_bytes",
    "write_synced",
]


def fsync_file(path: Path) -> None:
    """Flush a written file's data to the disk.

    Args:
        path: the file, already written and closed.
    """
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (new, renamed or deleted names) to the disk, where supported.

    Args:
        path: the folder; nothing happens on platforms that cannot open a folder.
    """
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

    Args:
        path: the file to write.
        data: its new content.

    Raises:
        OSError: the write failed (a full disk, a read-only file system, …), naming ``path``.
    """
    with naming(path), open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """Give ``path`` to an ``OSError`` raised inside that names no file.

    A write's error (``ENOSPC`` of a full disk, ``EIO``) carries only its errno, so the command
    line would print ``[Errno 28] No space left on device`` without saying where.

    Args:
        path: the file being written.

    Raises:
        OSError: the error, with ``filename`` set to ``path`` where it had none.
    """
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, os.fspath(path)) from exc


def safetensors_bytes(
    tensors: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> bytes:
    """``tensors`` in the safetensors format, in memory, so that they reach the disk through
    :func:`write_synced` (whose errors are ``OSError`` naming the file, where safetensors' own
    writer reports a full disk as a ``SafetensorError``).

    A tensor shared by several names is stored once, under the first of its names in sorted
    order (as ``safetensors.torch.save_model`` does; loading with ``load_model`` ties it again).

    Args:
        tensors: name → tensor (stored contiguous; tensors sharing memory are stored once).
        metadata: string metadata for the file's header, or ``None``.

    Returns:
        The content of a ``.safetensors`` file.

    Shape:
        any; each tensor is stored with its shape.
    """
    first: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for name in sorted(tensors):
        t = tensors[name]
        first.setdefault((t.data_ptr(), t.element_size(), tuple(t.shape)), name)
    kept = {name: tensors[name].contiguous() for name in sorted(first.values())}
    return save(kept, metadata=metadata)


def replace_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Replace ``path`` by what ``write(binary_file)`` writes, atomically: into a uniquely named
    temporary sibling, fsynced, renamed over the target (through a symbolic link), the folder
    fsynced. A failure leaves ``path`` as it was and no temporary file behind.

    Args:
        path: the file to replace (or create).
        write: called once with the temporary file, opened for binary writing.

    Raises:
        OSError: the file could not be written, naming ``path`` (not the temporary file).
    """
    target = Path(os.path.realpath(path))
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError) and exc.errno is not None and _about(exc, tmp, target):
            raise OSError(exc.errno, exc.strerror, str(path)) from exc  # the caller's path
        raise
    fsync_dir(target.parent)


def replace_file(path: Path, data: bytes) -> None:
    """Replace ``path`` by a file holding ``data``, atomically (see :func:`replace_with`).

    Args:
        path: the file to replace (or create).
        data: its new content.
    """
    replace_with(path, lambda f: f.write(data))


def _about(exc: OSError, *paths: Path) -> bool:
    """Whether ``exc`` names no file or one of ``paths``."""
    if exc.filename is None:
        return True
    if not isinstance(exc.filename, (str, os.PathLike)):
        return False
    return os.fspath(exc.filename) in {os.fspath(p) for p in paths}
