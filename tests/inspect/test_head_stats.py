"""Streamed per-head statistics (entropy, max weight, first-token weight) against the full
weights, on decoders of every shape the statistics must follow: grouped-query heads, rotary
positions, a sliding window, a block layout; and their memory, linear in ``T``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import attnlab as al
from attnlab.inspect import attention_stats, capture, capture_attention, diagnose
from attnlab.inspect.diagnostics import attention_entropy
from tests.distributed._launch import launch

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {
    "gqa-rope": dict(positions="rope", num_kv_heads=2),
    "sliding-mqa": dict(attention="sliding", window=5, positions="rope", num_kv_heads=1),
    "bigbird": dict(attention="bigbird", block_size=4),
    "gpt2": {},
}


def _model(**kw: object) -> al.GPT:
    torch.manual_seed(0)
    cfg = al.GPTConfig(vocab_size=50, n_positions=300, n_embd=32, n_layer=2, n_head=4, **kw)
    model = al.GPT(cfg).eval()
    with torch.no_grad():  # sharp heads: at GPT-2's init every head is near uniform
        for name, p in model.named_parameters():
            if name.endswith("c_attn.weight"):
                p.mul_(12.0)
    return model


@pytest.mark.parametrize("t", [1, 7, 257])
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_streamed_statistics_equal_those_of_the_full_weights(
    kind: str, t: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("attnlab.inspect.stats.TILE_ELEMENTS", 4096)  # many query chunks
    model = _model(**CONFIGS[kind])
    ids = torch.randint(0, 50, (2, t))
    with torch.no_grad(), capture(model) as full:
        model(ids)
    streamed = capture_attention(model, lambda: model(ids), weights=False, stats=True)
    assert list(streamed.stats) == list(full.attentions)
    for name, w in full.attentions.items():
        st, w = streamed.stats[name], w.double()
        assert st.entropy.shape == (2, 4, t)  # query heads, also over fewer key/value heads
        torch.testing.assert_close(st.entropy.double(), attention_entropy(w), atol=2e-5, rtol=0)
        torch.testing.assert_close(st.max_weight.double(), w.amax(-1), atol=5e-6, rtol=0)
        torch.testing.assert_close(st.first_weight.double(), w[..., 0], atol=5e-6, rtol=0)
    a, b = diagnose(full), diagnose(streamed)
    assert [(h.layer, h.head) for h in a.heads] == [(h.layer, h.head) for h in b.heads]
    for x, y in zip(a.heads, b.heads):
        for field in ("entropy_mean", "max_weight_mean", "first_token_share"):
            assert getattr(x, field) == pytest.approx(getattr(y, field), abs=2e-5), field


@pytest.mark.parametrize("t", [1, 7, 257])
@pytest.mark.parametrize(("window", "blocks"), [(None, 16), (9, 16), ((3, 2), 8)])
def test_attention_stats_follow_the_window_against_float64(
    t: int, window: object, blocks: int
) -> None:
    torch.manual_seed(1)
    q, k = torch.randn(1, 6, t, 8) * 2, torch.randn(1, 2, t, 8) * 2  # 6 query heads on 2
    st = attention_stats(q, k, is_causal=True, window=window, block_size=blocks)
    s = q.double() @ k.double().repeat_interleave(3, dim=1).transpose(-1, -2) / 8**0.5
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    vis = j <= i
    if window is not None:
        left, right = (window, 0) if isinstance(window, int) else window
        vis = vis & (j >= i - left) & (j <= i + right)
    p = torch.softmax(s.masked_fill(~vis, float("-inf")), -1)
    torch.testing.assert_close(st.entropy.double(), attention_entropy(p), atol=5e-5, rtol=0)
    torch.testing.assert_close(st.max_weight.double(), p.amax(-1), atol=5e-6, rtol=0)
    torch.testing.assert_close(st.first_weight.double(), p[..., 0], atol=5e-6, rtol=0)


def test_stopping_after_the_last_attention_layer_skips_the_logits() -> None:
    model = _model(positions="rope", num_kv_heads=2)
    seen: list[str] = []
    handle = model.lm_head.register_forward_hook(lambda *a: seen.append("lm_head"))
    try:
        cache = capture_attention(model, lambda: model(torch.randint(0, 50, (1, 5)))
                                  , weights=False, stats=True)  # fmt: skip
    finally:
        handle.remove()
    assert seen == [] and len(cache.stats) == 2
    with pytest.raises(al.errors.ArgumentTypeError):
        capture_attention(model, "not callable", stats=True)  # type: ignore[arg-type]


def _peak_rank(rank: int, world_size: int, t: int) -> int:
    """benchmarks/head_stats.py's measured child at ``t`` tokens, run in a fresh fork of the fork
    server of tests/distributed/_launch.py (one OpenMP thread, as the test workers run), which
    imported torch and attnlab once: a new interpreter per size would import them again, ~3 s of
    CPU each; the child resets the peak counter itself before the measured call."""
    spec = importlib.util.spec_from_file_location(
        "_head_stats_bench", ROOT / "benchmarks" / "head_stats.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return int(bench._child(t, 2)["peak_extra_bytes"])


def _peak(t: int) -> int:
    return int(launch(_peak_rank, 1, t)[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS from /proc (Linux)")
def test_memory_grows_linearly_in_t() -> None:
    # a SmolLM2-shaped decoder (9 query heads on 3, rotary): one layer's T × T weights alone
    # would grow 4× from T to 2T (36 MiB → 144 MiB); the streamed statistics grow about 2× at most
    small, large = _peak(1024), _peak(2048)
    assert large < 2.5 * small, (small, large)
    assert large < 9 * 2048 * 2048 * 4  # below one layer's weights
