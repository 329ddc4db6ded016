"""Bad input to the attention core and the modules: a ValueError/TypeError naming the argument
and saying what was expected and what was got."""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab import masks


def qkv(h: int = 4, h_kv: int = 2, t_q: int = 5, t_k: int = 7, d: int = 8, b: int = 2):
    return (
        torch.randn(b, h, t_q, d),
        torch.randn(b, h_kv, t_k, d),
        torch.randn(b, h_kv, t_k, d),
    )


def test_heads_not_a_multiple() -> None:
    q, k, v = qkv(h=4, h_kv=3)
    with pytest.raises(
        ValueError, match=r"query heads H = 4 must be a multiple of key/value heads H_kv = 3"
    ):
        al.scaled_dot_product_attention(q, k, v)


def test_rank_mismatch() -> None:
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"same rank.*\(2, 4, 5, 8\).*\(2, 7, 8\)"):
        al.scaled_dot_product_attention(q, k[:, 0], v)


def test_too_few_dims() -> None:
    with pytest.raises(
        ValueError, match=r"query must have shape \(\.\.\., H, T, D\).*got \(5, 8\)"
    ):
        al.scaled_dot_product_attention(torch.randn(5, 8), torch.randn(5, 8), torch.randn(5, 8))


def test_batch_mismatch() -> None:
    q, _, v = qkv()
    with pytest.raises(ValueError, match=r"leading \(batch\) dims, got \(2,\), \(3,\) and \(2,\)"):
        al.scaled_dot_product_attention(q, torch.randn(3, 2, 7, 8), v)


def test_head_dim_mismatch() -> None:
    q, _, v = qkv()
    with pytest.raises(ValueError, match=r"query and key head dims must match, got D = 8 and 6"):
        al.scaled_dot_product_attention(q, torch.randn(2, 2, 7, 6), v)


def test_key_value_length_mismatch() -> None:
    q, k, _ = qkv()
    with pytest.raises(
        ValueError,
        match=r"key and value must have the same heads and length.*\(2, 7\) and \(2, 6\)",
    ):
        al.scaled_dot_product_attention(q, k, torch.randn(2, 2, 6, 8))


def test_dtype_mismatch() -> None:
    q, k, v = qkv()
    with pytest.raises(
        TypeError, match=r"share a dtype, got torch.float32, torch.float64 and torch.float32"
    ):
        al.scaled_dot_product_attention(q, k.double(), v)


def test_integer_inputs() -> None:
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"query must have a floating dtype, got torch.int64"):
        al.scaled_dot_product_attention(q.long(), k, v)


def test_not_a_tensor() -> None:
    _, k, v = qkv()
    with pytest.raises(TypeError, match=r"query must be a torch.Tensor, got list"):
        al.scaled_dot_product_attention([1.0], k, v)  # type: ignore[arg-type]


def test_device_mismatch() -> None:
    q, k, v = qkv()
    meta = torch.empty(k.shape, device="meta")
    with pytest.raises(
        (ValueError, TypeError), match=r"one device, got cpu, meta and cpu|share a dtype"
    ):
        al.scaled_dot_product_attention(q, meta, v)


def test_mask_device_mismatch() -> None:
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"mask must be on the query's device cpu, got meta"):
        al.scaled_dot_product_attention(q, k, v, torch.ones(5, 7, dtype=torch.bool, device="meta"))


def test_query_heads_without_key_heads() -> None:
    q, k = torch.randn(2, 2, 5, 8), torch.randn(2, 0, 5, 8)
    with pytest.raises(ValueError, match=r"query heads H = 2 need key/value heads, got H_kv = 0"):
        al.scaled_dot_product_attention(q, k, k)


@pytest.mark.parametrize("shape", [(2, 7), (5, 6), (3, 4, 5, 7), (1, 1, 1, 5, 7)])
def test_mask_does_not_broadcast(shape: tuple[int, ...]) -> None:
    q, k, v = qkv()
    mask = torch.ones(shape, dtype=torch.bool)
    with pytest.raises(
        ValueError,
        match=r"mask has shape .* but must broadcast to \(\.\.\., H, T_q, T_k\) = \(2, 4, 5, 7\)",
    ):
        al.scaled_dot_product_attention(q, k, v, mask)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64])
