"""The sink cache (``SinkKVCache(window=w, sinks=s)``; StreamingLLM, Xiao et al. 2023): it equals full
attention while nothing has been evicted, and an explicit reference afterwards — the first ``s``
and the last ``w`` positions, turned by their places in the cache."""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab.nn.cache_policies import SinkKVCache
from attnlab.nn.kv_cache import KVCache, ModelCache
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.positional import RotaryEmbedding


def llama_like(n_layer: int = 2, **extra: object) -> al.GPT:
    torch.manual_seed(0)
    config = al.GPTConfig(
        vocab_size=53, n_positions=64, n_embd=24, n_layer=n_layer, n_head=6, num_kv_heads=2,
        positions="rope", rope_pairing="halves", norm="rmsnorm", mlp="gated", activation="silu",
        bias=False, **extra,
    )  # fmt: skip
    return al.GPT(config).double().eval()


def stream(model: al.GPT, ids: torch.Tensor, cache: ModelCache) -> torch.Tensor:
    """Feed ``ids`` one token at a time; the logits after each."""
    return torch.cat([model(ids[:, i : i + 1], cache=cache).logits for i in range(ids.shape[1])], 1)


@pytest.mark.parametrize("positions", ["rope", "learned", "alibi"])
def test_before_any_eviction_it_is_full_attention(positions: str) -> None:
    torch.manual_seed(1)
    cfg = al.GPTConfig(vocab_size=53, n_positions=64, n_embd=24, n_layer=2, n_head=4,
                       positions=positions)  # fmt: skip
    model = al.GPT(cfg).double().eval()
    ids = torch.randint(0, 53, (2, 12))
    with torch.no_grad():
        full = model(ids).logits
        sink = stream(model, ids, model.new_cache(2, 64, sinks=4, window=8))  # holds 12: none out
        assert torch.allclose(sink, full, atol=1e-12)


def test_one_layer_after_eviction_equals_the_model_on_the_kept_tokens() -> None:
    # one layer with rotary: a key depends on its token only (stored before the rotation), so
    # the step's logits are the model's on [sinks, last window, new] at positions 0 … K − 1
    model = llama_like(n_layer=1)
    s, w = 2, 5
    ids = torch.randint(0, 53, (1, 20))
    with torch.no_grad():
        got = stream(model, ids, model.new_cache(1, 64, sinks=s, window=w))
        for t in range(ids.shape[1]):
            kept = list(range(t)) if t <= s + w else [*range(s), *range(t - w, t)]
            ref = model(ids[:, [*kept, t]]).logits[:, -1]
            assert torch.allclose(got[:, t], ref, atol=1e-12), t


