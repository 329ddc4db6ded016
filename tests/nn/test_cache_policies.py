"""One class per KV cache policy (issue 33): each one's ``update`` hands the layer what the full
forward computes (float64), and each refuses the others' use with a typed error."""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab.nn.cache_policies import CrossKVCache, RollingKVCache, SinkKVCache
from attnlab.nn.cache_view import CacheView
from attnlab.nn.kv_cache import KVCache, KVCachePolicy

F64 = torch.float64


def _layer(**options: object) -> al.MultiHeadAttention:
    torch.manual_seed(0)
    rotary = al.RotaryEmbedding(8, max_len=32)
    return al.MultiHeadAttention(16, 2, rotary=rotary, dtype=F64, **options).eval()  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["full", "rolling", "sink"])
def test_decoding_through_update_equals_the_full_forward(policy: str) -> None:
    window = 3 if policy == "rolling" else None
    layer = _layer(window=window)
    x = torch.randn(2, 9, 16, dtype=F64)
    cache: KVCachePolicy = {
        "full": lambda: KVCache(2, 2, 9, 8, dtype=F64),
        "rolling": lambda: RollingKVCache(2, 2, 9, 8, window=3, dtype=F64),
        "sink": lambda: SinkKVCache(2, 2, 9, 8, window=7, sinks=2, dtype=F64),  # none evicted
    }[policy]()
    with torch.no_grad():
        full = layer(x, is_causal=True)
        steps = [layer(x[:, :4], is_causal=True, cache=cache)]
        steps += [layer(x[:, t : t + 1], is_causal=True, cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-12, rtol=0)
    assert cache.length == 9


def test_each_view_holds_what_its_policy_keeps() -> None:
    k, v = torch.randn(1, 1, 6, 4, dtype=F64), torch.randn(1, 1, 6, 4, dtype=F64)
    mask = torch.tensor([False, True, True, True, True, True])[None, None, None]
    grown = KVCache(1, 1, 6, 4, dtype=F64).update(k, v, mask, is_causal=True)
    assert torch.equal(grown.keys, k) and grown.mask is mask and grown.key_places is None
    rolling = RollingKVCache(1, 1, 6, 4, window=2, dtype=F64)
    rolling.update(k[:, :, :4], v[:, :, :4], None, window=(2, 0), is_causal=True)
    view = rolling.update(k[:, :, 4:], v[:, :, 4:], mask, window=(2, 0), is_causal=True)
    assert torch.equal(view.keys, k[:, :, 2:]) and torch.equal(view.mask, mask[..., 2:])
    sink = SinkKVCache(2, 1, 6, 4, window=2, sinks=(1, 0), dtype=F64)
    sink.update(k[:, :, :4].expand(2, -1, -1, -1), v[:, :, :4].expand(2, -1, -1, -1), None,
                is_causal=True)  # fmt: skip
    view = sink.update(k[:, :, 4:5].expand(2, -1, -1, -1), v[:, :, 4:5].expand(2, -1, -1, -1),
                       None, is_causal=True)  # fmt: skip
    assert torch.equal(view.keys[0], k[0, :, [0, 2, 3, 4]])  # [sink | last 2 | new], unrotated
    assert view.mask is not None and view.mask[:, 0, 0].tolist() == [
        [True] * 4,
        [False] + [True] * 3,
    ]
    assert view.key_places is not None and view.key_places.tolist() == [[0, 1, 2, 3], [0, 0, 1, 2]]
    assert sink.query_places(1).tolist() == [[3], [2]]  # a row counts only the keys it sees
    cross = CrossKVCache(1, 1, 6, 4, dtype=F64)
    assert not cross.filled and cross.update(k, v, None).keys.shape == k.shape and cross.filled
    again = cross.update(None, None, mask)
    assert isinstance(again, CacheView) and torch.equal(again.keys, k) and again.mask is mask


def test_cross_attention_reads_the_filled_cache_as_the_full_forward() -> None:
    layer = _layer()
    memory, tgt = torch.randn(2, 5, 16, dtype=F64), torch.randn(2, 3, 16, dtype=F64)
    cache = layer.new_cross_cache(2, 5)
    with torch.no_grad():
        steps = [layer(tgt[:, t : t + 1], memory, cache=cache) for t in range(3)]
        torch.testing.assert_close(torch.cat(steps, 1), layer(tgt, memory), atol=1e-12, rtol=0)


def test_each_policy_refuses_the_others_use() -> None:
    with pytest.raises(TypeError, match=r"use attnlab\.RollingKVCache\(\.\.\., window=4\)"):
        KVCache(1, 1, 8, 4, window=4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"use attnlab\.SinkKVCache\(\.\.\., window=4, sinks=2\)"):
        KVCache(1, 1, 8, 4, window=4, sinks=2)  # type: ignore[arg-type]
    k = torch.randn(1, 1, 2, 4)
    with pytest.raises(ValueError, match=r"KVCache\.update needs the new keys"):
        KVCache(1, 1, 8, 4).update(None, None, None)
    with pytest.raises(ValueError, match=r"CrossKVCache\.update needs the new keys"):
        CrossKVCache(1, 1, 8, 4).update(None, None, None)
    rolling = RollingKVCache(1, 1, 8, 4, window=4)
    with pytest.raises(ValueError, match=r"keeps only the last 4 .*RollingKVCache\(window=4\)"):
        rolling.update(k, k, None, window=None, is_causal=True)  # full attention reads them all
    sink = SinkKVCache(1, 1, 8, 4, window=4, sinks=1)
    with pytest.raises(ValueError, match=r"SinkKVCache\(window=4, sinks=1\)\) is for causal full"):
        sink.update(k, k, None, window=(4, 0), is_causal=True)
    with pytest.raises(ValueError, match="is for causal full attention"):
        sink.update(k, k, None, is_causal=False)
    assert rolling.length == sink.length == 0  # refused before they changed
    layer, x = _layer(), torch.randn(1, 2, 16)
    with pytest.raises(ValueError, match=r"self-attention call needs a KVCache.*got CrossKVCache"):
        layer.float()(x, is_causal=True, cache=CrossKVCache(1, 1, 8, 8))
    with pytest.raises(ValueError, match="cross-attention call needs a CrossKVCache"):
        layer(x, torch.randn(1, 3, 16), cache=KVCache(1, 1, 8, 8))
    layout = al.masks.bigbird_layout(8, block_size=2, num_random_blocks=0)
    with pytest.raises(ValueError, match=r"block_mask counts every position.*SinkKVCache"):
        layer(
            x, is_causal=True, block_mask=layout, cache=SinkKVCache(1, 1, 8, 8, window=4, sinks=1)
        )
