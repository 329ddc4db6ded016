"""A block layout carried by a layer (issue 12): ``BlockLayout.crop`` and ``mask_at``,
``MultiHeadAttention(block_mask=...)`` (a layout built for the longest sequence, cropped to each
call's keys, exact against the dense mask in float64, across a KV cache), and ``backend="auto"``
choosing the blockwise backend under a layout."""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab.nn.backends import ATTENTION_BACKENDS, choose_backend
from attnlab.nn.block_layout import BlockLayout, _runs, bigbird_layout, bigbird_mask
from attnlab.nn.cache_policies import RollingKVCache
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.mask_spec import normalize_mask

N, BLOCK = 40, 6  # a layout over 40 positions in blocks of 6: the last block holds 4
KINDS = {
    "bigbird": {"num_random_blocks": 1},
    "itc": {"global_blocks": (0, -1), "num_random_blocks": 2},
    "sparse": {"global_blocks": 0, "window_blocks": 0, "num_random_blocks": 2},
}


def _layout(causal: bool, kind: str = "bigbird", n: int = N) -> BlockLayout:
    return bigbird_layout(n, block_size=BLOCK, causal=causal, seed=5, **KINDS[kind])


def _dense(causal: bool, kind: str = "bigbird", n: int = N) -> torch.Tensor:
    """The layout's dense mask, built by ``bigbird_mask`` (not from the layout object)."""
    return bigbird_mask(n, block_size=BLOCK, causal=causal, seed=5, **KINDS[kind])


# -- BlockLayout.crop and mask_at -----------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", list(KINDS))
def test_crop_is_the_top_left_corner_of_the_dense_mask(causal: bool, kind: str) -> None:
    layout, dense = _layout(causal, kind), _dense(causal, kind)
    for t in (1, 4, 6, 7, 23, 36, 39, 40):
        crop = layout.crop(t)
        assert (crop.seq_len, crop.block_size, crop.causal) == (t, BLOCK, causal)
        assert torch.equal(crop.to_dense(), dense[:t, :t]), t
        for q_len in {1, min(3, t), t}:  # queries: the last positions
            assert torch.equal(crop.to_dense(q_len), dense[t - q_len : t, :t])
        # the runs cut from the parent's are the runs of the crop's own blocks
        assert crop.runs == _runs(crop.blocks)
        assert crop.query_runs == _runs(crop.blocks.T)


def test_crop_is_kept_and_checked() -> None:
    layout = _layout(True)
    assert layout.crop(N) is layout
    assert layout.crop(17) is layout.crop(17)  # one crop per length, built once
    assert layout.crop(17).crop(9).blocks.equal(layout.crop(9).blocks)
    with pytest.raises(ValueError, match=r"at most the layout's seq_len = 40.*got 41"):
        layout.crop(41)
    with pytest.raises(ValueError, match="seq_len must be a positive int"):
        layout.crop(0)


@pytest.mark.parametrize("causal", [False, True])
def test_mask_at_reads_the_dense_mask_at_positions(causal: bool) -> None:
    layout, dense = _layout(causal), _dense(causal)
    gen = torch.Generator().manual_seed(0)
    pos_q = torch.randint(0, N, (3, 5), generator=gen)
    pos_k = torch.randint(0, N, (3, 11), generator=gen)
    got = layout.mask_at(pos_q, pos_k)
    assert got.shape == (3, 5, 11) and got.dtype == torch.bool
    want = dense[pos_q[:, :, None], pos_k[:, None, :]]
    assert torch.equal(got, want)
    # positions 0 … T - 1 are the slots: the dense mask itself
    ar = torch.arange(N)
    assert torch.equal(layout.mask_at(ar, ar), dense)


# -- MultiHeadAttention(block_mask=...) ------------------------------------------------------


def _mha(layout: BlockLayout | None, **kw: object) -> al.MultiHeadAttention:
    torch.manual_seed(0)
    return al.MultiHeadAttention(24, 6, num_kv_heads=2, block_mask=layout, **kw).double()


