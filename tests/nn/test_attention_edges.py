"""Edges PyTorch's own SDPA tests cover (hardening, item 15): fp16 values whose Q Kᵀ overflows
fp16, and empty tensors (empty in, empty out, on every backend, forward and backward)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnlab as al

BACKENDS = ["math", "sdpa", "blockwise", "blockwise_python"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_fp16_scores_that_overflow_fp16_stay_finite(backend: str, is_causal: bool) -> None:
    """PyTorch's test: q = k = v = 256 in fp16. Q Kᵀ = 256² · 80 overflows fp16 (max 65504) unless
    the scores are formed in fp32, as the fused kernels do; the answer is 256 everywhere."""
    q = torch.full((1, 32, 23, 80), 256.0, dtype=torch.half)
    out, w = al.scaled_dot_product_attention(
        q, q, q, is_causal=is_causal, backend=backend, need_weights=True
    )
    assert torch.isfinite(w).all()
    if backend == "sdpa":  # PyTorch's own kernel, whatever it gives (torch 2.4's CPU one overflows)
        want = F.scaled_dot_product_attention(q, q, q, is_causal=is_causal)
        torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)
    else:
        assert bool((out == 256).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp16_large_random_values_match_the_float64_reference(backend: str) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 64, generator=gen) * 40 for _ in range(3))
    out = al.scaled_dot_product_attention(q.half(), k.half(), v.half(), backend=backend)
    s = (q.double() @ k.double().transpose(-2, -1)) / 8
    ref = torch.softmax(s, -1) @ v.double()
    assert torch.isfinite(out).all()
    assert float((out.double() - ref).abs().max()) < 0.05 * float(ref.abs().max())


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """PyTorch where it is defined; no key at all: rows that may see nothing, zeros."""
    if k.shape[-2] == 0:
        return (q.sum(-1, keepdim=True) * 0).expand(*q.shape[:-1], v.shape[-1]) * v.sum()
    return F.scaled_dot_product_attention(q, k, v)


# (B, H, T_q, T_k, D, D_v): each a zero somewhere
EMPTY = [
    pytest.param((0, 2, 3, 4, 8, 8), id="no-batch"),
    pytest.param((2, 0, 3, 4, 8, 8), id="no-heads"),
    pytest.param((2, 2, 0, 4, 8, 8), id="no-queries"),
    pytest.param((2, 2, 3, 0, 8, 8), id="no-keys"),
    pytest.param((2, 2, 3, 4, 8, 0), id="no-value-dim"),
    pytest.param((2, 2, 3, 4, 0, 8), id="no-head-dim"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dims", EMPTY)
def test_empty_in_empty_out(dims: tuple[int, ...], backend: str) -> None:
    b, h, t_q, t_k, d, d_v = dims
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(b, h, t_q, d, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, h, t_k, d, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, h, t_k, d_v, generator=gen, dtype=torch.float64, requires_grad=True)
    out, w = al.scaled_dot_product_attention(q, k, v, backend=backend, need_weights=True)
    want = _reference(q, k, v)
    assert out.shape == (b, h, t_q, d_v) and w.shape == (b, h, t_q, t_k)
    torch.testing.assert_close(out, want)
    assert not torch.isnan(w).any()
    if out.numel():
        g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
        got = torch.autograd.grad(out, (q, k, v), g, allow_unused=True)
        ref = torch.autograd.grad(want, (q, k, v), g, allow_unused=True)
        for a, r, t in zip(got, ref, (q, k, v)):
            a = torch.zeros_like(t) if a is None else a
            r = torch.zeros_like(t) if r is None else r
            torch.testing.assert_close(a, r)
    # causal and masked: the same shapes, never NaN
    mask = torch.ones(t_q, t_k, dtype=torch.bool)
    for kw in ({"is_causal": True}, {"mask": mask}):
        got_out = al.scaled_dot_product_attention(q, k, v, backend=backend, **kw)
        assert got_out.shape == (b, h, t_q, d_v) and not torch.isnan(got_out).any()


def test_no_head_dim_gives_the_mean_of_the_values() -> None:
    v = torch.randn(1, 2, 5, 3)
    empty = torch.randn(1, 2, 5, 0)
    out = al.scaled_dot_product_attention(empty[:, :, :4], empty, v)
    torch.testing.assert_close(out, v.mean(-2, keepdim=True).expand(1, 2, 4, 3))


@pytest.mark.parametrize("backend", ["math", "sdpa", "blockwise"])
def test_autocast_does_not_lower_the_precision_inside_attention(backend: str) -> None:
    """Under bf16 autocast, attention computes as it does for bf16 inputs without autocast (its
    scores, softmax and P·V in fp32 on math and blockwise), not with autocast's bf16 matmuls."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 33, 16, generator=gen).bfloat16() for _ in range(3))
    plain = al.scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = al.scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend)
    assert inside.dtype == torch.bfloat16
    assert torch.equal(inside, plain)
    # and fp32 inputs under autocast stay fp32 inside attention
    q32, k32, v32 = q.float(), k.float(), v.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out32 = al.scaled_dot_product_attention(q32, k32, v32, is_causal=True, backend=backend)
    assert out32.dtype == torch.float32
    assert torch.equal(
        out32, al.scaled_dot_product_attention(q32, k32, v32, is_causal=True, backend=backend)
    )
