"""attnlab.masks: the one place masks are built."""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab import masks


def test_padding_mask() -> None:
    tokens = torch.tensor([[5, 6, 0], [7, 0, 0]])
    m = masks.padding_mask(tokens, pad_id=0)
    assert m.shape == (2, 1, 1, 3) and m.dtype == torch.bool
    assert m.squeeze().tolist() == [[True, True, False], [True, False, False]]


def test_causal_mask_bottom_right() -> None:
    assert masks.causal_mask(3).int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert masks.causal_mask(2, 4).int().tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert masks.causal_mask(3, 2).int().tolist() == [
        [0, 0],
        [1, 0],
        [1, 1],
    ]  # top row sees nothing
    assert masks.causal_mask(1, 5).all()  # a decoding step sees the whole cache


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_to_additive_is_finite_and_dtype_safe(dtype: torch.dtype) -> None:
    allowed = torch.tensor([[True, False, True]])
    bias = masks.to_additive(allowed, dtype)
    assert bias.dtype == dtype and torch.isfinite(bias).all()
    assert bias.tolist() == [[0.0, torch.finfo(dtype).min, 0.0]]
    # -inf in a floating mask becomes the finite minimum; hidden stays hidden; a value below
    # the target dtype's range (-1e30 in fp16) clamps to the minimum and becomes hidden
    f = masks.to_additive(torch.tensor([0.5, float("-inf"), -1e30]), dtype)
    assert torch.isfinite(f).all()
    assert masks.is_masked_bias(f).tolist() == [False, True, dtype == torch.float16]


def test_to_additive_gives_zero_rows_in_attention() -> None:
    """A row hidden by ``to_additive`` gives zeros like a boolean mask, not a uniform average."""
    allowed = torch.ones(4, 4, dtype=torch.bool)
    allowed[1] = False
    q = torch.randn(1, 1, 4, 8)
    for dtype in (torch.float16, torch.float32):
        out = al.scaled_dot_product_attention(
            q.to(dtype), q.to(dtype), q.to(dtype), masks.to_additive(allowed, dtype)
        )
        assert (out[..., 1, :] == 0).all() and torch.isfinite(out).all()


def test_combine_bool_and_float() -> None:
    pad = masks.padding_mask(torch.tensor([[1, 2, 0]]), 0)  # (1, 1, 1, 3)
    causal = masks.causal_mask(3)
    both = masks.combine(pad, causal, None)
    assert both.shape == (1, 1, 3, 3) and both.dtype == torch.bool
    assert both[0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 0]]
    bias = torch.full((3, 3), 0.5)
    f = masks.combine(both, bias)
    assert f.dtype == torch.float32
    hidden = masks.is_masked_bias(f)
    assert (hidden == ~both).all()
    assert (f[~hidden] == 0.5).all()
    assert masks.combine() is None and masks.combine(None) is None


def test_from_key_padding_mask_flips_polarity() -> None:
    kpm = torch.tensor([[False, False, True]])  # True = ignore
    m = masks.from_key_padding_mask(kpm)
    assert m.shape == (1, 1, 1, 3) and m.squeeze().tolist() == [True, True, False]
    f = masks.from_key_padding_mask(torch.tensor([[0.0, float("-inf")]]))
    assert f.shape == (1, 1, 1, 2) and f.dtype == torch.float32
