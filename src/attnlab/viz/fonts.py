"""Fonts for token labels in any script: a font that draws every character, or ``□`` in its place.

matplotlib's default font (DejaVu Sans) has no glyph for kana or kanji, so a Japanese token label
would be drawn as empty boxes with a warning per character. :func:`font_for` finds an installed font
that draws every character of some texts (e.g. Debian's ``fonts-ipafont-gothic`` or
``fonts-noto-cjk``, or the IPAex font of the ``matplotlib-fontja`` package); :func:`fit_labels`
gives it to the labels that need it (Latin labels keep the default look) and, where no installed
font can draw a character, writes ``□`` instead and logs one warning. :func:`fit_figure` does that
for every text of a figure (tick labels, titles, axis labels, legends, annotations): every
:class:`~attnlab.viz.Plot` calls it when it is made, so no attnlab figure draws a label as boxes.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from matplotlib import font_manager, rcParams
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.ft2font import FT2Font
from matplotlib.text import Text
from matplotlib.ticker import FixedFormatter, FuncFormatter

from attnlab.errors import ArgumentTypeError

__all__ = [
    "MISSING_GLYPH",
    "FontChoice",
    "fit_figure",
    "fit_labels",
    "font_for",
    "needs_other_font",
    "warn_missing",
]

logger = logging.getLogger(__name__)

#: drawn in place of a character that no installed font holds
MISSING_GLYPH = "□"
#: family names that usually cover Japanese / CJK text, tried first
_CJK_HINTS = (
    "JP",
    "Japan",
    "CJK",
    "IPA",
    "Gothic",
    "Mincho",
    "Han",
    "Takao",
    "Droid Sans Fallback",
)


@dataclass(frozen=True)
class FontChoice:
    """The font that draws a set of texts.

    Attributes:
        name: its family name (e.g. ``"DejaVu Sans"``, ``"Noto Sans CJK JP"``).
        path: its file; ``None`` for matplotlib's default font (nothing to change).
        missing: characters of the texts that this font cannot draw (empty when it draws them
            all), in order of first appearance.
    """

    name: str
    path: str | None
    missing: tuple[str, ...]

    def properties(self, size: float | None = None) -> FontProperties:
        """``FontProperties`` for matplotlib text in this font.

        Args:
            size: the font size in points; ``None`` keeps matplotlib's default.

        Returns:
            The properties (matplotlib's default font when ``path`` is ``None``).
        """
        if self.path is None:
            return FontProperties(size=size)
        # this font first, then matplotlib's default for the characters it lacks (``▁``, …)
        return FontProperties(family=[_registered(self.path), _default_font()[0]], size=size)

    def drawable(self, text: str) -> str:
        """``text`` as this font can draw it.

        Args:
            text: the text to draw.

        Returns:
            ``text`` with each character the font lacks replaced by ``□``.
        """
        if not self.missing:
            return text
        lacking = set(self.missing)
        return "".join(MISSING_GLYPH if c in lacking else c for c in text)


@functools.cache
def _charmap(path: str) -> frozenset[int]:
    """The code points a font file maps to glyphs (empty when the file cannot be read)."""
    try:
        return frozenset(FT2Font(path).get_charmap())
    except (OSError, RuntimeError, ValueError):
        return frozenset()


@functools.cache
def _family(path: str) -> str:
    try:
        return str(FT2Font(path).family_name)
    except (OSError, RuntimeError, ValueError):
        return path


@functools.cache
def _registered(path: str) -> str:
    """The family name under which matplotlib finds the font file ``path`` (added once)."""
    if not any(f.fname == path for f in font_manager.fontManager.ttflist):
        font_manager.fontManager.addfont(path)
    return next(f.name for f in font_manager.fontManager.ttflist if f.fname == path)


def _default_font() -> tuple[str, str]:
    """``(family name, file)`` of the font matplotlib uses for plain text."""
    path = font_manager.findfont(FontProperties(family=rcParams["font.family"]))
    return _family(path), path


@functools.lru_cache(maxsize=1)
def _candidate_files() -> tuple[str, ...]:
    """Font files to try: those matplotlib knows and any other system font, CJK-looking first."""
    paths = {f.fname for f in font_manager.fontManager.ttflist}
    paths.update(font_manager.findSystemFonts())
    # matplotlib's "Last Resort" font maps every code point to a placeholder box: it draws nothing
    paths = {p for p in paths if "last resort" not in _family(p).lower()}
    hinted = [p for p in paths if any(h.lower() in _family(p).lower() for h in _CJK_HINTS)]
    rest = [p for p in paths if p not in set(hinted)]
    return tuple(sorted(hinted) + sorted(rest))


def _needed(texts: Iterable[str]) -> list[str]:
    """The distinct printable characters of ``texts`` (whitespace left out), in order."""
    seen: dict[str, None] = {}
    for text in texts:
        for c in str(text):
            if not c.isspace():
                seen.setdefault(c, None)
    return list(seen)


def font_for(texts: Iterable[str]) -> FontChoice:
    """The font that draws every character of ``texts``: matplotlib's default when it can,
    otherwise the first installed font that holds every character the default lacks (fonts whose
    name suggests Japanese or CJK are tried first), otherwise the one that lacks the fewest. Text
    in the chosen font falls back to the default for the characters it lacks itself.

    Args:
        texts: the strings to draw (e.g. token labels).

    Returns:
        A :class:`FontChoice`; its ``missing`` lists the characters no chosen font can draw.
    """
    if isinstance(texts, str):
        raise ArgumentTypeError("texts must be an iterable of strings, got a single str")
    chars = _needed(texts)
    name, path = _default_font()
    lacking = [c for c in chars if ord(c) not in _charmap(path)]
    if not lacking:
        return FontChoice(name, None, ())
    best: FontChoice = FontChoice(name, None, tuple(lacking))
    for candidate in _candidate_files():
        cmap = _charmap(candidate)
        miss = [c for c in lacking if ord(c) not in cmap]  # the default draws the others
        if len(miss) < len(best.missing):
            best = FontChoice(_family(candidate), candidate, tuple(miss))
            if not miss:
                break
    return best


def needs_other_font(text: str) -> bool:
    """Whether matplotlib's default font lacks a character of ``text`` (whitespace aside).

    Args:
        text: the text to draw.

    Returns:
        ``True`` when some character needs another font.
    """
    default = _charmap(_default_font()[1])
    return any(ord(c) not in default for c in text if not c.isspace())


def warn_missing(font: FontChoice) -> None:
    """Log one warning naming the characters ``font`` cannot draw (nothing when it draws all).

    Args:
        font: the choice :func:`font_for` made.
    """
    if font.missing:
        logger.warning(
            "no installed font draws %s; they are drawn as %s (install a font that does, e.g. "
            "Debian's fonts-ipafont-gothic or the matplotlib-fontja package)",
            "".join(font.missing),
            MISSING_GLYPH,
        )


def fit_labels(labels: Sequence[Text]) -> FontChoice:
    """Make matplotlib text objects drawable: labels the default font cannot draw get the font
    :func:`font_for` chooses; characters no installed font holds become ``□`` (one warning).

    Args:
        labels: text artists, e.g. ``ax.get_xticklabels() + ax.get_yticklabels()``.

    Returns:
        The :class:`FontChoice` used (its ``missing`` lists the replaced characters).
    """
    texts = [label.get_text() for label in labels]
    font = font_for(texts)
    warn_missing(font)
    for label, text in zip(labels, texts):
        if needs_other_font(text):
            label.set_text(font.drawable(text))
            label.set_fontproperties(font.properties(float(label.get_fontsize())))
    return font


def fit_figure(figure: Figure) -> FontChoice:
    """:func:`fit_labels` for every text of ``figure``: tick labels, titles, axis labels, legends,
    colorbar labels and annotations. One font is chosen for them all, and one warning is logged
    when some character has no installed font.

    Args:
        figure: a matplotlib figure, drawn or not.

    Returns:
        The :class:`FontChoice` used.
    """
    for ax in figure.axes:  # tick label artists exist once asked for
        ax.get_xticklabels()
        ax.get_yticklabels()
    texts = [t for t in figure.findobj(Text) if isinstance(t, Text) and t.get_text()]
    font = fit_labels(texts)
    if font.missing:  # drawing resets tick labels from their formatter: replace there too
        for ax in figure.axes:
            for axis in (ax.xaxis, ax.yaxis):
                old = axis.get_major_formatter()
                if not isinstance(old, (FixedFormatter, FuncFormatter)):
                    continue  # numbers: nothing to replace
                axis.set_major_formatter(
                    FuncFormatter(lambda x, pos, old=old: font.drawable(str(old(x, pos))))
                )
    return font
