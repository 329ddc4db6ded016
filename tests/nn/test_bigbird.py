"""Block-sparse attention (issue 12): BigBird's global, sliding and random blocks.

:func:`attnlab.masks.bigbird_layout` builds a :class:`attnlab.masks.BlockLayout` (which blocks
are visible), :func:`attnlab.masks.bigbird_mask` is the same layout as a dense mask. Passed as
``block_mask=``, every backend equals the float64 reference with the dense mask, forward and
backward, with ``is_causal``, padding and additive masks, GQA, odd lengths (the last block
partial) and ``T_q < T_k``; the blockwise backend visits only the visible tiles.
"""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab.nn.backends.plan import TilePlan
from attnlab.nn.mask_spec import empty_rows, hide_unseen_keys, normalize_mask
from tests.nn._patterns import BACKENDS, B, count_scores, use_small_tiles
from tests.nn._patterns import qkv as _qkv
from tests.nn._patterns import user_mask as _mask
from tests.reference import assert_close_rule, attention_ref

BLOCK = 16
LENGTHS = [(7, 7), (33, 33), (130, 130), (1, 130), (20, 33)]
LAYOUTS = {
    "bigbird": {},
    "itc": {"global_blocks": (0, -1), "num_random_blocks": 1},
    "window-only": {"global_blocks": 0, "num_random_blocks": 0},
    "sparse": {"global_blocks": 0, "window_blocks": 0, "num_random_blocks": 1},
}


@pytest.fixture(autouse=True)
def _small_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    use_small_tiles(monkeypatch)


def _check(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    layout: al.masks.BlockLayout,
    is_causal: bool,
    backend: str,
    gen: torch.Generator,
) -> None:
    out, w = al.scaled_dot_product_attention(
        q, k, v, mask, is_causal=is_causal, block_mask=layout, backend=backend, need_weights=True
    )
    dense = layout.to_dense(q.shape[-2])
    full = dense if mask is None else al.masks.combine(mask, dense)
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
@pytest.mark.parametrize("kind", list(LAYOUTS))
@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda t: f"{t[0]}x{t[1]}")
def test_every_backend_equals_the_float64_reference(
    lengths: tuple[int, int], kind: str, backend: str
) -> None:
    t_q, t_k = lengths
    gen = torch.Generator().manual_seed(t_q * 1000 + t_k)
    q, k, v = _qkv(t_q, t_k, gen)
    for causal_layout in (False, True):
        layout = al.masks.bigbird_layout(
            t_k, block_size=BLOCK, causal=causal_layout, seed=t_k, **LAYOUTS[kind]
        )
        for mask_kind in ("none", "padding", "additive"):
            mask = _mask(mask_kind, t_q, t_k, gen)
            for is_causal in (False, True):
                _check(q, k, v, mask, layout, is_causal, backend, gen)