def test_integer_masks_refused(dtype: torch.dtype) -> None:
    q, k, v = qkv()
    with pytest.raises(
        TypeError,
        match=rf"mask must be bool \(True = may attend\) or floating \(additive\), got dtype {dtype}",
    ):
        al.scaled_dot_product_attention(q, k, v, torch.ones(5, 7, dtype=dtype))


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_dropout_out_of_range(p: float) -> None:
    q, k, v = qkv()
    with pytest.raises(ValueError, match=rf"dropout_p must be in \[0, 1\), got {p}"):
        al.scaled_dot_product_attention(q, k, v, dropout_p=p)


def test_dropout_wrong_type() -> None:
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"dropout_p must be a float in \[0, 1\), got str"):
        al.scaled_dot_product_attention(q, k, v, dropout_p="0.1")  # type: ignore[arg-type]


def test_unknown_backend() -> None:
    q, k, v = qkv()
    with pytest.raises(
        ValueError,
        match=r"backend must be one of 'auto', 'math', 'sdpa', 'blockwise'(, '\w+')*, got 'flash'",
    ):
        al.scaled_dot_product_attention(q, k, v, backend="flash")  # type: ignore[arg-type]


def test_bad_scale_and_is_causal() -> None:
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"scale must be a float or None, got str"):
        al.scaled_dot_product_attention(q, k, v, scale="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"is_causal must be a bool, got int"):
        al.scaled_dot_product_attention(q, k, v, is_causal=1)  # type: ignore[arg-type]


# -- modules and masks --


def test_d_model_not_divisible() -> None:
    with pytest.raises(ValueError, match=r"d_model = 30 must be divisible by num_heads = 4"):
        al.MultiHeadAttention(30, 4)


def test_num_heads_not_multiple_of_kv_heads() -> None:
    with pytest.raises(ValueError, match=r"num_heads = 8 must be a multiple of num_kv_heads = 3"):
        al.MultiHeadAttention(64, 8, num_kv_heads=3)


@pytest.mark.parametrize("arg", ["d_model", "num_heads"])
def test_non_positive_sizes(arg: str) -> None:
    kwargs = {"d_model": 16, "num_heads": 4, arg: 0}
    with pytest.raises(ValueError, match=rf"{arg} must be a positive int, got 0"):
        al.MultiHeadAttention(kwargs["d_model"], kwargs["num_heads"])


def test_module_dropout_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1.0"):
        al.MultiHeadAttention(16, 4, dropout=1.0)


def test_module_input_shape() -> None:
    mha = al.MultiHeadAttention(16, 4)
    with pytest.raises(
        ValueError, match=r"query must have shape \(B, T, d_model=16\), got \(2, 5, 12\)"
    ):
        mha(torch.randn(2, 5, 12))
    with pytest.raises(ValueError, match=r"query and key batch sizes differ: 2 vs 3"):
        mha(torch.randn(2, 5, 16), torch.randn(3, 4, 16))


def test_module_mask_does_not_broadcast() -> None:
    mha = al.MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match=r"mask has shape \(2, 6\) but must broadcast"):
        mha(torch.randn(2, 5, 16), mask=torch.ones(2, 6, dtype=torch.bool))


def test_kv_cache_capacity() -> None:
    mha = al.MultiHeadAttention(16, 4, num_kv_heads=2)
    cache = al.KVCache(1, 2, capacity=6, d_head=4)
    mha(torch.randn(1, 4, 16), cache=cache, is_causal=True)
    with pytest.raises(
        ValueError, match=r"KV cache capacity exceeded: it holds 4 of 6 positions and 3 more"
    ):
        mha(torch.randn(1, 3, 16), cache=cache, is_causal=True)
    assert cache.length == 4  # the failed step left the cache as it was


