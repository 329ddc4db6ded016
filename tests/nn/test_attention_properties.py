"""Property tests (hypothesis) over random shapes and masks."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlab as al
from tests.reference import attention_ref, visible_mask


@st.composite
def problems(draw: st.DrawFn) -> dict:
    b = draw(st.integers(1, 2))
    h_kv = draw(st.integers(1, 3))
    h = h_kv * draw(st.integers(1, 3))
    t_q = draw(st.integers(1, 20))
    t_k = draw(st.integers(1, 20))
    d = draw(st.integers(1, 16))
    d_v = draw(st.sampled_from([d, 3]))
    causal = draw(st.booleans())
    kind = draw(st.sampled_from(["none", "bool", "float", "padding"]))
    density = draw(st.sampled_from([0.0, 0.2, 0.7, 1.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t_q, d, generator=gen, dtype=torch.float64)
    k = torch.randn(b, h_kv, t_k, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, h_kv, t_k, d_v, generator=gen, dtype=torch.float64)
    mask = None
    if kind == "bool":
        shape = draw(
            st.sampled_from([(b, h, t_q, t_k), (t_q, t_k), (b, 1, 1, t_k), (1, h, t_q, 1)])
        )
        mask = torch.rand(shape, generator=gen) < density
    elif kind == "float":
        mask = torch.randn(b, 1, t_q, t_k, generator=gen, dtype=torch.float64) * 2
        mask = mask.masked_fill(torch.rand(mask.shape, generator=gen) >= density, float("-inf"))
    elif kind == "padding":
        mask = (torch.rand(b, t_k, generator=gen) < density)[:, None, None, :]
    return {"q": q, "k": k, "v": v, "mask": mask, "causal": causal}


@settings(max_examples=40, deadline=None)
@given(problems())
def test_rows_sum_to_one_or_zero_and_backends_agree(p: dict) -> None:
    q, k, v, mask, causal = p["q"], p["k"], p["v"], p["mask"], p["causal"]
    results = {
        backend: al.scaled_dot_product_attention(
            q, k, v, mask, is_causal=causal, backend=backend, need_weights=True
        )
        for backend in ("math", "sdpa", "blockwise", "blockwise_python")
    }
    ref_out, ref_w = attention_ref(q, k, v, mask, is_causal=causal)
    vis = visible_mask(q.shape[-2], k.shape[-2], mask, causal)
    has_key = torch.ones(ref_w.shape[:-1], dtype=torch.bool)
    if vis is not None:
        has_key = vis.expand(ref_w.shape).any(dim=-1)
    for backend, (out, w) in results.items():
        assert torch.isfinite(out).all() and torch.isfinite(w).all(), backend
        sums = w.sum(dim=-1)
        torch.testing.assert_close(sums, has_key.double(), atol=1e-12, rtol=0, msg=backend)
        assert (w >= 0).all()
        torch.testing.assert_close(w, ref_w, atol=1e-12, rtol=0, msg=backend)
        torch.testing.assert_close(out, ref_out, atol=1e-11, rtol=0, msg=backend)
        if vis is not None:
            assert (w.masked_select(~vis.expand(w.shape)) == 0).all(), backend


@settings(max_examples=25, deadline=None)
@given(problems())
def test_gradients_agree_across_backends(p: dict) -> None:
    q, k, v, mask, causal = p["q"], p["k"], p["v"], p["mask"], p["causal"]
    d_out = torch.randn(*q.shape[:-1], v.shape[-1], dtype=torch.float64)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out, _ = attention_ref(*ref_in, mask, is_causal=causal)
    ref_g = torch.autograd.grad(ref_out, ref_in, d_out)
    for backend in ("math", "sdpa", "blockwise", "blockwise_python"):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = al.scaled_dot_product_attention(*inputs, mask, is_causal=causal, backend=backend)
        for g, r in zip(torch.autograd.grad(out, inputs, d_out), ref_g):
            assert torch.isfinite(g).all(), backend
            torch.testing.assert_close(g, r, atol=1e-10, rtol=0, msg=backend)


@settings(max_examples=25, deadline=None)
@given(problems())
def test_permuting_keys_permutes_nothing(p: dict) -> None:
    """Without a causal rule attention is a set function of the (key, value, mask column) triples."""
    q, k, v, mask = p["q"], p["k"], p["v"], p["mask"]
    t_k = k.shape[-2]
    perm = torch.randperm(t_k)
    out = al.scaled_dot_product_attention(q, k, v, mask, backend="blockwise")
    mask_p = None if mask is None else (mask[..., perm] if mask.shape[-1] > 1 else mask)
    out_p = al.scaled_dot_product_attention(
        q, k[..., perm, :], v[..., perm, :], mask_p, backend="blockwise"
    )
    torch.testing.assert_close(out, out_p, atol=1e-12, rtol=0)
