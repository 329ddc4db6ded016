"""Figures: files written and non-empty, drawn data equal to the captured weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlab as al
from attnlab.viz import figures as F


def _capture_weights(t: int = 6) -> tuple[torch.Tensor, al.MultiHeadAttention, torch.Tensor]:
    mha = al.MultiHeadAttention(16, 4).eval()
    x = torch.randn(1, t, 16)
    _, w = mha(x, is_causal=True, need_weights=True)
    return w.detach(), mha, x


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_heatmap_file_and_data(tmp_path, suffix):
    w, _, _ = _capture_weights()
    toks = "the cat sat on the mat".split()
    plot = F.attention_heatmap(
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
    w, _, _ = _capture_weights()
    plot = F.head_grid(w)
    np.testing.assert_array_equal(plot.data["weights"], w[0].numpy())
    assert plot.save(tmp_path / "grid.png").stat().st_size > 1000
    lh = F.layer_head_grid({"a": w, "b": w.flip(1)})
    np.testing.assert_array_equal(lh.data["weights"][1], w.flip(1)[0].numpy())
    assert lh.save(tmp_path / "lh.svg").stat().st_size > 1000


def test_step_panel_equals_module_weights(tmp_path):
    w, mha, x = _capture_weights(5)
    plot = F.step_panel_from_module(mha, x, head=2, is_causal=True)
    np.testing.assert_allclose(plot.data["weights"], w[0, 2].double().numpy(), atol=1e-6)
    assert plot.save(tmp_path / "steps.png").stat().st_size > 1000


def test_reduce_block_and_topk():
    w = torch.softmax(torch.randn(100, 100), -1)
    red = F.reduce_attention(w, max_tokens=10, method="block")
    assert red.matrix.shape == (10, 10)
    np.testing.assert_allclose(red.matrix[0, 0], w[:10, :10].sum(1).mean().item(), rtol=1e-5)
    np.testing.assert_allclose(red.matrix.sum(1), 1.0, rtol=1e-5)  # rows still sum to 1
    top = F.reduce_attention(w, max_tokens=7, method="topk")
    np.testing.assert_array_equal(top.matrix, w.numpy()[np.ix_(top.row_index, top.col_index)])
    assert top.col_index.tolist() == sorted(torch.topk(w.sum(0), 7).indices.tolist())
    with pytest.raises(ValueError, match="method"):
        F.reduce_attention(w, method="nope")  # type: ignore[arg-type]


def test_masks_noam_positions(tmp_path):
    m = F.mask_panel("a b c <pad>".split())
    assert not m.data["padding"][:, 3].any() and m.data["look_ahead"][0, 1] == 0
    assert (m.data["combined"] == (m.data["padding"] & m.data["look_ahead"])).all()
    n = F.noam_curve(((512, 400),), steps=1000)
    assert int(np.argmax(n.data["lr"][0])) + 1 == 400
    np.testing.assert_allclose(n.data["lr"][0, 399], 512**-0.5 * 400**-0.5)
    p = F.positional_encoding_figure(50, 16)
    np.testing.assert_array_equal(
        p.data["table"], al.nn.positional.sinusoidal_table(50, 16).numpy()
    )
    for plot, name in ((m, "m.png"), (n, "n.svg"), (p, "p.png")):
        assert plot.save(tmp_path / name).stat().st_size > 1000


def test_bad_input_messages(tmp_path):
    with pytest.raises(ValueError, match="weights must be 2-D"):
        F.attention_heatmap(torch.ones(3))
    with pytest.raises(ValueError, match="query_tokens must have 2 entries"):
        F.attention_heatmap(torch.ones(2, 2), query_tokens=["a"])
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        F.noam_curve(steps=10).save(tmp_path / "x.jpg")
