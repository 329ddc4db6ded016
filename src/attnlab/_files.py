"""Durable file writes: bytes on disk before anyone relies on them, files replaced all at once.

:func:`replace_with` writes a temporary sibling, fsyncs it, ``os.replace``-s it over the target
and fsyncs the folder, so a process killed at any moment leaves either the old file or the new one,
never a mix. The checkpoints' ``latest`` pointer and the truncated ``metrics.jsonl`` of a resumed
run are written this way. :func:`replace_folder` does the same for several files of one folder
(a Hugging Face folder's ``config.json`` and weights): they are written into a staging sibling
folder and the two folders swapped in one step.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import torch
from safetensors.torch import save

from attnlab.errors import ArgumentError

__all__ = [
    "fsync_dir",
    "fsync_file",
    "naming",
    "replace_file",
    "replace_folder",
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


def replace_folder(
    path: str | Path,
    write: Callable[[Path], object],
    replaced: Callable[[str], bool],
    last: str,
) -> Path:
    """Replace some files of the folder ``path`` by those ``write(stage)`` writes, all at once.

    The new files are written (fsynced) into a staging sibling, ``.NAME.save-PID-ID``, with hard
    links to (or copies of) the folder's other entries — those ``replaced`` does not select —
    and the staging folder then takes the folder's place: renamed onto it when it is missing or
    empty, else swapped with it in one ``renameat2(RENAME_EXCHANGE)`` (Linux), the old folder
    deleted afterwards. A process killed at any moment leaves the folder either as it was or as
    written, never a mix; its staging sibling is deleted by the next call for the same folder
    (once its process is gone), and readers of the folder never see it. Where the file system
    cannot swap two folders (not Linux, or a mount point), the new files are renamed into the
    folder one by one, ``last`` last, and the replaced files that were not rewritten are
    deleted after: a kill between two renames leaves some new files beside old ones.

    Args:
        path: the folder (made, with its parents, when missing).
        write: writes the new files into the folder it is given (fsynced, e.g. with
            :func:`write_synced`).
        replaced: whether an entry of the old folder (by name) is replaced, i.e. not carried
            over; entries ``write`` writes are replaced in any case.
        last: the file renamed last where the folders cannot be swapped (the one readers open
            first, such as ``config.json``).

    Returns:
        The folder (its real path).

    Raises:
        ArgumentError: ``path`` exists and is not a folder.
        OSError: a write failed; the folder is as it was and the staging sibling is deleted.
    """
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_dir():
        raise ArgumentError(f"{path} must be a folder, got a file")
    target.parent.mkdir(parents=True, exist_ok=True)
    _clean_stages(target)
    stage = target.with_name(f".{target.name}.save-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    stage.mkdir()
    try:
        write(stage)
        written = {p.name for p in stage.iterdir()}
        swap = target.is_dir() and not Path.cwd().is_relative_to(target)  # never under our feet
        if target.is_dir():
            shutil.copymode(target, stage)
            for entry in target.iterdir():
                if entry.name not in written and not replaced(entry.name):
                    _carry(entry, stage / entry.name)
        fsync_dir(stage)
        if not target.exists() or (swap and not any(target.iterdir())):
            os.replace(stage, target)  # onto nothing, or onto an empty folder: one rename
        elif swap and _exchange(stage, target):
            shutil.rmtree(stage, ignore_errors=True)  # the old folder, now under the stage's name
        else:
            _rename_each(stage, target, written, replaced, last)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    fsync_dir(target.parent)
    return target


def _clean_stages(target: Path) -> None:
    """Delete the staging siblings of ``target`` left by processes that are gone."""
    prefix = f".{target.name}.save-"
    for stage in target.parent.iterdir():
        pid = stage.name.removeprefix(prefix).split("-")[0] if stage.name.startswith(prefix) else ""
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stage, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (another user's counts as running)."""
    if pid == os.getpid():
        return False  # this process is not inside another call for the same folder
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _carry(entry: Path, to: Path) -> None:
    """An entry of the old folder into the new one: hard links where possible, else copies."""
    if entry.is_dir() and not entry.is_symlink():
        shutil.copytree(entry, to, symlinks=True, copy_function=_link_or_copy)
    elif entry.is_symlink():
        os.symlink(os.readlink(entry), to)
    else:
        _link_or_copy(str(entry), str(to))


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


# renameat2's flag that swaps two existing paths atomically (linux/fs.h)
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one step; ``False`` where the system or file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # pragma: no cover - a C library without renameat2
        return False
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EXDEV, errno.EBUSY, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _rename_each(
    stage: Path, target: Path, written: set[str], replaced: Callable[[str], bool], last: str
) -> None:
    """The fallback of :func:`replace_folder`: the new files renamed in one by one, ``last``
    last, then the replaced files that were not rewritten deleted."""
    for name in sorted(written, key=lambda n: n == last):
        os.replace(stage / name, target / name)
    fsync_dir(target)
    for entry in target.iterdir():
        if entry.name not in written and replaced(entry.name):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    shutil.rmtree(stage)
