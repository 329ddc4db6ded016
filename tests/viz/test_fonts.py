"""Every attnlab figure draws Japanese labels and titles in a font that holds them (issue 24).

The alignment figure used to be the only one that chose a CJK font for all its texts; the
attention heatmaps fitted their tick labels alone, so a Japanese title (``attnlab plot heads`` on
an en→ja run puts the translation there) came out as boxes with a matplotlib "Glyph … missing"
warning per character. :class:`attnlab.viz.Plot` now fits every text of its figure.
"""

from __future__ import annotations

import io
import logging
import warnings

import pytest
import torch

from attnlab.viz import attention_heatmap, head_grid, layer_head_grid
from attnlab.viz import fonts as fonts_module
from attnlab.viz.fonts import MISSING_GLYPH, font_for

QUERIES = ["私", "は", "猫", "です"]
KEYS = ["I", "am", "a", "cat", "."]
TITLE = "attnlab translate: 私は猫です"


def _weights(*lead: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.softmax(torch.randn(*lead, len(QUERIES), len(KEYS), generator=gen), dim=-1)


FIGURES = {
    "heatmap": lambda: attention_heatmap(
        _weights(), query_tokens=QUERIES, key_tokens=KEYS, title=TITLE
    ),
    "heads": lambda: head_grid(_weights(2), query_tokens=QUERIES, key_tokens=KEYS, title=TITLE),
    "layers": lambda: layer_head_grid(
        _weights(2, 2), query_tokens=QUERIES, key_tokens=KEYS, title=TITLE
    ),
}


def _render(make) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot = make()
        plot.figure.savefig(io.BytesIO(), format="png")  # draw every text
    return plot, [str(w.message) for w in caught]


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_japanese_labels_and_title_draw_without_missing_glyphs(name: str) -> None:
    if font_for([*QUERIES, TITLE]).missing:
        pytest.skip("no Japanese font installed (Debian: fonts-ipafont-gothic)")
    plot, messages = _render(FIGURES[name])
    assert not [m for m in messages if "missing from font" in m], messages
    titles = [t for t in plot.figure.texts if t.get_text()]  # a suptitle
    titles += [ax.title for ax in plot.figure.axes if ax.get_title()]
    japanese = [t for t in titles if "猫" in t.get_text()]
    assert japanese, "the Japanese title is drawn"
    for t in japanese:
        assert "DejaVu" not in t.get_fontname()


def test_without_a_japanese_font_one_warning_and_boxes(monkeypatch, caplog) -> None:
    """No installed font holds the characters: □ in their place, one log line, no crash."""
    monkeypatch.setattr(fonts_module, "_candidate_files", lambda: ())
    with caplog.at_level(logging.WARNING, logger="attnlab.viz.fonts"):
        plot, messages = _render(FIGURES["heads"])
    assert not [m for m in messages if "missing from font" in m], messages
    assert caplog.text.count("no installed font draws") == 1
    assert MISSING_GLYPH in plot.figure.texts[0].get_text()  # the suptitle


def test_a_character_the_default_font_draws_falls_back_to_it(caplog) -> None:
    """BPE's ``▁`` (U+2581) is in matplotlib's default font but not in IPA Gothic: a label that
    mixes it with kana is drawn whole, with no warning, instead of ``□`` for ``▁``."""
    labels = ["▁彼", "▁は", "▁", "。"]
    if font_for(labels).path is None or font_for(["彼"]).missing:
        pytest.skip("no Japanese font installed (Debian: fonts-ipafont-gothic)")
    with caplog.at_level(logging.WARNING, logger="attnlab.viz.fonts"):
        plot, messages = _render(
            lambda: attention_heatmap(_weights()[:, :4], query_tokens=labels, key_tokens=labels)
        )
    assert not [m for m in messages if "missing" in m], messages
    assert "no installed font draws" not in caplog.text
    ticks = [t.get_text() for t in plot.figure.axes[0].get_yticklabels()]
    assert ticks == labels
