"""Sliding-window attention (issue 12): ``window=(left, right)``, FlashAttention's ``window_size``.

Query ``i`` at position ``p_i = i + T_k - T_q`` (bottom-right, as the causal rule) sees keys
``p_i - left <= j <= p_i + right``. Every backend equals the float64 reference with the dense
:func:`attnlab.masks.sliding_window_mask`, forward and backward, with ``is_causal``, padding and
additive masks, GQA, odd lengths and ``T_q != T_k``; the blockwise backend visits only the tiles
that meet the band.
"""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab.nn.backends import blockwise
from attnlab.nn.backends.plan import TilePlan
from attnlab.nn.cache_policies import RollingKVCache
from attnlab.nn.kv_cache import KVCache, ModelCache
from attnlab.nn.mask_spec import (
    _band_leaves_every_row_a_key,
    _structure_sees_every_key,
    empty_rows,
    hide_unseen_keys,
    normalize_mask,
)
from tests.decoding._models import tiny_gpt
from tests.nn._patterns import BACKENDS, B, count_scores, use_small_tiles
from tests.nn._patterns import qkv as _qkv
from tests.nn._patterns import user_mask as _mask
from tests.reference import assert_close_rule, attention_ref

WINDOWS = [(0, 0), (3, 0), (2, 5), (1000, 0), 4, (None, 2), (3, None)]
LENGTHS = [(1, 1), (7, 7), (33, 33), (130, 130), (5, 9), (9, 5), (33, 130)]


@pytest.fixture(autouse=True)
def _small_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    use_small_tiles(monkeypatch)


def _dense(mask: torch.Tensor | None, t_q: int, t_k: int, window: object) -> torch.Tensor:
    band = al.masks.sliding_window_mask(t_q, t_k, window)  # type: ignore[arg-type]
    return band if mask is None else al.masks.combine(mask, band)


def _check(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    window: object,
    is_causal: bool,
    backend: str,
    gen: torch.Generator,
) -> None:
    out, w = al.scaled_dot_product_attention(
        q, k, v, mask, is_causal=is_causal, window=window, backend=backend, need_weights=True
    )
    full = _dense(mask, q.shape[-2], k.shape[-2], window)
    ref, ref_w = attention_ref(q, k, v, full, is_causal=is_causal)
    base, base_w = attention_ref(q, k, v, full, is_causal=is_causal, upcast=False)
    assert_close_rule(out, ref, base, "output")
    assert_close_rule(w, ref_w, base_w, "weights")
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), g.to(out.dtype))
    want = torch.autograd.grad(ref, (q, k, v), g)
    baseline = torch.autograd.grad(base, (q, k, v), g.to(base.dtype))
    for name, a, b, c in zip("qkv", got, want, baseline):
        assert_close_rule(a, b, c, f"d{name}")


