"""Printing a model's text without letting it drive the terminal.

A model writes whatever characters its vocabulary holds, escape sequences included: printed raw,
``ESC [ 2 J`` clears the screen and others move the cursor, rewrite the window title or hide what
follows. On a terminal the command line therefore shows every control character except newline
and tab (and the carriage return of a ``\\r\\n`` line end) as a visible escape, ``\\x1b`` for
``ESC``; written to a file or a pipe, or with ``--raw``, the text is written exactly as decoded.

:func:`escape_controls` is the one rule; :class:`TextConsole` applies it to everything it prints
(the text a command prints itself, and the reports a task prints through it).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

__all__ = ["TextConsole", "escape_controls", "writes_to_terminal"]

# every control character (Unicode category Cc: C0, DEL, C1) but tab and newline, as ``\xNN``
_ESCAPES = {
    code: f"\\x{code:02x}"
    for code in (*range(0x00, 0x20), *range(0x7F, 0xA0))
    if chr(code) not in "\t\n"
}


def escape_controls(text: str) -> str:
    """``text`` with its control characters shown as escapes, e.g. ``ESC`` as ``\\x1b``.

    Every character of Unicode category ``Cc`` (``U+0000``–``U+001F``, ``U+007F``–``U+009F``)
    becomes ``\\xNN``, except newline and tab, which are kept, and a carriage return directly
    before a newline (a Windows line end), which moves nothing. Other text is unchanged (a
    backslash already in the text is not doubled, so the result is for reading, not parsing).

    Example:
        >>> escape_controls("\\x1b[2Jhi\\tthere\\n")
        '\\\\x1b[2Jhi\\tthere\\n'
    """
    # a carriage return before a newline only ends a line: keep the "\r\n" pairs
    return "\r\n".join(part.translate(_ESCAPES) for part in text.split("\r\n"))


def writes_to_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (its ``isatty()``; False when it cannot say)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except (ValueError, OSError):  # a closed or detached stream
        return False


class TextConsole(Console):
    """A rich ``Console`` that shows control characters escaped when it writes to a terminal.

    Every string it renders (``print``, table cells, a task's report) goes through
    :func:`escape_controls` first when its file is a terminal and ``raw`` is False; rich's own
    styling is added afterwards and is unaffected.

    Args:
        raw: never escape (``--raw``): the text reaches the terminal as it is.
        **kwargs: passed on to ``rich.console.Console``.
    """

    def __init__(self, *, raw: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.raw = raw

    @property
    def escapes(self) -> bool:
        """Whether control characters are shown escaped: on a terminal, unless ``raw``."""
        return not self.raw and writes_to_terminal(self.file)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        """rich's ``render_str`` of the text with its control characters escaped (on a terminal)."""
        return super().render_str(escape_controls(text) if self.escapes else text, **kwargs)

    def print_text(self, text: str) -> None:
        """Print a model's ``text`` and a newline.

        On a terminal (and not ``raw``) control characters are escaped; otherwise the text is
        written byte for byte, bypassing rich (which would drop carriage returns, bells and
        backspaces and could wrap long lines).
        """
        if self.escapes:
            self.print(text, markup=False, highlight=False, soft_wrap=True, emoji=False)
            return
        self.file.write(text + "\n")
        self.file.flush()
