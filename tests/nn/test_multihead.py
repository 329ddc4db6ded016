"""MultiHeadAttention: parity with torch.nn.MultiheadAttention, GQA/MQA, caches, hooks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnlab as al
from attnlab import masks
from tests.reference import attention_ref

TOL = {torch.float64: 1e-12, torch.float32: 2e-5}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("backend", ["math", "sdpa", "blockwise", "auto"])
@pytest.mark.parametrize("cross", [False, True])
def test_from_torch_matches_torch(dtype: torch.dtype, backend: str, cross: bool) -> None:
    """Same outputs and (head-averaged) weights as ``nn.MultiheadAttention`` with its masks converted."""
    ref = nn.MultiheadAttention(32, 4, batch_first=True, dtype=dtype).eval()
    with torch.no_grad():  # non-zero biases so that every parameter matters
        ref.in_proj_bias.normal_()
        ref.out_proj.bias.normal_()
    mha = al.MultiHeadAttention.from_torch(ref, backend=backend).eval()
    b, t_q, t_k = 3, 5, 7 if cross else 5
    x = torch.randn(b, t_q, 32, dtype=dtype)
    y = torch.randn(b, t_k, 32, dtype=dtype) if cross else x
    kpm = torch.zeros(b, t_k, dtype=torch.bool)
    kpm[1, -2:] = True  # True = ignore (torch's polarity)
    attn_mask = torch.zeros(t_q, t_k, dtype=torch.bool)
    attn_mask[0, 1] = True
    want, want_w = ref(x, y, y, key_padding_mask=kpm, attn_mask=attn_mask, need_weights=True)
    mask = masks.combine(masks.from_key_padding_mask(kpm), ~attn_mask)
    got, got_w = mha(x, y if cross else None, mask=mask, need_weights=True)
    tol = TOL[dtype]
    torch.testing.assert_close(got, want, atol=tol, rtol=0)
    assert got_w.shape == (b, 4, t_q, t_k)
    torch.testing.assert_close(got_w.mean(dim=1), want_w, atol=tol, rtol=0)
    # a float attn_mask converts as is (additive), and the float key_padding_mask too
    fmask = torch.randn(t_q, t_k, dtype=dtype)
    fkpm = torch.zeros(b, t_k, dtype=dtype).masked_fill(kpm, float("-inf"))
    want = ref(x, y, y, key_padding_mask=fkpm, attn_mask=fmask, need_weights=False)[0]
    got = mha(x, y if cross else None, mask=masks.combine(masks.from_key_padding_mask(fkpm), fmask))
    torch.testing.assert_close(got, want, atol=tol, rtol=0)


def test_from_torch_causal_and_gradients() -> None:
    ref = nn.MultiheadAttention(16, 2, batch_first=True, dtype=torch.float64)
    mha = al.MultiHeadAttention.from_torch(ref, backend="blockwise")
    x = torch.randn(2, 6, 16, dtype=torch.float64, requires_grad=True)
    causal = nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.float64)
    want = ref(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)[0]
    got = mha(x, is_causal=True)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    g_want = torch.autograd.grad(want.sum(), (x, ref.in_proj_weight))
    g_got = torch.autograd.grad(got.sum(), (x, mha.in_proj_weight))
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=0)


def test_from_torch_refuses_unsupported() -> None:
    with pytest.raises(ValueError, match=r"batch_first=True.*got batch_first=False"):
        al.MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2))
    with pytest.raises(ValueError, match=r"kdim == vdim == embed_dim"):
        al.MultiHeadAttention.from_torch(
            nn.MultiheadAttention(8, 2, kdim=4, vdim=4, batch_first=True)
        )
    with pytest.raises(ValueError, match=r"add_bias_kv or add_zero_attn"):
        al.MultiHeadAttention.from_torch(
            nn.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True)
        )
    with pytest.raises(TypeError, match=r"must be a torch.nn.MultiheadAttention, got Linear"):
        al.MultiHeadAttention.from_torch(nn.Linear(2, 2))  # type: ignore[arg-type]


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_grouped_query_heads_match_manual(num_kv_heads: int) -> None:
    """GQA/MQA: the module equals projections + the float64 reference with shared K/V heads."""
    torch.manual_seed(1)
    mha = al.MultiHeadAttention(32, 4, num_kv_heads=num_kv_heads, dtype=torch.float64)
    d_kv = num_kv_heads * 8
    assert mha.in_proj_weight.shape == (32 + 2 * d_kv, 32)
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    w, bias = mha.in_proj_weight, mha.in_proj_bias
    qkv = x @ w.T + bias
    q, k, v = qkv.split([32, d_kv, d_kv], dim=-1)
    q = q.unflatten(-1, (4, 8)).transpose(1, 2)
    k = k.unflatten(-1, (num_kv_heads, 8)).transpose(1, 2)
    v = v.unflatten(-1, (num_kv_heads, 8)).transpose(1, 2)
    z, _ = attention_ref(q, k, v, is_causal=True)
    want = mha.out_proj(z.transpose(1, 2).reshape(2, 6, 32))
    torch.testing.assert_close(mha(x, is_causal=True), want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("num_kv_heads", [4, 1])
@pytest.mark.parametrize("backend", ["math", "sdpa", "blockwise"])
def test_kv_cache_steps_equal_full_pass(num_kv_heads: int, backend: str) -> None:
    """Decoding token by token with a KV cache gives the causal full-sequence outputs."""
    mha = al.MultiHeadAttention(
        32, 4, num_kv_heads=num_kv_heads, backend=backend, dtype=torch.float64
    )
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    full = mha(x, is_causal=True)
    cache = al.KVCache(2, num_kv_heads, capacity=8, d_head=8, dtype=torch.float64)
    first = mha(x[:, :3], is_causal=True, cache=cache)
    steps = [first] + [mha(x[:, t : t + 1], is_causal=True, cache=cache) for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-12, rtol=0)
    assert cache.length == 7


def test_rotary_with_cache_equals_full_pass() -> None:
    rope = al.RotaryEmbedding(8, max_len=32)
    mha = al.MultiHeadAttention(16, 2, rotary=rope, dtype=torch.float64)
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    full = mha(x, is_causal=True)
    cache = al.KVCache(1, 2, capacity=5, d_head=8, dtype=torch.float64)
    steps = [mha(x[:, t : t + 1], is_causal=True, cache=cache) for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-12, rtol=0)
    plain = al.MultiHeadAttention(16, 2, dtype=torch.float64)
    plain.load_state_dict(mha.state_dict())
    assert not torch.allclose(plain(x, is_causal=True), full)  # the rotation did something


def test_cross_attention_static_cache_is_reused() -> None:
    mha = al.MultiHeadAttention(16, 2, dtype=torch.float64)
    memory = torch.randn(2, 9, 16, dtype=torch.float64)
    tgt = torch.randn(2, 4, 16, dtype=torch.float64)
    full = mha(tgt, memory)
    cache = al.CrossKVCache(2, 2, capacity=9, d_head=8, dtype=torch.float64)
    a = mha(tgt[:, :2], memory, cache=cache)
    b = mha(tgt[:, 2:], memory, cache=cache)
    torch.testing.assert_close(torch.cat([a, b], dim=1), full, atol=1e-12, rtol=0)
    assert cache.filled and cache.length == 9


def test_no_bias_and_dropout_in_training_only() -> None:
    mha = al.MultiHeadAttention(16, 2, bias=False, dropout=0.5)
    assert mha.in_proj_bias is None and mha.out_proj.bias is None
    x = torch.randn(2, 6, 16)
    mha.eval()
    torch.testing.assert_close(mha(x), mha(x), atol=0, rtol=0)
    mha.train()
    assert not torch.allclose(mha(x), mha(x))


def test_hooks_see_activations_without_changing_output() -> None:
    mha = al.MultiHeadAttention(16, 4, num_kv_heads=2).eval()
    x = torch.randn(2, 5, 16)
    before = mha(x, is_causal=True)
    seen: dict[str, torch.Tensor] = {}
    handles = [
        getattr(mha, name).register_forward_hook(lambda m, i, o, n=name: seen.__setitem__(n, o))
        for name in ("hook_q", "hook_k", "hook_v", "hook_weights", "hook_z")
    ]
    after = mha(x, is_causal=True)
    for h in handles:
        h.remove()
    torch.testing.assert_close(after, before, atol=0, rtol=0)
    assert seen["hook_q"].shape == (2, 4, 5, 4)
    assert seen["hook_k"].shape == (2, 2, 5, 4)
    assert seen["hook_weights"].shape == (2, 4, 5, 5)
    assert seen["hook_z"].shape == (2, 4, 5, 4)
    torch.testing.assert_close(seen["hook_weights"].sum(-1), torch.ones(2, 4, 5))
    assert (seen["hook_weights"].triu(1) == 0).all()