def test_mask_builders_reject_bad_input() -> None:
    with pytest.raises(ValueError, match=r"tokens must have shape \(B, T\), got \(5,\)"):
        masks.padding_mask(torch.tensor([1, 2, 0, 0, 3]), 0)
    with pytest.raises(
        TypeError, match=r"tokens must be integer token ids, got dtype torch.float32"
    ):
        masks.padding_mask(torch.zeros(1, 3), 0)
    with pytest.raises(ValueError, match=r"q_len must be a positive int, got 0"):
        masks.causal_mask(0)
    with pytest.raises(TypeError, match=r"mask must be bool or floating, got dtype torch.int64"):
        masks.to_additive(torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match=r"dtype must be a floating torch.dtype, got torch.int32"):
        masks.to_additive(torch.ones(2, 2, dtype=torch.bool), torch.int32)
    with pytest.raises(ValueError, match=r"masks do not broadcast together: \(2, 3\), \(4,\)"):
        masks.combine(torch.ones(2, 3, dtype=torch.bool), torch.ones(4, dtype=torch.bool))
    with pytest.raises(
        TypeError, match=r"masks\[1\] must be bool or floating, got dtype torch.uint8"
    ):
        masks.combine(torch.ones(2, dtype=torch.bool), torch.ones(2, dtype=torch.uint8))
    with pytest.raises(
        ValueError, match=r"key_padding_mask must have shape \(B, T_k\), got \(3,\)"
    ):
        masks.from_key_padding_mask(torch.zeros(3, dtype=torch.bool))
    with pytest.raises(
        TypeError, match=r"key_padding_mask must be bool or floating, got dtype torch.uint8"
    ):
        masks.from_key_padding_mask(torch.zeros(1, 3, dtype=torch.uint8))


def test_positional_bad_input() -> None:
    with pytest.raises(ValueError, match=r"d_head must be even for rotary embeddings, got 7"):
        al.RotaryEmbedding(7)
    rope = al.RotaryEmbedding(8, max_len=16)
    with pytest.raises(ValueError, match=r"x has head dim 6, expected d_head = 8"):
        rope(torch.randn(1, 1, 3, 6), torch.arange(3))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 16\).*got values up to 16"):
        rope(torch.randn(1, 1, 3, 8), torch.tensor([14, 15, 16]))
    with pytest.raises(TypeError, match=r"positions must be integer ids, got dtype torch.float32"):
        rope(torch.randn(1, 1, 3, 8), torch.zeros(3))
    with pytest.raises(ValueError, match=r"num_heads must be a positive int, got 0"):
        al.alibi_slopes(0)


def test_fast_checks_refuse_what_the_full_checks_refuse() -> None:
    """The one-pass check of the usual call lets through only what the full checks accept:
    an unhashable backend, a bool or a tensor dropout_p, an int 0 and every malformed q/k/v
    still get the typed errors (or pass, for int 0) of the full checks."""
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"backend must be one of"):
        al.scaled_dot_product_attention(q, k, v, backend=["sdpa"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"dropout_p must be a float in \[0, 1\), got bool"):
        al.scaled_dot_product_attention(q, k, v, dropout_p=False)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"dropout_p must be a float in \[0, 1\), got Tensor"):
        al.scaled_dot_product_attention(q, k, v, dropout_p=torch.tensor(0.0))  # type: ignore[arg-type]
    torch.testing.assert_close(
        al.scaled_dot_product_attention(q, k, v, dropout_p=0),
        al.scaled_dot_product_attention(q, k, v, dropout_p=0.0),
    )
    bad = [
        ((q, k.double(), v), TypeError, "share a dtype"),
        ((q.long(), k.long(), v.long()), TypeError, "floating dtype"),
        ((q[0], k, v), ValueError, "same rank"),
        ((q, k[:, :, :, :4], v), ValueError, "head dims must match"),
        ((q, k, v[:, :, :3]), ValueError, "same heads and length"),
        ((q, k[:, :0], v[:, :0]), ValueError, "need key/value heads"),
        ((q[:1], k, v), ValueError, "share leading"),
    ]
    for args, error, message in bad:
        with pytest.raises(error, match=message):
            al.scaled_dot_product_attention(*args)