def test_a_layer_after_eviction_equals_an_explicit_reference() -> None:
    torch.manual_seed(2)
    d, h, h_kv, s, w = 16, 4, 2, 3, 4
    rotary = RotaryEmbedding(d // h, max_len=32, pairing="halves")
    layer = MultiHeadAttention(d, h, num_kv_heads=h_kv, rotary=rotary).double().eval()
    xs = torch.randn(1, 15, d, dtype=torch.float64)
    cache = SinkKVCache(1, h_kv, 32, d // h, dtype=torch.float64, window=w, sinks=s)
    keys, values = [], []
    for t in range(xs.shape[1]):
        x = xs[:, t : t + 1]
        with torch.no_grad():
            got = layer(x, is_causal=True, cache=cache)
            # the reference: K, V of every token, unrotated; keep [0, s) and the last w before t
            q, k, v = (p.view(1, 1, -1, d // h).transpose(1, 2) for p in layer.project_qkv(x)[:3])
            keys.append(k), values.append(v)
            kept = list(range(t)) if t <= s + w else [*range(s), *range(t - w, t)]
            kk = torch.cat([keys[i] for i in [*kept, t]], dim=2)
            vv = torch.cat([values[i] for i in [*kept, t]], dim=2)
            n = kk.shape[2]
            kk = rotary(kk, torch.arange(n))  # places 0 … n − 1
            q = rotary(q, torch.tensor([n - 1]))
            kk, vv = kk.repeat_interleave(h // h_kv, 1), vv.repeat_interleave(h // h_kv, 1)
            z = torch.softmax(q @ kk.transpose(-1, -2) / (d // h) ** 0.5, -1) @ vv
            ref = layer.out_proj(z.transpose(1, 2).reshape(1, 1, d))
        assert torch.allclose(got, ref, atol=1e-12), t
    assert cache.held == s + w and cache.length == 15 and cache.next_position == s + w


@pytest.mark.parametrize("backend", ["math", "sdpa", "blockwise"])
def test_every_backend_and_generate_streams_past_the_position_table(backend: str) -> None:
    model = llama_like()
    for block in model.transformer.h:
        block.attn.backend = backend
    ids = torch.randint(0, 53, (1, 100))  # longer than n_positions = 64
    with torch.no_grad():
        logits = stream(model, ids, model.new_cache(1, 200, sinks=4, window=16))
    assert logits.shape == (1, 100, 53) and torch.isfinite(logits).all()


def test_bad_sink_caches_are_refused() -> None:
    with pytest.raises(
        TypeError, match=r"use attnlab\.SinkKVCache\(\.\.\., window=None, sinks=2\)"
    ):
        KVCache(1, 2, 8, 4, sinks=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sinks must be a non-negative int"):
        SinkKVCache(1, 2, 8, 4, window=4, sinks=-1)
    model = llama_like(attention=al.SlidingSpec(3))
    with pytest.raises(ValueError, match="a sink cache is for full attention"):
        model.new_cache(1, 8, sinks=2, window=4)
    model = llama_like()
    cache = model.new_cache(1, 8, sinks=2, window=4)
    with pytest.raises(ValueError, match="attention_mask must be None with a sink cache"):
        model(torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2), cache=cache)
    with pytest.raises(ValueError, match="needs both sinks and window"):
        model.new_cache(1, 8, sinks=2)


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
def test_generate_with_a_sink_cache_goes_past_the_position_table(strategy: str) -> None:
    model = llama_like()
    prompt = torch.randint(0, 53, (1, 10))
    options: dict[str, object] = {"strategy": strategy}
    if strategy == "sample":
        options["generator"] = torch.Generator().manual_seed(0)
    out = al.generate(
        model, prompt, max_new_tokens=80, cache_sinks=4, cache_window=20, **options
    )  # 90 positions, n_positions = 64
    assert out.shape[1] == 90 and torch.equal(out[:, :10], prompt)
    if strategy == "greedy":  # the same tokens as feeding them one by one
        cache = model.new_cache(1, 128, sinks=4, window=20)
        with torch.no_grad():
            logits = model(prompt, cache=cache).logits[:, -1]
            ids = [int(logits.argmax())]
            for _ in range(79):
                logits = model(torch.tensor([ids[-1:]]), cache=cache).logits[:, -1]
                ids.append(int(logits.argmax()))
        assert out[0, 10:].tolist() == ids


def test_generate_refuses_a_sink_cache_it_cannot_use() -> None:
    model = llama_like()
    prompt = torch.randint(0, 53, (1, 10))
    with pytest.raises(ValueError, match="needs both cache_sinks and cache_window"):
        al.generate(model, prompt, max_new_tokens=4, cache_sinks=4)
    with pytest.raises(ValueError, match="must fit the position table n_positions = 64"):
        al.generate(model, prompt, max_new_tokens=4, cache_sinks=4, cache_window=60)


@pytest.mark.parametrize("sizes", [[1] * 40, [10, 1, 1, 5, 3, 20], [40]])
def test_rows_with_their_own_sinks_stream_as_separate_caches(sizes: list[int]) -> None:
    # sinks=(0, 4, 2): one batch, each row as its own single-row sink cache (a window cache for
    # the first), whether fed a token at a time or in chunks that cross the evictions
    model = llama_like()
    ids = torch.randint(0, 53, (1, sum(sizes)))

    def feed(x: torch.Tensor, cache: ModelCache) -> torch.Tensor:
        ends = torch.tensor(sizes).cumsum(0).tolist()
        return torch.cat(
            [model(x[:, e - n : e], cache=cache).logits for n, e in zip(sizes, ends, strict=True)],
            1,
        )

    rows = (0, 4, 2)
    with torch.no_grad():
        got = feed(ids.expand(3, -1), model.new_cache(3, 64, sinks=rows, window=6))
        for r, s in enumerate(rows):
            ref = feed(ids, model.new_cache(1, 64, sinks=s, window=6))
            assert torch.allclose(got[r], ref[0], atol=1e-12), (r, s)
    cache = model.new_cache(3, 64, sinks=rows, window=6)
    cache.reorder(torch.tensor([2, 0, 0]))  # beam search: a row takes its own sinks along
    assert cache.layers[0].row_sinks.tolist() == [2, 0, 0]  # type: ignore[attr-defined]


def test_the_layers_share_a_steps_places_and_stream_the_same_numbers() -> None:
    # a model's sink caches compute a step's places (queries, keys, the rows' mask) once: every
    # layer gets the same tensors, and the logits are bit for bit those of unshared caches
    model = llama_like(n_layer=3)
    ids = torch.randint(0, 53, (1, 14))
    rows = (0, 3)
    shared = model.new_cache(2, 64, sinks=rows, window=5)
    own = ModelCache(
        [SinkKVCache(2, 2, 64, 4, window=5, sinks=rows, dtype=torch.float64) for _ in range(3)]
    )
    with torch.no_grad():
        for i in range(ids.shape[1]):
            x = ids[:, i : i + 1].expand(2, -1)
            assert torch.equal(model(x, cache=shared).logits, model(x, cache=own).logits), i
    first, second = shared.layers[0], shared.layers[1]
    assert isinstance(first, SinkKVCache) and isinstance(second, SinkKVCache)
    assert first.row_sinks is second.row_sinks
    assert first.query_places(1) is second.query_places(1)
    assert first.key_places(1)[0] is second.key_places(1)[0]
    index = torch.tensor([1, 1])
    shared.reorder(index)  # beam search: one new tensor of the rows' sinks for every layer
    assert first.row_sinks is second.row_sinks and first.row_sinks.tolist() == [3, 3]


def test_sinks_per_row_are_checked() -> None:
    with pytest.raises(ValueError, match="or one per batch row"):
        SinkKVCache(2, 2, 8, 4, window=4, sinks=(0, 1, 2))
    with pytest.raises(ValueError, match="or one per batch row"):
        SinkKVCache(2, 2, 8, 4, window=4, sinks=(0, -1))
    cfg = al.GPTConfig(vocab_size=53, n_positions=64, n_embd=24, n_layer=1, n_head=4)
    with pytest.raises(ValueError, match=r"sinks per row \(0, 2\) need rotary positions"):
        al.GPT(cfg).new_cache(2, 8, sinks=(0, 2), window=4)  # learned positions
    same = al.GPT(cfg).new_cache(2, 8, sinks=(2, 2), window=4).layers[0]
    assert same.row_sinks is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [({"cache_sinks": "2", "cache_window": 8}, TypeError, "cache_sinks must be an int, got str"),
     ({"cache_sinks": -1, "cache_window": 8}, ValueError, "cache_sinks must be a non-negative"),
     ({"cache_sinks": 2, "cache_window": 0}, ValueError, "cache_window must be a positive int"),
     ({"cache_sinks": 2, "cache_window": 8.0}, TypeError, "cache_window must be an int")],
)  # fmt: skip
def test_generate_refuses_sink_options_of_the_wrong_type(
    options: dict, error: type, message: str
) -> None:
    # issue 32: cache_sinks='2' ended in "can only concatenate str (not int) to str"
    with pytest.raises(error, match=message):
        al.generate(llama_like(), torch.randint(0, 53, (1, 10)), max_new_tokens=2, **options)
