"""LinformerAttention (Wang et al. 2020): exact attention as a special case, masks, refusals, the
measured error, and parity with the ``linformer`` package."""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab import masks
from attnlab.nn.approximation_errors import linformer_errors
from attnlab.nn.linformer import (
    LinformerAttention,
    key_mask,
    linformer_attention,
    random_projection,
    relative_error,
)

F64 = torch.float64


def _identity_layer(
    d_model: int, heads: int, t: int, max_len: int, sharing: str = "headwise", kv_heads=None
) -> tuple[LinformerAttention, al.MultiHeadAttention]:
    """A Linformer with k = T and E = F = the first T rows of I_max_len, and the exact layer
    with the same weights."""
    mha = al.MultiHeadAttention(d_model, heads, num_kv_heads=kv_heads, dtype=F64, backend="math")
    with torch.no_grad():
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    lin = LinformerAttention(
        d_model, heads, k=t, max_len=max_len, sharing=sharing, num_kv_heads=kv_heads, dtype=F64,
        backend="math",
    )  # fmt: skip
    missing, unexpected = lin.load_state_dict(mha.state_dict(), strict=False)
    assert sorted(missing) == sorted(n for n, _ in lin.named_parameters() if "proj_" in n[:5])
    assert not unexpected
    with torch.no_grad():
        eye = torch.eye(max_len, dtype=F64)[:t]  # (k = T, max_len)
        for p in (lin.proj_e, lin.proj_f):
            if p is not None:
                p.copy_(eye.expand_as(p))
    return lin, mha


@pytest.mark.parametrize("sharing", ["headwise", "key-value", "none"])
@pytest.mark.parametrize(("t", "max_len"), [(7, 7), (5, 12)])
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_identity_projections_give_exact_attention(sharing, t, max_len, kv_heads) -> None:
    """k = T and E = F = I: Linformer is softmax attention — forward and backward, float64."""
    torch.manual_seed(0)
    lin, mha = _identity_layer(16, 4, t, max_len, sharing, kv_heads)
    x = torch.randn(3, t, 16, dtype=F64, requires_grad=True)
    got, got_w = lin(x, need_weights=True)
    want, want_w = mha(x, need_weights=True)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(got_w, want_w, atol=1e-12, rtol=0)  # k = T: weights over keys
    g = torch.randn_like(got)
    g_got = torch.autograd.grad(got, (x, lin.in_proj_weight, lin.out_proj.weight), g)
    g_want = torch.autograd.grad(want, (x, mha.in_proj_weight, mha.out_proj.weight), g)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=0)


def test_identity_cross_attention_equals_exact() -> None:
    """Cross-attention (T_q != T_k): still exact for identity projections."""
    torch.manual_seed(1)
    lin, mha = _identity_layer(16, 2, 6, 6)
    x, y = torch.randn(2, 4, 16, dtype=F64), torch.randn(2, 6, 16, dtype=F64)
    torch.testing.assert_close(lin(x, y), mha(x, y), atol=1e-12, rtol=0)


def test_right_padding_equals_the_unpadded_sequence() -> None:
    """Zeroing masked keys before E K: a right-padded sequence gives what the shorter one gives,
    and NaN in the padding never reaches the output."""
    torch.manual_seed(2)
    lin = LinformerAttention(16, 4, k=5, max_len=12, dtype=F64).eval()
    x = torch.randn(2, 9, 16, dtype=F64)
    tokens = torch.ones(2, 9, dtype=torch.long)
    tokens[1, 6:] = 0
    mask = masks.padding_mask(tokens, pad_id=0)  # (B, 1, 1, T)
    y = x.clone()
    y[1, 6:] = float("nan")
    out = lin(x, y, mask=mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0], lin(x[:1], y[:1])[0], atol=1e-12, rtol=0)
    short = lin(x[1:], y[1:, :6])  # T_k = 6 keys: the first 6 columns of E and F
    torch.testing.assert_close(out[1], short[0], atol=1e-12, rtol=0)


def test_fully_masked_keys_give_zero_rows() -> None:
    q = k = v = torch.randn(1, 2, 4, 8, dtype=F64)
    mask = torch.zeros(1, 1, 1, 4, dtype=torch.bool)
    out = linformer_attention(q, k, v, random_projection(3, 4, dtype=F64), mask=mask)
    assert torch.equal(out, torch.zeros_like(out))


def test_shapes_and_weights() -> None:
    lin = LinformerAttention(32, 4, k=8, max_len=64, sharing="none", num_kv_heads=2)
    assert lin.proj_e.shape == (2, 8, 64)
    out, w = lin(torch.randn(2, 10, 32), torch.randn(2, 50, 32), need_weights=True)
    assert out.shape == (2, 10, 32)
    assert w.shape == (2, 4, 10, 8)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 10))
    assert LinformerAttention(32, 4, k=8, max_len=64, sharing="key-value").proj_f is None


def test_hooks_see_the_projected_weights() -> None:
    lin = LinformerAttention(16, 2, k=3, max_len=8)
    seen = {}
    h = lin.hook_weights.register_forward_hook(lambda m, i, o: seen.setdefault("w", o))
    lin(torch.randn(1, 8, 16))
    h.remove()
    assert seen["w"].shape == (1, 2, 8, 3)


