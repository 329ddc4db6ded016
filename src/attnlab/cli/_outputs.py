"""Output files named on the command line, checked before any work is done.

A figure or a viewer is written at the end of a command (after loading a model and running it);
a path that can never be written — a file where a folder must be, a folder where the file must
be, a figure that is neither PNG nor SVG — is refused first, in one line naming the option.
Problems only the write itself can reveal (a read-only file system, a full disk) are reported
then, as ``PATH: REASON``, and leave any file already at ``PATH`` unchanged
(:func:`attnlab.viz.files.write_file`).
"""

from __future__ import annotations

from pathlib import Path

from attnlab.cli.errors import CLIError
from attnlab.viz.files import check_output_path

__all__ = ["checked_figure"]

FIGURE_SUFFIXES = (".png", ".svg")


def checked_figure(path: str | Path, flag: str) -> Path:
    """``path`` (the value of option ``flag``) as a ``Path``, when a figure can be written there
    (:func:`attnlab.viz.files.check_output_path`) and its name ends in ``.png`` or ``.svg``."""
    if Path(path).suffix.lower() not in FIGURE_SUFFIXES:
        raise CLIError(f"{flag} must end in .png or .svg, got {str(path)!r}")
    return check_output_path(path, flag)
