"""The blockwise backend's two ways of computing a tile: PyTorch's fused CPU kernel per piece
(merged by log-sum-exp) and the online softmax written out in PyTorch. The pattern grids
(tests/nn/test_window.py, test_bigbird.py, test_attention*.py) run both; here: what only the fused
path has to get right — leading dims and mask layouts reshaped for the kernel, the log-sum-exp of
pieces that see nothing, the choice between the two, and its errors."""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab.nn.backends import fused_tiles
from attnlab.nn.backends.blockwise import blockwise_attention
from attnlab.nn.mask_spec import normalize_mask
from tests.reference import attention_ref

KERNELS = ["fused", "python"]


def _grads(out: torch.Tensor, inputs: tuple[torch.Tensor, ...], d_out: torch.Tensor) -> tuple:
    return torch.autograd.grad(out, inputs, d_out)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(
    "mask_shape", [None, (2, 1, 1, 1, 37), (3, 1, 29, 37), (29, 37), (2, 3, 4, 29, 37)]
)
@pytest.mark.parametrize("causal", [False, True])
def test_leading_dims_and_mask_layouts(
    kernel: str, mask_shape: tuple[int, ...] | None, causal: bool
) -> None:
    """Inputs ``(2, 3, H, T, D)`` and masks broadcast along any dim, boolean and additive, small
    tiles so that rows see nothing in some pieces; against float64 forward and backward."""
    gen = torch.Generator().manual_seed(1)
    shape_q, shape_k = (2, 3, 4, 29, 8), (2, 3, 2, 37, 8)  # GQA: 4 query heads, 2 kv heads
    q = torch.randn(shape_q, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(shape_k, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(shape_k, generator=gen, dtype=torch.float64, requires_grad=True)
    masks: list[torch.Tensor | None] = [None]
    if mask_shape is not None:
        hidden = torch.rand(mask_shape, generator=gen) < 0.3
        bias = torch.randn(mask_shape, generator=gen, dtype=torch.float64)
        masks = [~hidden, bias.masked_fill(hidden, float("-inf"))]
    d_out = torch.randn(2, 3, 4, 29, 8, generator=gen, dtype=torch.float64)
    for mask in masks:
        masking = normalize_mask(q, k, mask, causal)
        if masking.allowed is not None:  # rows that see nothing are the caller's business
            seen = masking.visible(29, 37, q.device)
            assert seen is not None
            if not seen.any(-1).all():
                continue
        out, _ = blockwise_attention(
            q, k, v, masking, 8**-0.5, 0.0, False, block_size=5, query_block=7, tile_kernel=kernel
        )
        ref, _ = attention_ref(q, k, v, mask, is_causal=causal)
        torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
        for g, g_ref in zip(_grads(out, (q, k, v), d_out), _grads(ref, (q, k, v), d_out)):
            torch.testing.assert_close(g, g_ref, atol=1e-12, rtol=0)


def test_a_piece_that_sees_nothing_has_no_weight() -> None:
    """The kernel returns ``L = 0`` for a row whose keys are all hidden; merged as such it would
    pull the row towards zero. A padding mask hiding the first keys of every row, in pieces of
    three keys, must give the float64 result."""
    q, k, v = (torch.randn(1, 2, 6, 4, dtype=torch.float64) for _ in range(3))
    allowed = torch.ones(6, 6, dtype=torch.bool)
    allowed[:, :3] = False
    masking = normalize_mask(q, k, allowed, False)
    out, _ = blockwise_attention(q, k, v, masking, 0.5, 0.0, False, block_size=3)
    ref, _ = attention_ref(q, k, v, allowed, scale=0.5)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_types_are_computed_in_fp32(dtype: torch.dtype) -> None:
    """Half inputs are upcast once: the fused tiles give the written-out path's fp32 result."""
    q, k, v = (torch.randn(1, 2, 70, 16).to(dtype) for _ in range(3))
    masking = normalize_mask(q, k, None, True)
    fused, _ = blockwise_attention(q, k, v, masking, 0.25, 0.0, False, tile_kernel="fused")
    python, _ = blockwise_attention(q, k, v, masking, 0.25, 0.0, False, tile_kernel="python")
    assert fused.dtype == dtype
    torch.testing.assert_close(fused.float(), python.float(), atol=1e-2, rtol=0)
    ref, _ = attention_ref(q.double(), k.double(), v.double(), is_causal=True, scale=0.25)
    err = (fused.double() - ref).abs().max()
    assert err <= 2 * (python.double() - ref).abs().max() + 1e-3


def test_auto_chooses_the_written_out_tiles_where_the_kernel_cannot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    original = fused_tiles.fused_tiles

    def spy(*args: object) -> object:
        calls.append("fused")
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr("attnlab.nn.backends.blockwise.fused_tiles", spy)
    q = torch.randn(1, 2, 9, 4, requires_grad=True)
    al.scaled_dot_product_attention(q, q, q, is_causal=True, backend="blockwise")
    assert calls == ["fused"]
    # dropout, a bias that needs its gradient, and D_v != D take the written-out tiles
    al.scaled_dot_product_attention(q, q, q, dropout_p=0.5, backend="blockwise")
    bias = torch.zeros(9, 9, requires_grad=True)
    al.scaled_dot_product_attention(q, q, q, bias, backend="blockwise").sum().backward()
    assert bias.grad is not None
    al.scaled_dot_product_attention(q, q, torch.randn(1, 2, 9, 3), backend="blockwise")
    assert calls == ["fused"]


def test_tile_kernel_errors() -> None:
    q = torch.randn(1, 1, 4, 4)
    masking = normalize_mask(q, q, None, False)
    with pytest.raises(ValueError, match="tile_kernel must be one of 'auto', 'fused', 'python'"):
        blockwise_attention(q, q, q, masking, 0.5, 0.0, False, tile_kernel="flash")
    with pytest.raises(ValueError, match=r"tile_kernel=.fused. needs .*dropout_p=0"):
        blockwise_attention(q, q, q, masking, 0.5, 0.1, False, tile_kernel="fused")
