"""Attention views: files written and non-empty, drawn data equal to the captured weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlab as al
from attnlab.viz.attention import attention_heatmap, head_grid, layer_head_grid, reduce_attention
from attnlab.viz.lessons import noam_curve
from tests.viz.weights import capture_weights


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_heatmap_file_and_data(tmp_path, suffix):
    w, _, _ = capture_weights()
    toks = "the cat sat on the mat".split()
    plot = attention_heatmap(
        w[0, 1], query_tokens=toks, key_tokens=toks, mask=al.masks.causal_mask(6)
    )
    path = plot.save(tmp_path / f"heat{suffix}")
    assert path.stat().st_size > 1000
    np.testing.assert_array_equal(plot.data["weights"], w[0, 1].numpy())
    # the image on the axes holds the same numbers
    drawn = plot.figure.axes[0].images[0].get_array()
    np.testing.assert_array_equal(
        np.ma.getdata(drawn)[np.asarray(plot.data["mask"])],
        w[0, 1].numpy()[al.masks.causal_mask(6).numpy()],
    )


def test_head_grid_and_layers_equal_captured(tmp_path):
    w, _, _ = capture_weights()
    plot = head_grid(w)
    np.testing.assert_array_equal(plot.data["weights"], w[0].numpy())
    assert plot.save(tmp_path / "grid.png").stat().st_size > 1000
    lh = layer_head_grid({"a": w, "b": w.flip(1)})
    np.testing.assert_array_equal(lh.data["weights"][1], w.flip(1)[0].numpy())
    assert lh.save(tmp_path / "lh.svg").stat().st_size > 1000


def test_reduce_block_and_topk():
    w = torch.softmax(torch.randn(100, 100), -1)
    red = reduce_attention(w, max_tokens=10, method="block")
    assert red.matrix.shape == (10, 10)
    np.testing.assert_allclose(red.matrix[0, 0], w[:10, :10].sum(1).mean().item(), rtol=1e-5)
    np.testing.assert_allclose(red.matrix.sum(1), 1.0, rtol=1e-5)  # rows still sum to 1
    top = reduce_attention(w, max_tokens=7, method="topk")
    np.testing.assert_array_equal(top.matrix, w.numpy()[np.ix_(top.row_index, top.col_index)])
    assert top.col_index.tolist() == sorted(torch.topk(w.sum(0), 7).indices.tolist())
    with pytest.raises(ValueError, match="method"):
        reduce_attention(w, method="nope")  # type: ignore[arg-type]


def test_bad_input_messages(tmp_path):
    with pytest.raises(ValueError, match="weights must be 2-D"):
        attention_heatmap(torch.ones(3))
    with pytest.raises(ValueError, match="query_tokens must have 2 entries"):
        attention_heatmap(torch.ones(2, 2), query_tokens=["a"])
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        noam_curve(steps=10).save(tmp_path / "x.jpg")


# ----------------------------------------------------------------------------- token labels


def _tick_texts(ax) -> tuple[list[str], list[str]]:
    return [t.get_text() for t in ax.get_yticklabels()], [
        t.get_text() for t in ax.get_xticklabels()
    ]


def test_head_grid_labels_both_axes_and_thins_long_sides():
    w, _, _ = capture_weights(6)
    toks = "the cat sat on the mat".split()
    plot = head_grid(w, query_tokens=toks, key_tokens=toks)
    axes = [ax for ax in plot.figure.axes if ax.images and ax.get_label() != "<colorbar>"]
    rows, cols = _tick_texts(axes[0])  # one row of four heads: labels on the left and the bottom
    assert rows == toks and cols == toks
    assert _tick_texts(axes[1])[0] == [""] * 6 or _tick_texts(axes[1])[0] == []
    # 60 positions: thinned, each kept label says its position
    long = torch.softmax(torch.randn(2, 60, 60), -1)
    words = [f"w{i}" for i in range(60)]
    plot = head_grid(long, query_tokens=words, key_tokens=words, max_tokens=64)
    rows, _ = _tick_texts(plot.figure.axes[0])
    assert 4 <= len(rows) < 60 and rows[0] == "0 w0"
    pos, word = rows[1].split()
    assert word == f"w{pos}"
    # reduced by blocks: the labels are the blocks' positions
    plot = head_grid(long, query_tokens=words, key_tokens=words, max_tokens=20)
    rows, _ = _tick_texts(plot.figure.axes[0])
    assert rows[0] == "0–2" and plot.data["weights"].shape == (2, 20, 20)


def test_layer_head_grid_self_and_cross_rows_carry_their_own_labels(tmp_path):
    src, tgt = "a b c d e f g".split(), "<s> x y z".split()
    att = {
        "encoder.layers.0.self_attn": torch.softmax(torch.randn(1, 2, 7, 7), -1),
        "decoder.layers.0.self_attn": torch.softmax(torch.randn(1, 2, 4, 4), -1),
        "decoder.layers.0.cross_attn": torch.softmax(torch.randn(1, 2, 4, 7), -1),
    }
    q = {n: src if n.startswith("encoder") else tgt for n in att}
    k = {n: tgt if n == "decoder.layers.0.self_attn" else src for n in att}
    plot = layer_head_grid(att, query_tokens=q, key_tokens=k)
    panels = [ax for ax in plot.figure.axes if ax.images and ax.get_label() != "<colorbar>"]
    assert len(panels) == 6
    for row, name in enumerate(att):
        rows, cols = _tick_texts(panels[2 * row])
        assert rows == q[name] and cols == k[name]
        np.testing.assert_array_equal(
            plot.data["weights"][row, :, : len(q[name]), : len(k[name])], att[name][0].numpy()
        )
    assert np.isnan(plot.data["weights"][1, :, 4:, :]).all()
    assert plot.save(tmp_path / "lh.png").stat().st_size > 1000
    # one sequence for a GPT; a length that does not fit names the layer
    gpt = {
        "h.0": torch.softmax(torch.randn(2, 5, 5), -1),
        "h.1": torch.softmax(torch.randn(2, 5, 5), -1),
    }
    toks = list("abcde")
    plot = layer_head_grid(gpt, query_tokens=toks, key_tokens=toks)
    panels = [ax for ax in plot.figure.axes if ax.images and ax.get_label() != "<colorbar>"]
    assert _tick_texts(panels[0])[0] == toks and _tick_texts(panels[2])[1] == toks
    with pytest.raises(
        ValueError, match=r"query_tokens has 4 entries but layer 'encoder.layers.0.self_attn' has 7"
    ):
        layer_head_grid(att, query_tokens=tgt)


_ODD_TOKENS = ["a", "$$", "$x", " ", "b"]  # "$$": empty mathtext; " ": a character model's space


def _odd_token_figures():
    """Every figure that labels tokens, drawn with ``_ODD_TOKENS``."""
    from attnlab.inspect.patching import PatchResult
    from attnlab.viz import alignment_heatmap, mask_panel, patching_figure
    from attnlab.viz.steps_by_hand import step_panel_by_hand

    toks, t = _ODD_TOKENS, len(_ODD_TOKENS)
    w = torch.softmax(torch.randn(2, t, t, generator=torch.Generator().manual_seed(0)), -1)
    x = torch.randn(t, 4, generator=torch.Generator().manual_seed(1))
    patched = PatchResult("positions", torch.rand(2, t), 1.0, 0.0, ("0", "1"))
    return {
        "heatmap": lambda: attention_heatmap(w[0], query_tokens=toks, key_tokens=toks),
        "heads": lambda: head_grid(w, query_tokens=toks, key_tokens=toks),
        "layers": lambda: layer_head_grid([w, w], query_tokens=toks, key_tokens=toks),
        "masks": lambda: mask_panel(toks),
        "steps": lambda: step_panel_by_hand(x, tokens=toks, mask="none"),  # viz.step_panel
        "alignment": lambda: alignment_heatmap(w[0], source_tokens=toks, target_tokens=toks),
        "patching": lambda: patching_figure(patched, tokens=toks),
    }


@pytest.mark.parametrize("kind", list(_odd_token_figures()))
def test_a_dollar_or_space_token_is_drawn_as_it_reads(kind, tmp_path):
    """A ``$…$`` token is a dollar sign, not mathtext (``$$`` used to raise a ParseException
    when the figure was drawn), and a space is ``␣``, not a blank label."""
    plot = _odd_token_figures()[kind]()
    assert plot.save(tmp_path / "odd.png", dpi=30).stat().st_size > 500  # drawn, no error
    labels = [t for ax in plot.figure.axes for t in ax.get_xticklabels() + ax.get_yticklabels()]
    texts = {t.get_text() for t in labels}
    assert any("$$" in s for s in texts) and any("␣" in s for s in texts), sorted(texts)
    assert not any(t.get_text() == " " for t in labels)
    assert not any(t.get_parse_math() for t in labels if "$" in t.get_text())


def test_layers_grey_the_masked_future_and_say_so(tmp_path):
    w, _, _ = capture_weights()  # (1, H, 6, 6), causal
    future = al.masks.causal_mask(6)
    plot = layer_head_grid({"a": w, "b": w}, masks={"a": future})
    grid = plot.data["weights"]
    assert np.isnan(grid[0][:, ~future.numpy()]).all()  # masked: NaN, drawn as "bad" (grey)
    np.testing.assert_array_equal(grid[0][:, future.numpy()], w[0][:, future].numpy())
    assert not np.isnan(grid[1]).any()  # a layer without a mask hides nothing
    assert plot.data["mask"][0, 0].tolist() == future.tolist() and plot.data["mask"][1].all()
    images = [
        ax.images[0]
        for ax in plot.figure.axes
        if ax.images and len(ax.images[0].get_array().shape) == 2
    ]
    assert tuple(images[0].cmap.get_bad()[:3]) == pytest.approx((0xBD / 255,) * 3)
    legend = [t.get_text() for leg in plot.figure.legends for t in leg.get_texts()]
    assert any("masked" in t for t in legend)
    with pytest.raises(al.errors.ArgumentError, match="masks\\['a'\\] must have"):
        layer_head_grid({"a": w}, masks={"a": future[:5]})


def test_many_layers_fit_a_figure_a_person_can_open():
    w = torch.softmax(torch.randn(1, 3, 3), -1)
    plot = layer_head_grid({f"model.layers.{i}.self_attn": w for i in range(30)})
    width, height = plot.figure.get_size_inches()
    assert height <= 24.0 and width <= 24.0  # at most 2,880 px at 120 dpi (was 62 in)
