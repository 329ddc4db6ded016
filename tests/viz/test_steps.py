"""The step panel: drawn weights equal to what the module and the model compute."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlab as al
from attnlab.viz import Plot
from attnlab.viz.steps import step_panel, step_panel_from_model, step_panel_from_module
from tests.viz.weights import capture_weights


def test_step_panel_equals_module_weights(tmp_path):
    w, mha, x = capture_weights(5)
    plot = step_panel_from_module(mha, x, head=2, is_causal=True)
    np.testing.assert_allclose(plot.data["weights"], w[0, 2].double().numpy(), atol=1e-6)
    assert plot.save(tmp_path / "steps.png").stat().st_size > 1000


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


def _colorbars(plot: Plot) -> list:
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
        plot = step_panel_from_model(
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
    plot = step_panel_from_model(gpt, lambda: gpt(ids))
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
    plot = step_panel_from_model(
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
        p = step_panel_from_model(model, run, layer=layer, head=1, batch_index=1)
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
        step_panel_from_model(gpt, boom)
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in gpt.modules())
    with pytest.raises(ValueError, match=r"layer must be an attention module path .* got 'nope'"):
        step_panel_from_model(gpt, lambda: gpt(ids), layer="nope")
    with pytest.raises(TypeError, match="run must be a zero-argument callable"):
        step_panel_from_model(gpt, gpt(ids))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="run\\(\\) called no attention layer"):
        step_panel_from_model(gpt, lambda: None)
    with pytest.raises(ValueError, match=r"head must be in \[0, 4\), got 4"):
        step_panel_from_model(gpt, lambda: gpt(ids), head=4)
    with pytest.raises(ValueError, match=r"batch_index must be in \[0, 1\), got 1"):
        step_panel_from_model(gpt, lambda: gpt(ids), batch_index=1)
    # decoding with a filled KV cache is not one forward over the sequence
    cache = gpt.new_cache(1, 16)
    gpt(ids, cache=cache)
    with pytest.raises(ValueError, match="KV cache already holding 5 positions"):
        step_panel_from_model(gpt, lambda: gpt(ids[:, :1], cache=cache))
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in gpt.modules())


def test_step_panel_additive_mask_and_numbers():
    torch.manual_seed(0)
    t, d = 5, 4
    x, q, k, v = torch.randn(t, 8), torch.randn(t, d), torch.randn(t, d), torch.randn(t, d)
    bias = al.nn.positional.alibi_bias(1, t)[0]  # (T, T)
    bias = bias.masked_fill(~al.masks.causal_mask(t), float("-inf"))
    plot = step_panel(x, q, k, v, mask=bias, tokens=list("abcde"))
    ref = torch.softmax(q.double() @ k.double().T / d**0.5 + bias.double(), -1)
    np.testing.assert_allclose(plot.data["weights"], ref.numpy(), atol=1e-12)
    assert np.isneginf(plot.data["scores"][~al.masks.causal_mask(t).numpy()]).all()
    np.testing.assert_allclose(plot.data["output"], (ref @ v.double()).numpy(), atol=1e-12)
    # the finite minimum of a dtype hides a key too (attnlab.masks.to_additive)
    add = al.masks.to_additive(al.masks.causal_mask(t), torch.bfloat16)
    p2 = step_panel(x, q, k, v, mask=add)
    np.testing.assert_array_equal(p2.data["mask"], al.masks.causal_mask(t).numpy())
    # numbers in the cells of small panels (masked scores say −∞), none in a big one
    images = _colorbars(plot)
    texts = [[t.get_text() for t in img.axes.texts] for img in images]
    assert len(texts[5]) == int(al.masks.causal_mask(t).sum())  # weights: visible cells
    assert texts[4].count("−∞") == t * (t - 1) // 2
    big = step_panel(
        torch.randn(20, 64), torch.randn(20, 8), torch.randn(20, 8), torch.randn(20, 8)
    )
    assert [len(img.axes.texts) for img in _colorbars(big)] == [0, 0, 0, 0, 0, 0, 0]
    with pytest.raises(TypeError, match="mask must be bool or floating"):
        step_panel(x, q, k, v, mask=torch.ones(t, t, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask must have shape \(T_q, T_k\) = \(5, 5\)"):
        step_panel(x, q, k, v, mask=torch.ones(5, 4, dtype=torch.bool))
