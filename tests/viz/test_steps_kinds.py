"""`plot steps` draws, for every registered kind of attention, the weights the layer used.

For each kind a tiny float64 model runs once; the panel's weights must equal (a) what capture
records for that layer and head and (b) a float64 reference written here from the kind's own
equation: the causal band of a sliding window, the dense mask of a BigBird layout, Linformer's
``softmax(q (E K)ᵀ / √d)``, Performer's ``D⁻¹ φ(q) φ(k)ᵀ``, ALiBi's bias, the padding of a
cross-attention's source.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

import attnlab as al
from attnlab.viz.steps import step_panel_from_model

F64 = torch.float64
T = 8


def _gpt(attention: al.AttentionSpec, **options) -> al.GPT:
    torch.manual_seed(0)
    cfg = al.GPTConfig(
        vocab_size=30, n_positions=16, n_embd=16, n_layer=1, n_head=4, attention=attention,
        **options,
    )  # fmt: skip
    return al.GPT(cfg).to(F64).eval()


def _seq2seq(attention: al.AttentionSpec) -> al.Transformer:
    torch.manual_seed(0)
    cfg = al.TransformerConfig(
        src_vocab_size=30, tgt_vocab_size=30, d_model=16, num_heads=4, num_encoder_layers=1,
        num_decoder_layers=1, d_ff=32, max_len=16, dropout=0.0, attention=attention,
    )  # fmt: skip
    return al.Transformer(cfg).to(F64).eval()


def _softmax(s: torch.Tensor, visible: torch.Tensor) -> np.ndarray:
    return torch.softmax(s.masked_fill(~visible, float("-inf")), -1).numpy()


def _scores(data: dict) -> torch.Tensor:
    q, k = torch.from_numpy(data["q"]), torch.from_numpy(data["k"])
    return q @ k.T / q.shape[-1] ** 0.5  # q kᵀ / √d_head


i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
CAUSAL = j <= i


def _full(layer, data, head):
    return _softmax(_scores(data), CAUSAL)


def _alibi(layer, data, head):
    slope = al.nn.positional.alibi_slopes(4)[head].double()
    return _softmax(_scores(data) - slope * (i - j), CAUSAL)  # ALiBi: −m_h (i − j)


def _sliding(layer, data, head):
    return _softmax(_scores(data), CAUSAL & (j >= i - 3))  # each query: itself and 3 before


def _bigbird(layer, data, head):
    b = layer.block_mask.block_size
    dense = layer.block_mask.blocks[i // b, j // b]  # the layout's blocks, cell by cell
    return _softmax(_scores(data), CAUSAL & dense)


def _linformer(layer, data, head):
    x = torch.from_numpy(data["x"])
    d = layer.d_head
    k_tok = (x @ layer.in_proj_weight[16:32].T + layer.in_proj_bias[16:32])[
        :, head * d : (head + 1) * d
    ]
    e = layer.proj_e[:, :T]  # headwise: one E (k × T_k)
    q = torch.from_numpy(data["q"])
    return torch.softmax(q @ (e @ k_tok).T / d**0.5, -1).detach().numpy()  # softmax(q (EK)ᵀ/√d)


def _performer(layer, data, head):
    w, m = layer.features.double(), layer.features.shape[0]

    def phi(x: torch.Tensor) -> torch.Tensor:  # φ(x) = exp(W x' − ‖x'‖²/2) / √m, x' = x / d^¼
        x = x / layer.d_head**0.25
        return torch.exp(x @ w.T - x.square().sum(-1, keepdim=True) / 2) / m**0.5

    a = phi(torch.from_numpy(data["q"])) @ phi(torch.from_numpy(data["k"])).T * CAUSAL
    return (a / a.sum(-1, keepdim=True)).numpy()  # D⁻¹ φ(q) φ(k)ᵀ


def _cross(layer, data, head):
    keep = torch.tensor([True] * 6 + [False] * 2)  # the source's padding (pad id 0)
    return _softmax(_scores(data), keep.expand(T, T))


ids = torch.randint(3, 30, (2, T), generator=torch.Generator().manual_seed(1))
src = ids.clone()
src[0, 6:] = 0

Case = tuple[Callable[[], torch.nn.Module], str, Callable[..., object], Callable]
CASES: dict[str, Case] = {
    "full_gqa_rope": (lambda: _gpt(al.FullSpec(), positions="rope", num_kv_heads=2),
                      "transformer.h.0.attn", lambda m: m(ids), _full),
    "full_gqa_alibi": (lambda: _gpt(al.FullSpec(), positions="alibi", num_kv_heads=2),
                       "transformer.h.0.attn", lambda m: m(ids), _alibi),
    "sliding": (lambda: _gpt(al.SlidingSpec(window=3)), "transformer.h.0.attn",
                lambda m: m(ids), _sliding),
    "bigbird": (lambda: _gpt(al.BigBirdSpec(block_size=1, num_random_blocks=1)),
                "transformer.h.0.attn", lambda m: m(ids), _bigbird),
    "linformer": (lambda: _seq2seq(al.LinformerSpec(k=5)), "encoder.layers.0.self_attn",
                  lambda m: m(ids, ids), _linformer),
    "performer": (lambda: _gpt(al.PerformerSpec(num_features=32)), "transformer.h.0.attn",
                  lambda m: m(ids), _performer),
    "cross": (lambda: _seq2seq(al.FullSpec()), "decoder.layers.0.cross_attn",
              lambda m: m(src, ids), _cross),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(CASES))
def test_plot_steps_draws_the_weights_the_layer_used(kind: str) -> None:
    build, name, forward, reference = CASES[kind]
    model = build()
    layer = dict(model.named_modules())[name]
    with torch.no_grad(), al.inspect.capture(model) as cache:
        forward(model)
    head = 3  # GQA: key/value head 1
    plot = step_panel_from_model(model, lambda: forward(model), layer=name, head=head)
    got = plot.data["weights"]
    np.testing.assert_allclose(got, cache.attentions[name][0, head].numpy(), atol=1e-12)
    want = reference(layer, plot.data, head)
    np.testing.assert_allclose(got, want, atol=1e-12)
    if kind in ("sliding", "bigbird", "cross"):
        assert (want == 0).any()  # the kind's mask hides some key of some query
    # what S hides is what the weights give nothing to; the softmax of S is A
    assert plot.data["mask"].dtype == np.bool_
    s = torch.from_numpy(plot.data["scores"])
    assert not plot.data["mask"][~np.isfinite(plot.data["scores"])].any()
    np.testing.assert_allclose(torch.softmax(s, -1).numpy(), got, atol=1e-12)
    title = plot.figure.get_suptitle()
    assert title.startswith(f"{name} · head 3")
    texts = [ax.get_title() for ax in plot.figure.axes]
    if kind == "linformer":
        labels = [t.get_text() for t in plot.figure.axes[8].get_xticklabels()]
        assert labels[:2] == ["E·K row 0", "E·K row 1"] and got.shape == (T, 5)
    if kind == "performer":
        assert any("varphi" in t and "log" in t for t in texts)
    plt = pytest.importorskip("matplotlib.pyplot")
    plt.close(plot.figure)
