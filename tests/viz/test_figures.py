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


# ----------------------------------------------------------------------------- the step panel


def _tiny_gpt(positions: str = "learned", num_kv_heads: int | None = None) -> al.GPT:
    torch.manual_seed(0)
    cfg = al.GPTConfig(
        vocab_size=50,
        n_positions=32,
        n_embd=16,
        n_layer=2,
        n_head=4,
        num_kv_heads=num_kv_heads,
        positions=positions,
    )
    return al.GPT(cfg).eval()


def _captured(model, run) -> al.inspect.ActivationCache:
    with torch.no_grad(), al.inspect.capture(model) as cache:
        run()
    return cache


def _colorbars(plot: F.Plot) -> list:
    """The images of the panels (axes holding an image that is not a colour bar)."""
    return [ax.images[0] for ax in plot.figure.axes if ax.images and ax.get_label() != "<colorbar>"]


@pytest.mark.parametrize(
    ("positions", "num_kv_heads"), [("learned", None), ("rope", 2), ("alibi", None), ("alibi", 1)]
)
def test_step_panel_from_model_gpt_equals_capture(positions, num_kv_heads, tmp_path):
    gpt = _tiny_gpt(positions, num_kv_heads)
    ids = torch.randint(0, 50, (2, 7))
    keep = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])  # the second sequence left-padded

    def run():
        return gpt(ids, attention_mask=keep)

    cache = _captured(gpt, run)
    words = "the cat sat on the mat .".split()
    for layer, b in ((None, 1), ("transformer.h.1.attn", 0)):
        plot = F.step_panel_from_model(
            gpt, run, layer=layer, head=3, query_tokens=words, batch_index=b
        )
        name = layer or "transformer.h.0.attn"  # default: the first attention layer
        want = cache.attentions[name][b, 3].double().numpy()
        np.testing.assert_allclose(plot.data["weights"], want, atol=1e-6)
        assert {"x", "q", "k", "v", "scores", "weights", "output", "mask"} <= set(plot.data)
        assert ("bias" in plot.data) == (positions == "alibi")
    # the drawing: seven panels, each with its own colour bar, token labels on the rows
    images = _colorbars(plot)
    assert len(images) == 7 and all(img.colorbar is not None for img in images)
    ax_scores = images[4].axes
    assert [t.get_text() for t in ax_scores.get_yticklabels()] == words
    assert [t.get_text() for t in ax_scores.get_xticklabels()] == words
    assert "x (layer input)" in images[0].axes.get_title()
    assert "transformer.h.1.attn" in plot.figure.get_suptitle()
    assert plot.save(tmp_path / f"gpt_{positions}.png").stat().st_size > 1000
    # no hook is left behind
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in gpt.modules())


def test_step_panel_from_model_names_ln1_as_the_gpt_input():
    gpt = _tiny_gpt()
    ids = torch.randint(0, 50, (1, 5))
    plot = F.step_panel_from_model(gpt, lambda: gpt(ids))
    assert "transformer.h.0.ln_1" in plot.figure.get_suptitle()
    x = gpt.transformer.h[0].ln_1(gpt.transformer.wte(ids) + gpt.transformer.wpe(torch.arange(5)))
    np.testing.assert_allclose(plot.data["x"], x[0].detach().double().numpy(), atol=1e-6)


def test_step_panel_from_model_transformer_cross_attention_with_padded_source(tmp_path):
    torch.manual_seed(0)
    cfg = al.TransformerConfig(
        src_vocab_size=40,
        tgt_vocab_size=40,
        d_model=32,
        num_heads=4,
        num_encoder_layers=1,
        num_decoder_layers=2,
        d_ff=64,
        dropout=0.0,
    )
    model = al.Transformer(cfg).eval()
    src = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])  # pad_id 0
    tgt = torch.tensor([[1, 9, 10, 11, 12], [1, 3, 4, 5, 6]])
    src_words = "das ist ein Haus <pad> <pad>".split()
    tgt_words = "<s> this is a house".split()

    def run():
        return model(src, tgt)

    cache = _captured(model, run)
    name = "decoder.layers.1.cross_attn"
    assert cache.kinds[name] == "cross"
    plot = F.step_panel_from_model(
        model, run, layer=name, head=2, query_tokens=tgt_words, key_tokens=src_words
    )
    np.testing.assert_allclose(
        plot.data["weights"], cache.attentions[name][0, 2].double().numpy(), atol=1e-6
    )
    assert plot.data["weights"][:, 4:].sum() == 0 and not plot.data["mask"][:, 4:].any()
    assert np.isneginf(plot.data["scores"][:, 4:]).all()
    assert plot.data["k"].shape == (6, 8) and plot.data["q"].shape == (5, 8)
    images = _colorbars(plot)
    assert [t.get_text() for t in images[4].axes.get_xticklabels()] == src_words
    assert [t.get_text() for t in images[2].axes.get_yticklabels()] == src_words  # K rows: source
    assert "m" in images[2].axes.get_title()  # K = m W^K
    assert "encoder" in plot.figure.get_suptitle()  # where the memory came from
    # decoder self-attention (causal + target padding) and the second sequence
    for layer in ("decoder.layers.0.self_attn", "encoder.layers.0.self_attn"):
        p = F.step_panel_from_model(model, run, layer=layer, head=1, batch_index=1)
        np.testing.assert_allclose(
            p.data["weights"], cache.attentions[layer][1, 1].double().numpy(), atol=1e-6
        )
    assert plot.save(tmp_path / "cross.png").stat().st_size > 1000


