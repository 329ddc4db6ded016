"""PerformerAttention / FAVOR+ (Choromanski et al. 2021): the random features, the error trend, the
causal prefix sums against a direct computation, gradients, redraws, masks, and parity with the
``performer-pytorch`` package."""

from __future__ import annotations

import functools
import sys

import pytest
import torch

import attnlab as al
from attnlab import masks
from attnlab.nn.approximation_errors import favor_errors
from attnlab.nn.performer import (
    PerformerAttention,
    favor_attention,
    orthogonal_random_features,
    softmax_features,
)

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _direct(q, k, v, w, is_causal=False, keep=None, scale=None):
    """The same linear attention written as a T_q × T_k matrix: A = φ(Q) φ(K)ᵀ, masked, row-normalised."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    groups = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(groups, -3), v.repeat_interleave(groups, -3)
    x_q, x_k = q * scale**0.5, k * scale**0.5
    phi_q = torch.exp(x_q @ w.T - x_q.square().sum(-1, keepdim=True) / 2)
    phi_k = torch.exp(x_k @ w.T - x_k.square().sum(-1, keepdim=True) / 2)
    a = phi_q @ phi_k.transpose(-2, -1)  # (B, H, T_q, T_k)
    t_q, t_k = q.shape[-2], k.shape[-2]
    if is_causal:
        a = a * masks.causal_mask(t_q, t_k)
    if keep is not None:
        a = a * keep
    return (a @ v) / a.sum(-1, keepdim=True)


# ------------------------------------------------------------------------------ random features


def test_orthogonal_blocks_and_chi_norms() -> None:
    d, m = 8, 20  # two full blocks and 4 rows of a third
    w = orthogonal_random_features(m, d, generator=_gen(0), dtype=F64)
    assert w.shape == (m, d)
    for lo in range(0, m, d):
        block = w[lo : lo + d]
        gram = block @ block.T
        off = gram - torch.diag(torch.diagonal(gram))
        assert off.abs().max() < 1e-12  # rows within a block are exactly orthogonal
    # the norms are those of N(0, I_d) vectors: E‖ω‖² = d
    big = orthogonal_random_features(8192, d, generator=_gen(1), dtype=F64)
    assert abs(big.square().sum(-1).mean().item() / d - 1) < 0.03
    # and the directions are uniform: E[ω ωᵀ] = I
    cov = big.T @ big / big.shape[0]
    assert (cov - torch.eye(d, dtype=F64)).abs().max() < 0.08
    iid = orthogonal_random_features(m, d, generator=_gen(0), orthogonal=False, dtype=F64)
    assert (iid[:d] @ iid[:d].T - torch.diag((iid[:d] ** 2).sum(-1))).abs().max() > 0.1
    # reproducible from the generator
    assert torch.equal(w, orthogonal_random_features(m, d, generator=_gen(0), dtype=F64))


def test_features_estimate_the_softmax_kernel() -> None:
    """Lemma 1: E[φ(x)ᵀ φ(y)] = exp(xᵀy) — the average over many features approaches it."""
    g = _gen(2)
    x, y = (0.4 * torch.randn(2, 1, 6, generator=g, dtype=F64)).unbind(0)
    exact = torch.exp(x @ y.T)
    w = orthogonal_random_features(200_000, 6, generator=g, dtype=F64)
    est = softmax_features(x, w, stabilize="none") @ softmax_features(y, w, stabilize="none").T
    assert abs(est.item() / exact.item() - 1) < 0.01
    assert (softmax_features(x, w) >= 0).all()


@pytest.mark.parametrize("is_causal", [False, True])
def test_error_falls_as_features_grow(is_causal: bool) -> None:
    """Unbiased-ish: averaged over 6 draws, 4096 features are > 4× closer to exact attention than 64
    (the standard deviation falls as 1/√m: 8× in expectation)."""
    g = _gen(3)
    q, k, v = torch.randn(3, 1, 2, 64, 16, generator=g, dtype=F64).unbind(0)
    err = favor_errors(0.5 * q, 0.5 * k, v, [64, 4096], trials=6, is_causal=is_causal,
                       generator=g).mean(1)  # fmt: skip
    assert err[1] < err[0] / 4, err


# ------------------------------------------------------------------------------ the linear forms


@pytest.mark.parametrize(("t_q", "t_k"), [(9, 9), (4, 9), (9, 4), (1, 7)])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("chunk", [1, 3, 128])
def test_prefix_sums_equal_the_direct_causal_computation(t_q, t_k, kv_heads, chunk) -> None:
    """φ(Q) prefix sums (by chunks of 1, 3 or all queries) == the O(T²) matrix of the same linear
    attention with a (bottom-right) causal mask, float64, to 1e-10; queries that see no key give
    zeros."""
    g = _gen(4)
    q = torch.randn(2, 4, t_q, 8, generator=g, dtype=F64)
    k = torch.randn(2, kv_heads, t_k, 8, generator=g, dtype=F64)
    v = torch.randn(2, kv_heads, t_k, 5, generator=g, dtype=F64)
    w = orthogonal_random_features(24, 8, generator=g, dtype=F64)
    got, weights = favor_attention(q, k, v, w, is_causal=True, need_weights=True, chunk_size=chunk)
    want = _direct(q, k, v, w, is_causal=True)
    sees = masks.causal_mask(t_q, t_k).any(-1)  # (T_q,)
    torch.testing.assert_close(got[..., sees, :], want[..., sees, :], atol=1e-10, rtol=0)
    assert torch.equal(got[..., ~sees, :], torch.zeros_like(got[..., ~sees, :]))
    torch.testing.assert_close(weights @ v.repeat_interleave(4 // kv_heads, -3), got,
                               atol=1e-10, rtol=0)  # fmt: skip
    bi = favor_attention(q, k, v, w)
    torch.testing.assert_close(bi, _direct(q, k, v, w), atol=1e-10, rtol=0)


def test_key_padding_contributes_nothing() -> None:
    g = _gen(5)
    q, k, v = torch.randn(3, 2, 3, 7, 8, generator=g, dtype=F64).unbind(0)
    w = orthogonal_random_features(16, 8, generator=g, dtype=F64)
    keep = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    keep[1, ..., 4:] = False
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 4:], v2[1, :, 4:] = float("nan"), 1e6  # whatever the padding holds
    for causal in (False, True):
        out = favor_attention(q, k2, v2, w, causal, mask=keep)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, _direct(q, k, v, w, causal, keep), atol=1e-10, rtol=0)
        if not causal:  # the padded sample equals its unpadded keys
            short = favor_attention(q[1:], k[1:, :, :4], v[1:, :, :4], w, causal)
            torch.testing.assert_close(out[1:], short, atol=1e-12, rtol=0)
    none = favor_attention(q, k, v, w, mask=torch.zeros(1, 1, 1, 7, dtype=torch.bool))
    assert torch.equal(none, torch.zeros_like(none))


def test_gradients_flow() -> None:
    """gradcheck in float64 (the detached stabilisers cancel, so the gradients are exact)."""
    g = _gen(6)
    q, k, v = (0.5 * torch.randn(3, 1, 2, 5, 4, generator=g, dtype=F64)).unbind(0)
    w = orthogonal_random_features(6, 4, generator=g, dtype=F64)
    for causal in (False, True):
        args = tuple(t.clone().requires_grad_(True) for t in (q, k, v))
        assert torch.autograd.gradcheck(
            lambda a, b, c, causal=causal: favor_attention(a, b, c, w, causal), args
        )
    layer = PerformerAttention(16, 2, num_features=8, causal=True)
    x = torch.randn(2, 6, 16, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


# ----------------------------------------------------------------------------------- the module


def test_module_shapes_weights_and_many_features_approach_exact() -> None:
    torch.manual_seed(7)
    mha = al.MultiHeadAttention(16, 2, dtype=F64)
    perf = PerformerAttention(16, 2, num_features=16384, dtype=F64)
    perf.load_state_dict({**mha.state_dict(), "features": perf.features,
                          "calls_since_redraw": perf.calls_since_redraw})  # fmt: skip
    x = 0.3 * torch.randn(2, 12, 16, dtype=F64)
    for causal in (False, True):
        out, w = perf(x, is_causal=causal, need_weights=True)
        want, want_w = mha(x, is_causal=causal, need_weights=True)
        assert out.shape == (2, 12, 16) and w.shape == (2, 2, 12, 12)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 12, dtype=F64))
        assert (w - want_w).abs().max() < 0.02
        assert (out - want).abs().max() < 0.02
        if causal:
            assert torch.equal(w.triu(1), torch.zeros_like(w))
    default = PerformerAttention(64, 4)  # d_head = 16: m = round(16 ln 16) = 44
    assert default.features.shape == (44, 16)


def test_redraw() -> None:
    torch.manual_seed(8)
    layer = PerformerAttention(16, 2, num_features=8)
    before = layer.features.clone()
    layer.redraw_features(generator=_gen(0))
    assert not torch.equal(before, layer.features)
    assert torch.equal(layer.features, orthogonal_random_features(8, 8, generator=_gen(0)))
    assert "features" in layer.state_dict()

    every = PerformerAttention(16, 2, num_features=8, redraw_interval=2)
    x = torch.randn(1, 4, 16)
    seen = []
    for _ in range(5):
        every(x)
        seen.append(every.features.clone())
    # calls 1, 2 share one draw, a new one before call 3 (and call 5)
    assert torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])
    assert torch.equal(seen[2], seen[3]) and not torch.equal(seen[3], seen[4])
    every.eval()
    fixed = every.features.clone()
    for _ in range(4):
        every(x)
    assert torch.equal(fixed, every.features)  # never in eval mode


def test_dropout_only_while_training() -> None:
    torch.manual_seed(9)
    layer = PerformerAttention(16, 2, num_features=8, dropout=0.5)
    x = torch.randn(2, 6, 16)
    a, b = layer(x), layer(x)
    assert not torch.allclose(a, b)
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x), atol=0, rtol=0)


def test_bad_inputs() -> None:
    layer = PerformerAttention(16, 2, num_features=8)
    x = torch.randn(1, 6, 16)
    with pytest.raises(ValueError, match=r"mask has shape \(6, 6\).*causal and per-query"):
        layer(x, mask=masks.causal_mask(6))
    with pytest.raises(TypeError, match="mask must be boolean"):
        layer(x, mask=torch.zeros(1, 1, 1, 6))
    with pytest.raises(ValueError, match="cache must be None"):
        layer(x, cache=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positions must be None: PerformerAttention does not"):
        layer(x, positions=torch.arange(6))
    with pytest.raises(ValueError, match="num_features must be a positive int, got 0"):
        PerformerAttention(16, 2, num_features=0)
    q = k = v = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match=r"features must have shape \(m, D\) = \(m, 4\)"):
        favor_attention(q, k, v, torch.randn(6, 3))
    with pytest.raises(ValueError, match="must be a multiple of k's H_kv = 3"):
        favor_attention(q, torch.randn(1, 3, 5, 4), torch.randn(1, 3, 5, 4), torch.randn(6, 4))
    with pytest.raises(TypeError, match="k must have a floating dtype"):
        favor_attention(q, k.long(), v, torch.randn(6, 4))
    with pytest.raises(ValueError, match="stabilize must be one of"):
        softmax_features(q, torch.randn(6, 4), stabilize="max")


# ----------------------------------------------------------------------- peer: performer-pytorch


@pytest.mark.skipif(
    sys.version_info >= (3, 12), reason="performer-pytorch imports distutils, gone in Python 3.12"
)
def test_matches_performer_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    """lucidrains' ``performer_pytorch.SelfAttention`` with our weights and its random-feature
    matrix copied into ``features``: equal outputs in float64 once its ``eps`` (added to every
    feature, and to the causal denominator) is set to 0; within 1e-3 with its defaults."""
    import performer_pytorch as peer_lib  # a dev dependency (pyproject) on Python < 3.12
    import performer_pytorch.performer_pytorch as impl

    torch.manual_seed(10)
    for causal in (False, True):
        peer = peer_lib.SelfAttention(dim=32, heads=4, dim_head=8, nb_features=24,
                                      causal=causal).double().eval()  # fmt: skip
        ours = PerformerAttention(32, 4, num_features=24, dtype=F64).eval()
        with torch.no_grad():
            ours.in_proj_weight.copy_(
                torch.cat([peer.to_q.weight, peer.to_k.weight, peer.to_v.weight])
            )
            ours.in_proj_bias.zero_()  # the peer's q/k/v projections have no bias
            ours.out_proj.weight.copy_(peer.to_out.weight)
            ours.out_proj.bias.copy_(peer.to_out.bias)
            ours.features.copy_(peer.fast_attention.projection_matrix)
        x = 0.5 * torch.randn(2, 10, 32, dtype=F64)
        want = ours(x, is_causal=causal)
        assert (peer(x) - want).abs().max() < 1e-3  # its defaults: eps = 1e-4 (features), 1e-6
        with monkeypatch.context() as patch:
            patch.setattr(impl, "softmax_kernel", functools.partial(impl.softmax_kernel, eps=0.0))
            if causal:
                patch.setattr(peer.fast_attention, "causal_linear_fn",
                              functools.partial(impl.causal_linear_attention_noncuda, eps=0.0))  # fmt: skip
            torch.testing.assert_close(peer(x), want, atol=1e-12, rtol=0)
