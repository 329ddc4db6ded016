"""Feed-forward, encoder and decoder layers against references written from the equations.

The references below take the *same weights* as the modules and compute in a chosen dtype:
float64 is the reference, the module's own dtype is the baseline of the error rule
``err <= 2 · err_baseline + floor``. They are also used by tests/models/test_transformer.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab import masks
from attnlab.nn.hooks import HookPoint
from attnlab.nn.layers import DecoderLayer, EncoderLayer, FeedForward
from attnlab.nn.multihead import MultiHeadAttention
from tests.reference import assert_close_rule, attention_ref

D, H, FF = 16, 4, 32


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


# ---------------------------------------------------------------- references (same weights)


def _w(t: torch.Tensor | None, dt: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.detach().to(dt)


def ref_layer_norm(ln: nn.LayerNorm, x: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """LayerNorm(x) = (x − mean) / √(var + eps) · γ + β   (biased variance)."""
    x = x.to(dt)
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + ln.eps) * _w(ln.weight, dt) + _w(ln.bias, dt)


def ref_ffn(ff: FeedForward, x: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """FFN(x) = act(x W₁ᵀ + b₁) W₂ᵀ + b₂, act = ReLU or the exact (erf) GELU."""
    h = x.to(dt) @ _w(ff.linear1.weight, dt).T + _w(ff.linear1.bias, dt)
    if ff.activation == "relu":
        h = torch.clamp(h, min=0)
    else:
        h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
    return h @ _w(ff.linear2.weight, dt).T + _w(ff.linear2.bias, dt)


def ref_mha(
    mha: MultiHeadAttention,
    xq: torch.Tensor,
    xkv: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    dt: torch.dtype,
) -> torch.Tensor:
    """Concat(softmax(Q Kᵀ/√d_h + M) V) W^O + b^O with Q, K, V from ``in_proj_weight``."""
    w, b = _w(mha.in_proj_weight, dt), _w(mha.in_proj_bias, dt)
    d, kv, dh = mha.d_model, mha.num_kv_heads * mha.d_head, mha.d_head
    xq, xkv = xq.to(dt), xkv.to(dt)
    q = xq @ w[:d].T + b[:d]
    k = xkv @ w[d : d + kv].T + b[d : d + kv]
    v = xkv @ w[d + kv :].T + b[d + kv :]
    bsz, tq, tk = xq.shape[0], xq.shape[1], xkv.shape[1]
    q = q.view(bsz, tq, mha.num_heads, dh).transpose(1, 2)
    k = k.view(bsz, tk, mha.num_kv_heads, dh).transpose(1, 2)
    v = v.view(bsz, tk, mha.num_kv_heads, dh).transpose(1, 2)
    z, _ = attention_ref(q, k, v, mask, is_causal=is_causal, upcast=dt == torch.float64)
    z = z.to(dt).transpose(1, 2).reshape(bsz, tq, d)
    return z @ _w(mha.out_proj.weight, dt).T + _w(mha.out_proj.bias, dt)


def ref_encoder_layer(
    layer: EncoderLayer, x: torch.Tensor, mask: torch.Tensor | None, dt: torch.dtype
) -> torch.Tensor:
    """post-norm: x ← LN(x + Sublayer(x));  pre-norm: x ← x + Sublayer(LN(x))."""
    x = x.to(dt)

    def attn(h: torch.Tensor) -> torch.Tensor:
        return ref_mha(layer.self_attn, h, h, mask, False, dt)

    if layer.norm_first:
        x = x + attn(ref_layer_norm(layer.norm1, x, dt))
        return x + ref_ffn(layer.ff, ref_layer_norm(layer.norm2, x, dt), dt)
    x = ref_layer_norm(layer.norm1, x + attn(x), dt)
    return ref_layer_norm(layer.norm2, x + ref_ffn(layer.ff, x, dt), dt)


def ref_decoder_layer(
    layer: DecoderLayer,
    x: torch.Tensor,
    memory: torch.Tensor,
    self_mask: torch.Tensor | None,
    memory_mask: torch.Tensor | None,
    dt: torch.dtype,
) -> torch.Tensor:
    """Masked self-attention, cross-attention, FFN; each in the layer's residual form."""
    x, memory = x.to(dt), memory.to(dt)
    subs = [
        lambda h: ref_mha(layer.self_attn, h, h, self_mask, True, dt),
        lambda h: ref_mha(layer.cross_attn, h, memory, memory_mask, False, dt),
        lambda h: ref_ffn(layer.ff, h, dt),
    ]
    for sub, ln in zip(subs, (layer.norm1, layer.norm2, layer.norm3)):
        if layer.norm_first:
            x = x + sub(ref_layer_norm(ln, x, dt))
        else:
            x = ref_layer_norm(ln, x + sub(x), dt)
    return x


