"""Writing an output file all at once: a good file is never replaced by a broken one.

:func:`write_file` checks the path (no file where a folder must be, not a folder itself), creates
the missing parent folders, writes into a temporary sibling, flushes it to the disk and renames
it over the target. A full disk, a read-only folder or a killed process therefore leaves either
the old file or the new one, never a truncated figure or viewer, and no temporary file behind.
An ``OSError`` names the path the caller gave (``PATH: No space left on device``), as ``open``
would, even when it came from writing into the temporary file.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from attnlab.errors import ArgumentError
from attnlab.training.files import replace_with

__all__ = ["check_output_path", "output_path", "write_file"]


def check_output_path(path: str | os.PathLike[str], name: str = "path") -> Path:
    """``path`` as a ``Path``, when a file can be created there; nothing is created.

    Args:
        path: the file to write.
        name: the argument's name, for the error message (e.g. ``"-o/--output"``).

    Returns:
        ``path`` as a ``Path``.

    Raises:
        ValueError: a parent of ``path`` exists but is a file, not a folder.
        IsADirectoryError: ``path`` is a folder.
    """
    path = Path(path)
    for parent in path.parents:  # the nearest existing one decides
        if parent.exists():
            if not parent.is_dir():
                raise ArgumentError(
                    f"{name} must lie in a folder, but {str(parent)!r} is a file, not a folder "
                    f"(got {str(path)!r})"
                )
            break
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    return path


def output_path(path: str | os.PathLike[str], name: str = "path") -> Path:
    """``path`` as a ``Path`` to write, checked by :func:`check_output_path`, with its parent
    folders created.

    Args:
        path: the file to write.
        name: the argument's name, for the error message; default ``"path"``.

    Returns:
        ``path`` as a ``Path``; its parent folder exists.

    Raises:
        ValueError: a parent of ``path`` exists but is a file, not a folder.
        IsADirectoryError: ``path`` is a folder.
    """
    path = check_output_path(path, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_file(
    path: str | os.PathLike[str], write: Callable[[BinaryIO], object], name: str = "path"
) -> Path:
    """Write a file through ``write(binary_file)``, replacing ``path`` only once it is complete.

    Args:
        path: the file to write (parent folders are created; a symbolic link is written through).
        write: writes the content into the open binary file it is given.
        name: the argument's name, for error messages.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        ValueError: a parent of ``path`` is a file.
        OSError: the file could not be written (a full disk, a read-only file system, no
            permission, …), with ``path`` as its file name; ``path`` is then unchanged.
    """
    path = output_path(path, name)
    if path.exists() and not path.is_file():  # a device or a pipe (/dev/stdout): write in place
        with open(path, "wb") as f:
            write(f)
        return path
    replace_with(path, write)
    return path