def test_step_panel_from_model_errors_remove_hooks():
    gpt = _tiny_gpt()
    ids = torch.randint(0, 50, (1, 5))

    def boom():
        gpt(ids)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        F.step_panel_from_model(gpt, boom)
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in gpt.modules())
    with pytest.raises(ValueError, match=r"layer must be an attention module path .* got 'nope'"):
        F.step_panel_from_model(gpt, lambda: gpt(ids), layer="nope")
    with pytest.raises(TypeError, match="run must be a zero-argument callable"):
        F.step_panel_from_model(gpt, gpt(ids))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="run\\(\\) called no attention layer"):
        F.step_panel_from_model(gpt, lambda: None)
    with pytest.raises(ValueError, match=r"head must be in \[0, 4\), got 4"):
        F.step_panel_from_model(gpt, lambda: gpt(ids), head=4)
    with pytest.raises(ValueError, match=r"batch_index must be in \[0, 1\), got 1"):
        F.step_panel_from_model(gpt, lambda: gpt(ids), batch_index=1)
    # decoding with a filled KV cache is not one forward over the sequence
    cache = gpt.new_cache(1, 16)
    gpt(ids, cache=cache)
    with pytest.raises(ValueError, match="KV cache already holding 5 positions"):
        F.step_panel_from_model(gpt, lambda: gpt(ids[:, :1], cache=cache))
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in gpt.modules())


def test_step_panel_additive_mask_and_numbers():
    torch.manual_seed(0)
    t, d = 5, 4
    x, q, k, v = torch.randn(t, 8), torch.randn(t, d), torch.randn(t, d), torch.randn(t, d)
    bias = al.nn.positional.alibi_bias(1, t)[0]  # (T, T)
    bias = bias.masked_fill(~al.masks.causal_mask(t), float("-inf"))
    plot = F.step_panel(x, q, k, v, mask=bias, tokens=list("abcde"))
    ref = torch.softmax(q.double() @ k.double().T / d**0.5 + bias.double(), -1)
    np.testing.assert_allclose(plot.data["weights"], ref.numpy(), atol=1e-12)
    assert np.isneginf(plot.data["scores"][~al.masks.causal_mask(t).numpy()]).all()
    np.testing.assert_allclose(plot.data["output"], (ref @ v.double()).numpy(), atol=1e-12)
    # the finite minimum of a dtype hides a key too (attnlab.masks.to_additive)
    add = al.masks.to_additive(al.masks.causal_mask(t), torch.bfloat16)
    p2 = F.step_panel(x, q, k, v, mask=add)
    np.testing.assert_array_equal(p2.data["mask"], al.masks.causal_mask(t).numpy())
    # numbers in the cells of small panels (masked scores say −∞), none in a big one
    images = _colorbars(plot)
    texts = [[t.get_text() for t in img.axes.texts] for img in images]
    assert len(texts[5]) == int(al.masks.causal_mask(t).sum())  # weights: visible cells
    assert texts[4].count("−∞") == t * (t - 1) // 2
    big = F.step_panel(
        torch.randn(20, 64), torch.randn(20, 8), torch.randn(20, 8), torch.randn(20, 8)
    )
    assert [len(img.axes.texts) for img in _colorbars(big)] == [0, 0, 0, 0, 0, 0, 0]
    with pytest.raises(TypeError, match="mask must be bool or floating"):
        F.step_panel(x, q, k, v, mask=torch.ones(t, t, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask must have shape \(T_q, T_k\) = \(5, 5\)"):
        F.step_panel(x, q, k, v, mask=torch.ones(5, 4, dtype=torch.bool))


# ----------------------------------------------------------------------------- token labels


def _tick_texts(ax) -> tuple[list[str], list[str]]:
    return [t.get_text() for t in ax.get_yticklabels()], [
        t.get_text() for t in ax.get_xticklabels()
    ]


def test_head_grid_labels_both_axes_and_thins_long_sides():
    w, _, _ = _capture_weights(6)
    toks = "the cat sat on the mat".split()
    plot = F.head_grid(w, query_tokens=toks, key_tokens=toks)
    axes = [ax for ax in plot.figure.axes if ax.images and ax.get_label() != "<colorbar>"]
    rows, cols = _tick_texts(axes[0])  # one row of four heads: labels on the left and the bottom
    assert rows == toks and cols == toks
    assert _tick_texts(axes[1])[0] == [""] * 6 or _tick_texts(axes[1])[0] == []
    # 60 positions: thinned, each kept label says its position
    long = torch.softmax(torch.randn(2, 60, 60), -1)
    words = [f"w{i}" for i in range(60)]
    plot = F.head_grid(long, query_tokens=words, key_tokens=words, max_tokens=64)
    rows, _ = _tick_texts(plot.figure.axes[0])
    assert 4 <= len(rows) < 60 and rows[0] == "0 w0"
    pos, word = rows[1].split()
    assert word == f"w{pos}"
    # reduced by blocks: the labels are the blocks' positions
    plot = F.head_grid(long, query_tokens=words, key_tokens=words, max_tokens=20)
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
    plot = F.layer_head_grid(att, query_tokens=q, key_tokens=k)
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
    plot = F.layer_head_grid(gpt, query_tokens=toks, key_tokens=toks)
    panels = [ax for ax in plot.figure.axes if ax.images and ax.get_label() != "<colorbar>"]
    assert _tick_texts(panels[0])[0] == toks and _tick_texts(panels[2])[1] == toks
    with pytest.raises(
        ValueError, match=r"query_tokens has 4 entries but layer 'encoder.layers.0.self_attn' has 7"
    ):
        F.layer_head_grid(att, query_tokens=tgt)
