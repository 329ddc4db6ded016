"""O(1)-per-token decoding of causal Performer attention (issue 12): GPT and the encoder-decoder
decode from running sums (``PerformerState``), with the full forward's logits at every position
and the tokens of the recomputing reference (``RecomputeCache``) for greedy, sampling and beam
search."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import attnlab as al
from attnlab import GPT
from attnlab.models.gpt import RecomputeCache
from attnlab.models.transformer import Seq2SeqCache, Seq2SeqRecomputeCache
from attnlab.nn.kv_cache import KVCache, ModelCache, PerformerState
from tests.decoding._models import tiny_gpt

F64 = torch.float64


def _performer_gpt(kv_heads: int | None = 2, dtype: torch.dtype = F64, **kw: Any) -> GPT:
    return tiny_gpt(
        attention="performer", num_features=16, num_kv_heads=kv_heads, dtype=dtype, **kw
    )


def _recomputing(model: Any) -> None:
    """Make ``model.new_cache`` give the recomputing reference (what decoding did before)."""

    def new_cache(batch: int, capacity: int, **kw: Any) -> RecomputeCache:
        return RecomputeCache(batch, capacity, device=kw.get("device"))

    model.new_cache = new_cache


@pytest.mark.parametrize("kv_heads", [None, 2, 1])
def test_decoded_logits_equal_the_full_forward(kv_heads: int | None) -> None:
    """float64, left-padded batch, MHA/GQA/MQA: a prompt (in two pieces), then one token at a
    time through ``decode_step`` and ``forward`` — every position's logits are the full
    forward's."""
    model = _performer_gpt(kv_heads)
    ids = torch.randint(1, 61, (3, 20))
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, :5] = 0
    mask[2, :9] = 0  # padding past the first prompt piece
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        cache = model.new_cache(3, 20)
        assert isinstance(cache, ModelCache)
        assert all(isinstance(c, PerformerState) for c in cache.layers)
        outs = [model(ids[:, :6], attention_mask=mask[:, :6], cache=cache).logits]
        outs.append(model(ids[:, 6:8], attention_mask=mask[:, :8], cache=cache).logits)
        for i in range(8, 14):
            step = model.decode_step(ids[:, i : i + 1], cache, mask[:, : i + 1].bool())
            outs.append(step[:, None])
        for i in range(14, 20):
            out = model(ids[:, i : i + 1], attention_mask=mask[:, : i + 1], cache=cache)
            outs.append(out.logits)
    got = torch.cat(outs, 1)
    real = mask.bool()
    assert cache.length == 20
    torch.testing.assert_close(got[real], full[real], atol=1e-10, rtol=1e-10)


def test_state_memory_does_not_grow_while_decoding() -> None:
    """The cache holds the same tensors' shapes and bytes after 1 and after 50 tokens, and its
    size does not depend on the capacity; a KV cache's does."""
    model = _performer_gpt(2, n_positions=128)
    cache = model.new_cache(2, 120)
    size = cache.nbytes()
    assert size == model.new_cache(2, 5).nbytes() == 2 * 8 * 2 * 2 * (16 * 8 + 16 + 1)
    assert size < tiny_gpt(n_positions=128, num_kv_heads=2).new_cache(2, 120).nbytes()
    shapes = [
        (c.s.shape, c.z.shape, c.c.shape) for c in cache.layers if isinstance(c, PerformerState)
    ]
    with torch.no_grad():
        model(torch.randint(0, 61, (2, 3)), cache=cache)
        for _ in range(50):
            model.decode_step(torch.randint(0, 61, (2, 1)), cache)
            now = [(c.s.shape, c.z.shape, c.c.shape) for c in cache.layers
                   if isinstance(c, PerformerState)]  # fmt: skip
            assert now == shapes and cache.nbytes() == size
    assert cache.length == 53


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_generation_gives_the_tokens_of_the_recomputing_path(dtype: torch.dtype) -> None:
    """greedy, sampling and beam search over a left-padded batch: the same tokens as before
    (the prefix recomputed at every step)."""
    model = _performer_gpt(2, dtype=dtype)
    reference = _performer_gpt(2, dtype=dtype)
    _recomputing(reference)
    prompt = torch.randint(1, 61, (3, 7))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, :3] = 0
    runs: list[dict[str, Any]] = [
        {"strategy": "greedy"},
        {"strategy": "sample", "top_k": 10},
        {"strategy": "beam", "num_beams": 3},
    ]
    for kw in runs:
        got, want = (
            al.generate(
                m,
                prompt,
                attention_mask=mask,
                max_new_tokens=12,
                generator=torch.Generator().manual_seed(3),
                **kw,
            )
            for m in (model, reference)
        )
        assert torch.equal(got, want), kw["strategy"]


