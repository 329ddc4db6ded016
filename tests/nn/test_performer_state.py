"""The running state of causal FAVOR+ (issue 12): ``PerformerState`` and ``favor_attention(...,
state=)`` against the prefix-sum form, the running stabiliser, masks, GQA/MQA, reorder, constant
memory, dtypes, the features it is tied to, and the errors."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.nn.kv_cache import KVCache, ModelCache, PerformerState
from attnlab.nn.performer import PerformerAttention, favor_attention, orthogonal_random_features

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _qkv(seed: int, b=2, h=4, h_kv=2, t=13, d=8, d_v=5, dtype=F64):
    g = _gen(seed)
    q = torch.randn(b, h, t, d, generator=g, dtype=dtype)
    k = torch.randn(b, h_kv, t, d, generator=g, dtype=dtype)
    v = torch.randn(b, h_kv, t, d_v, generator=g, dtype=dtype)
    w = orthogonal_random_features(24, d, generator=g, dtype=dtype)
    return q, k, v, w


def _in_blocks(q, k, v, w, sizes, *, keep=None, chunk=128, state=None):
    """Run the sequence through a state in blocks of ``sizes`` positions."""
    b, _, t, _ = q.shape
    if state is None:
        state = PerformerState(b, k.shape[1], t, w.shape[0], v.shape[-1], dtype=F64)
    outs, i = [], 0
    for n in sizes:
        mask = None if keep is None else keep[..., i : i + n]
        outs.append(
            favor_attention(
                q[:, :, i : i + n],
                k[:, :, i : i + n],
                v[:, :, i : i + n],
                w,
                True,
                mask=mask,
                state=state,
                chunk_size=chunk,
            )
        )
        i += n
    assert i == t and state.length == t
    return torch.cat(outs, dim=2), state


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("sizes", [[13], [1] * 13, [5, 1, 1, 4, 2]])
@pytest.mark.parametrize("chunk", [2, 128])
def test_blocks_through_the_state_equal_the_prefix_sums(kv_heads, sizes, chunk) -> None:
    """A prompt, then one token at a time (or blocks) through the state == the causal prefix-sum
    form over the whole sequence, float64 (MHA, GQA, MQA; chunked or not)."""
    q, k, v, w = _qkv(0, h_kv=kv_heads)
    want = favor_attention(q, k, v, w, is_causal=True)
    got, state = _in_blocks(q, k, v, w, sizes, chunk=chunk)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)
    assert state.s.shape == (2, kv_heads, 24, 5) and state.z.shape == (2, kv_heads, 24)


def test_left_padding_and_nan_in_padding() -> None:
    """Masked keys contribute nothing (whatever they hold); a row whose keys so far are all masked
    keeps zero sums and gives zero outputs, never NaN."""
    q, k, v, w = _qkv(1, b=3)
    keep = torch.ones(3, 1, 1, 13, dtype=torch.bool)
    keep[1, ..., :4] = False
    keep[2, ..., :9] = False
    k2, v2 = k.clone(), v.clone()
    k2[1, :, :4], v2[1, :, :4] = float("nan"), 1e6
    want = favor_attention(q, k, v, w, True, mask=keep)
    got, _ = _in_blocks(q, k2, v2, w, [6, 1, 1, 1, 1, 3], keep=keep)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[1:, :, 4:][0], want[1, :, 4:], atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(got[0], want[0], atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(got[2, :, 9:], want[2, :, 9:], atol=1e-12, rtol=1e-10)
    assert torch.equal(got[2, :, :9], torch.zeros_like(got[2, :, :9]))  # sees no key yet
    # the padded row equals its unpadded keys alone
    alone, _ = _in_blocks(q[1:2, :, 4:], k[1:2, :, 4:], v[1:2, :, 4:], w, [3, 1, 1, 1, 1, 2])
    torch.testing.assert_close(got[1:2, :, 4:], alone, atol=1e-12, rtol=1e-10)
    # a state that saw only masked keys
    empty = PerformerState(1, 2, 4, 24, 5, dtype=F64)
    none = torch.zeros(1, 1, 1, 2, dtype=torch.bool)
    out = favor_attention(q[:1, :, :2], k[:1, :, :2], v[:1, :, :2], w, True, mask=none, state=empty)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(empty.s, torch.zeros_like(empty.s))
    assert torch.isinf(empty.c).all() and empty.length == 2


def test_running_stabiliser_rescales_the_sums() -> None:
    """Keys whose exponents grow along the sequence move the stabiliser c at each step: the sums
    stay e^{−c} Σ φ(k_j) v_jᵀ with c the largest exponent so far (no overflow: every term ≤ 1/√m),
    and the outputs those of the prefix-sum form."""
    q, k, v, w = _qkv(2, h_kv=1, t=12)
    k = k * torch.linspace(0.2, 3.0, 12, dtype=F64)[:, None]  # exponents grow with j
    m = w.shape[0]
    state = PerformerState(2, 1, 12, m, 5, dtype=F64)
    scale = 8**-0.5
    x = k * math.sqrt(scale)
    logits = x @ w.T - x.square().sum(-1, keepdim=True) / 2  # (B, 1, T, m)
    for i in range(12):
        favor_attention(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], w, True,
                        state=state)  # fmt: skip
        c = logits[:, :, : i + 1].amax(dim=(-2, -1))  # the running maximum
        torch.testing.assert_close(state.c, c)
        phi = torch.exp(logits[:, :, : i + 1] - c[..., None, None]) / math.sqrt(m)
        torch.testing.assert_close(state.s, phi.transpose(-2, -1) @ v[:, :, : i + 1])
        torch.testing.assert_close(state.z, phi.sum(-2))
        assert state.z.max() <= (i + 1) / math.sqrt(m)
    assert (state.c[:, 0] > logits[:, :, :6].amax(dim=(-3, -2, -1))).all()  # it did move
    got, _ = _in_blocks(q, k, v, w, [1] * 12)
    torch.testing.assert_close(got, favor_attention(q, k, v, w, True), atol=1e-12, rtol=1e-10)


def test_memory_is_constant_in_the_number_of_tokens() -> None:
    """O(1) memory: the sums keep their shapes and bytes after any number of tokens, and do not
    depend on the capacity (unlike a KV cache, which grows with it)."""
    q, k, v, w = _qkv(3, t=1)
    state = PerformerState(2, 2, 10_000, 24, 5, dtype=F64)
    small = PerformerState(2, 2, 10, 24, 5, dtype=F64)
    shapes, size = (state.s.shape, state.z.shape, state.c.shape), state.nbytes()
    assert size == small.nbytes() == 8 * 2 * 2 * (24 * 5 + 24 + 1)
    for _ in range(300):
        favor_attention(q, k, v, w, True, state=state)
        assert (state.s.shape, state.z.shape, state.c.shape) == shapes
    assert state.nbytes() == size and state.length == 300
    kv = KVCache(2, 2, 10_000, 8)
    assert ModelCache([state, state]).nbytes() == 2 * size < kv.nbytes()


def test_reorder_selects_rows() -> None:
    q, k, v, w = _qkv(4, b=3, t=8)
    state = PerformerState(3, 2, 8, 24, 5, dtype=F64)
    favor_attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], w, True, state=state)
    index = torch.tensor([2, 0, 2])
    ModelCache([state]).reorder(index)
    assert state.batch == 3
    rest = favor_attention(q[index, :, 5:], k[index, :, 5:], v[index, :, 5:], w, True, state=state)
    want = favor_attention(q[index], k[index], v[index], w, True)[:, :, 5:]
    torch.testing.assert_close(rest, want, atol=1e-12, rtol=1e-10)


def test_half_inputs_with_float32_sums() -> None:
    """Half-precision activations read a float32 state; the output keeps the input's dtype."""
    q, k, v, w = _qkv(5, dtype=torch.float32)
    state = PerformerState(2, 2, 13, 24, 5)
    got, _ = _in_blocks(q.bfloat16(), k.bfloat16(), v.bfloat16(), w, [4] + [1] * 9, state=state)
    assert got.dtype == torch.bfloat16 and state.s.dtype == torch.float32
    want = favor_attention(q.double(), k.double(), v.double(), w.double(), True)
    assert (got.double() - want).abs().max() < 0.05