@pytest.mark.parametrize("backend", BACKENDS)
def test_with_a_window_too(backend: str) -> None:
    gen = torch.Generator().manual_seed(4)
    q, k, v = _qkv(130, 130, gen)
    layout = al.masks.bigbird_layout(130, block_size=BLOCK)
    for window in (5, (20, 3), (None, 40)):
        out = al.scaled_dot_product_attention(
            q, k, v, window=window, block_mask=layout, backend=backend
        )
        dense = layout.to_dense() & al.masks.sliding_window_mask(130, 130, window)
        ref, _ = attention_ref(q, k, v, dense)
        assert_close_rule(out, ref, ref)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_within_twice_the_plain_error(backend: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    q, k, v = _qkv(67, 67, gen, dtype)
    layout = al.masks.bigbird_layout(67, block_size=BLOCK, causal=True)
    _check(q, k, v, _mask("padding", 67, 67, gen), layout, False, backend, gen)
    _check(q, k, v, None, al.masks.bigbird_layout(67, block_size=8), False, backend, gen)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_that_see_no_key_give_zeros_and_unseen_nan_never_leaks(backend: str) -> None:
    """A layout that leaves block 2's queries nothing, and key block 3 unseen by every query;
    with right padding, the rows whose every visible key is padding see nothing too."""
    t = 70  # 5 blocks of 16, the last partial
    blocks = torch.eye(5, dtype=torch.bool)
    blocks[2, 2] = False
    blocks[3, 3] = False
    blocks[3, 0] = True
    layout = al.masks.BlockLayout(blocks, BLOCK, t)
    gen = torch.Generator().manual_seed(5)
    q, k, v = _qkv(t, t, gen)
    mask = torch.ones(B, 1, 1, t, dtype=torch.bool)
    mask[1, ..., 10:] = False  # row 1: only keys 0…9; queries 16…47 and 64… see nothing
    with torch.no_grad():
        k[:, :, 48:64] = float("nan")  # key block 3: no query sees it
        v[:, :, 48:64] = float("inf")
    for m in (None, mask):
        if m is not None:
            with torch.no_grad():
                k[1, :, 10:] = float("nan")  # padding
                v[1, :, 10:] = float("inf")
        out, w = al.scaled_dot_product_attention(
            q, k, v, m, block_mask=layout, backend=backend, need_weights=True
        )
        assert not torch.isnan(out).any() and not torch.isnan(w).any()
        assert (out[:, :, 32:48] == 0).all() and (w[:, :, 32:48] == 0).all()
        dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
        assert (dq[:, :, 32:48] == 0).all()
        assert not any(torch.isnan(g).any() for g in (dq, dk, dv))
        dense = layout.to_dense() if m is None else m & layout.to_dense()
        ref, _ = attention_ref(q, k, v, dense)
        assert_close_rule(out, ref, ref)
    assert (out[1, :, 16:48] == 0).all() and (out[1, :, 64:] == 0).all()


def test_a_call_without_block_mask_has_no_blocks() -> None:
    q = torch.randn(1, 2, 9, 4)
    m = normalize_mask(q, q, None, True)
    assert m.blocks is None and m == normalize_mask(q, q, None, True, None, None)
    layout = al.masks.bigbird_layout(9, block_size=4, num_random_blocks=0, global_blocks=0)
    assert normalize_mask(q, q, None, False, None, layout).blocks is layout
    # a layout that hides nothing is no layout; a causal one that hides nothing more is causal
    full = al.masks.BlockLayout(torch.ones(3, 3, dtype=torch.bool), 4, 9)
    assert normalize_mask(q, q, None, False, None, full).blocks is None
    # BigBird on 3 blocks: the global block and the band already cover everything
    assert normalize_mask(q, q, None, False, None, al.masks.bigbird_layout(9, block_size=4)) == (
        normalize_mask(q, q, None, False)
    )
    causal_full = al.masks.BlockLayout(torch.ones(3, 3, dtype=torch.bool), 4, 9, causal=True)
    m = normalize_mask(q, q, None, False, None, causal_full)
    assert m.blocks is None and m.causal_offset == 0


@pytest.mark.parametrize("is_causal", [False, True])
def test_empty_rows_and_unseen_keys_account_for_the_layout(is_causal: bool) -> None:
    """Computed from the layout's runs (``O(T · runs)``), equal to the dense answer."""
    gen = torch.Generator().manual_seed(6)
    for t_q, t_k in ((23, 23), (5, 23), (1, 23)):
        q, k = torch.randn(2, 2, t_q, 4), torch.randn(2, 2, t_k, 4)
        for trial in range(6):
            blocks = torch.rand(6, 6, generator=gen) < 0.3
            layout = al.masks.BlockLayout(blocks, 4, t_k, causal=trial % 2 == 1)
            masks = (
                None,
                torch.rand(2, 1, 1, t_k, generator=gen) > 0.3,
                torch.rand(1, 2, t_q, t_k, generator=gen) > 0.3,
            )
            for mask in masks:
                for window in (None, (5, 2)):
                    m = normalize_mask(q, k, mask, is_causal, window, layout)
                    vis = layout.to_dense(t_q) & al.masks.sliding_window_mask(t_q, t_k, window)
                    if mask is not None:
                        vis = vis & mask
                    if is_causal:
                        vis = vis & al.masks.causal_mask(t_q, t_k)
                    want = ~vis.any(-1, keepdim=True)
                    got = empty_rows(m, t_q, t_k, q.device)
                    if got is None:
                        assert not want.any()
                    else:
                        assert torch.equal(got.expand(want.shape), want.expand(got.shape))
                    seen = vis.expand(2, 2, t_q, t_k).any(-2)  # (B, H_kv, T_k)
                    kk, _ = hide_unseen_keys(
                        m.allowed, k + 1, k + 1, m.bounds(t_q, t_k), t_q, m.blocks
                    )
                    if m.blocks is not None:
                        assert torch.equal(kk[..., 0] != 0, seen)


@pytest.mark.parametrize("is_causal", [False, True])
def test_a_layout_decides_off_the_cpu_as_on_it(is_causal: bool) -> None:
    """On a device whose values cannot be read back (``meta`` stands in for CUDA), "no row is
    empty" and "every key is seen" come from the layout on the CPU (cached per shape), and agree
    with the CPU's own read-back: a layout that covers everything stays structure there."""
    meta = torch.device("meta")
    covered = 0
    for t_q, t_k in LENGTHS:
        for name, kw in LAYOUTS.items():
            layout = al.masks.bigbird_layout(t_k, block_size=BLOCK, causal=is_causal, **kw)
            for window in (None, (40, 0)):
                cpu_q, cpu_k = torch.randn(1, 2, t_q, 4), torch.randn(1, 2, t_k, 4)
                m = normalize_mask(cpu_q, cpu_k, None, is_causal, window, layout)
                if m.blocks is None:  # every block visible: no layout left
                    continue
                bounds = m.bounds(t_q, t_k)
                rows_cpu = empty_rows(m, t_q, t_k, cpu_q.device) is None
                kk, _ = hide_unseen_keys(None, cpu_k, cpu_k, bounds, t_q, m.blocks)
                keys_cpu = kk is cpu_k
                k = cpu_k.to(meta)
                rows_meta = empty_rows(m, t_q, t_k, meta) is None
                kk, _ = hide_unseen_keys(None, k, k, bounds, t_q, m.blocks)
                assert (rows_meta, kk is k) == (rows_cpu, keys_cpu), (name, t_q, t_k, window)
                covered += rows_cpu and keys_cpu
    assert covered > 0
    # with padding, rows opened on the device keep the layout (the backends keep skipping tiles)
    layout = al.masks.bigbird_layout(130, block_size=BLOCK, causal=is_causal)
    q = torch.randn(2, 2, 130, 4, device=meta)
    pad = torch.ones(2, 1, 1, 130, dtype=torch.bool, device=meta)
    m = normalize_mask(q, q, pad, is_causal, None, layout)
    rows = empty_rows(m, 130, 130, meta)
    assert rows is not None and m.open_rows(rows, 130, 130, meta).blocks is layout


# --------------------------------------------------------------------- blockwise: visible tiles only


@pytest.mark.parametrize("backend", ["blockwise", "blockwise_python"])
@pytest.mark.parametrize("causal", [False, True])
def test_blockwise_visits_only_the_visible_blocks(
    monkeypatch: pytest.MonkeyPatch, causal: bool, backend: str
) -> None:
    t, b = 8192, 64
    layout = al.masks.bigbird_layout(t, block_size=b, causal=causal)
    visible = layout.num_visible * b * b  # every block is whole at this length
    counted = count_scores(monkeypatch)
    q = torch.randn(1, 1, t, 8, requires_grad=True)
    k = torch.randn(1, 1, t, 8, requires_grad=True)
    v = torch.randn(1, 1, t, 8, requires_grad=True)
    out = al.scaled_dot_product_attention(q, k, v, block_mask=layout, backend=backend)
    # exactly the visible blocks' scores, a few percent of T² (one tile per run of blocks)
    assert sum(counted) == visible < t * t / 10
    runs = sum(len(runs) for runs in layout.runs)
    # the fused kernel takes a tile that crosses the diagonal in two calls (below it, and on it)
    assert (
        len(counted) == runs if backend == "blockwise_python" else runs <= len(counted) <= 2 * runs
    )
    counted.clear()
    out.sum().backward()  # the backward pass recomputes the same tiles
    assert sum(counted) == visible
    counted.clear()
    # with a padding mask too, and with rows that see nothing (opened, then zeroed)
    pad = torch.ones(1, 1, 1, t, dtype=torch.bool)
    pad[..., 64:] = False
    o = al.scaled_dot_product_attention(q, k, v, pad, block_mask=layout, backend=backend)
    assert sum(counted) == visible
    assert causal or (o[..., 64:, :] != 0).any()  # every row sees the global block


def test_blockwise_plan_of_a_partial_last_block() -> None:
    layout = al.masks.bigbird_layout(130, block_size=16, num_random_blocks=0, global_blocks=0)
    plan = TilePlan.make_blocks(130, 130, 8192, layout, None, None)
    assert [t[0].r0 for t in plan.blocks] == list(range(0, 130, 16))
    assert plan.blocks[-1][0].r1 == 130 and plan.blocks[-1][-1].j1 == 130
    assert [(t.j0, t.j1) for t in plan.blocks[3]] == [(32, 80)]
    # a decoding-like call: the queries are the last positions
    plan = TilePlan.make_blocks(3, 130, 8192, layout, 127, None)
    assert [(t.r0, t.r1, t.j0, t.j1) for tiles in plan.blocks for t in tiles] == [
        (0, 1, 96, 128),
        (1, 3, 112, 130),
    ]


# ------------------------------------------------------------------------------ layouts and masks


def test_bigbird_layout_values() -> None:
    layout = al.masks.bigbird_layout(8, block_size=2, num_random_blocks=0)
    assert torch.equal(
        layout.blocks.int(),
        torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 1, 1]]),
    )
    n = 40
    layout = al.masks.bigbird_layout(n * 16 - 5, block_size=16, global_blocks=(0, -1), seed=1)
    blocks = layout.blocks
    assert blocks.shape == (n, n) and layout.seq_len == n * 16 - 5
    assert blocks[[0, -1]].all() and blocks[:, [0, -1]].all()
    r, c = torch.arange(n)[:, None], torch.arange(n)[None, :]
    assert blocks[(r - c).abs() <= 1].all()
    # exactly two random blocks in each non-global row, outside band and globals
    extra = blocks & ~((r - c).abs() <= 1)
    extra[:, [0, -1]] = False
    assert (extra[1:-1].sum(1) == 2).all()
    # reproducible from the seed or a generator, different for another seed
    again = al.masks.bigbird_layout(n * 16 - 5, block_size=16, global_blocks=(0, -1), seed=1)
    assert torch.equal(again.blocks, blocks)
    gen = torch.Generator().manual_seed(1)
    same = al.masks.bigbird_layout(n * 16 - 5, block_size=16, global_blocks=(0, -1), generator=gen)
    assert torch.equal(same.blocks, blocks)
    other = al.masks.bigbird_layout(n * 16 - 5, block_size=16, global_blocks=(0, -1), seed=2)
    assert not torch.equal(other.blocks, blocks)


