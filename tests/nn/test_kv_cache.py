"""The preallocated KV cache."""

from __future__ import annotations

import pytest
import torch

from attnlab.decoding.steppers import CausalStepper
from attnlab.nn.kv_cache import KVCache, ModelCache
from tests.decoding._models import tiny_gpt


def test_append_returns_everything_so_far_and_stops_at_capacity() -> None:
    cache = KVCache(2, 3, 5, 4)
    k, v = torch.randn(2, 3, 3, 4), torch.randn(2, 3, 3, 4)
    keys, values = cache.append(k, v)
    assert torch.equal(keys, k) and torch.equal(values, v) and cache.length == 3
    k2, v2 = torch.randn(2, 3, 2, 4), torch.randn(2, 3, 2, 4)
    keys, _ = cache.append(k2, v2)
    assert torch.equal(keys, torch.cat([k, k2], dim=2)) and cache.length == 5
    with pytest.raises(ValueError, match="capacity exceeded: it holds 5 of 5"):
        cache.append(k2[:, :, :1], v2[:, :, :1])
    with pytest.raises(ValueError, match="keys have shape"):
        KVCache(2, 3, 5, 4).append(torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4))


def test_reorder_selects_rows_everywhere() -> None:
    layers = [KVCache(3, 1, 4, 2) for _ in range(2)]
    for c in layers:
        c.append(torch.arange(3.0).view(3, 1, 1, 1).expand(3, 1, 2, 2), torch.zeros(3, 1, 2, 2))
    cache = ModelCache(layers)
    cache.reorder(torch.tensor([2, 2, 0]))
    for c in layers:
        assert c.keys[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
    assert cache.length == 2 and cache.capacity == 4


def test_generation_cache_is_sized_prompt_plus_new_tokens() -> None:
    model = tiny_gpt()
    prompt = torch.randint(0, 61, (2, 5))
    stepper = CausalStepper(model, prompt, None, 5 + 3)
    assert stepper.cache.capacity == 8 and len(stepper.cache.layers) == 2
    stepper.prefill()
    for _ in range(3):
        stepper.step(torch.zeros(2, dtype=torch.long))
    assert stepper.cache.length == 8
    with pytest.raises(ValueError, match="capacity exceeded"):
        stepper.step(torch.zeros(2, dtype=torch.long))


def test_a_cache_beyond_the_memory_is_refused_before_it_is_allocated() -> None:
    # issue 32: KVCache(1, 1, 10**12, 8) asked the allocator for 64 TB (its raw RuntimeError)
    with pytest.raises(ValueError, match=r"KVCache\(batch=1, .*capacity=1000000000000.* needs"):
        KVCache(1, 1, 10**12, 8)
    assert KVCache(1, 1, 10**12, 8, device="meta").k.shape == (1, 1, 10**12, 8)  # shapes only
    with pytest.raises(TypeError, match=r"dtype must be a torch\.dtype"):
        KVCache(1, 1, 4, 8, dtype="float32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device 'bogus': torch knows no such device"):
        KVCache(1, 1, 4, 8, device="bogus")
