"""attention_stats: blockwise entropy / max weight / log-sum-exp against float64 references."""

from __future__ import annotations

import pytest
import torch

from attnlab import scaled_dot_product_attention
from attnlab.inspect import attention_stats
from tests.distributed._launch import launch


def _reference(q, k, mask=None, is_causal=False, scale=None):
    """Exact statistics from the full float64 weight matrix."""
    q, k = q.double(), k.double()
    k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q @ k.transpose(-2, -1) * scale
    t_q, t_k = s.shape[-2:]
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    if is_causal:
        i, j = torch.arange(t_q)[:, None], torch.arange(t_k)[None]
        s = s.masked_fill(j > i + t_k - t_q, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    empty = torch.isinf(lse)
    p = torch.softmax(s.masked_fill(empty[..., None], 0.0), dim=-1).masked_fill(
        empty[..., None], 0.0
    )
    entropy = -torch.special.xlogy(p, p).sum(-1)
    return entropy, p.amax(-1), lse


def _close(stats, ref, atol):
    entropy, max_weight, lse = ref
    assert (stats.entropy.double() - entropy).abs().max() <= atol
    assert (stats.max_weight.double() - max_weight).abs().max() <= atol
    finite = torch.isfinite(lse)
    assert torch.equal(torch.isfinite(stats.logsumexp), finite)
    assert (stats.logsumexp.double()[finite] - lse[finite]).abs().max() <= atol


def test_matches_exact_values_at_1024() -> None:
    q, k = torch.randn(1, 4, 1024, 64) * 1.5, torch.randn(1, 4, 1024, 64) * 1.5
    for causal in (False, True):
        stats = attention_stats(q, k, is_causal=causal)
        assert (
            stats.entropy.shape == stats.max_weight.shape == stats.logsumexp.shape == (1, 4, 1024)
        )
        _close(stats, _reference(q, k, is_causal=causal), 1e-4)


def test_causal_rows_score_little_more_than_the_keys_they_see(monkeypatch) -> None:
    """Query chunks of up to TILE_ELEMENTS / block_size rows scored every key up to their last
    row's: at 1024 causal tokens all 1024² pairs, twice the 525k visible ones (a third of
    notebook 11's time). Chunks of block_size / 4 rows stop near the diagonal."""
    t, d = 1024, 8
    q, k = torch.randn(1, 1, t, d), torch.randn(1, 1, t, d)
    scored = []
    matmul = torch.matmul

    def counting(a, b):
        out = matmul(a, b)
        if a.shape[-1] == d and b.shape[-2] == d:  # scores Q Kᵀ (not the e · [K, 1] product)
            scored.append(out.shape[-2] * out.shape[-1])
        return out

    monkeypatch.setattr(torch, "matmul", counting)
    stats = attention_stats(q, k, is_causal=True)
    monkeypatch.undo()
    assert sum(scored) <= 0.6 * t * t  # the visible pairs: t (t + 1) / 2 ≈ 0.5 t²
    _close(stats, _reference(q, k, is_causal=True), 1e-5)


@pytest.mark.parametrize(
    ("t_q", "t_k", "h", "h_kv", "causal"),
    [(1, 17, 4, 4, True), (17, 113, 4, 2, True), (113, 17, 4, 1, True), (127, 127, 2, 2, False)],
)
def test_grid_shapes_heads_causal(t_q: int, t_k: int, h: int, h_kv: int, causal: bool) -> None:
    q, k = torch.randn(2, h, t_q, 16) * 2, torch.randn(2, h_kv, t_k, 16) * 2
    stats = attention_stats(q, k, is_causal=causal, block_size=16)
    _close(stats, _reference(q, k, is_causal=causal), 1e-4)


def test_masks_and_fully_masked_rows() -> None:
    q, k = torch.randn(2, 4, 9, 8), torch.randn(2, 2, 9, 8)  # grouped heads
    keep = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    keep[1, ..., 5:] = False  # padding keys
    bias = torch.randn(4, 9, 9)
    bias[0, 3, :] = float("-inf")  # a row that may see nothing
    for mask in (keep, bias):
        stats = attention_stats(q, k, mask, is_causal=True, block_size=4)
        _close(stats, _reference(q, k, mask, is_causal=True), 1e-5)
    stats = attention_stats(q, k, bias)
    assert torch.all(stats.entropy[:, 0, 3] == 0) and torch.all(stats.max_weight[:, 0, 3] == 0)
    assert torch.all(stats.logsumexp[:, 0, 3] == float("-inf"))
    assert torch.isfinite(stats.entropy).all()


def test_agrees_with_the_weights_of_the_attention_core() -> None:
    q, k = torch.randn(1, 6, 33, 16), torch.randn(1, 2, 40, 16)
    _, w = scaled_dot_product_attention(q, k, k, is_causal=True, need_weights=True, scale=0.3)
    stats = attention_stats(q, k, is_causal=True, scale=0.3, block_size=8)
    assert torch.allclose(stats.max_weight, w.amax(-1), atol=1e-5)
    assert torch.allclose(stats.entropy, -torch.special.xlogy(w, w).sum(-1), atol=1e-4)
    assert torch.allclose(stats.effective_keys, stats.entropy.exp())


def test_half_precision_inputs_give_fp32_statistics() -> None:
    q, k = torch.randn(1, 2, 64, 32), torch.randn(1, 2, 64, 32)
    ref = _reference(q.bfloat16(), k.bfloat16(), is_causal=True)
    stats = attention_stats(q.bfloat16(), k.bfloat16(), is_causal=True)
    assert stats.entropy.dtype == torch.float32
    _close(stats, ref, 1e-4)


def test_bad_input_names_the_argument() -> None:
    q = torch.randn(1, 4, 8, 16)
    with pytest.raises(
        ValueError, match="query heads H = 4 must be a multiple of key heads H_kv = 3"
    ):
        attention_stats(q, torch.randn(1, 3, 8, 16))
    with pytest.raises(ValueError, match="head dims must match"):
        attention_stats(q, torch.randn(1, 4, 8, 8))
    with pytest.raises(ValueError, match="mask has shape"):
        attention_stats(q, q, torch.ones(3, 8, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"query must be a torch\.Tensor"):
        attention_stats([1.0], q)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        attention_stats(q, q, block_size=0)


def _memory_rank(rank: int, world_size: int, t: int) -> dict[str, object]:
    """The peak resident memory beyond the inputs of ``attention_stats`` at ``t`` tokens, in a
    process of its own: a fresh fork of the fork server of tests/distributed/_launch.py, which
    imported torch and attnlab once (a new interpreter would import them again, ~3 s of CPU
    each time); the peak counter is reset in that process before the measured call."""
    import resource

    def status(field: str) -> int | None:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
        return None

    # one thread, as the test workers run (tests/conftest.py): a second OpenMP thread adds no
    # memory worth measuring here, but spins on the other core (twice the CPU seconds)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    q, k = torch.randn(1, 12, t, 64), torch.randn(1, 12, t, 64)
    attention_stats(q[..., :64, :], k[..., :64, :])  # warm up torch's lazily loaded kernels
    peak: str | None
    try:  # reset the peak-RSS counter (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base, peak = status("VmRSS"), "VmHWM"
    except OSError:
        base, peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, None
    stats = attention_stats(q, k, is_causal=True)
    top = status(peak) if peak else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert top is not None and base is not None
    return {"extra": top - base, "finite": bool(torch.isfinite(stats.entropy).all())}


def _peak_extra_bytes(t: int) -> int:
    result = launch(_memory_rank, 1, t)[0]
    assert result["finite"]
    return int(result["extra"])


def test_memory_stays_far_below_one_weight_matrix() -> None:
    # at T = 4096 one fp32 weight matrix of 12 heads is 768 MiB: a T × T implementation fails here
    extra = _peak_extra_bytes(4096)
    assert extra <= 512 * 2**20
    assert extra < 0.5 * 12 * 4096 * 4096 * 4


@pytest.mark.slow
def test_memory_at_16384_tokens_and_12_heads_is_under_512_mib() -> None:
    extra = _peak_extra_bytes(16384)
    assert extra <= 512 * 2**20, f"{extra / 2**20:.0f} MiB beyond the inputs"
