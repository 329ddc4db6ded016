"""FLOPs of ``attention="bigbird"`` (issue 12): the visible blocks' scores, counted exactly (the
last block partial), against ``FlopCounterMode`` on the blockwise backend's tiles."""

from __future__ import annotations

import dataclasses
import functools
import inspect

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab import GPT, GPTConfig, Transformer, TransformerConfig
from attnlab.inspect import flops, kv_cache_bytes
from attnlab.inspect.flops import block_pairs
from attnlab.models.config import block_layout
from attnlab.nn.backends import ATTENTION_BACKENDS, blockwise
from attnlab.nn.masks import bigbird_layout

BIGBIRD = {"attention": "bigbird", "block_size": 8, "num_random_blocks": 1}


@pytest.fixture(autouse=True)
def _written_out_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """``blockwise_counted``: the blockwise backend with its tiles written out in PyTorch matmuls,
    which FlopCounterMode sees (it has no formula for PyTorch's fused CPU attention kernel)."""
    fn = blockwise.blockwise_attention
    if "tile_kernel" in inspect.signature(fn).parameters:
        fn = functools.partial(fn, tile_kernel="python")
    monkeypatch.setitem(ATTENTION_BACKENDS, "blockwise_counted", fn)


def _counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _tiles_by_hand(layout, t_q: int) -> int:
    """The scores of the visible tiles, from the dense block matrix: rows of each query block
    met by the queries times the keys of each visible key block, cut at the block's last query
    under a causal layout."""
    t, b = layout.seq_len, layout.block_size
    total = 0
    for i in range(t - t_q, t):  # each query, at its position
        r = i // b
        last = min(t, (r + 1) * b) - 1  # the block's last position
        for c in range(layout.num_blocks):
            if bool(layout.blocks[r, c]):
                hi = min((c + 1) * b, t, last + 1) if layout.causal and t_q > 1 else min(
                    (c + 1) * b, t)  # fmt: skip
                total += max(0, hi - c * b)
    return total


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t", [5, 16, 37, 64])
def test_block_pairs_counts_the_visible_tiles(causal: bool, t: int) -> None:
    layout = bigbird_layout(t, block_size=8, causal=causal, num_random_blocks=1, seed=t)
    assert block_pairs(layout) == _tiles_by_hand(layout, t)
    assert block_pairs(layout, 1) == _tiles_by_hand(layout, 1)  # a decoding step's row
    if t % 8 == 0:  # whole blocks: b² a visible block
        assert block_pairs(layout) == layout.num_visible * 64
    # the tiles hold the visible pairs and no more than their blocks
    assert int(layout.to_dense().sum()) <= block_pairs(layout) <= layout.num_visible * 64
    with pytest.raises(ValueError, match="q_len must be at most"):
        block_pairs(layout, t + 1)


def _small_gpt(**kw: object) -> GPTConfig:
    return GPTConfig(vocab_size=97, n_positions=64, n_embd=32, n_head=4, n_layer=2,
                     backend="blockwise_counted", **kw)  # fmt: skip


@pytest.mark.parametrize("t", [37, 64])
def test_gpt_agrees_with_flop_counter(t: int) -> None:
    cfg = _small_gpt(num_kv_heads=2, **BIGBIRD)
    model = GPT(cfg)
    x = torch.randint(0, 97, (2, t))
    report = flops(cfg, seq_len=t, batch=2)
    with torch.no_grad():
        counted = _counted(lambda: model(x))
    assert report.forward_total == counted
    layout = block_layout(cfg, causal=True).crop(t)
    pairs = block_pairs(layout)
    assert report.forward["attention/scores"] == 2 * 2 * 2 * 4 * pairs * 8  # B·L·2·H·pairs·d_h
    assert report.forward["attention/reduce"] == report.forward["attention/scores"]
    n = layout.num_blocks
    assert layout.num_visible < n * (n + 1) // 2  # it hides some of the causal blocks
    full = flops(_small_gpt(num_kv_heads=2), seq_len=t, batch=2)
    assert report.params == full.params
    assert report.memory["kv_cache"] == full.memory["kv_cache"] == kv_cache_bytes(cfg, t, 2)
    assert report.memory["attention_matrix"] == 2 * 4 * pairs * 4  # B·H·pairs·fp32


def test_transformer_agrees_with_flop_counter() -> None:
    config = TransformerConfig(
        src_vocab_size=61, tgt_vocab_size=61, d_model=32, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=2, d_ff=64, max_len=48, backend="blockwise_counted", **BIGBIRD,
    )  # fmt: skip
    model = Transformer(config).eval()
    src, tgt = torch.randint(3, 61, (2, 43)), torch.randint(3, 61, (2, 29))
    report = flops(config, seq_len=29, batch=2, src_len=43)
    with torch.no_grad():
        counted = _counted(lambda: model(src, tgt))
    assert report.forward_total == counted
    enc = block_pairs(block_layout(config, causal=False).crop(43))
    dec = block_pairs(block_layout(config, causal=True).crop(29))
    assert report.forward["encoder/attention/scores"] == 2 * 2 * 2 * 4 * enc * 8
    assert report.forward["decoder/self_attention/scores"] == 2 * 2 * 2 * 4 * dec * 8
    assert report.forward["decoder/cross_attention/scores"] == 2 * 2 * 2 * 4 * 29 * 43 * 8
    assert enc < 43 * 43
    plain = dataclasses.replace(
        config, attention="full", block_size=None, global_blocks=None, window_blocks=None,
        num_random_blocks=None, bigbird_seed=None,
    )  # fmt: skip
    assert report.memory["kv_cache"] == kv_cache_bytes(plain, 29, 2, src_len=43)
