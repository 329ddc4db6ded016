"""Every backend of ``scaled_dot_product_attention`` against the float64 reference.

The rule (flash-attention's tests): ``err(backend) <= 2 · err(plain same-dtype PyTorch) + floor``
for the output, the weights and the query/key/value gradients, over a sparse grid of dtypes,
causal on/off, ``T_q != T_k``, lengths 1, 17, 113, 127, 513, head dims 8, 64, 80, MHA/GQA/MQA and
masks (boolean, additive, ``to_additive``, padding) with fully hidden rows.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

import attnlab as al
from attnlab import masks
from tests.reference import assert_close_rule, attention_ref, visible_mask

BACKENDS = ("math", "sdpa", "blockwise", "blockwise_python", "auto")
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
HEADS = ((2, 2), (4, 2), (4, 1))  # MHA, GQA, MQA
HEAD_DIMS = (8, 64, 80)
LENGTHS = ((1, 1), (1, 17), (17, 17), (113, 127), (127, 113), (17, 513), (513, 513))
MASKS = ("none", "bool", "float", "additive", "padding")


@dataclass(frozen=True)
class Case:
    dtype: torch.dtype
    causal: bool
    t_q: int
    t_k: int
    d: int
    h: int
    h_kv: int
    mask: str

    def __str__(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        c = "causal" if self.causal else "full"
        return f"{dt}-{c}-q{self.t_q}-k{self.t_k}-d{self.d}-h{self.h}/{self.h_kv}-{self.mask}"


def _grid() -> list[Case]:
    """A thinned product: dtype x causal x lengths, with masks, head dims and head layouts
    cycled so that every dtype meets every mask kind, every head dim and MHA/GQA/MQA; length 513
    uses a small head count (it is the expensive one); fp16 gets a short list of its own."""
    cases = []
    main = itertools.product(DTYPES[:3], (False, True), LENGTHS)
    for n, (dtype, causal, (t_q, t_k)) in enumerate(main):
        d, (h, h_kv), mask = HEAD_DIMS[n % 3], HEADS[(n // 3) % 3], MASKS[n % 5]
        if max(t_q, t_k) == 513:
            d, h, h_kv = 64, 2, 1
        cases.append(Case(dtype, causal, t_q, t_k, d, h, h_kv, mask))
    for n, (causal, (t_q, t_k)) in enumerate(itertools.product((False, True), LENGTHS[:5])):
        h, h_kv = HEADS[n % 3]
        cases.append(
            Case(
                torch.float16,
                causal,
                t_q,
                t_k,
                HEAD_DIMS[n % 3],
                h,
                h_kv,
                ("bool", "padding")[n % 2],
            )
        )
    return cases


GRID = _grid()


def make_mask(
    kind: str, b: int, h: int, t_q: int, t_k: int, dtype: torch.dtype
) -> torch.Tensor | None:
    """A mask of the given kind, with the first query row of batch 0 hidden everywhere."""
    if kind == "none":
        return None
    if kind == "padding":
        lengths = torch.randint(1, t_k + 1, (b,))
        lengths[0] = t_k  # at least one full row
        tokens = torch.where(torch.arange(t_k)[None] < lengths[:, None], 1, 0)
        if b > 1:
            tokens[-1] = 0  # a batch row whose keys are all padding: every row hidden
        return masks.padding_mask(tokens, pad_id=0)  # (B, 1, 1, T_k)
    allowed = torch.rand(b, h, t_q, t_k) < 0.7
    allowed[0, :, 0, :] = False  # fully hidden row
    if kind == "bool":
        return allowed
    if kind == "additive":
        return masks.to_additive(allowed, dtype)
    bias = torch.randn(b, 1, t_q, t_k, dtype=torch.float64) * 0.5
    return bias.masked_fill(~allowed[:, :1], float("-inf")).to(dtype)


def make_qkv(case: Case, b: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.randn(b, case.h, case.t_q, case.d, dtype=case.dtype)
    k = torch.randn(b, case.h_kv, case.t_k, case.d, dtype=case.dtype)
    v = torch.randn(b, case.h_kv, case.t_k, case.d, dtype=case.dtype)
    return q, k, v


def _grads(
    out: torch.Tensor, d_out: torch.Tensor, inputs: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(out, inputs, d_out.to(out.dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", GRID, ids=str)
def test_backend_matches_reference(case: Case, backend: str) -> None:
    """Outputs, weights and q/k/v gradients within 2x the plain same-dtype error of float64."""
    b = 2
    q, k, v = make_qkv(case, b)
    mask = make_mask(case.mask, b, case.h, case.t_q, case.t_k, case.dtype)
    inputs = tuple(t.clone().requires_grad_() for t in (q, k, v))
    need_weights = case.t_k <= 127 or backend == "math"
    result = al.scaled_dot_product_attention(
        *inputs, mask, is_causal=case.causal, backend=backend, need_weights=need_weights
    )
    out, weights = result if need_weights else (result, None)
    assert out.dtype == case.dtype and out.shape == (b, case.h, case.t_q, case.d)

    ref_in = tuple(t.double().requires_grad_() for t in (q, k, v))
    ref_out, ref_w = attention_ref(*ref_in, mask, is_causal=case.causal)
    base_in = tuple(t.clone().requires_grad_() for t in (q, k, v))
    base_out, base_w = attention_ref(*base_in, mask, is_causal=case.causal, upcast=False)

    assert_close_rule(out, ref_out, base_out, "output")
    if weights is not None:
        assert_close_rule(weights, ref_w, base_w, "weights")

    d_out = torch.randn(out.shape, dtype=torch.float64)
    got = _grads(out, d_out, inputs)
    ref = _grads(ref_out, d_out, ref_in)
    base = _grads(base_out, d_out, base_in)
    # torch 2.4's CPU flash backward rounds float16 more coarsely (~3x plain float16; fine from 2.5)
    coarse = (
        case.dtype == torch.float16 and backend in ("sdpa", "auto") and torch.__version__ < "2.5"
    )
    for name, g, r, bl in zip(("dq", "dk", "dv"), got, ref, base):
        assert_close_rule(g, r, bl, name, factor=3.0 if coarse else 2.0)

    # rows that may see no key: zero output, zero weights, zero query gradient
    vis = visible_mask(case.t_q, case.t_k, mask, case.causal)
    if vis is not None:
        empty = ~vis.expand(b, case.h, case.t_q, case.t_k).any(dim=-1)
        assert (out[empty] == 0).all()
        assert (got[0][empty] == 0).all()
        if weights is not None:
            assert (weights[empty] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_rows_are_zero_everywhere(backend: str, dtype: torch.dtype) -> None:
    """A row that may see no key: zeros in output, weights and gradients, in every dtype."""
    q = torch.randn(2, 4, 6, 16, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 2, 9, 16, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 2, 9, 16, dtype=dtype, requires_grad=True)
    allowed = torch.ones(2, 4, 6, 9, dtype=torch.bool)
    allowed[:, :, 2] = False  # row 2 sees nothing
    allowed[1] = False  # batch row 1 sees nothing at all
    out, w = al.scaled_dot_product_attention(q, k, v, allowed, backend=backend, need_weights=True)
    assert not out.isnan().any() and not w.isnan().any()
    assert (out[:, :, 2] == 0).all() and (out[1] == 0).all()
    assert (w[:, :, 2] == 0).all() and (w[1] == 0).all()
    torch.testing.assert_close(w[0, :, 0].float().sum(-1), torch.ones(4), atol=1e-2, rtol=0)
    out.float().pow(2).sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad).all()
    assert (q.grad[:, :, 2] == 0).all() and (q.grad[1] == 0).all()
    assert (k.grad[1] == 0).all() and (v.grad[1] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nan_and_inf_in_padding_never_reach_output(backend: str, dtype: torch.dtype) -> None:
    """NaN/inf stored in keys and values that every query must ignore leave the output finite."""
    b, h, t, d = 2, 2, 10, 8
    tokens = torch.ones(b, t, dtype=torch.long)
    tokens[0, 7:] = 0
    tokens[1, 4:] = 0
    mask = masks.padding_mask(tokens, 0)
    q = torch.randn(b, h, t, d, dtype=dtype)
    k = torch.randn(b, h, t, d, dtype=dtype)
    v = torch.randn(b, h, t, d, dtype=dtype)
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[0, :, 7:] = float("nan")
    v_bad[0, :, 7:] = float("inf")
    k_bad[1, :, 4:] = float("-inf")
    v_bad[1, :, 4:] = float("nan")
    k_bad.requires_grad_()
    v_bad.requires_grad_()
    qg = q.clone().requires_grad_()
    out = al.scaled_dot_product_attention(qg, k_bad, v_bad, mask, is_causal=True, backend=backend)
    clean = al.scaled_dot_product_attention(q, k, v, mask, is_causal=True, backend=backend)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, clean, atol=0, rtol=0)
    out.float().sum().backward()
    for g in (qg.grad, k_bad.grad, v_bad.grad):
        assert g is not None and torch.isfinite(g).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_is_causal_and_mask_both_apply(backend: str) -> None:
    """Documented: with ``is_causal=True`` and a mask, a key must pass both."""
    q = torch.randn(2, 2, 5, 8, dtype=torch.float64)
    k = torch.randn(2, 2, 7, 8, dtype=torch.float64)
    v = torch.randn(2, 2, 7, 8, dtype=torch.float64)
    mask = torch.rand(2, 1, 5, 7) < 0.6
    both = al.scaled_dot_product_attention(q, k, v, mask, is_causal=True, backend=backend)
    explicit = mask & masks.causal_mask(5, 7)
    expected = al.scaled_dot_product_attention(q, k, v, explicit, backend="math")
    torch.testing.assert_close(both, expected, atol=1e-12, rtol=0)
    only_mask = al.scaled_dot_product_attention(q, k, v, mask, backend=backend)
    assert not torch.allclose(both, only_mask)  # the causal rule did change something
    import attnlab.nn.attention as attention_module

    assert "both apply" in (attention_module.__doc__ or "")  # the documented semantics


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_causal_alignment_is_bottom_right(backend: str, causal: bool) -> None:
    """One decoding step with a cache (T_q = 1) sees every key when causal; T_q < T_k sees the past."""
    q = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 6, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 6, 8, dtype=torch.float64)
    out = al.scaled_dot_product_attention(q, k, v, is_causal=causal, backend=backend)
    mask = masks.causal_mask(3, 6) if causal else None
    ref, _ = attention_ref(q, k, v, mask)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    last = al.scaled_dot_product_attention(q[:, :, -1:], k, v, is_causal=causal, backend=backend)
    full = al.scaled_dot_product_attention(q[:, :, -1:], k, v, backend=backend)
    torch.testing.assert_close(last, full, atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [0.05, 1.0, 3.0])
def test_custom_scale(backend: str, scale: float) -> None:
    q = torch.randn(2, 2, 9, 16, dtype=torch.float64)
    k = torch.randn(2, 2, 11, 16, dtype=torch.float64)
    v = torch.randn(2, 2, 11, 16, dtype=torch.float64)
    out = al.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=True, backend=backend)
    ref, _ = attention_ref(q, k, v, is_causal=True, scale=scale)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    default = al.scaled_dot_product_attention(q, k, v, scale=None, backend=backend)
    ref_default, _ = attention_ref(q, k, v)
    torch.testing.assert_close(default, ref_default, atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_value_head_dim_may_differ(backend: str) -> None:
    q = torch.randn(1, 4, 5, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 6, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 6, 12, dtype=torch.float64)
    out = al.scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend)
    ref, _ = attention_ref(q, k, v, is_causal=True)
    assert out.shape == (1, 4, 5, 12)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_additive_and_boolean_masks_agree(backend: str) -> None:
    """A boolean mask and ``to_additive`` of it (in the query's dtype) give the same result."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        q = torch.randn(2, 2, 7, 8, dtype=dtype)
        k = torch.randn(2, 2, 7, 8, dtype=dtype)
        allowed = torch.rand(2, 2, 7, 7) < 0.5
        allowed[:, :, 3] = False
        a = al.scaled_dot_product_attention(q, k, k, allowed, backend=backend)
        b = al.scaled_dot_product_attention(
            q, k, k, masks.to_additive(allowed, dtype), backend=backend
        )
        c = al.scaled_dot_product_attention(
            q, k, k, masks.to_additive(allowed, torch.float32), backend=backend
        )
        torch.testing.assert_close(a, b, atol=0, rtol=0)
        torch.testing.assert_close(a, c, atol=0, rtol=0)


def test_alibi_bias_as_mask_matches_reference() -> None:
    """A float bias (ALiBi) plus causal on every backend."""
    h, t = 4, 33
    bias = al.alibi_bias(h, t, dtype=torch.float64)
    q, k, v = (torch.randn(1, h, t, 16, dtype=torch.float64) for _ in range(3))
    ref, _ = attention_ref(q, k, v, bias, is_causal=True)
    for backend in BACKENDS:
        out = al.scaled_dot_product_attention(q, k, v, bias, is_causal=True, backend=backend)
        torch.testing.assert_close(out, ref, atol=1e-12, rtol=0, msg=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch_sdpa(backend: str, causal: bool) -> None:
    """Parity with ``torch.nn.functional.scaled_dot_product_attention`` (T_q == T_k, where torch's
    top-left causal alignment agrees with ours) and with an explicit bottom-right mask otherwise."""
    q = torch.randn(2, 4, 13, 16)
    k = torch.randn(2, 4, 13, 16)
    v = torch.randn(2, 4, 13, 16)
    mask = torch.rand(2, 1, 13, 13) < 0.8
    mask[..., 0] = True  # torch gives NaN for fully hidden rows; keep every row non-empty
    ours = al.scaled_dot_product_attention(q, k, v, mask, backend=backend)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, theirs, atol=2e-6, rtol=1e-5)
    ours = al.scaled_dot_product_attention(q, k, v, is_causal=causal, backend=backend)
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(ours, theirs, atol=2e-6, rtol=1e-5)
    q2 = q[:, :, -5:]
    ours = al.scaled_dot_product_attention(q2, k, v, is_causal=causal, backend=backend)
    theirs = F.scaled_dot_product_attention(
        q2, k, v, attn_mask=masks.causal_mask(5, 13) if causal else None
    )
    torch.testing.assert_close(ours, theirs, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_need_weights_are_exact_softmax(backend: str) -> None:
    """Weights from every backend equal the float64 softmax and are the same whichever backend."""
    q = torch.randn(2, 4, 9, 8, dtype=torch.float64)
    k = torch.randn(2, 2, 12, 8, dtype=torch.float64)
    v = torch.randn(2, 2, 12, 8, dtype=torch.float64)
    mask = torch.randn(2, 4, 9, 12, dtype=torch.float64)
    out, w = al.scaled_dot_product_attention(
        q, k, v, mask, is_causal=True, backend=backend, need_weights=True
    )
    ref_out, ref_w = attention_ref(q, k, v, mask, is_causal=True)
    assert w.shape == (2, 4, 9, 12)
    torch.testing.assert_close(w, ref_w, atol=1e-13, rtol=0)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=0)
    torch.testing.assert_close(w @ v.repeat_interleave(2, dim=1), out, atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", ["math", "sdpa", "blockwise"])
def test_leading_dims_beyond_batch(backend: str) -> None:
    """Any leading dims ``...`` (also none beyond the heads)."""
    q = torch.randn(3, 2, 2, 5, 8, dtype=torch.float64)
    k = torch.randn(3, 2, 1, 6, 8, dtype=torch.float64)
    out = al.scaled_dot_product_attention(q, k, k, is_causal=True, backend=backend)
    ref, _ = attention_ref(q, k, k, is_causal=True)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    out3 = al.scaled_dot_product_attention(q[0, 0], k[0, 0], k[0, 0], backend=backend)
    ref3, _ = attention_ref(q[0, 0], k[0, 0], k[0, 0])
    torch.testing.assert_close(out3, ref3, atol=1e-12, rtol=0)


def test_auto_backend_is_a_real_choice() -> None:
    """``auto`` gives the same numbers as the backend it picks."""
    q = torch.randn(1, 2, 17, 8, dtype=torch.float64)
    a = al.scaled_dot_product_attention(q, q, q, is_causal=True, backend="auto")
    s = al.scaled_dot_product_attention(q, q, q, is_causal=True, backend="sdpa")
    torch.testing.assert_close(a, s, atol=1e-12, rtol=0)


@pytest.mark.parametrize(("block", "query_block"), [(1, 1), (7, 5), (16, 64), (1000, 3)])
def test_blockwise_block_sizes(block: int, query_block: int) -> None:
    """The online softmax depends on neither block size (odd sizes, a block of one key or row)."""
    from attnlab.nn.backends.blockwise import blockwise_attention
    from attnlab.nn.mask_spec import Masking

    q = torch.randn(1, 2, 23, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 29, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 29, 8, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(1, 2, 23, 29, dtype=torch.float64, requires_grad=True)
    masking = Masking(None, bias, 29 - 23)
    out, _ = blockwise_attention(
        q, k, v, masking, 8**-0.5, 0.0, False, block_size=block, query_block=query_block
    )
    ref, _ = attention_ref(q, k, v, bias, is_causal=True)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    g = torch.autograd.grad(out.sum(), (q, k, v, bias))
    g_ref = torch.autograd.grad(ref.sum(), (q, k, v, bias))
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_row_hidden_in_first_block_with_very_negative_scores(backend: str) -> None:
    """A row whose first key block is hidden and whose visible scores are all far below zero must
    not underflow (the running maximum must not be clamped to 0)."""
    from attnlab.nn.backends.blockwise import blockwise_attention
    from attnlab.nn.mask_spec import Masking

    q = torch.randn(1, 1, 4, 8)
    k = torch.randn(1, 1, 12, 8)
    v = torch.randn(1, 1, 12, 8)
    bias = torch.full((4, 12), -300.0)
    allowed = torch.ones(4, 12, dtype=torch.bool)
    allowed[:, :6] = False
    out = al.scaled_dot_product_attention(
        q, k, v, bias.masked_fill(~allowed, float("-inf")), backend=backend
    )
    ref, _ = attention_ref(
        q.double(), k.double(), v.double(), bias.double().masked_fill(~allowed, float("-inf"))
    )
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)
    small, _ = blockwise_attention(
        q, k, v, Masking(allowed, bias, None), 8**-0.5, 0.0, False, block_size=4,
        tile_kernel="python",
    )  # fmt: skip
    torch.testing.assert_close(small.double(), ref, atol=1e-5, rtol=0)
    # the fused tiles merge by log-sum-exp, which near −300 holds ~3e-5 in fp32 (normalize_mask
    # shifts such a bias to 0 before any backend sees it, as the first call above shows)
    fused, _ = blockwise_attention(
        q, k, v, Masking(allowed, bias, None), 8**-0.5, 0.0, False, block_size=4,
        tile_kernel="fused",
    )  # fmt: skip
    torch.testing.assert_close(fused.double(), ref, atol=1e-4, rtol=0)
