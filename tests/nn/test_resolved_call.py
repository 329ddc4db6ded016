"""Every attention layer emits the call it ran (hook_call): its scores' softmax is its weights."""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab.nn.linformer import LinformerAttention
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.performer import PerformerAttention, favor_features
from attnlab.nn.positional import RotaryEmbedding
from attnlab.nn.resolved_call import ResolvedCall

F64 = torch.float64


def _layers() -> dict[str, tuple[MultiHeadAttention, dict]]:
    torch.manual_seed(0)
    layout = al.masks.bigbird_layout(12, block_size=3, num_random_blocks=1)
    return {
        "full_gqa_rope": (
            MultiHeadAttention(16, 4, num_kv_heads=2, rotary=RotaryEmbedding(4), dtype=F64),
            {"is_causal": True},
        ),
        "window": (MultiHeadAttention(16, 4, window=3, dtype=F64), {"is_causal": True}),
        "bigbird": (MultiHeadAttention(16, 4, block_mask=layout, dtype=F64), {}),
        "linformer": (
            LinformerAttention(16, 4, k=5, max_len=12, num_kv_heads=2, sharing="none", dtype=F64),
            {"mask": torch.tensor([True] * 7 + [False] * 2)[None, None, None]},
        ),
        "performer": (PerformerAttention(16, 4, num_kv_heads=2, dtype=F64), {}),
        "performer_causal": (PerformerAttention(16, 4, dtype=F64), {"is_causal": True}),
    }


@pytest.mark.parametrize("kind", list(_layers()))
def test_the_resolved_calls_scores_give_the_weights_the_layer_computed(kind: str) -> None:
    layer, kwargs = _layers()[kind]
    layer.eval()
    calls: list[ResolvedCall] = []
    handle = layer.hook_call.register_forward_hook(lambda m, a, out: calls.append(out))
    x = torch.randn(2, 9, 16, dtype=F64)
    _, w = layer(x, need_weights=True, **kwargs)
    handle.remove()
    (call,) = calls
    assert call.query_input is x and not call.cross
    torch.testing.assert_close(call.scores().softmax(-1), w, atol=1e-12, rtol=0)
    assert call.weights is not None and torch.equal(call.weights, w)
    assert call.output is not None and call.output.shape == (2, 4, 9, 4)
    if kind == "linformer":
        e_h, f_h = call.key_projection, call.value_projection
        assert call.method == "linformer" and e_h is not None and f_h is not None
        assert call.key_mask is not None and call.key_mask.shape[-1] == 9
        assert e_h.shape == (4, 5, 9) and call.k.shape == (2, 2, 5, 4)
        # E K over the kept keys, per key/value head (heads 0, 1 read E_0)
        k = layer.project_qkv(x)[1].unflatten(-1, (2, 4)).transpose(1, 2)[:, :, :7]
        torch.testing.assert_close(call.k, e_h[::2, :, :7] @ k, atol=1e-12, rtol=0)
    if kind.startswith("performer"):
        assert call.method == "favor" and call.q_features is not None
        phi_q, phi_k = favor_features(call.q, call.k, layer.features, scale=call.scale)
        assert torch.equal(call.q_features, phi_q) and torch.equal(call.k_features, phi_k)


def test_nothing_is_emitted_or_built_without_a_listener() -> None:
    layer, _ = _layers()["linformer"]
    assert not layer.hook_call.active
    out = layer(torch.randn(1, 4, 16, dtype=F64))
    assert out.shape == (1, 4, 16)