def _randomize(module: nn.Module) -> None:
    """Non-trivial LayerNorm and bias values, so that a wrong wiring cannot hide."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.3 * torch.randn_like(p))


# ---------------------------------------------------------------- feed-forward


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward_matches_equation(activation: str) -> None:
    ff = FeedForward(D, FF, activation=activation)
    _randomize(ff)
    x = torch.randn(3, 5, D)
    assert_close_rule(ff(x), ref_ffn(ff, x, torch.float64), ref_ffn(ff, x, torch.float32))
    # the two activations are really different functions: the test can fail
    ff.activation = "gelu" if activation == "relu" else "relu"  # type: ignore[assignment]
    assert (ff(x) - ref_ffn(ff, x, torch.float32)).abs().max() < 1e-5
    assert (ff(x).double() - ref_ffn(ff, x, torch.float64)).abs().max() < 1e-5
    ff.activation = activation  # type: ignore[assignment]
    ff_other = FeedForward(D, FF, activation=ff.activation)
    ff_other.load_state_dict(ff.state_dict())
    ff_other.activation = "gelu" if activation == "relu" else "relu"  # type: ignore[assignment]
    assert (ff(x) - ff_other(x)).abs().max() > 1e-3


def test_feed_forward_hooks_see_pre_and_post_activation() -> None:
    ff = FeedForward(D, FF, activation="relu")
    seen: dict[str, torch.Tensor] = {}
    ff.hook_pre.register_forward_hook(lambda m, a, o: seen.__setitem__("pre", o))
    ff.hook_post.register_forward_hook(lambda m, a, o: seen.__setitem__("post", o))
    ff(torch.randn(2, 3, D))
    assert seen["pre"].shape == (2, 3, FF)
    torch.testing.assert_close(seen["post"], F.relu(seen["pre"]))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"activation": "tanh"}, "activation"),
        ({"dropout": 1.0}, "dropout"),
        ({"d_ff": 0}, "d_ff"),
    ],
)
def test_feed_forward_bad_arguments_name_the_argument(kwargs: dict, name: str) -> None:
    args = {"d_model": D, "d_ff": FF, **kwargs}
    with pytest.raises(ValueError, match=name):
        FeedForward(args.pop("d_model"), args.pop("d_ff"), **args)


# ---------------------------------------------------------------- encoder layer


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_reference(norm_first: bool, activation: str) -> None:
    layer = EncoderLayer(D, H, FF, norm_first=norm_first, activation=activation).eval()
    _randomize(layer)
    x = torch.randn(2, 7, D)
    mask = masks.padding_mask(torch.tensor([[5] * 7, [5] * 4 + [0] * 3]), 0)
    got = layer(x, mask)
    assert_close_rule(
        got,
        ref_encoder_layer(layer, x, mask, torch.float64),
        ref_encoder_layer(layer, x, mask, torch.float32),
    )
    # float64 module: the same equations to rounding
    layer64 = layer.double()
    ref = ref_encoder_layer(layer64, x, mask, torch.float64)
    torch.testing.assert_close(layer64(x.double(), mask), ref, atol=1e-12, rtol=1e-12)
    # the other wiring gives something else: the test can tell them apart
    layer64.norm_first = not norm_first
    assert (ref_encoder_layer(layer64, x, mask, torch.float64) - ref).abs().max() > 1e-2


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_torch(norm_first: bool) -> None:
    """The same weights in ``torch.nn.TransformerEncoderLayer`` give the same output."""
    layer = EncoderLayer(D, H, FF, norm_first=norm_first).eval()
    _randomize(layer)
    ref = nn.TransformerEncoderLayer(
        D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first
    ).eval()
    with torch.no_grad():
        ref.self_attn.in_proj_weight.copy_(layer.self_attn.in_proj_weight)
        ref.self_attn.in_proj_bias.copy_(layer.self_attn.in_proj_bias)
        ref.self_attn.out_proj.load_state_dict(layer.self_attn.out_proj.state_dict())
        ref.linear1.load_state_dict(layer.ff.linear1.state_dict())
        ref.linear2.load_state_dict(layer.ff.linear2.state_dict())
        ref.norm1.load_state_dict(layer.norm1.state_dict())
        ref.norm2.load_state_dict(layer.norm2.state_dict())
    x = torch.randn(2, 6, D)
    kpm = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])  # PyTorch polarity: True = ignore
    got = layer(x, masks.from_key_padding_mask(kpm))
    want = ref(x, src_key_padding_mask=kpm)
    keep = ~kpm  # PyTorch's fast path may zero padded rows; compare real positions
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- decoder layer


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("num_kv_heads", [None, 2])
def test_decoder_layer_matches_reference(norm_first: bool, num_kv_heads: int | None) -> None:
    layer = DecoderLayer(D, H, FF, norm_first=norm_first, num_kv_heads=num_kv_heads).eval()
    _randomize(layer)
    x, memory = torch.randn(2, 5, D), torch.randn(2, 8, D)
    memory_mask = masks.padding_mask(torch.tensor([[4] * 8, [4] * 3 + [0] * 5]), 0)
    got = layer(x, memory, is_causal=True, memory_mask=memory_mask)
    args = (x, memory, None, memory_mask)
    assert_close_rule(
        got,
        ref_decoder_layer(layer, *args, torch.float64),
        ref_decoder_layer(layer, *args, torch.float32),
    )
    layer64 = layer.double()
    ref = ref_decoder_layer(layer64, *args, torch.float64)
    got64 = layer64(x.double(), memory.double(), is_causal=True, memory_mask=memory_mask)
    torch.testing.assert_close(got64, ref, atol=1e-12, rtol=1e-12)
    layer64.norm_first = not norm_first
    assert (ref_decoder_layer(layer64, *args, torch.float64) - ref).abs().max() > 1e-2


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch(norm_first: bool) -> None:
    """The same weights in ``torch.nn.TransformerDecoderLayer`` give the same output."""
    layer = DecoderLayer(D, H, FF, norm_first=norm_first, activation="gelu").eval()
    _randomize(layer)
    ref = nn.TransformerDecoderLayer(
        D, H, FF, dropout=0.0, activation="gelu", batch_first=True, norm_first=norm_first
    ).eval()
    with torch.no_grad():
        for mine, theirs in (
            (layer.self_attn, ref.self_attn),
            (layer.cross_attn, ref.multihead_attn),
        ):
            theirs.in_proj_weight.copy_(mine.in_proj_weight)
            theirs.in_proj_bias.copy_(mine.in_proj_bias)
            theirs.out_proj.load_state_dict(mine.out_proj.state_dict())
        ref.linear1.load_state_dict(layer.ff.linear1.state_dict())
        ref.linear2.load_state_dict(layer.ff.linear2.state_dict())
        for k in (1, 2, 3):
            getattr(ref, f"norm{k}").load_state_dict(getattr(layer, f"norm{k}").state_dict())
    x, memory = torch.randn(2, 5, D), torch.randn(2, 6, D)
    kpm = torch.tensor([[False] * 6, [False] * 2 + [True] * 4])
    causal = ~masks.causal_mask(5)  # PyTorch polarity
    got = layer(x, memory, is_causal=True, memory_mask=masks.from_key_padding_mask(kpm))
    want = ref(x, memory, tgt_mask=causal, memory_key_padding_mask=kpm)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_cached_steps_equal_full(norm_first: bool) -> None:
    from attnlab.nn.cache_policies import CrossKVCache
    from attnlab.nn.kv_cache import KVCache

    layer = DecoderLayer(D, H, FF, norm_first=norm_first, num_kv_heads=2).eval()
    x, memory = torch.randn(2, 6, D), torch.randn(2, 4, D)
    full = layer(x, memory, is_causal=True)
    self_cache = KVCache(2, 2, 6, D // H)
    cross_cache = CrossKVCache(2, 2, 4, D // H)
    steps = [
        layer(
            x[:, t : t + 1], memory, is_causal=True, self_cache=self_cache, cross_cache=cross_cache
        )
        for t in range(6)
    ]
    assert cross_cache.filled and cross_cache.length == 4 and self_cache.length == 6
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_decoder_self_attention_is_causal() -> None:
    """Changing a later target position leaves earlier outputs unchanged."""
    layer = DecoderLayer(D, H, FF).eval()
    x, memory = torch.randn(1, 6, D), torch.randn(1, 4, D)
    a = layer(x, memory, is_causal=True)
    x2 = x.clone()
    x2[:, 4] += 1.0
    b = layer(x2, memory, is_causal=True)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert (a[:, 4] - b[:, 4]).abs().max() > 1e-3


# ---------------------------------------------------------------- hooks


def _hook_everything(module: nn.Module) -> dict[str, torch.Tensor]:
    seen: dict[str, torch.Tensor] = {}
    for name, m in module.named_modules():
        if isinstance(m, HookPoint):
            m.register_forward_hook(lambda mod, a, out, name=name: seen.__setitem__(name, out))
    return seen


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_hooks_capture_without_changing_output(norm_first: bool) -> None:
    layer = DecoderLayer(D, H, FF, norm_first=norm_first).eval()
    x, memory = torch.randn(2, 5, D), torch.randn(2, 7, D)
    memory_mask = masks.padding_mask(torch.tensor([[3] * 7, [3] * 5 + [0] * 2]), 0)
    before = layer(x, memory, is_causal=True, memory_mask=memory_mask)
    seen = _hook_everything(layer)
    after = layer(x, memory, is_causal=True, memory_mask=memory_mask)
    torch.testing.assert_close(after, before, atol=1e-6, rtol=1e-6)

    for name in ("hook_resid_pre", "hook_resid_mid", "hook_resid_mid2", "hook_resid_post"):
        assert seen[name].shape == (2, 5, D), name
    torch.testing.assert_close(seen["hook_resid_pre"], x)
    torch.testing.assert_close(seen["hook_resid_post"], after)
    if norm_first:  # the residual stream is the sum of what the sub-layers add
        total = x + seen["hook_self_attn_out"] + seen["hook_cross_attn_out"] + seen["hook_mlp_out"]
        torch.testing.assert_close(seen["hook_resid_post"], total, atol=1e-5, rtol=1e-5)
    self_w, cross_w = seen["self_attn.hook_weights"], seen["cross_attn.hook_weights"]
    assert self_w.shape == (2, H, 5, 5) and cross_w.shape == (2, H, 5, 7)
    assert torch.all(self_w.triu(1) == 0)  # look-ahead
    assert torch.all(cross_w[1, :, :, 5:] == 0)  # source padding
    torch.testing.assert_close(cross_w.sum(-1), torch.ones(2, H, 5))


def test_encoder_hooks_capture_without_changing_output() -> None:
    layer = EncoderLayer(D, H, FF).eval()
    x = torch.randn(2, 5, D)
    before = layer(x)
    seen = _hook_everything(layer)
    after = layer(x)
    torch.testing.assert_close(after, before, atol=1e-6, rtol=1e-6)
    names = {"hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post"}
    assert names <= set(seen)
    assert seen["self_attn.hook_weights"].shape == (2, H, 5, 5)
    # post-norm: resid_mid = LN1(resid_pre + attn_out)
    torch.testing.assert_close(
        seen["hook_resid_mid"], layer.norm1(x + seen["hook_attn_out"]), atol=1e-6, rtol=1e-6
    )


def test_dropout_is_active_only_in_training() -> None:
    layer = EncoderLayer(D, H, FF, dropout=0.5)
    x = torch.randn(2, 5, D)
    layer.train()
    assert (layer(x) - layer(x)).abs().max() > 1e-3
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x))
