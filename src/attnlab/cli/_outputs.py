"""Output files named on the command line, checked before any work is done.

A figure or a viewer is written at the end of a command (after loading a model and running it);
a path that can never be written — a file where a folder must be, a folder where the file must
be, a figure that is neither PNG nor SVG — is refused first, in one line naming the option.
Problems only the write itself can reveal (a read-only file system, a full disk) are reported
then, as ``PATH: REASON``, and leave any file already at ``PATH`` unchanged
(:func:`attnlab.viz._files.write_file`).
"""

from __future__ import annotations

from pathlib import Path

from attnlab.cli.errors import CLIError
from attnlab.viz._files import check_output_path

__all__ = ["checked_figure", "checked_output"]

FIGURE_SUFFIXES = (".png", ".svg")


def checked_output(path: str | Path, flag: str) -> Path:
    """``path`` (the value of option ``flag``) as a ``Path``, when a file can be created there.

    Raises:
        ValueError: a parent of ``path`` is a file (the message names ``flag``).
        IsADirectoryError: ``path`` is a folder (reported as ``PATH: Is a directory``).
    """
    return check_output_path(path, flag)


def checked_figure(path: str | Path, flag: str) -> Path:
    """:func:`checked_output` for a figure, whose name must end in ``.png`` or ``.svg``."""
    if Path(path).suffix.lower() not in FIGURE_SUFFIXES:
        raise CLIError(f"{flag} must end in .png or .svg, got {str(path)!r}")
    return checked_output(path, flag)
