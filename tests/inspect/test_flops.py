"""flops(): the term-by-term formulas against torch's FlopCounterMode and real parameter counts."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab import GPT, GPTConfig, Transformer, TransformerConfig
from attnlab.inspect import flops, kv_cache_bytes


def _counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _within(estimate: int, measured: int, rel: float = 0.02) -> bool:
    return abs(estimate - measured) <= rel * measured


# The explicit "math" backend: on the CPU torch's fused attention kernel is not in FlopCounterMode's
# registry (it would count the attention matmuls as 0), so the counter sees them only as matmuls.
SMALL = {"vocab_size": 97, "n_positions": 64, "n_embd": 64, "n_head": 4, "backend": "math"}
GPT_CONFIGS = [
    GPTConfig(n_layer=2, **SMALL),
    GPTConfig(n_layer=3, num_kv_heads=2, positions="rope", bias=False, **SMALL),
    # Llama's parts (RMSNorm, SwiGLU of width 96, untied head, Qwen2's q/k/v biases)
    GPTConfig(
        n_layer=2,
        num_kv_heads=2,
        positions="rope",
        bias=False,
        norm="rmsnorm",
        activation="silu",
        mlp="gated",
        d_ff=96,
        qkv_bias=True,
        tie_embeddings=False,
        **SMALL,
    ),
    # GPT-NeoX's (parallel residual, partial rotary, exact GELU, untied head)
    GPTConfig(
        n_layer=2,
        positions="rope",
        rotary_dim=4,
        rope_pairing="halves",
        activation="gelu",
        parallel_residual=True,
        tie_embeddings=False,
        family="neox",
        **SMALL,
    ),
    # attention-only (Olsson et al. 2022): no MLP
    GPTConfig(n_layer=2, positions="rope", mlp="none", **SMALL),
]


@pytest.mark.parametrize(
    "config", GPT_CONFIGS, ids=["gpt", "gpt-gqa-rope", "llama", "neox", "attention-only"]
)
def test_gpt_agrees_with_flop_counter(config: GPTConfig) -> None:
    model = GPT(config)
    x = torch.randint(0, config.vocab_size, (2, 48))
    report = flops(config, seq_len=48, batch=2)
    with torch.no_grad():
        forward = _counted(lambda: model(x))
    train = _counted(lambda: model(x, labels=x).loss.backward())
    assert _within(report.forward_total, forward)
    assert _within(report.train_total, train)
    assert report.train_total == 3 * report.forward_total
    assert report.params["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "extra",
    [{}, {"share_embeddings": True, "norm_first": True}, {"tie_output": False, "num_kv_heads": 1}],
    ids=["base", "shared-prenorm", "untied-mqa"],
)
def test_transformer_agrees_with_flop_counter(extra: dict) -> None:
    config = TransformerConfig(
        src_vocab_size=61, tgt_vocab_size=61, d_model=32, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=3, d_ff=64, backend="math", **extra,
    )  # fmt: skip
    model = Transformer(config)
    src, tgt = torch.randint(3, 61, (2, 11)), torch.randint(3, 61, (2, 7))
    report = flops(config, seq_len=7, batch=2, src_len=11)
    with torch.no_grad():
        forward = _counted(lambda: model(src, tgt))
    train = _counted(lambda: model(src, tgt, targets=tgt).loss.backward())
    assert _within(report.forward_total, forward)
    assert _within(report.train_total, train)
    assert report.params["total"] == sum(p.numel() for p in model.parameters())
    assert report.src_len == 11 and "decoder/cross_attention/kv" in report.forward


def test_fused_backend_differs_only_by_the_attention_matmuls() -> None:
    config = dataclasses.replace(GPT_CONFIGS[0], backend="sdpa")
    x = torch.randint(0, config.vocab_size, (1, 40))
    with torch.no_grad():
        counted = _counted(lambda: GPT(config)(x))
    terms = flops(config, seq_len=40).grouped()
    assert counted == flops(config, seq_len=40).forward_total - terms["scores"] - terms["reduce"]


def test_gpt2_small_matches_the_seed_numbers() -> None:
    # nanoGPT's transformer_sizing: 124M parameters, ~292 GFLOPs forward and ~875 GFLOPs a step
    report = flops(GPTConfig(), seq_len=1024)
    assert report.params["total"] == 124_439_808
    assert report.forward["attention/qkv"] == 12 * 2 * 1024 * 768 * 3 * 768
    assert report.forward["attention/scores"] == 12 * 2 * 1024 * 1024 * 768
    assert report.forward["lm_head"] == 2 * 1024 * 768 * 50257
    assert round(report.forward_total / 1e9) == 292 and round(report.train_total / 1e9) == 875
    d = report.to_dict()
    assert d["train_total"] == report.train_total and d["memory"]["parameters"] == 124_439_808 * 4


def test_kv_cache_bytes_for_mha_gqa_mqa() -> None:
    config = GPTConfig(n_layer=12, n_head=12, num_kv_heads=4, n_embd=768)
    report = flops(config, seq_len=1000, batch=2)
    per_head = 2 * 12 * 2 * 64 * 1000 * 4  # K and V · layers · batch · d_head · T · fp32
    assert report.kv_cache == {"MHA": 12 * per_head, "GQA": 4 * per_head, "MQA": per_head}
    assert report.memory["kv_cache"] == 4 * per_head
    assert kv_cache_bytes(config, 1000, 2, num_kv_heads=1, dtype=torch.bfloat16) == per_head // 2
    # encoder-decoder: self-attention cache (target) + cross-attention keys/values (source)
    tc = TransformerConfig()
    assert kv_cache_bytes(tc, 10, src_len=30) == 2 * 6 * 8 * 64 * (10 + 30) * 4


def test_bad_arguments() -> None:
    with pytest.raises(
        TypeError, match="config must be a GPTConfig or a TransformerConfig, got dict"
    ):
        flops({}, 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seq_len must be a positive int, got 0"):
        flops(GPTConfig(), 0)
    with pytest.raises(ValueError, match="num_kv_heads must divide the 12 query heads, got 5"):
        flops(GPTConfig(), 10, num_kv_heads=5)
    with pytest.raises(ValueError, match="src_len is only for the encoder-decoder"):
        flops(GPTConfig(), 10, src_len=4)


def test_a_length_past_the_models_positions_is_refused() -> None:
    # GPT-2 has 1024 positions: 4096 tokens is a model that cannot run, not a FLOP count
    with pytest.raises(
        ValueError, match=r"seq_len must be at most config.n_positions = 1024 .*4096"
    ):
        flops(GPTConfig(), 4096)
    with pytest.raises(ValueError, match=r"seq_len must be at most config.n_positions = 1024"):
        kv_cache_bytes(GPTConfig(), 1025)
    rope = GPTConfig(positions="rope", n_positions=256)  # rope and alibi keep the limit too
    with pytest.raises(ValueError, match=r"config.n_positions = 256 .*got 257"):
        flops(rope, 257)
    tc = TransformerConfig(max_len=64)
    with pytest.raises(ValueError, match=r"src_len must be at most config.max_len = 64 .*got 65"):
        flops(tc, 10, src_len=65)
    with pytest.raises(ValueError, match=r"seq_len must be at most config.max_len = 64"):
        kv_cache_bytes(tc, 65, src_len=10)
    # the limit itself, and a longer context when the config has one
    assert flops(GPTConfig(), 1024).seq_len == 1024
    longer = flops(dataclasses.replace(GPTConfig(), n_positions=4096), 4096)
    assert longer.params["embedding/position"] == 4096 * 768


# -- attention patterns (issue 12) --------------------------------------------------------------

PATTERN_SMALL = {**SMALL, "n_layer": 2}


def test_window_pairs_is_the_mask_count() -> None:
    from attnlab.inspect.flops import window_pairs
    from attnlab.nn.masks import sliding_window_mask

    for t_q, t_k, window in [(17, 17, (3, 0)), (9, 9, (2, 2)), (5, 12, (4, 0)), (6, 6, (10, 10))]:
        mask = sliding_window_mask(t_q, t_k, window)
        if window[1] == 0:
            mask = mask & torch.ones(t_q, t_k).tril(t_k - t_q).bool()
        assert window_pairs(t_q, t_k, *window) == int(mask.sum())


def test_sliding_gpt_counts_the_visible_pairs() -> None:
    t, w, b = 48, 7, 2
    full = GPTConfig(**PATTERN_SMALL)
    cfg = dataclasses.replace(full, attention="sliding", window=w)
    report, dense = flops(cfg, seq_len=t, batch=b), flops(full, seq_len=t, batch=b)
    pairs = sum(min(i + 1, w + 1) for i in range(t))  # causal window: exactly the visible pairs
    d_h, h = cfg.d_head, cfg.n_head
    assert report.forward["attention/scores"] == b * cfg.n_layer * 2 * h * pairs * d_h
    assert report.forward["attention/reduce"] == report.forward["attention/scores"]
    assert dense.forward_total - report.forward_total == b * cfg.n_layer * 4 * h * d_h * (
        t * t - pairs
    )
    # the math backend still forms T × T scores: FlopCounterMode sees the full-attention figure
    model = GPT(cfg)
    x = torch.randint(0, cfg.vocab_size, (b, t))
    with torch.no_grad():
        counted = _counted(lambda: model(x))
    assert _within(dense.forward_total, counted)
    assert (
        report.memory["kv_cache"] == kv_cache_bytes(cfg, t, b) == dense.memory["kv_cache"] * w // t
    )
    assert report.memory["attention_matrix"] == b * h * t * (w + 1) * 4
    assert report.params == dense.params


def test_performer_gpt_agrees_with_flop_counter() -> None:
    cfg = GPTConfig(**PATTERN_SMALL, attention="performer", num_features=24)
    model = GPT(cfg)
    for t in (48, 64):  # one chunk of the causal prefix sums
        x = torch.randint(0, cfg.vocab_size, (2, t))
        report = flops(cfg, seq_len=t, batch=2)
        with torch.no_grad():
            counted = _counted(lambda x=x: model(x))
        assert report.forward_total == counted
        assert report.params["total"] == sum(p.numel() for p in model.parameters())
        # no KV cache: the running sums of every layer, as large as the cache decoding makes
        assert report.memory["kv_cache"] == kv_cache_bytes(cfg, t, 2)
        assert kv_cache_bytes(cfg, t, 2) == model.new_cache(2, t).nbytes()
        assert kv_cache_bytes(cfg, 1, 2) == kv_cache_bytes(cfg, t, 2)  # flat in T


def test_performer_causal_chunks_agree_with_flop_counter() -> None:
    from attnlab.nn.performer import PerformerAttention

    layer = PerformerAttention(32, 4, num_features=16, causal=True)
    cfg = GPTConfig(vocab_size=10, n_positions=400, n_embd=32, n_head=4, n_layer=1,
                    attention="performer", num_features=16)  # fmt: skip
    for t in (130, 300):  # several chunks of 128 queries
        x = torch.randn(1, t, 32)
        with torch.no_grad():
            counted = _counted(lambda x=x: layer(x))
        terms = {
            k: v for k, v in flops(cfg, seq_len=t).forward.items() if k.startswith("attention")
        }
        assert sum(terms.values()) == counted


@pytest.mark.parametrize(
    "extra",
    [{"attention": "linformer", "linformer_k": 5}, {"attention": "performer", "num_features": 12}],
    ids=["linformer", "performer"],
)
def test_transformer_patterns_agree_with_flop_counter(extra: dict) -> None:
    config = TransformerConfig(
        src_vocab_size=61, tgt_vocab_size=61, d_model=32, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=2, d_ff=64, max_len=32, backend="math", **extra,
    )  # fmt: skip
    model = Transformer(config)
    src, tgt = torch.randint(3, 61, (2, 11)), torch.randint(3, 61, (2, 7))
    report = flops(config, seq_len=7, batch=2, src_len=11)
    with torch.no_grad():
        counted = _counted(lambda: model(src, tgt))
    assert report.forward_total == counted
    assert report.params["total"] == sum(p.numel() for p in model.parameters())
    if extra["attention"] == "linformer":
        assert report.forward["encoder/attention/scores"] == 2 * 2 * 2 * 4 * 11 * 5 * 8
        assert report.memory["kv_cache"] == kv_cache_bytes(
            dataclasses.replace(config, attention="full", linformer_k=None), 7, 2, src_len=11
        )


def test_sliding_transformer_windows() -> None:
    from attnlab.inspect.flops import window_pairs

    config = TransformerConfig(
        src_vocab_size=61, tgt_vocab_size=61, d_model=32, num_heads=4, num_encoder_layers=1,
        num_decoder_layers=1, d_ff=64, attention="sliding", window=3,
    )  # fmt: skip
    r = flops(config, seq_len=10, src_len=12)
    assert r.forward["encoder/attention/scores"] == 2 * 4 * window_pairs(12, 12, 3, 3) * 8
    assert r.forward["decoder/self_attention/scores"] == 2 * 4 * window_pairs(10, 10, 3, 0) * 8
    assert r.forward["decoder/cross_attention/scores"] == 2 * 4 * 10 * 12 * 8  # full
