"""capture on Linformer layers: true ``(B, H, T_q, k)`` weights, the projected key axis said so,
and the effective token weights ``A · F`` (issue 12)."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab import Transformer, TransformerConfig
from attnlab.inspect import capture, run_with_cache
from attnlab.inspect.capture import ProjectedKeys
from attnlab.nn import LinformerAttention
from attnlab.nn.masks import padding_mask

ENCODER = ("encoder.layers.0.self_attn", "encoder.layers.1.self_attn")


def _model(dtype: torch.dtype = torch.float32, k: int = 6) -> Transformer:
    cfg = TransformerConfig(
        src_vocab_size=30, tgt_vocab_size=30, d_model=32, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=1, d_ff=64, dropout=0.0, max_len=24, attention="linformer",
        linformer_k=k,
    )  # fmt: skip
    return Transformer(cfg).to(dtype).eval()


# two sources of 9 positions, the second right-padded (pad_id 0) after 5 tokens
SRC = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 2], [13, 14, 15, 16, 2, 0, 0, 0, 0]])
TGT = torch.tensor([[1, 12, 11, 10], [1, 16, 15, 14]])


def _inputs_of(model: torch.nn.Module, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The input of each named attention layer (its query = key = value activations)."""
    seen: dict[str, torch.Tensor] = {}
    handles = []
    for name in names:
        module = model.get_submodule(name)

        def pre(mod, args, kwargs, name=name):
            seen[name] = args[0].detach()

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
    return seen, handles