@pytest.mark.parametrize("backend", ["auto", "math", "sdpa", "blockwise"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t", [1, 4, 6, 23, 29, 40])  # T < b, T = b, not a multiple of b, N
def test_layer_equals_the_dense_mask(backend: str, causal: bool, t: int) -> None:
    layout = _layout(causal)
    layer = _mha(layout, backend=backend)
    x = torch.randn(2, t, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(t))
    pad = torch.ones(2, 1, 1, t, dtype=torch.bool)
    pad[1, ..., : t // 3] = False  # some keys padded in row 1
    out, w = layer(x, mask=pad, is_causal=causal, need_weights=True)
    dense = _dense(causal)[:t, :t]
    ref, ref_w = layer(x, mask=pad & dense, is_causal=causal, need_weights=True, block_mask=False)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w, ref_w, rtol=1e-12, atol=1e-12)
    assert torch.all(w[..., ~dense] == 0)
    # the layout matters: without it the output differs (unless it hides nothing at this length)
    plain_rule = torch.ones(t, t, dtype=torch.bool)
    if causal:
        plain_rule = plain_rule.tril()
    assert t < 29 or not torch.equal(dense, plain_rule)  # the long ones hide some blocks
    if not torch.equal(dense, plain_rule):
        plain = layer(x, mask=pad, is_causal=causal, block_mask=False)
        assert not torch.allclose(plain, out)


@pytest.mark.parametrize("kind", list(KINDS))
def test_kv_cache_steps_equal_the_full_forward(kind: str) -> None:
    layout = _layout(True, kind)
    layer = _mha(layout)
    x = torch.randn(2, 31, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    full = layer(x, is_causal=True)
    cache = KVCache(2, 2, N, 4, dtype=torch.float64)
    parts = [layer(x[:, :7], is_causal=True, cache=cache)]  # a prompt, then one token a step
    parts += [layer(x[:, i : i + 1], is_causal=True, cache=cache) for i in range(7, 31)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-12, atol=1e-12)
    # each step's row sees exactly the keys of that row in the dense mask
    dense = _dense(True, kind)
    cache = KVCache(2, 2, N, 4, dtype=torch.float64)
    layer(x[:, :12], is_causal=True, cache=cache)
    _, w = layer(x[:, 12:13], is_causal=True, cache=cache, need_weights=True)
    assert torch.equal(w[0, 0, 0] > 0, dense[12, :13])


def test_a_layout_passed_for_one_call_replaces_the_layers() -> None:
    layer = _mha(None)
    x = torch.randn(1, 20, 24, dtype=torch.float64)
    other = _layout(False, "sparse")
    got = layer(x, block_mask=other)
    want = layer(x, mask=_dense(False, "sparse")[:20, :20])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert _mha(other).block_mask is other


def test_bad_block_masks_are_refused() -> None:
    with pytest.raises(TypeError, match=r"block_mask must be an attnlab\.masks\.BlockLayout"):
        al.MultiHeadAttention(24, 6, block_mask=torch.ones(4, 4, dtype=torch.bool))  # type: ignore[arg-type]
    layer = _mha(_layout(True))
    x = torch.randn(1, 41, 24, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"block_mask covers 40 positions.*T_k = 41"):
        layer(x, is_causal=True)
    with pytest.raises(TypeError, match=r"None \(the layer's own\) or False"):
        layer(x[:, :5], block_mask=True)  # type: ignore[arg-type]
    rolling = RollingKVCache(1, 2, 16, 4, dtype=torch.float64, window=8)
    with pytest.raises(ValueError, match=r"block_mask counts every.*RollingKVCache\(window=8\)"):
        layer(x[:, :5], is_causal=True, cache=rolling)
    assert rolling.length == 0  # refused before the cache changed


# -- backend="auto" ----------------------------------------------------------------------------


def test_auto_chooses_blockwise_under_a_layout() -> None:
    q = torch.randn(1, 2, 23, 8)
    layout = _layout(True).crop(23)
    sparse = normalize_mask(q, q, None, False, None, layout)
    dense = normalize_mask(q, q, None, True)
    assert choose_backend("auto", False, sparse) == "blockwise"
    assert choose_backend("auto", True, sparse) == "math"  # the weights decide first
    assert choose_backend("auto", False, dense) == "sdpa"
    assert choose_backend("sdpa", False, sparse) == "sdpa"  # an explicit backend stays
    # a layout that hides nothing is dropped: full attention keeps the fused kernel
    everything = BlockLayout(torch.ones(4, 4, dtype=torch.bool), BLOCK, 23)
    assert choose_backend("auto", False, normalize_mask(q, q, None, False, None, everything)) == (
        "sdpa"
    )


def test_auto_runs_blockwise_in_the_function_and_the_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    for name in ("math", "sdpa", "blockwise"):
        fn = ATTENTION_BACKENDS[name]

        def spy(*args: object, _fn=fn, _name=name) -> object:  # type: ignore[no-untyped-def]
            calls.append(_name)
            return _fn(*args)

        monkeypatch.setitem(ATTENTION_BACKENDS, name, spy)
    layout = _layout(True)
    q = torch.randn(1, 2, N, 8)
    al.scaled_dot_product_attention(q, q, q, block_mask=layout)
    al.scaled_dot_product_attention(q, q, q, block_mask=layout, need_weights=True)
    al.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert calls == ["blockwise", "math", "sdpa"]
    calls.clear()
    layer = _mha(layout)
    x = torch.randn(1, 30, 24, dtype=torch.float64)
    layer(x, is_causal=True)
    layer(x, is_causal=True, need_weights=True)
    layer(x, is_causal=True, block_mask=False)
    assert calls == ["blockwise", "math", "sdpa"]


def test_auto_runs_a_narrow_window_on_blockwise() -> None:
    """A band much narrower than the keys goes to the backend that visits only its tiles; a wide
    one (or a call without lengths) stays on the fused kernels."""
    q = torch.randn(1, 1, 1024, 8)
    narrow = normalize_mask(q, q, None, True, 128)
    wide = normalize_mask(q, q, None, True, 700)
    assert choose_backend("auto", False, narrow, 1024, 1024) == "blockwise"
    assert choose_backend("auto", False, wide, 1024, 1024) == "sdpa"
    assert choose_backend("auto", False, narrow) == "sdpa"
    assert choose_backend("auto", True, narrow, 1024, 1024) == "math"
    # the whole call: what auto computes is what blockwise computes
    out = al.scaled_dot_product_attention(q, q, q, is_causal=True, window=128)
    ref = al.scaled_dot_product_attention(q, q, q, is_causal=True, window=128, backend="math")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
