"""The alignment figure: drawn data equal to the captured cross-attention, labels in a font
that draws them, and clear errors."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import torch
from matplotlib import font_manager

import attnlab as al
from attnlab.inspect import capture
from attnlab.viz import fonts as fonts_module
from attnlab.viz.alignment import alignment_heatmap
from attnlab.viz.fonts import MISSING_GLYPH, FontChoice, font_for

SOURCE = ["i", "like", "french", "food", ".", "<eos>"]
TARGET = ["私", "は", "フランス", "料理", "が", "好き", "。"]


def cross_weights() -> torch.Tensor:
    """The last cross-attention of a small encoder-decoder: (1, H, T, S)."""
    torch.manual_seed(0)
    cfg = al.TransformerConfig(
        src_vocab_size=20, tgt_vocab_size=20, d_model=16, num_heads=4,
        num_encoder_layers=1, num_decoder_layers=2, d_ff=32, dropout=0.0,
    )  # fmt: skip
    model = al.Transformer(cfg).eval()
    src = torch.randint(3, 20, (1, len(SOURCE)))
    tgt = torch.randint(3, 20, (1, len(TARGET)))
    with capture(model) as cache:
        model(src, tgt)
    return cache.attentions[cache.names("cross")[-1]]


def test_data_is_the_mean_over_heads_and_its_argmax(tmp_path):
    w = cross_weights()
    plot = alignment_heatmap(w, source_tokens=SOURCE, target_tokens=TARGET, title="cross")
    mean = w[0].numpy().mean(axis=0)
    np.testing.assert_array_equal(plot.data["weights"], mean)
    np.testing.assert_array_equal(plot.data["alignment"], mean.argmax(axis=1))
    # the image and the rings hold the same numbers
    ax = plot.figure.axes[0]
    np.testing.assert_array_equal(np.ma.getdata(ax.images[0].get_array()), mean)
    rings = ax.collections[0].get_offsets()
    np.testing.assert_array_equal(np.asarray(rings)[:, 0], mean.argmax(axis=1))
    np.testing.assert_array_equal(np.asarray(rings)[:, 1], np.arange(len(TARGET)))
    assert plot.save(tmp_path / "align.png").stat().st_size > 1000


def test_one_head_is_drawn_as_given():
    w = cross_weights()[0, 2]
    plot = alignment_heatmap(w, source_tokens=SOURCE, target_tokens=TARGET, mark_argmax=False)
    np.testing.assert_array_equal(plot.data["weights"], w.numpy())
    assert not plot.figure.axes[0].collections


def test_labels_drawn_or_replaced():
    w = cross_weights()
    plot = alignment_heatmap(w, source_tokens=SOURCE, target_tokens=TARGET)
    font = font_for([*SOURCE, *TARGET])
    assert str(plot.data["font"]) == font.name
    assert list(plot.data["missing"]) == list(font.missing)
    assert list(plot.data["target_tokens"]) == [font.drawable(t) for t in TARGET]
    assert list(plot.data["source_tokens"]) == SOURCE  # Latin: every font draws it


def test_no_font_draws_them(monkeypatch, caplog):
    """Without a font for kana and kanji, those characters are drawn as □ and named."""
    monkeypatch.setattr(fonts_module, "_candidate_files", lambda: ())
    w = cross_weights()
    with caplog.at_level(logging.WARNING, logger="attnlab.viz.fonts"):
        plot = alignment_heatmap(w, source_tokens=SOURCE, target_tokens=TARGET)
    assert "私" in "".join(plot.data["missing"])
    assert plot.data["target_tokens"][0] == MISSING_GLYPH
    assert plot.data["target_tokens"][3] == MISSING_GLYPH * 2
    assert "no installed font draws" in caplog.text


def test_font_for_latin_is_the_default():
    choice = font_for(["hello", "world ."])
    assert choice.path is None and choice.missing == ()
    assert FontChoice("x", None, ("a",)).drawable("abc") == f"{MISSING_GLYPH}bc"
    with pytest.raises(TypeError, match="texts must be an iterable of strings"):
        font_for("hello")


def test_bad_input_messages():
    w = cross_weights()
    with pytest.raises(ValueError, match="target_tokens must have 7 entries"):
        alignment_heatmap(w, source_tokens=SOURCE, target_tokens=TARGET[:-1])
    with pytest.raises(ValueError, match="source_tokens must have 6 entries"):
        alignment_heatmap(w, source_tokens=SOURCE[:2], target_tokens=TARGET)
    with pytest.raises(
        ValueError, match=r"weights must be \(T, S\), \(H, T, S\) or \(1, H, T, S\)"
    ):
        alignment_heatmap(w.repeat(2, 1, 1, 1), source_tokens=SOURCE, target_tokens=TARGET)
    with pytest.raises(ValueError, match="weights must be 2-D or 3-D or 4-D"):
        alignment_heatmap(torch.ones(3), source_tokens=["a"], target_tokens=["b"])
    with pytest.raises(TypeError, match=r"weights must be a torch\.Tensor or numpy\.ndarray"):
        alignment_heatmap([[1.0]], source_tokens=["a"], target_tokens=["b"])  # type: ignore[arg-type]


def test_a_japanese_font_is_installed():
    """`make test` installs Debian's fonts-ipafont-gothic, so Japanese labels draw as text."""
    font = font_for(["私 は 毎日 英語 を 勉強 し ま す 。"])
    assert font.missing == (), f"no installed font draws {''.join(font.missing)} (make browser)"
    assert font.path is not None


def test_every_heatmap_draws_japanese_labels_in_a_font_that_holds_them():
    """`attnlab plot` on an en→ja run: the tick labels of any attention figure, not only the
    alignment, get the Japanese font; Latin labels keep the default font."""
    from attnlab import viz

    w = cross_weights()[0, 0]  # one head, (T, S)
    plot = viz.attention_heatmap(w, query_tokens=TARGET, key_tokens=SOURCE)
    ax = plot.figure.axes[0]
    japanese = font_for(TARGET)
    for label in ax.get_yticklabels():  # the Japanese font first (the default as fallback)
        found = font_manager.findfont(label.get_fontproperties())
        assert os.path.realpath(found) == os.path.realpath(str(japanese.path)), label.get_text()
    for label in ax.get_xticklabels():
        assert label.get_fontproperties().get_file() is None, label.get_text()  # the default