def test_causal_layout_keeps_the_lower_blocks_and_the_rule_inside() -> None:
    layout = al.masks.bigbird_layout(200, block_size=16, causal=True, num_random_blocks=3)
    assert layout.causal and not torch.triu(layout.blocks, 1).any()
    # each row has min(3, hidden lower blocks) random blocks
    n = layout.num_blocks
    r, c = torch.arange(n)[:, None], torch.arange(n)[None, :]
    base = ((r - c).abs() <= 1) | (c == 0) | (r == 0)
    extra = (layout.blocks & ~base).sum(1)
    room = ((c <= r) & ~base).sum(1)
    assert torch.equal(extra, room.clamp(max=3))
    dense = layout.to_dense()
    assert torch.equal(dense, dense & al.masks.causal_mask(200))
    assert torch.equal(
        al.masks.bigbird_mask(200, block_size=16, causal=True, num_random_blocks=3), dense
    )
    assert torch.equal(dense[150:], layout.to_dense(50))


def test_dense_mask_is_the_expanded_layout() -> None:
    layout = al.masks.bigbird_layout(37, block_size=8, seed=3)
    dense = al.masks.bigbird_mask(37, block_size=8, seed=3)
    i, j = torch.arange(37)[:, None], torch.arange(37)[None, :]
    assert dense.shape == (37, 37) and torch.equal(dense, layout.blocks[i // 8, j // 8])


BAD = [
    ({"block_size": 0}, ValueError, "block_size must be a positive int, got 0"),
    ({"block_size": 2.0}, TypeError, "block_size must be an int, got float"),
    ({"block_size": 4, "window_blocks": 2}, ValueError, "window_blocks must be 0 or odd"),
    ({"block_size": 4, "window_blocks": -1}, ValueError, "window_blocks must be >= 0"),
    ({"block_size": 4, "num_random_blocks": -2}, ValueError, "num_random_blocks must be >= 0"),
    ({"block_size": 4, "global_blocks": (0, 9)}, ValueError, "global_blocks holds block 9"),
    ({"block_size": 4, "global_blocks": "0"}, TypeError, "global_blocks must be an int"),
    ({"block_size": 4, "seed": 1.5}, TypeError, "seed must be an int"),
    # seeds are 32-bit (issue 32: 2**70 was an OverflowError inside torch)
    ({"block_size": 4, "seed": 2**70}, ValueError, rf"seed must be in \[0, 2\*\*32\), got {2**70}"),
    ({"block_size": 4, "seed": -1}, ValueError, r"seed must be in \[0, 2\*\*32\), got -1"),
    ({"block_size": 4, "generator": 3}, TypeError, "generator must be a torch.Generator"),
    ({"block_size": 4, "causal": 1}, TypeError, "causal must be a bool"),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), BAD, ids=repr)
def test_bad_layout_arguments_are_refused_by_name(
    kwargs: dict[str, object], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        al.masks.bigbird_layout(30, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        al.masks.bigbird_mask(30, **kwargs)  # type: ignore[arg-type]


def test_bad_block_layouts_and_block_masks_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="seq_len must be a positive int, got 0"):
        al.masks.bigbird_layout(0, block_size=4)
    with pytest.raises(ValueError, match=r"blocks has shape \(3, 3\) but must be .* \(4, 4\)"):
        al.masks.BlockLayout(torch.ones(3, 3, dtype=torch.bool), 4, 13)
    with pytest.raises(TypeError, match="blocks must be a bool tensor"):
        al.masks.BlockLayout(torch.ones(4, 4), 4, 13)
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        al.masks.BlockLayout(torch.ones(4, 4, dtype=torch.bool), -4, 13)
    q = torch.randn(1, 2, 12, 4)
    layout = al.masks.bigbird_layout(13, block_size=4)
    for backend in ("math", "sdpa", "blockwise"):
        with pytest.raises(ValueError, match=r"block_mask covers seq_len = 13 .* T_k = 12"):
            al.scaled_dot_product_attention(q, q, q, block_mask=layout, backend=backend)
        with pytest.raises(TypeError, match=r"block_mask must be an attnlab\.masks\.BlockLayout"):
            al.scaled_dot_product_attention(
                q,
                q,
                q,
                block_mask=layout.to_dense(),
                backend=backend,  # type: ignore[arg-type]
            )
    k = torch.randn(1, 2, 13, 4)
    with pytest.raises(ValueError, match=r"T_q <= T_k"):
        al.scaled_dot_product_attention(torch.randn(1, 2, 14, 4), k, k, block_mask=layout)
    with pytest.raises(ValueError, match="q_len must be at most seq_len = 13, got 14"):
        layout.to_dense(14)


def test_a_spec_seed_is_32_bit() -> None:
    from attnlab.nn.kinds import BigBirdSpec

    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*32\)"):
        BigBirdSpec(block_size=4, seed=2**70)
