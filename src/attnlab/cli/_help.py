"""Help texts: a docstring's reStructuredText as plain text, and ``attnlab plot KIND --help``.

Docstrings are written for the documentation site (````code````, ``:func:`name```); ``--help``
prints them to a terminal, where that markup is noise. :func:`plain` removes it. :class:`KindHelp`
is the ``-h/--help`` of a command whose first argument picks what it does (``attnlab plot
steps --help``): given that argument it prints that kind's text and only the options it reads.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["KindHelp", "plain"]


def plain(doc: str | None, paragraphs: int = 1) -> str | None:
    """The first ``paragraphs`` of a docstring without reStructuredText markup.

    Args:
        doc: a module's or function's ``__doc__`` (``None`` under ``python -OO``).
        paragraphs: how many blank-line separated paragraphs to keep. Default 1.

    Returns:
        The text, ``None`` when ``doc`` is ``None``: ````x```` → ``x``, ``:func:`~a.b``` → ``b``
        (the last name of a ``~`` target, as Sphinx shows it).

    Examples:
        >>> plain("``attnlab demo`` — see :func:`~attnlab.cli.demo.run`.")
        'attnlab demo — see run.'
    """
    if doc is None:
        return None
    text = "\n\n".join(doc.strip().split("\n\n")[:paragraphs]).replace("``", "")
    parts = text.split("`")  # outside, inside, outside, …: the inside of :role:`…`
    for i in range(1, len(parts) - 1, 2):
        before = parts[i - 1]
        head, colon, role = before[:-1].rpartition(":")
        if before.endswith(":") and colon and role.isalpha():
            parts[i - 1] = head  # ":func:" dropped
        target = parts[i].split("<")[0].strip() if "<" in parts[i] else parts[i]
        parts[i] = target[1:].rsplit(".", 1)[-1] if target.startswith("~") else target
    return "".join(parts)


class KindHelp(argparse.Action):
    """``-h/--help`` that, after a KIND (``attnlab plot steps --help``), prints that kind's text
    and its options only; before one (``attnlab plot --help``), the whole help.

    Args:
        texts: per kind, what it draws (plain text).
        options: per kind, the option strings it reads (``"--text"``, …); an option no kind
            lists is shown for every kind, and ``-h`` and the output option always are.
    """

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str = argparse.SUPPRESS,
        *,
        texts: Mapping[str, str],
        options: Mapping[str, Sequence[str]],
        always: Sequence[str] = ("-h", "-o"),
        help: str | None = None,
    ) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)
        self.texts, self.options, self.always = texts, options, always

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        kind = getattr(namespace, "kind", None)
        if not isinstance(kind, str) or kind not in self.texts:
            parser.print_help()
            parser.exit()
        listed = {flag for flags in self.options.values() for flag in flags}
        mine = set(self.options.get(kind, ())) | set(self.always)
        one = argparse.ArgumentParser(
            prog=f"{parser.prog} {kind}",
            description=self.texts[kind],
            add_help=False,
            formatter_class=parser.formatter_class,
        )
        for action in parser._actions:  # the options this kind reads, in the parser's order
            flags = set(action.option_strings)
            if flags and (flags & mine or not flags & listed):
                one._add_action(action)
        one.print_help()
        parser.exit()