def test_layer_decodes_and_never_redraws_with_a_cache() -> None:
    torch.manual_seed(6)
    layer = PerformerAttention(16, 4, num_kv_heads=2, num_features=12, causal=True,
                               redraw_interval=1, dtype=F64)  # fmt: skip
    x = torch.randn(2, 9, 16, dtype=F64)
    keep = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    keep[0, ..., :3] = False
    layer.eval()
    want = layer(x, mask=keep)
    layer.train()  # a redraw before every call without a cache; none with one
    features, calls = layer.features.clone(), int(layer.calls_since_redraw)
    state = PerformerState(2, 2, 9, 12, 4, dtype=F64)
    outs = [layer(x[:, :4], mask=keep[..., :4], cache=state)]
    for i in range(4, 9):
        outs.append(layer(x[:, i : i + 1], mask=keep[..., : i + 1], cache=state))
    assert torch.equal(layer.features, features) and int(layer.calls_since_redraw) == calls
    got = torch.cat(outs, 1)
    torch.testing.assert_close(got[1], want[1], atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(got[0, 3:], want[0, 3:], atol=1e-12, rtol=1e-10)
    # a redraw since the state was filled is refused
    layer.redraw_features(generator=_gen(0))
    with pytest.raises(ValueError, match="random features changed"):
        layer(x[:, :1], cache=state)
    fresh = PerformerState(2, 2, 9, 12, 4, dtype=F64)
    layer(x[:, :1], cache=fresh)  # a new state is fine
    layer.load_state_dict(layer.state_dict())  # writes the features: refused as well
    with pytest.raises(ValueError, match="random features changed"):
        layer(x[:, :1], cache=fresh)


def test_errors() -> None:
    torch.manual_seed(7)
    layer = PerformerAttention(16, 4, num_kv_heads=2, num_features=12, causal=True)
    x = torch.randn(2, 3, 16)
    state = PerformerState(2, 2, 5, 12, 4)
    with pytest.raises(ValueError, match="cache must be None or a PerformerState"):
        layer(x, cache=KVCache(2, 2, 5, 4))
    with pytest.raises(ValueError, match="key and value must be None with a PerformerState"):
        layer(x, torch.randn(2, 4, 16), cache=state)
    with pytest.raises(ValueError, match="is_causal must be True with a PerformerState"):
        layer(x, is_causal=False, cache=state)
    with pytest.raises(ValueError, match=r"weights .* are not available with a PerformerState"):
        layer(x, need_weights=True, cache=state)
    handle = layer.hook_weights.register_forward_hook(lambda mod, args, out: None)
    with pytest.raises(ValueError, match="are not available with a PerformerState"):
        layer(x, cache=state)
    handle.remove()
    with pytest.raises(ValueError, match=r"cache holds H_kv = 1 heads and m = 12 features"):
        layer(x, cache=PerformerState(2, 1, 5, 12, 4))
    with pytest.raises(ValueError, match=r"must broadcast to \(B, H, 1, T_past \+ T\)"):
        layer(x, mask=torch.ones(2, 1, 1, 7, dtype=torch.bool), cache=state)
    assert state.length == 0  # nothing was absorbed by the refused calls
    layer(x, cache=state)
    with pytest.raises(ValueError, match="PerformerState capacity exceeded: it took 3 of 5"):
        layer(x, cache=state)
    q, k, v, w = _qkv(8, t=4)
    st = PerformerState(2, 2, 9, 24, 5, dtype=F64)
    with pytest.raises(ValueError, match="T_q = 4 but T_k = 3"):
        favor_attention(q, k[:, :, :3], v[:, :, :3], w, True, state=st)
    with pytest.raises(ValueError, match=r"state holds \(B, H_kv, m, D_v\) = \(2, 2, 24, 5\)"):
        favor_attention(q, k, v, w[:10], True, state=st)
    per_head = torch.ones(2, 4, 1, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="it must have 1 or H_kv = 2 heads"):
        favor_attention(q, k, v, w, True, mask=per_head, state=st)
    with pytest.raises(ValueError, match="v has shape"):
        st.append(torch.zeros(2, 2, 3, 24, dtype=F64), torch.zeros(2, 2, 3, 4, dtype=F64))
    with pytest.raises(ValueError, match="num_features must be a positive int"):
        PerformerState(2, 2, 5, 0, 4)
    with pytest.raises(TypeError, match=r"dtype must be a floating torch\.dtype"):
        PerformerState(2, 2, 5, 3, 4, dtype=torch.long)