def _by_hand(layer: LinformerAttention, x: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """``softmax(Q (E K)ᵀ / √d_head)`` in float64 from the layer's parameters, keys at hidden
    positions zeroed before the projection (Wang et al. 2020, eq. 7)."""
    x = x.double()
    d, h, dh = layer.d_model, layer.num_heads, layer.d_head
    w = layer.in_proj_weight.detach().double()
    b = layer.in_proj_bias.detach().double()
    q = x @ w[:d].T + b[:d]
    k = x @ w[d : 2 * d].T + b[d : 2 * d]
    bsz, t, _ = x.shape
    q = q.view(bsz, t, h, dh).transpose(1, 2)  # (B, H, T, d_head)
    k = k.view(bsz, t, h, dh).transpose(1, 2)
    k = k * visible[:, None, :, None].double()  # hidden keys contribute nothing
    e = layer.proj_e.detach().double()[:, :t]  # (k, T)
    k_bar = e @ k  # (B, H, k, d_head)
    return torch.softmax(q @ k_bar.transpose(-2, -1) / math.sqrt(dh), dim=-1)  # (B, H, T, k)


def _capture(model: Transformer) -> tuple[torch.Tensor, object, dict[str, torch.Tensor]]:
    seen, handles = _inputs_of(model, ENCODER)
    try:
        with torch.no_grad():
            out, cache = run_with_cache(model, SRC, TGT)
    finally:
        for handle in handles:
            handle.remove()
    return out, cache, seen


def test_captured_linformer_weights_are_exact_in_float64() -> None:
    model = _model(torch.float64)
    _, cache, seen = _capture(model)
    visible = SRC != 0
    for name in ENCODER:
        got = cache.attentions[name]
        assert got.shape == (2, 4, 9, 6) and got.dtype == torch.float64  # (B, H, T_q, k)
        want = _by_hand(model.get_submodule(name), seen[name], visible)
        assert (got - want).abs().max() < 1e-12
        assert torch.allclose(got.sum(-1), torch.ones(2, 4, 9, dtype=torch.float64))


def test_captured_linformer_weights_in_float32_match_within_the_float32_error() -> None:
    model = _model(torch.float32)
    _, cache, seen = _capture(model)
    visible = SRC != 0
    for name in ENCODER:
        layer = model.get_submodule(name)
        want = _by_hand(layer, seen[name], visible)
        got = cache.attentions[name].double()
        # the same formula evaluated in float32: the error a plain implementation makes
        x = seen[name]
        d, dh = layer.d_model, layer.d_head
        w, b = layer.in_proj_weight.detach(), layer.in_proj_bias.detach()
        q = (x @ w[:d].T + b[:d]).view(2, 9, 4, dh).transpose(1, 2)
        k = (x @ w[d : 2 * d].T + b[d : 2 * d]).view(2, 9, 4, dh).transpose(1, 2)
        k = k * visible[:, None, :, None]
        base = torch.softmax(q @ (layer.proj_e.detach()[:, :9] @ k).transpose(-2, -1) / dh**0.5, -1)
        err_base = (base.double() - want).abs().max().item()
        assert (got - want).abs().max().item() <= 2 * err_base + 1e-7


def test_the_projected_key_axis_is_recorded() -> None:
    model = _model()
    out, cache, _ = _capture(model)
    plain = model(SRC, TGT)
    assert torch.equal(out.logits, plain.logits)  # capture changes nothing
    assert list(cache.projected) == list(ENCODER)  # the decoder's layers attend to tokens
    info = cache.projected[ENCODER[0]]
    assert isinstance(info, ProjectedKeys)
    assert (info.method, info.k, info.key_length) == ("linformer", 6, 9)
    assert info.labels == [f"E·K row {j}" for j in range(6)]
    assert cache.key_labels(ENCODER[1]) == info.labels
    assert cache.key_labels("decoder.layers.0.cross_attn") is None
    layer = model.get_submodule(ENCODER[0])
    e, f = layer.projections()
    assert info.key_projection.shape == info.value_projection.shape == (4, 6, 9)
    assert torch.equal(info.key_projection[2], e[:, :9].detach())
    assert torch.equal(info.value_projection[3], f[:, :9].detach())
    assert torch.equal(info.key_mask, padding_mask(SRC, 0)[:, :, 0, :])  # (B, 1, T_k)
    # the other layers keep their token × token weights
    assert cache.attentions["decoder.layers.0.cross_attn"].shape == (2, 4, 4, 9)
    with pytest.raises(ValueError, match="attends to its key tokens directly"):
        cache.effective_weights("decoder.layers.0.cross_attn")


def test_effective_weights_are_the_mixing_matrix_of_the_values() -> None:
    """``z = A (F V) = (A F) V`` exactly: A·F is what each query took from each token."""
    model = _model(torch.float64)
    with torch.no_grad(), capture(model, hooks=("hook_v", "hook_z")) as cache:
        model(SRC, TGT)
    for name in ENCODER:
        eff = cache.effective_weights(name)
        assert eff.shape == (2, 4, 9, 9) and eff.dtype == torch.float64
        v = cache.activations[f"{name}.hook_v"]  # (B, H, T, d_head), before the projection
        z = cache.activations[f"{name}.hook_z"]  # (B, H, T, d_head)
        v = v * (SRC != 0)[:, None, :, None]  # what the layer zeroed
        assert (eff @ v - z).abs().max() < 1e-12
        assert torch.all(eff[1, :, :, 5:] == 0)  # padding gives nothing
        assert (eff < 0).any()  # not a distribution: F has entries of both signs
        f = cache.projected[name].value_projection
        expected = cache.attentions[name] @ (f * (SRC != 0)[:, None, None, :])
        assert torch.allclose(eff, expected, rtol=0, atol=1e-14)


@pytest.mark.parametrize("sharing", ["none", "key-value"])
def test_grouped_heads_and_sharing_variants(sharing: str) -> None:
    torch.manual_seed(1)
    layer = LinformerAttention(
        16, num_heads=4, num_kv_heads=2, k=5, max_len=12, sharing=sharing, dtype=torch.float64
    ).eval()
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    with capture(layer, hooks=("hook_v", "hook_z")) as cache:
        layer(x)
    assert cache.attentions[""].shape == (1, 4, 7, 5)
    info = cache.projected[""]
    assert info.key_mask is None and info.value_projection.shape == (4, 5, 7)
    e, _ = layer.projections()
    for h in range(4):  # query head h reads key/value head h // 2
        want_e = e[h // 2] if sharing == "none" else e
        assert torch.equal(info.key_projection[h], want_e[..., :7].detach())
    if sharing == "key-value":
        assert torch.equal(info.key_projection, info.value_projection)  # A·E = A·F here
    eff = cache.effective_weights("")
    v = cache.activations["hook_v"].repeat_interleave(2, dim=1)  # (1, H, T, d_head)
    assert (eff @ v - cache.activations["hook_z"]).abs().max() < 1e-12
    one = info.effective_weights(cache.attentions[""][0])  # (H, T_q, k) → (H, T_q, T_k)
    assert torch.equal(one, eff[0])
    with pytest.raises(ValueError, match=r"weights must be \(B, H, T_q, k\)"):
        info.effective_weights(torch.ones(1, 4, 7, 7))