def test_refuses_causal() -> None:
    lin = LinformerAttention(16, 2, k=4, max_len=8)
    x = torch.randn(1, 6, 16)
    with pytest.raises(ValueError, match=r"is_causal=True is not supported.*cannot be causal"):
        lin(x, is_causal=True)
    with pytest.raises(ValueError, match=r"mask has shape \(6, 6\).*causal and per-query"):
        lin(x, mask=masks.causal_mask(6))
    with pytest.raises(ValueError, match="cannot be causal"):
        lin.causal = True  # a subclass default that asks for causal attention
        lin(x)


def test_bad_inputs() -> None:
    lin = LinformerAttention(16, 2, k=4, max_len=8)
    with pytest.raises(
        ValueError, match="T_k = 9 positions but the layer projects at most max_len = 8"
    ):
        lin(torch.randn(1, 9, 16))
    with pytest.raises(TypeError, match="mask must be boolean"):
        lin(torch.randn(1, 6, 16), mask=torch.zeros(1, 1, 1, 6))
    with pytest.raises(ValueError, match=r"must broadcast to \(B, H, 1, T_k\)"):
        lin(torch.randn(1, 6, 16), mask=torch.ones(1, 1, 1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="cache must be None"):
        lin(torch.randn(1, 6, 16), cache=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window must be None: LinformerAttention does not"):
        lin(torch.randn(1, 6, 16), window=2)
    lin(torch.randn(1, 6, 16), positions=None, check_positions=False)  # neutral values
    with pytest.raises(ValueError, match=r"query must have shape \(B, T, d_model=16\)"):
        lin(torch.randn(6, 16))
    with pytest.raises(ValueError, match="sharing must be one of"):
        LinformerAttention(16, 2, k=4, max_len=8, sharing="layerwise")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k must be a positive int, got 0"):
        LinformerAttention(16, 2, k=0, max_len=8)
    q = k = v = torch.randn(1, 2, 6, 8)
    with pytest.raises(ValueError, match="e projects sequences of at most n = 4"):
        linformer_attention(q, k, v, torch.randn(3, 4))
    with pytest.raises(ValueError, match=r"e must have shape \(k, n\) or \(H_kv, k, n\)"):
        linformer_attention(q, k, v, torch.randn(5, 3, 8))
    with pytest.raises(TypeError, match=r"query must be a torch\.Tensor"):
        linformer_attention([1.0], k, v, torch.randn(3, 8))  # type: ignore[arg-type]


def test_key_mask_shapes() -> None:
    m = key_mask(torch.ones(2, 1, 1, 5, dtype=torch.bool), 2, 4, 5, "x")
    assert m is not None and m.shape == (2, 1, 5)
    assert key_mask(torch.ones(5, dtype=torch.bool), 2, 4, 5, "x").shape == (1, 1, 5)


def test_measured_errors_fall_with_k() -> None:
    """Theorem 1's JL estimate P Rᵀ R V improves as k grows (error ~ 1/√k); fitted E, F reach
    near-exact attention once k approaches T."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 32, 8, generator=g, dtype=F64).unbind(0)
    jl = linformer_errors(q, k, v, [4, 256], trials=8, generator=g).mean(1)
    assert jl[1] < jl[0] / 4  # 1/√k: 8 times smaller in expectation
    fitted = linformer_errors(q, k, v, [2, 32], projections="fitted", trials=1, steps=150,
                              generator=g)[:, 0]  # fmt: skip
    assert fitted[1] < 0.1 * fitted[0]
    assert relative_error(v, v) == 0.0


# --------------------------------------------------------------------------- peer: linformer


def test_matches_the_linformer_package() -> None:
    """Copy lucidrains' ``linformer.LinformerSelfAttention`` weights (its proj_k is our Eᵀ):
    equal outputs in float64, for the full length and a shorter sequence, headwise and
    key-value sharing, one kv head (MQA)."""
    import linformer as peer_lib  # a dev dependency (pyproject)

    torch.manual_seed(3)
    for share_kv, one_kv_head, t in [(False, False, 16), (True, False, 11), (False, True, 16)]:
        peer = (
            peer_lib.LinformerSelfAttention(
                dim=32, seq_len=16, k=6, heads=4, share_kv=share_kv, one_kv_head=one_kv_head
            )
            .double()
            .eval()
        )
        lin = LinformerAttention(
            32, 4, k=6, max_len=16, sharing="key-value" if share_kv else "headwise",
            num_kv_heads=1 if one_kv_head else None, dtype=F64,
        ).eval()  # fmt: skip
        to_v = peer.to_k if share_kv else peer.to_v
        with torch.no_grad():
            lin.in_proj_weight.copy_(torch.cat([peer.to_q.weight, peer.to_k.weight, to_v.weight]))
            lin.in_proj_bias.zero_()  # the peer's q/k/v projections have no bias
            lin.out_proj.weight.copy_(peer.to_out.weight)
            lin.out_proj.bias.copy_(peer.to_out.bias)
            lin.proj_e.copy_(peer.proj_k.T)
            if not share_kv:
                lin.proj_f.copy_(peer.proj_v.T)
        x = torch.randn(2, t, 32, dtype=F64)
        torch.testing.assert_close(lin(x), peer(x), atol=1e-12, rtol=0)
