"""Gradients by finite differences (``torch.autograd.gradcheck``, float64) and dropout."""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from tests.reference import attention_ref

BACKENDS = ("math", "sdpa", "blockwise", "blockwise_python")


def _inputs(h: int, h_kv: int, t_q: int, t_k: int, d: int) -> tuple[torch.Tensor, ...]:
    return tuple(
        torch.randn(1, n, t, d, dtype=torch.float64, requires_grad=True)
        for n, t in ((h, t_q), (h_kv, t_k), (h_kv, t_k))
    )


@pytest.mark.parametrize("backend", ["math", "blockwise", "blockwise_python", "sdpa"])
@pytest.mark.parametrize(
    ("causal", "t_q", "t_k", "h", "h_kv", "mask"),
    [
        (False, 4, 6, 2, 2, None),
        (True, 5, 5, 4, 2, "bool"),
        (True, 6, 4, 2, 1, "float"),  # T_q > T_k: the top rows see nothing
    ],
)
def test_gradcheck(
    backend: str, causal: bool, t_q: int, t_k: int, h: int, h_kv: int, mask: str | None
) -> None:
    q, k, v = _inputs(h, h_kv, t_q, t_k, 5)
    m: torch.Tensor | None = None
    if mask == "bool":
        m = torch.rand(1, h, t_q, t_k) < 0.6
        m[0, 0, 1] = False  # a fully hidden row
    elif mask == "float":
        m = torch.randn(1, 1, t_q, t_k, dtype=torch.float64)
        m[..., 0, :] = float("-inf")

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return al.scaled_dot_product_attention(q, k, v, m, is_causal=causal, backend=backend)

    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", ["math", "blockwise", "blockwise_python"])
def test_gradcheck_additive_bias_gradient(backend: str) -> None:
    """A learnable additive bias (e.g. relative positions) gets its gradient too."""
    q, k, v = _inputs(2, 2, 4, 5, 3)
    bias = torch.randn(1, 2, 4, 5, dtype=torch.float64, requires_grad=True)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return al.scaled_dot_product_attention(q, k, v, b, is_causal=True, backend=backend)

    assert torch.autograd.gradcheck(f, (q, k, v, bias), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_with_dropout_is_consistent(backend: str) -> None:
    """With the RNG reseeded before each call the dropout mask is fixed, so the backward pass
    must be the derivative of the very forward pass that ran (the blockwise backend regenerates
    its keep-mask block by block)."""
    q, k, v = _inputs(2, 1, 5, 7, 4)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(1234)
        return al.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=0.4, backend=backend
        )

    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p", [0.2, 0.6])
def test_dropout_drops_weights_and_rescales(backend: str, p: float) -> None:
    """With ``V = I`` the output *is* the dropped weights: every entry is 0 or ``w / (1 − p)``, and
    the fraction dropped is ``p`` (within 4 standard deviations)."""
    b, h, t_q, t_k = 4, 4, 32, 48
    q = torch.randn(b, h, t_q, 8, dtype=torch.float64)
    k = torch.randn(b, h, t_k, 8, dtype=torch.float64)
    v = torch.eye(t_k, dtype=torch.float64).expand(b, h, t_k, t_k)
    _, w = attention_ref(q, k, v)
    out = al.scaled_dot_product_attention(q, k, v, dropout_p=p, backend=backend)
    kept = out != 0
    torch.testing.assert_close(out[kept], (w / (1 - p))[kept], atol=1e-12, rtol=0)
    n = out.numel()
    frac = 1 - kept.double().mean().item()
    assert abs(frac - p) < 4 * (p * (1 - p) / n) ** 0.5
    assert torch.allclose(out.mean(), w.mean(), atol=0.05 * float(w.mean()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_is_seeded_and_off_at_zero(backend: str) -> None:
    q = torch.randn(1, 2, 9, 8)
    torch.manual_seed(7)
    a = al.scaled_dot_product_attention(q, q, q, dropout_p=0.5, backend=backend)
    torch.manual_seed(7)
    b = al.scaled_dot_product_attention(q, q, q, dropout_p=0.5, backend=backend)
    c = al.scaled_dot_product_attention(q, q, q, dropout_p=0.5, backend=backend)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert not torch.equal(a, c)
    plain = al.scaled_dot_product_attention(q, q, q, dropout_p=0.0, backend=backend)
    ref, _ = attention_ref(q, q, q)
    torch.testing.assert_close(plain.double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_keeps_fully_masked_rows_zero(backend: str) -> None:
    q = torch.randn(1, 2, 6, 8, requires_grad=True)
    mask = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    mask[..., 2, :] = False
    out = al.scaled_dot_product_attention(q, q, q, mask, dropout_p=0.3, backend=backend)
    assert (out[:, :, 2] == 0).all() and torch.isfinite(out).all()
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_blockwise_dropout_backward_matches_its_own_mask() -> None:
    """Read the blockwise forward's keep-mask through ``V = I`` and check its q/k gradients against
    the float64 reference that uses that same mask (several query and key blocks)."""
    from attnlab.nn.backends.blockwise import blockwise_attention
    from attnlab.nn.mask_spec import Masking

    t_q, t_k = 40, 300
    q = torch.randn(1, 2, t_q, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, t_k, 8, dtype=torch.float64, requires_grad=True)
    v = torch.eye(t_k, dtype=torch.float64).expand(1, 2, t_k, t_k).contiguous()
    masking = Masking(None, None, t_k - t_q)
    out, _ = blockwise_attention(
        q, k, v, masking, 8**-0.5, 0.3, False, block_size=64, query_block=16
    )
    keep = out.detach() != 0
    ref, _ = attention_ref(q, k, v, is_causal=True, keep=keep, dropout_p=0.3)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    d_out = torch.randn_like(out)
    g = torch.autograd.grad(out, (q, k), d_out)
    g_ref = torch.autograd.grad(ref, (q, k), d_out)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
