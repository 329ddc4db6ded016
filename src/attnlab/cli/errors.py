"""How the command line reports an exception: a user's mistake in one line, a bug in full.

The rule (:func:`is_user_error`) decides by the exception's *type* alone, never by its message or
by where it was raised:

* an :class:`~attnlab.errors.AttnlabError` — what attnlab raises on purpose about its input
  (:class:`~attnlab.errors.ArgumentError`, a ``ValueError``; :class:`~attnlab.errors.ArgumentTypeError`,
  a ``TypeError``; :class:`~attnlab.training.manifest.CheckpointError`, …) and the command line's
  own :class:`CLIError` — is the user's mistake;
* an operating-system error about a file — ``FileNotFoundError``, ``PermissionError``,
  ``IsADirectoryError``, ``NotADirectoryError``, ``FileExistsError`` (e.g. an output path whose
  parent is a file), or the errno of a full disk (``ENOSPC``, ``EDQUOT``), a read-only file
  system (``EROFS``) or a path too long (``ENAMETOOLONG``) — is the user's, wherever it was
  raised: the user named the path. It is shown as ``PATH: DESCRIPTION``.

Everything else — a plain ``ValueError`` or ``TypeError`` (raised by torch, numpy, transformers,
or by a builtin call such as ``int("x")`` inside attnlab), ``KeyError``, ``AttributeError``,
``RuntimeError``, ``IndexError``, … — is a bug in attnlab: a value it should have validated
reached code that could not take it.

:func:`report` prints a user's mistake as ``attnlab: error: <message>`` (exit code 2) and a bug as
its traceback followed by ``attnlab: internal error: <type>: <message> (this is a bug in attnlab;
please report it)`` (exit code 1). With ``--verbose`` a user's mistake is preceded by its
traceback too.
"""

from __future__ import annotations

import errno
import sys
import traceback
from typing import TextIO

from attnlab.errors import AttnlabError

__all__ = [
    "BUG_EXIT",
    "USER_ERROR_EXIT",
    "CLIError",
    "is_user_error",
    "one_line",
    "report",
    "user_message",
]

USER_ERROR_EXIT = 2
BUG_EXIT = 1

# errno values of OSErrors that are about the user's files, besides the subclasses below
_FILE_ERRNOS = frozenset(
    code
    for code in (
        errno.ENOSPC,
        getattr(errno, "EDQUOT", None),
        errno.EROFS,
        errno.ENAMETOOLONG,
    )
    if code is not None
)
_FILE_ERRORS = (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
)


class CLIError(AttnlabError):
    """An error to report as one line (``attnlab: error: …``) with a non-zero exit."""


def _is_file_error(exc: BaseException) -> bool:
    return isinstance(exc, _FILE_ERRORS) or (isinstance(exc, OSError) and exc.errno in _FILE_ERRNOS)


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the user's mistake (one line, exit 2) rather than a bug in attnlab.

    By type alone (see the module's docstring): an :class:`~attnlab.errors.AttnlabError` (a
    :class:`CLIError` among them), or an ``OSError`` about a file (not found, permission denied,
    a directory where a file was expected or the reverse, a file in the way, a full disk, a
    read-only file system, a path too long).
    """
    return isinstance(exc, AttnlabError) or _is_file_error(exc)


def one_line(text: str) -> str:
    """``text`` with its lines joined by spaces (a one-line report keeps all of a message)."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def user_message(exc: BaseException) -> str:
    """The one-line message of a user's mistake.

    An ``OSError`` that carries a path and an OS description is ``PATH: DESCRIPTION`` (``old ->
    new: …`` for a rename); any other exception is its text, or its type when it has none.
    """
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        path = str(exc.filename)
        if exc.filename2 is not None:
            path += f" -> {exc.filename2}"
        return one_line(f"{path}: {exc.strerror}")
    return one_line(str(exc)) or type(exc).__name__


def report(exc: BaseException, *, verbose: bool = False, stream: TextIO | None = None) -> int:
    """Write ``exc`` as the command line reports it and return the exit code.

    Args:
        exc: the exception a command raised.
        verbose: also print the traceback of a user's mistake.
        stream: where to write (default: ``sys.stderr`` at the time of the call).

    Returns:
        :data:`USER_ERROR_EXIT` (2) for a user's mistake, :data:`BUG_EXIT` (1) for a bug.
    """
    out = sys.stderr if stream is None else stream
    if is_user_error(exc):
        if verbose:
            traceback.print_exception(exc, file=out)
        out.write(f"attnlab: error: {user_message(exc)}\n")
        return USER_ERROR_EXIT
    traceback.print_exception(exc, file=out)
    message = one_line(str(exc))
    out.write(
        f"attnlab: internal error: {type(exc).__name__}"
        f"{': ' + message if message else ''} (this is a bug in attnlab; please report it)\n"
    )
    return BUG_EXIT
