"""The learning path is one path: each notebook links the next, and no page states a stale count.

A notebook's link to the next is ``[notebook N](NN_name.ipynb)`` after its ``**Next:**``: the
``.ipynb`` beside it in Jupyter, and on the site the next notebook's page (docs/hooks.py rewrites
it; the site's link check fails the build on one that goes nowhere).
"""

from __future__ import annotations

import itertools
import re

import pytest

from tests.conftest import REPO
from tests.notebooks.test_notebooks import SOURCES

NUMBER_WORDS = (
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
).split()
# "the twelve notebooks", "twelve jupytext notebooks", "16 notebooks"
_COUNT = re.compile(r"\b(\w+)\s+(?:jupytext\s+)?notebooks\b", re.IGNORECASE)


@pytest.mark.parametrize(
    ("source", "following"),
    list(itertools.pairwise(SOURCES)),
    ids=[s.stem[:2] for s in SOURCES[:-1]],
)
def test_each_notebook_ends_with_a_link_to_the_next(source, following) -> None:
    text = source.read_text(encoding="utf-8")
    link = re.compile(r"\*\*Next:\*\*[^%]*\]\(" + re.escape(following.name[:-3]) + r"\.ipynb\)")
    assert link.search(text), (
        f"{source.name}: end with '**Next:** [notebook {int(following.stem[:2])}]"
        f"({following.stem}.ipynb) …' in a markdown cell"
    )


def _stated(word: str) -> int | None:
    """The number a word says (``twelve``, ``16``), or None."""
    if word.isdigit():
        return int(word)
    return NUMBER_WORDS.index(word.lower()) + 1 if word.lower() in NUMBER_WORDS else None


def test_no_page_states_a_stale_number_of_notebooks() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    stale = [
        f"{page.name}: {m[0]!r}"
        for page in pages
        for m in _COUNT.finditer(page.read_text(encoding="utf-8"))
        if _stated(m[1]) not in (None, len(SOURCES))
    ]
    assert not stale, f"{len(SOURCES)} notebooks, but: {stale} (or say no number at all)"