def test_cache_kinds_are_checked_and_the_reference_still_works() -> None:
    model = _performer_gpt(2)
    ids = torch.randint(0, 61, (2, 9))
    with torch.no_grad():
        full = model(ids).logits
        ref = RecomputeCache(2, 16)
        a = model(ids[:, :4], cache=ref).logits
        b = model(ids[:, 4:], cache=ref).logits
    torch.testing.assert_close(torch.cat([a, b], 1), full)
    with pytest.raises(ValueError, match="cache must be None or a PerformerState"):
        model(ids, cache=ModelCache([KVCache(2, 2, 16, 8) for _ in range(2)]))
    with pytest.raises(
        ValueError, match=r"cache must be a KV cache \(KVCache, .*\) for GPTSelfAttention"
    ):
        tiny_gpt()(ids, cache=model.new_cache(2, 16))
    with pytest.raises(ValueError, match="cache was made for batch 2, input_ids has batch 1"):
        model(ids[:1], cache=model.new_cache(2, 16))
    half = model.new_cache(2, 16, dtype=torch.bfloat16)
    assert all(c.s.dtype == torch.float32 for c in half.layers if isinstance(c, PerformerState))


def test_a_redraw_since_the_prompt_is_refused() -> None:
    model = _performer_gpt(2)
    ids = torch.randint(0, 61, (1, 6))
    cache = model.new_cache(1, 10)
    with torch.no_grad():
        model(ids, cache=cache)
        model.transformer.h[0].attn.redraw_features()
        with pytest.raises(ValueError, match="random features changed"):
            model.decode_step(ids[:, :1], cache)


# -- the encoder-decoder's decoder ------------------------------------------------------------


def _performer_seq2seq(dtype: torch.dtype = F64) -> Any:
    torch.manual_seed(0)
    cfg = al.TransformerConfig(
        src_vocab_size=23, tgt_vocab_size=23, d_model=32, num_heads=4, num_kv_heads=2,
        num_encoder_layers=2, num_decoder_layers=2, d_ff=64, dropout=0.0, max_len=32,
        attention="performer", num_features=16,
    )  # fmt: skip
    return al.Transformer(cfg).to(dtype).eval()


def test_seq2seq_decoded_logits_equal_the_full_decode() -> None:
    model = _performer_seq2seq()
    src = torch.randint(3, 23, (2, 9))
    src[1, 6:] = 0
    tgt = torch.randint(3, 23, (2, 10))
    tgt[0, 7:] = 0  # padding in the target: hidden keys
    src_mask = al.masks.padding_mask(src, 0)
    with torch.no_grad():
        memory = model.encode(src)
        full = model.decode(tgt, memory, src_mask=src_mask).logits
        cache = model.new_cache(2, 10, src_len=9)
        assert isinstance(cache, Seq2SeqCache) and not isinstance(cache, Seq2SeqRecomputeCache)
        assert all(isinstance(c, PerformerState) for c in cache.layers)
        assert cache.cross is not None and all(isinstance(c, al.CrossKVCache) for c in cache.cross)
        outs = [model.decode(tgt[:, :3], memory, src_mask=src_mask, cache=cache).logits]
        for i in range(3, 10):
            outs.append(model.decode(tgt[:, i : i + 1], memory, cache=cache).logits)
    got = torch.cat(outs, 1)
    torch.testing.assert_close(got[0, :7], full[0, :7], atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(got[1], full[1], atol=1e-10, rtol=1e-10)
    assert cache.length == 10


def test_seq2seq_generation_gives_the_tokens_of_the_recomputing_path() -> None:
    model, reference = _performer_seq2seq(), _performer_seq2seq()
    pad = reference.config.pad_id

    def new_cache(batch: int, capacity: int, **kw: Any) -> Seq2SeqRecomputeCache:
        return Seq2SeqRecomputeCache(torch.full((batch, capacity), pad, dtype=torch.long))

    reference.new_cache = new_cache
    src = torch.randint(3, 23, (3, 8))
    src[2, 5:] = 0
    runs: list[dict[str, Any]] = [
        {"strategy": "greedy"},
        {"strategy": "beam", "num_beams": 3},
        {"strategy": "sample", "top_k": 10},
    ]
    for kw in runs:
        got, want = (
            al.generate(
                m,
                src,
                max_new_tokens=10,
                eos_token_id=[],
                generator=torch.Generator().manual_seed(1),
                **kw,
            )
            for m in (model, reference)
        )
        assert torch.equal(got, want), kw["strategy"]
