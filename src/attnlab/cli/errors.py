"""How the command line reports an exception: a user's mistake in one line, a bug in full.

The rule (:func:`is_user_error`) decides by the exception's *type* and by *where it was raised*,
never by its message:

* :class:`CLIError` — the command line's own errors — is always the user's mistake.
* A ``ValueError`` or ``TypeError`` (or a subclass, such as
  :class:`~attnlab.training.checkpoint.CheckpointError`) is the user's mistake when attnlab raised
  it on purpose: the innermost frame of its traceback lies in the attnlab package *and* what
  executed there is a ``raise`` statement. This is how the library reports bad arguments (see
  ``DESIGN.md``, "Errors at public boundaries"). The same types raised anywhere else are bugs: in
  torch, numpy or transformers (attnlab passed on a value it should have validated), or by a
  builtin call in attnlab's own code (``int("x")``, ``bytes.decode``, a call with the wrong
  arguments), which no one raised on purpose.
* An operating-system error about a file — ``FileNotFoundError``, ``PermissionError``,
  ``IsADirectoryError``, ``NotADirectoryError``, ``FileExistsError`` (e.g. an output path whose
  parent is a file), or the errno of a full disk (``ENOSPC``, ``EDQUOT``), a read-only file
  system (``EROFS``) or a path too long (``ENAMETOOLONG``) — is the user's, wherever it was
  raised: the user named the path. It is shown as ``PATH: DESCRIPTION``.

Everything else — ``KeyError``, ``AttributeError``, ``RuntimeError``, ``IndexError``,
``AssertionError``, the ``ValueError`` of a library beneath attnlab, … — is a bug in attnlab.

:func:`report` prints a user's mistake as ``attnlab: error: <message>`` (exit code 2) and a bug as
its traceback followed by ``attnlab: internal error: <type>: <message> (this is a bug in attnlab;
please report it)`` (exit code 1). With ``--verbose`` a user's mistake is preceded by its
traceback too.
"""

from __future__ import annotations

import dis
import errno
import sys
import traceback
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import TextIO

__all__ = [
    "BUG_EXIT",
    "USER_ERROR_EXIT",
    "CLIError",
    "is_user_error",
    "one_line",
    "raised_by_attnlab",
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

# the opcode of a `raise` statement (a re-raised exception keeps the frame and the instruction
# that raised it first)
_RAISE_OP = "RAISE_VARARGS"


class CLIError(Exception):
    """An error to report as one line (``attnlab: error: …``) with a non-zero exit."""


@cache
def _package_dir() -> Path:
    import attnlab

    return Path(attnlab.__file__).resolve().parent


def _innermost(tb: TracebackType) -> TracebackType:
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def _in_package(filename: str) -> bool:
    try:
        return Path(filename).resolve().is_relative_to(_package_dir())
    except (OSError, ValueError):
        return False


def _executes_raise(tb: TracebackType) -> bool:
    """Whether the instruction that raised in ``tb``'s frame is a ``raise`` statement.

    An exception raised by a call (a builtin or an extension function) is instead raised at
    the call's instruction.
    """
    for instruction in dis.get_instructions(tb.tb_frame.f_code):
        if instruction.offset == tb.tb_lasti:
            return instruction.opname == _RAISE_OP
    return False


def raised_by_attnlab(exc: BaseException) -> bool:
    """Whether a ``raise`` statement of the attnlab package raised ``exc``.

    True when the innermost frame of its traceback (where it was raised) is a file of the
    attnlab package and the instruction executing there is a ``raise``; False for an exception
    raised in another package, or by a builtin or extension call from attnlab's code.
    """
    if exc.__traceback__ is None:
        return False
    tb = _innermost(exc.__traceback__)
    return _in_package(tb.tb_frame.f_code.co_filename) and _executes_raise(tb)


def _is_file_error(exc: BaseException) -> bool:
    return isinstance(exc, _FILE_ERRORS) or (isinstance(exc, OSError) and exc.errno in _FILE_ERRNOS)


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the user's mistake (one line, exit 2) rather than a bug in attnlab.

    The rule, by type and by where it was raised, never by message (see the module's docstring):
    a :class:`CLIError`; a ``ValueError``/``TypeError`` raised by a ``raise`` in the attnlab
    package; an ``OSError`` about a file (not found, permission denied, a directory where a file
    was expected or the reverse, a file in the way, a full disk, a read-only file system, a path
    too long).
    """
    if isinstance(exc, CLIError):
        return True
    if isinstance(exc, (ValueError, TypeError)):
        return raised_by_attnlab(exc)
    return _is_file_error(exc)


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