# ------------------------------------------------------------------------- every backend, a grid


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda t: f"{t[0]}x{t[1]}")
def test_every_backend_equals_the_float64_reference(
    lengths: tuple[int, int], window: object, backend: str
) -> None:
    t_q, t_k = lengths
    gen = torch.Generator().manual_seed(t_q * 1000 + t_k)
    q, k, v = _qkv(t_q, t_k, gen)
    for kind in ("none", "padding", "additive"):
        mask = _mask(kind, t_q, t_k, gen)
        for is_causal in (False, True):
            _check(q, k, v, mask, window, is_causal, backend, gen)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_within_twice_the_plain_error(backend: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    q, k, v = _qkv(67, 67, gen, dtype)
    _check(q, k, v, _mask("padding", 67, 67, gen), (9, 2), True, backend, gen)
    _check(q, k, v, None, 16, False, backend, gen)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_that_see_no_key_give_zeros_and_unseen_nan_never_leaks(backend: str) -> None:
    """Right padding under a window: rows whose whole window is padding see no key."""
    t = 40
    gen = torch.Generator().manual_seed(5)
    q, k, v = _qkv(t, t, gen)
    mask = torch.ones(B, 1, 1, t, dtype=torch.bool)
    mask[1, ..., 20:] = False  # row 1: keys 20… are padding, so queries 23… see nothing
    with torch.no_grad():
        k[1, :, 20:] = float("nan")
        v[1, :, 20:] = float("inf")
    out, w = al.scaled_dot_product_attention(
        q, k, v, mask, is_causal=True, window=3, backend=backend, need_weights=True
    )
    assert not torch.isnan(out).any() and not torch.isnan(w).any()
    assert (out[1, :, 23:] == 0).all() and (w[1, :, 23:] == 0).all()
    assert (out[1, :, :23].abs().sum(-1) > 0).all()
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert (dq[1, :, 23:] == 0).all()
    assert not any(torch.isnan(g).any() for g in (dq, dk, dv))
    ref, _ = attention_ref(q, k, v, _dense(mask, t, t, 3), is_causal=True)
    assert_close_rule(out, ref, ref)


@pytest.mark.parametrize("backend", ["math", "sdpa", "blockwise"])
def test_keys_outside_every_window_are_hidden(backend: str) -> None:
    """A decoding-like step (T_q < T_k): keys older than the window hold NaN, output is finite."""
    gen = torch.Generator().manual_seed(8)
    q, k, v = _qkv(2, 20, gen)
    with torch.no_grad():
        k[..., :10, :] = float("nan")  # the queries (positions 18, 19) see 18 - 5 = 13 onwards
        v[..., :10, :] = float("inf")
    out = al.scaled_dot_product_attention(q, k, v, window=5, backend=backend)
    ref, _ = attention_ref(q, k, v, al.masks.sliding_window_mask(2, 20, 5))
    assert_close_rule(out, ref, ref)


def test_window_is_structure_not_a_dense_tensor() -> None:
    q = torch.randn(1, 2, 9, 4)
    k = torch.randn(1, 2, 12, 4)
    m = normalize_mask(q, k, None, False, (2, 1))
    assert m.allowed is None and m.window == (2, 1) and m.causal_offset is None
    torch.testing.assert_close(
        m.visible(9, 12, q.device), al.masks.sliding_window_mask(9, 12, (2, 1))
    )
    # a side that hides nothing at these lengths is dropped; (left >= T_k - 1, 0) is causal
    assert normalize_mask(q, k, None, False, (100, 1)).window == (None, 1)
    causal = normalize_mask(q, k, None, False, 11)
    assert causal.window is None and causal.causal_offset == 3
    assert normalize_mask(q, k, None, True, (2, 5)).window == (2, None)
    assert normalize_mask(q, k, None, False, (None, None)).window is None
    assert normalize_mask(q, k, None, False, None) == normalize_mask(q, k, None, False)


@pytest.mark.parametrize("is_causal", [False, True])
def test_empty_rows_account_for_the_window(is_causal: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    for t_q, t_k in ((9, 5), (5, 9), (12, 12)):
        q, k = torch.randn(1, 2, t_q, 4), torch.randn(1, 2, t_k, 4)
        for mask in (None, torch.rand(1, 2, t_q, t_k, generator=gen) > 0.6):
            for window in ((0, 0), (1, 0), (0, 2), 3):
                m = normalize_mask(q, k, mask, is_causal, window)
                got = empty_rows(m, t_q, t_k, q.device)
                vis = _dense(mask, t_q, t_k, window)
                if is_causal:
                    vis = vis & al.masks.causal_mask(t_q, t_k)
                want = ~vis.any(-1, keepdim=True)
                if got is None:
                    assert not want.any()
                else:
                    assert torch.equal(
                        got.expand(want.shape) if want.dim() >= got.dim() else got,
                        want.expand(got.shape),
                    )


def test_band_coverage_decided_from_the_bounds_equals_the_dense_answer() -> None:
    """Whether every row keeps a key, and every key is seen, from ``(lo, hi)`` and the lengths
    alone (what lets a device skip the read-back): every bound and length up to 7, exhaustively."""
    sides = [None, *range(-7, 8)]
    for t_q in range(1, 8):
        for t_k in range(1, 8):
            i, j = torch.arange(t_q)[:, None], torch.arange(t_k)[None, :]
            for lo in sides:
                for hi in sides:
                    vis = torch.ones(t_q, t_k, dtype=torch.bool)
                    if lo is not None:
                        vis &= j >= i + lo
                    if hi is not None:
                        vis &= j <= i + hi
                    bounds = (lo, hi)
                    rows = _band_leaves_every_row_a_key(bounds, t_q, t_k)
                    assert rows == bool(vis.any(-1).all()), (bounds, t_q, t_k)
                    keys = _structure_sees_every_key(bounds, None, t_q, t_k)
                    assert keys == bool(vis.any(-2).all()), (bounds, t_q, t_k)


def test_a_window_stays_structure_off_the_cpu() -> None:
    """On a device whose values cannot be read back (``meta`` stands in for CUDA) a window that
    leaves every row a key is neither opened into a dense mask nor zeroes keys: the flex and
    blockwise backends keep skipping the tiles outside the band."""
    meta = torch.device("meta")
    cases = (
        (300, 300, 64, True, True),
        (100, 300, (250, 0), True, True),
        (40, 300, (8, 3), False, False),
    )
    for t_q, t_k, window, is_causal, all_seen in cases:
        q, k = torch.randn(1, 2, t_q, 4, device=meta), torch.randn(1, 2, t_k, 4, device=meta)
        m = normalize_mask(q, k, None, is_causal, window)
        assert m.window is not None and empty_rows(m, t_q, t_k, meta) is None
        kk, vv = hide_unseen_keys(None, k, k, m.bounds(t_q, t_k), t_q)
        # keys 0 … 251 lie outside every window of the last case: zeroed (new tensors)
        assert (kk is k and vv is k) == all_seen
    # rows without a key (T_q > T_k, causal): the device takes the long way, no read-back
    q, k = torch.randn(1, 2, 9, 4, device=meta), torch.randn(1, 2, 5, 4, device=meta)
    m = normalize_mask(q, k, None, True, 2)
    assert empty_rows(m, 9, 5, meta) is not None


# --------------------------------------------------------------------- blockwise: band tiles only


@pytest.mark.parametrize("backend", ["blockwise", "blockwise_python"])
def test_blockwise_visits_only_the_tiles_of_the_band(
    monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    t, w = 8192, 64
    counted = count_scores(monkeypatch)
    q = torch.randn(1, 1, t, 8, requires_grad=True)
    k = torch.randn(1, 1, t, 8, requires_grad=True)
    v = torch.randn(1, 1, t, 8, requires_grad=True)
    out = al.scaled_dot_product_attention(q, k, v, window=w, backend=backend)
    q_block = blockwise.QUERY_BLOCK
    assert len(counted) == t // q_block  # one tile per query block
    # each query block of 64 rows reads at most w + 64 keys: O(T · w), not O(T²)
    assert sum(counted) <= t * (w + q_block)
    assert sum(counted) < t * t / 50
    counted.clear()
    out.sum().backward()  # the backward pass recomputes the same tiles
    if backend == "blockwise_python":  # the gathered band's backward is the kernel's, by autograd
        assert len(counted) == t // q_block and sum(counted) <= t * (w + q_block)
    counted.clear()
    al.scaled_dot_product_attention(q, k, v, window=(w, w), is_causal=True, backend=backend)
    assert sum(counted) <= t * (w + q_block)  # the causal rule cuts the right side
    counted.clear()
    # with a padding mask too, and with rows that see nothing (opened, then zeroed)
    pad = torch.ones(1, 1, 1, t, dtype=torch.bool)
    pad[..., t // 2 :] = False
    o = al.scaled_dot_product_attention(q, k, v, pad, window=w, backend=backend)
    assert sum(counted) <= t * (w + q_block) and (o[..., t // 2 + w :, :] == 0).all()


def test_blockwise_band_plan_masks_only_cut_tiles() -> None:
    plan = TilePlan.make_band(256, 256, 64, 32, (-40, 0))
    for tiles in plan.blocks:
        r0, r1 = tiles[0].r0, tiles[0].r1
        assert tiles[0].j0 == max(0, r0 - 40) and tiles[-1].j1 == r1
        for tile in tiles:  # a tile inside every row's window needs no mask
            inside = tile.j0 >= r1 - 1 - 40 and tile.j1 - 1 <= r0
            assert tile.band == (not inside)


# ------------------------------------------------------------------------------ masks and errors


def test_sliding_window_mask_values() -> None:
    assert torch.equal(
        al.masks.sliding_window_mask(4, 6, (1, 1)).int(),
        torch.tensor(
            [[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1]]
        ),
    )
    for t_q, t_k in ((5, 5), (3, 7), (7, 3)):
        assert torch.equal(
            al.masks.sliding_window_mask(t_q, t_k, 100), al.masks.causal_mask(t_q, t_k)
        )
        i = torch.arange(t_q)[:, None] + t_k - t_q
        j = torch.arange(t_k)[None, :]
        assert torch.equal(
            al.masks.sliding_window_mask(t_q, t_k, (2, 3)), (j >= i - 2) & (j <= i + 3)
        )
        assert torch.equal(
            al.masks.sliding_window_mask(t_q, t_k, 2),
            al.masks.sliding_window_mask(t_q, t_k, (2, 0)),
        )
        assert al.masks.sliding_window_mask(t_q, t_k, None).all()
        assert torch.equal(
            al.masks.sliding_window_mask(t_q, t_k, (None, 0)), al.masks.causal_mask(t_q, t_k)
        )


BAD_WINDOWS = [
    ("3", TypeError, "window must be None, an int"),
    (3.0, TypeError, "window must be None, an int"),
    ((1, 2, 3), TypeError, "window must be None, an int"),
    ((1.5, 0), TypeError, r"window = \(left, right\) must hold ints or None .* left = 1.5"),
    ((True, 0), TypeError, r"window = \(left, right\) must hold ints"),
    (True, TypeError, "window must be None, an int"),
    (-1, ValueError, r"window = \(left, right\) must be >= 0, got left = -1; write None"),
    ((2, -1), ValueError, r"must be >= 0, got right = -1"),
]


@pytest.mark.parametrize(("window", "error", "message"), BAD_WINDOWS, ids=repr)
def test_bad_windows_are_refused_naming_window(window: object, error: type, message: str) -> None:
    q = k = v = torch.randn(1, 2, 5, 4)
    with pytest.raises(error, match=message):
        al.scaled_dot_product_attention(q, k, v, window=window)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        al.masks.sliding_window_mask(5, 5, window)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        al.MultiHeadAttention(8, 2, window=window)  # type: ignore[arg-type]
    mha = al.MultiHeadAttention(8, 2)
    with pytest.raises(error, match=message):
        mha(torch.randn(1, 5, 8), window=window)  # type: ignore[arg-type]


def test_sliding_window_mask_checks_lengths() -> None:
    with pytest.raises(ValueError, match="t_q must be a positive int, got 0"):
        al.masks.sliding_window_mask(0, 3, 1)
    with pytest.raises(TypeError, match="t_k must be an int"):
        al.masks.sliding_window_mask(3, 2.0, 1)  # type: ignore[arg-type]


# ------------------------------------------------------------------ multi-head attention, caches


def test_multihead_window_attribute_and_override() -> None:
    torch.manual_seed(0)
    mha = al.MultiHeadAttention(32, 4, num_kv_heads=2, window=3).double().eval()
    assert mha.window == (3, 0)
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    plain = al.MultiHeadAttention(32, 4, num_kv_heads=2).double().eval()
    plain.load_state_dict(mha.state_dict())
    band = al.masks.sliding_window_mask(13, 13, 3)
    for backend in ("math", "sdpa", "blockwise"):
        mha.backend = plain.backend = backend
        out, w = mha(x, need_weights=True)
        ref, ref_w = plain(x, mask=band, need_weights=True)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(w, ref_w)
        torch.testing.assert_close(mha(x, window=(None, None)), plain(x))  # off for this call
        torch.testing.assert_close(
            mha(x, window=(1, 1)), plain(x, mask=al.masks.sliding_window_mask(13, 13, (1, 1)))
        )


@pytest.mark.parametrize("rolling", [False, True])
def test_decoding_with_a_window_equals_the_full_forward(rolling: bool) -> None:
    """Prefill then one token at a time; a rolling cache holds at most ``w`` keys between steps
    and hands the attention at most ``w + 1``."""
    torch.manual_seed(1)
    w = 4
    mha = al.MultiHeadAttention(32, 4, num_kv_heads=2, window=w).double().eval()
    x = torch.randn(2, 17, 32, dtype=torch.float64)
    keep = torch.ones(2, 17, dtype=torch.bool)
    keep[1, :3] = False  # left padding in row 1
    mask = keep[:, None, None, :]
    full = mha(x, mask=mask, is_causal=True)
    cache = (
        RollingKVCache(2, 2, 32, 8, dtype=torch.float64, window=w)
        if rolling
        else KVCache(2, 2, 32, 8, dtype=torch.float64)
    )
    outs = [mha(x[:, :6], mask=mask[..., :6], is_causal=True, cache=cache)]
    seen = []
    mha.hook_k.register_forward_hook(lambda mod, args, out: seen.append(out.shape[-2]))
    for t in range(6, 17):
        outs.append(mha(x[:, t : t + 1], mask=mask[..., : t + 1], is_causal=True, cache=cache))
        assert cache.length == t + 1
        if rolling:
            assert cache.keys.shape[-2] == w and cache.k.shape[-2] == w
    torch.testing.assert_close(torch.cat(outs, 1), full)
    if rolling:
        assert max(seen) == w + 1


def test_a_rolling_cache_refuses_a_window_it_cannot_serve() -> None:
    mha = al.MultiHeadAttention(16, 2, window=6)
    cache = RollingKVCache(1, 2, 32, 8, window=4)
    with pytest.raises(ValueError, match=r"cache keeps only the last 4 positions"):
        mha(torch.randn(1, 3, 16), is_causal=True, cache=cache)
    with pytest.raises(ValueError, match=r"cache keeps only the last 4 positions"):
        al.MultiHeadAttention(16, 2)(torch.randn(1, 3, 16), is_causal=True, cache=cache)
    with pytest.raises(ValueError, match="window must be a positive int"):
        RollingKVCache(1, 2, 32, 8, window=0)


def _windowed_gpt(w: int) -> al.GPT:
    model = tiny_gpt(positions="rope")
    for block in model.transformer.h:
        block.attn.window = (w, 0)
    return model


def test_generation_with_a_windowed_model_equals_the_full_forward() -> None:
    w = 5
    model = _windowed_gpt(w)
    prompt = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(0))
    got = al.generate(model, prompt, max_new_tokens=20)
    ids = prompt
    with torch.no_grad():
        for _ in range(20):  # greedy on the full forward, no cache
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(got, ids)
    # the window changes what the model computes: without it the logits differ
    with torch.no_grad():
        windowed = model(ids).logits
        for block in model.transformer.h:
            block.attn.window = None
        assert not torch.allclose(windowed, model(ids).logits)


def test_a_rolling_model_cache_gives_the_full_forward_logits() -> None:
    w = 5
    model = _windowed_gpt(w)
    ids = torch.randint(0, 61, (2, 30), generator=torch.Generator().manual_seed(1))
    cfg = model.config
    cache = ModelCache(
        [
            RollingKVCache(2, cfg.kv_heads, 64, cfg.d_head, dtype=torch.float64, window=w)
            for _ in range(cfg.n_layer)
        ]
    )
    with torch.no_grad():
        full = model(ids).logits
        steps = [model(ids[:, :8], cache=cache).logits]
        for t in range(8, 30):
            steps.append(model.decode_step(ids[:, t : t + 1], cache)[:, None])
            assert all(c.keys.shape[-2] <= w for c in cache.layers)
    assert (
        cache.length == 30
        and cache.nbytes() == 2 * cfg.n_layer * 2 * cfg.kv_heads * w * cfg.d_head * 8
    )
    torch.testing.assert_close(torch.cat(steps, 1), full)
