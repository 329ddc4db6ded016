"""Masks of every rank that broadcasts, and values that must be finite (hardening, items 11–12).

A mask is valid when it broadcasts to ``(B, H, T_q, T_k)`` by PyTorch's rules, whatever its rank
(<= 4); every backend gives the float64 reference's result with it, forward and backward.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import attnlab as al
from tests.reference import assert_close_rule, attention_ref

BACKENDS = ["math", "sdpa", "blockwise", "blockwise_python"]
B, H, H_KV, T_Q, T_K, D = 2, 4, 2, 5, 7, 8

# every rank from 0 to 4, and the broadcast patterns of each
SHAPES = [
    (),
    (T_K,),
    (1,),
    (T_Q, T_K),
    (1, T_K),
    (T_Q, 1),
    (H, T_Q, T_K),
    (1, 1, T_K),
    (H, 1, T_K),
    (B, 1, 1, T_K),
    (B, H, T_Q, T_K),
    (1, H, 1, 1),
    (B, 1, T_Q, 1),
]


def _mask(shape: tuple[int, ...], kind: str, gen: torch.Generator) -> torch.Tensor:
    if kind == "bool":
        m = torch.rand(shape, generator=gen) > 0.3
        return m if m.dim() else torch.tensor(True)
    bias = torch.randn(shape, generator=gen, dtype=torch.float64)
    hidden = torch.rand(shape, generator=gen) < 0.3
    return bias.masked_fill(hidden, float("-inf"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)) or "scalar")
def test_every_rank_that_broadcasts(shape: tuple[int, ...], kind: str, backend: str) -> None:
    gen = torch.Generator().manual_seed(sum(shape) + len(shape))
    q = torch.randn(B, H, T_Q, D, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, H_KV, T_K, D, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, H_KV, T_K, D, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = _mask(shape, kind, gen)
    full = mask.expand(B, H, T_Q, T_K)
    for is_causal in (False, True):
        out, w = al.scaled_dot_product_attention(
            q, k, v, mask, is_causal=is_causal, backend=backend, need_weights=True
        )
        ref, ref_w = attention_ref(q, k, v, full, is_causal=is_causal)
        assert_close_rule(out, ref, ref, "output")
        assert_close_rule(w, ref_w, ref_w, "weights")
        g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
        got = torch.autograd.grad(out, (q, k, v), g)
        want = torch.autograd.grad(ref, (q, k, v), g)
        for name, a, b in zip("qkv", got, want):
            assert_close_rule(a, b, b, f"d{name}")


def test_a_mask_of_higher_rank_than_the_scores_is_refused() -> None:
    q = k = v = torch.randn(H, T_Q, D)  # no batch dim: the scores are (H, T_q, T_k)
    with pytest.raises(ValueError, match=r"mask has shape \(1, 1, 5, 5\) but must broadcast"):
        al.scaled_dot_product_attention(q, k, v, torch.ones(1, 1, T_Q, T_Q, dtype=torch.bool))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_float_mask_must_be_finite_where_it_does_not_hide(bad: float) -> None:
    q = k = v = torch.randn(1, 2, 3, 4)
    mask = torch.zeros(3, 3)
    mask[1, 2] = bad
    for backend in BACKENDS:
        with pytest.raises(ValueError, match="mask must not hold NaN or \\+inf"):
            al.scaled_dot_product_attention(q, k, v, mask, backend=backend)
    mask[1, 2] = float("-inf")  # -inf hides a key: fine
    al.scaled_dot_product_attention(q, k, v, mask)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), float("-inf")])
def test_scale_must_be_finite(scale: float) -> None:
    q = k = v = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"scale must be finite, got"):
        al.scaled_dot_product_attention(q, k, v, scale=scale)


def test_a_float_mask_of_zeros_and_ones_warns_once_naming_mask() -> None:
    """The Annotated Transformer's habit: a 0/1 float mask adds 0 or 1 to the scores."""
    q = k = v = torch.randn(1, 2, 3, 4)
    ones = torch.tril(torch.ones(3, 3))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        for _ in range(3):
            al.scaled_dot_product_attention(q, k, v, ones)
    messages = [str(w.message) for w in seen]
    assert len(messages) == 1 and "mask is floating and holds only 0 and 1" in messages[0]
    assert seen[0].filename == __file__  # points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        al.scaled_dot_product_attention(q, k, v, torch.zeros(3, 3))  # all 0: a no-op bias
        al.scaled_dot_product_attention(q, k, v, ones.bool())


# ----------------------------------------------------------------------------- huge finite biases


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_huge_finite_biases_give_the_float64_result(backend: str, dtype: torch.dtype) -> None:
    """A float32 mask of −1e9 is a finite bias, not a hidden key: softmax(s − 1e9) = softmax(s).

    Before, a row of −1e9 everywhere gave weights of 1 each on blockwise (its log-sum-exp lost
    log T_k to rounding) and NaN with half-precision queries (−1e9 became −inf after the check
    for hidden entries).
    """
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(B, H, T_Q, D, generator=gen).to(dtype).requires_grad_()
    k = torch.randn(B, H_KV, T_K, D, generator=gen).to(dtype).requires_grad_()
    v = torch.randn(B, H_KV, T_K, D, generator=gen).to(dtype).requires_grad_()
    mask = torch.zeros(B, 1, T_Q, T_K)
    mask[:, :, 0] = -1e9  # a row of −1e9 everywhere
    mask[:, :, 1, 3:] = -1e9  # a row where −1e9 hides keys in effect
    mask[:, :, 2] = torch.linspace(-3e4, -2.9e4, T_K)  # beyond fp16's range, spread 1000
    mask[1, :, 3] = torch.finfo(torch.float32).min  # hidden: a row that sees nothing
    out, w = al.scaled_dot_product_attention(q, k, v, mask, backend=backend, need_weights=True)
    ref, ref_w = attention_ref(q, k, v, mask)
    # the baseline: the same problem in the inputs' dtype, rows shifted by hand to a largest 0
    shifted = mask - mask.masked_fill(mask <= torch.finfo(mask.dtype).min, -torch.inf).amax(
        -1, keepdim=True
    ).nan_to_num(neginf=0.0)
    base, base_w = attention_ref(q, k, v, shifted, upcast=False)
    assert_close_rule(out, ref, base, "output")
    assert_close_rule(w, ref_w, base_w, "weights")
    g = torch.randn(out.shape, generator=gen).to(dtype)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(ref, (q, k, v), g.double())
    baseline = torch.autograd.grad(base, (q, k, v), g)
    for name, a, b, c in zip("qkv", got, want, baseline):
        assert_close_rule(a, b, c, f"d{name}")


def test_a_bias_that_hides_nothing_gives_no_boolean_mask() -> None:
    """ALiBi's (H, T, T) bias hides no key: the backends get no per-row boolean mask to process
    (empty rows, unseen keys), and the result is that of the float64 reference."""
    from attnlab.nn.mask_spec import normalize_mask

    q = k = v = torch.randn(1, H, 9, D, dtype=torch.float64)
    bias = al.alibi_bias(H, 9, 9).double()
    masking = normalize_mask(q, k, bias, True)
    assert masking.allowed is None and masking.bias is not None
    hiding = normalize_mask(
        q, k, bias.masked_fill(torch.eye(9, dtype=torch.bool), -torch.inf), True
    )
    assert hiding.allowed is not None
    for backend in BACKENDS:
        out = al.scaled_dot_product_attention(q, k, v, bias, is_causal=True, backend=backend)
        ref, _ = attention_ref(q, k, v, bias, is_causal=True)
        assert_close_rule(out, ref, ref, "output")
