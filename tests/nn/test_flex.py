"""The ``"flex"`` backend (PyTorch's FlexAttention) against the float64 reference.

Compiling FlexAttention costs seconds per shape on the CPU, so the grid is small and awkward:
lengths that are no multiple of any block, ``T_q < T_k``, grouped-query heads, ``D_v != D``;
every case shares the inputs' shapes where it can (a kernel per shape, mask structure and dtype).
On the CPU PyTorch's FlexAttention is forward only: a call that needs a gradient takes the
exact ``"blockwise"`` path (tested here too); the flex backward runs in the ``cuda`` suite.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import attnlab as al
from attnlab.nn.backends import choose_backend, flex
from attnlab.nn.block_layout import bigbird_layout
from attnlab.nn.mask_spec import normalize_mask
from attnlab.nn.masks import sliding_window_mask
from tests.reference import assert_close_rule, attention_ref

B, H, H_KV, T, D, D_V = 2, 4, 2, 37, 16, 24


def _qkv(t_q: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.randn(B, H, t_q, D).to(dtype)
    k = torch.randn(B, H_KV, T, D).to(dtype)
    v = torch.randn(B, H_KV, T, D_V).to(dtype)
    return q, k, v


def _padding() -> torch.Tensor:
    pad = torch.ones(B, 1, 1, T, dtype=torch.bool)
    pad[0, ..., 29:] = False
    return pad


def _bias() -> torch.Tensor:
    bias = torch.randn(H, T, T)
    bias[:, :, 3] = float("-inf")  # a hidden key inside a floating mask
    return bias


_LAYOUT = bigbird_layout(T, block_size=8, num_random_blocks=1)
_PAD, _BIAS = _padding(), _bias()
# name: (T_q, kwargs of scaled_dot_product_attention, the reference's mask, its is_causal)
CASES = {
    "causal_gqa": (T, {"is_causal": True}, None, True),
    "window_offset": (
        5,
        {"is_causal": True, "window": (4, 2)},
        sliding_window_mask(5, T, (4, 0)),
        False,
    ),
    "bigbird": (T, {"block_mask": _LAYOUT}, _LAYOUT.to_dense(T), False),
    "padding_causal": (T, {"mask": _PAD, "is_causal": True}, _PAD, True),
    "bias": (T, {"mask": _BIAS}, _BIAS, False),
}


def _run(name: str, dtype: torch.dtype, need_weights: bool = False) -> None:
    t_q, kwargs, dense, causal = CASES[name]
    q, k, v = _qkv(t_q, dtype)
    result = al.scaled_dot_product_attention(
        q, k, v, backend="flex", need_weights=need_weights, **kwargs
    )
    out, weights = result if need_weights else (result, None)
    ref_out, ref_w = attention_ref(q, k, v, dense, is_causal=causal)
    base_out, base_w = attention_ref(q, k, v, dense, is_causal=causal, upcast=False)
    assert out.dtype == dtype
    assert_close_rule(out, ref_out, base_out, f"{name} output")
    if weights is not None:
        assert_close_rule(weights, ref_w, base_w, f"{name} weights")


@pytest.mark.parametrize("name", list(CASES))
def test_flex_matches_reference_fp32(name: str) -> None:
    """Causal with GQA, a window with T_q < T_k, BigBird, padding, a floating bias: exact."""
    _run(name, torch.float32)


@pytest.mark.parametrize(("name", "dtype"), [("window_offset", torch.bfloat16)])
def test_flex_matches_reference_half(name: str, dtype: torch.dtype) -> None:
    """In bf16, within twice the plain bf16 error of the float64 reference."""
    _run(name, dtype)


def test_flex_need_weights_are_exact() -> None:
    """``need_weights`` returns the exact weights (math) next to flex's output."""
    _run("causal_gqa", torch.float32, need_weights=True)


def test_flex_runs_under_no_grad_with_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs that require grad, under ``no_grad`` (evaluation of a model): the flex path runs."""
    calls: list[int] = []
    compiled = flex._compiled()

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return compiled(*args, **kwargs)

    monkeypatch.setattr(flex, "_compiled", lambda: counting)
    q, k, v = (t.requires_grad_() for t in _qkv(T, torch.float32))
    with torch.no_grad():
        out = al.scaled_dot_product_attention(q, k, v, is_causal=True, backend="flex")
    ref, _ = attention_ref(q.detach(), k.detach(), v.detach(), is_causal=True)
    base, _ = attention_ref(q.detach(), k.detach(), v.detach(), is_causal=True, upcast=False)
    assert_close_rule(out, ref, base)
    assert calls == [1]


def test_flex_fallback_gradients_and_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU a gradient, float64 or dropout takes the exact blockwise path (no compile)."""
    calls: list[int] = []
    monkeypatch.setattr(flex, "_compiled", lambda: calls.append(1))  # must not be reached
    q, k, v = (t.requires_grad_() for t in _qkv(T, torch.float32))
    out = al.scaled_dot_product_attention(q, k, v, is_causal=True, window=3, backend="flex")
    ref_in = tuple(t.detach().double().requires_grad_() for t in (q, k, v))
    base_in = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    dense = sliding_window_mask(T, T, (3, 0))
    ref_out, _ = attention_ref(*ref_in, dense)
    base_out, _ = attention_ref(*base_in, dense, upcast=False)
    assert_close_rule(out, ref_out, base_out)
    d_out = torch.randn(out.shape, dtype=torch.float64)
    for g, r, bl in zip(
        torch.autograd.grad(out, (q, k, v), d_out.float()),
        torch.autograd.grad(ref_out, ref_in, d_out),
        torch.autograd.grad(base_out, base_in, d_out.float()),
        strict=True,
    ):
        assert_close_rule(g, r, bl, "gradient")
    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    out64 = al.scaled_dot_product_attention(q64, k64, v64, is_causal=True, backend="flex")
    assert_close_rule(out64, *[attention_ref(q64, k64, v64, is_causal=True)[0]] * 2)
    with torch.no_grad():
        dropped = al.scaled_dot_product_attention(q, k, v, dropout_p=0.5, backend="flex")
    assert dropped.shape == (B, H, T, D_V) and torch.isfinite(dropped).all()
    assert not calls


def test_structure_block_mask_is_cached_per_shape() -> None:
    """One BlockMask per (structure, lengths, device); another window or length builds another."""
    q = torch.zeros(1, 1, 300, 8)
    causal = normalize_mask(q, q, None, True)
    windowed = normalize_mask(q, q, None, True, 16)
    first = flex.structure_block_mask(causal, 300, 300, q.device)
    assert flex.structure_block_mask(causal, 300, 300, q.device) is first
    other = flex.structure_block_mask(windowed, 300, 300, q.device)
    assert other is not first
    assert flex.structure_block_mask(causal, 299, 300, q.device) is not first
    # the window's block mask skips the tiles far from the diagonal; causal skips the upper ones
    dense_first = first.to_dense()[0, 0]
    assert dense_first.tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert other.to_dense()[0, 0].tolist() == [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    assert flex.structure_block_mask(normalize_mask(q, q, None, False), 300, 300, q.device) is None


def test_auto_chooses_flex_on_cuda_for_structure_only() -> None:
    """``auto``: flex on CUDA for a window or a layout over >= 128 queries; never on the CPU."""
    q = torch.zeros(1, 1, 1024, 8)
    narrow = normalize_mask(q, q, None, True, 64)
    full = normalize_mask(q, q, None, True)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert choose_backend("auto", False, narrow, 1024, 1024, cuda) == "flex"
    assert choose_backend("auto", False, narrow, 1024, 1024, cpu) == "blockwise"
    assert choose_backend("auto", False, narrow, 1, 1024, cuda) == "blockwise"  # a decode step
    assert choose_backend("auto", False, full, 1024, 1024, cuda) == "sdpa"
    assert choose_backend("auto", True, narrow, 1024, 1024, cuda) == "math"


def test_a_model_runs_on_flex() -> None:
    """``GPTConfig(backend="flex")``: the logits of ``"math"`` (evaluation, so flex itself runs)."""
    from attnlab import GPT, GPTConfig

    cfg = {"vocab_size": 50, "n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 4}
    model = GPT(GPTConfig(**cfg, backend="flex")).eval()
    reference = GPT(GPTConfig(**cfg, backend="math")).eval()
    reference.load_state_dict(model.state_dict())
    ids = torch.randint(0, 50, (B, T))
    with torch.no_grad():
        got, want = model(ids).logits, reference(ids).logits
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_padding_reuses_the_structure_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """A padding mask over several tiles: exact, and no ``BlockMask`` is built per call.

    T = 520 spans five 128-tiles; the window hides the far tiles, the padding hides keys inside
    the visited ones (whole tiles for the first sequence). The structure's mask is built on
    the first call only; later calls with other padding (every layer of a model, every batch)
    reuse its tiles, and padding alone (no structure) builds none at all.
    """
    # the shapes of test_padding_skips_the_tiles_it_hides (any several tiles show the reuse): the
    # padded calls under a window leave rows without keys there and here, so they are the same
    # kernel (compiled once per shape and mask form, seconds each on the CPU)
    t = 520
    q, k, v = (torch.randn(3, 2, t, 16) for _ in range(3))
    pad = torch.ones(3, 1, 1, t, dtype=torch.bool)
    pad[0, ..., 128:] = False
    pad[1, ..., 290:] = False
    built: list[int] = []
    create = flex._create
    monkeypatch.setattr(flex, "_create", lambda *a, **kw: built.append(1) or create(*a, **kw))
    flex._STRUCTURES.clear()
    window = sliding_window_mask(t, t, (40, 0))
    for padding in (pad, pad.roll(7, dims=-1)):
        out = al.scaled_dot_product_attention(q, k, v, mask=padding, window=40, backend="flex")
        ref_out, _ = attention_ref(q, k, v, padding & window)
        base_out, _ = attention_ref(q, k, v, padding & window, upcast=False)
        assert_close_rule(out, ref_out, base_out, "window + padding over five tiles")
    assert len(built) == 1
    # padding alone, at any length: the inputs of the "padding_causal" case, whose kernel it is
    # (the open bounds are read as the causal rule's are)
    q, k, v = _qkv(T, torch.float32)
    out = al.scaled_dot_product_attention(q, k, v, mask=_PAD, backend="flex")
    ref_out, _ = attention_ref(q, k, v, _PAD)
    assert_close_rule(out, ref_out, attention_ref(q, k, v, _PAD, upcast=False)[0], "padding")
    assert len(built) == 1


def test_structure_visited_tiles_are_its_partial_and_full_tiles() -> None:
    """The tiles a padded call may visit are exactly the structure's partial and full tiles."""
    q = torch.zeros(1, 1, 300, 8)
    for masking in (
        normalize_mask(q, q, None, True, 100),
        normalize_mask(
            q, q, None, False, block_mask=bigbird_layout(300, block_size=32, causal=True)
        ),
    ):
        structure = flex._structure(masking, 300, 300, q.device)
        assert torch.equal(structure.visited, structure.block_mask.to_dense() > 0)


def test_padding_skips_the_tiles_it_hides() -> None:
    """Per sequence, a tile whose keys are all padding is not listed, so the kernel skips it
    (it is not merely masked); the kept tiles come first, in column order, and the call stays
    exact against the float64 reference."""
    t = 520  # five 128-tiles, the last one short
    pad = torch.ones(3, 1, 1, t, dtype=torch.bool)
    pad[0, ..., 130:] = False  # keys of tiles 0 and 1 (two keys) only
    pad[1, ..., :300] = False  # left padding: tiles 2 … 4
    q = torch.randn(3, 2, t, 16)
    for window, lead_rows in ((None, [2, 2, 2, 2, 2]), (100, [1, 2, 1, 0, 0])):
        masking = normalize_mask(q, q, pad, True, window)
        block_mask = flex._block_mask(masking, q.shape[:-3], t, t, q.device)
        counts = block_mask.kv_num_blocks
        assert counts[0, 0].tolist() == [min(r + 1, c) for r, c in enumerate(lead_rows)]
        listed = [
            block_mask.kv_indices[1, 0, row, : counts[1, 0, row]].tolist() for row in range(5)
        ]
        if window is None:  # causal: row r sees tiles 0 … r, of which padding keeps 2 … 4
            assert listed == [[], [], [2], [2, 3], [2, 3, 4]]
        assert counts[2, 0].tolist() == ([1, 2, 3, 4, 5] if window is None else [1, 2, 2, 2, 2])
    k, v = torch.randn(3, 2, t, 16), torch.randn(3, 2, t, 16)
    graphs = counters["stats"]["unique_graphs"]
    for window in (None, 100):
        band = sliding_window_mask(t, t, (window if window else t, 0))
        out = al.scaled_dot_product_attention(
            q, k, v, mask=pad, is_causal=True, window=window, backend="flex"
        )
        ref_out, _ = attention_ref(q, k, v, pad & band)
        base_out, _ = attention_ref(q, k, v, pad & band, upcast=False)
        assert_close_rule(out, ref_out, base_out, f"padding skipped, window {window}")
    # the bounds are read by the kernel, not compiled into it: one kernel with or without a window
    assert counters["stats"]["unique_graphs"] - graphs <= 1


def test_a_mask_per_row_skips_the_tiles_it_hides() -> None:
    """A boolean mask with rows (``(B, H, T_q, T_k)``, as a floating mask's ``-inf`` become) is
    reduced over rows and columns of each tile: a tile it hides entirely is not listed, the
    call is exact against float64 (``T_q != T_k``, the last tiles short, under a window)."""
    t_q, t_k = 300, 290
    gen = torch.Generator().manual_seed(3)
    allowed = torch.rand(2, 2, t_q, t_k, generator=gen) > 0.3
    allowed[0, 1, 128:256, :128] = False  # one whole tile of one head of one sequence
    q = torch.randn(2, 2, t_q, 16, generator=gen)
    k, v = (torch.randn(2, 2, t_k, 16, generator=gen) for _ in range(2))
    masking = normalize_mask(q, k, allowed, False, None)
    counts = flex._block_mask(masking, q.shape[:-3], t_q, t_k, q.device).kv_num_blocks
    assert counts[0, 1].tolist() == [3, 2, 3] and counts[1, 0].tolist() == [3, 3, 3]
    band = sliding_window_mask(t_q, t_k, (150, 20))
    for window, dense in ((None, allowed), ((150, 20), allowed & band)):
        out = al.scaled_dot_product_attention(q, k, v, mask=allowed, window=window, backend="flex")
        ref_out, _ = attention_ref(q, k, v, dense)
        base_out, _ = attention_ref(q, k, v, dense, upcast=False)
        assert_close_rule(out, ref_out, base_out, f"a mask per row, window {window}")


def test_a_padded_block_mask_reads_nothing_back() -> None:
    """Which tiles padding keeps is decided on the device: on ``meta`` (no value can be read
    back, the CPU's stand-in for a CUDA sync check) the ``BlockMask`` of a padded call builds."""
    meta = torch.device("meta")
    q = torch.randn(3, 2, 520, 16, device=meta)
    pad = torch.ones(3, 1, 1, 520, dtype=torch.bool, device=meta)
    for window in (None, 100):
        masking = normalize_mask(q, q, pad, True, window)
        block_mask = flex._block_mask(masking, q.shape[:-3], 520, 520, meta)
        assert block_mask.kv_num_blocks.shape == (3, 1, 5)
        assert block_mask.kv_num_blocks.device == meta


def test_allow_recompiles_sets_dynamos_limit_under_this_torchs_name() -> None:
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    before = getattr(config, name)
    try:
        flex.allow_recompiles(123)
        assert getattr(config, name) == 123
    finally:
        setattr(config, name, before)


@pytest.mark.parametrize(
    ("t_q", "window", "block"), [(512, None, 128), (256, None, 256), (512, 200, 128)]
)
def test_a_layout_of_whole_tiles_gives_its_tiles_directly(
    monkeypatch: pytest.MonkeyPatch, t_q: int, window: int | None, block: int
) -> None:
    """A block layout whose blocks are whole 128 × 128 tiles gives the BlockMask its tiles
    without evaluating the mask_mod over T_q × T_k entries: the same tiles, partial and full,
    as create_block_mask finds, and one visited tile per visible layout block."""
    t = 512
    layout = bigbird_layout(t, block_size=block, num_random_blocks=1, causal=True)
    q, k = torch.zeros(1, 1, t_q, 8), torch.zeros(1, 1, t, 8)
    masking = normalize_mask(q, k, None, False, window, layout)
    cpu = torch.device("cpu")
    want = flex._create(flex._structure_mod(masking, t_q, t, cpu), None, None, t_q, t, cpu)

    def refuse(*args: object) -> None:
        raise AssertionError("create_block_mask evaluated the mask_mod")

    monkeypatch.setattr(flex, "_create", refuse)
    got = flex._build_structure(masking, t_q, t, cpu).block_mask
    assert torch.equal(got.to_dense(), want.to_dense())
    assert torch.equal(got.kv_num_blocks, want.kv_num_blocks)
    assert torch.equal(got.full_kv_num_blocks, want.full_kv_num_blocks)
    for ours, theirs, counts in (
        (got.kv_indices, want.kv_indices, got.kv_num_blocks),
        (got.full_kv_indices, want.full_kv_indices, got.full_kv_num_blocks),
    ):
        for row, n in enumerate(counts[0, 0].tolist()):
            assert ours[0, 0, row, :n].sort().values.tolist() == sorted(
                theirs[0, 0, row, :n].tolist()
            )
    if window is None:  # each visible layout block's tiles on or below the diagonal
        r = block // 128
        tiles = layout.blocks.repeat_interleave(r, 0).repeat_interleave(r, 1).tril()
        tiles = tiles[-(t_q // 128) :]
        visited = got.kv_num_blocks + got.full_kv_num_blocks
        assert visited[0, 0].tolist() == tiles.sum(-1).tolist()


def test_a_layout_of_smaller_blocks_evaluates_the_mask_mod(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks that do not fill whole tiles (b = 64) keep create_block_mask."""
    layout = bigbird_layout(256, block_size=64, num_random_blocks=1, causal=True)
    q = torch.zeros(1, 1, 256, 8)
    masking = normalize_mask(q, q, None, False, None, layout)
    called = []
    original = flex._create
    monkeypatch.setattr(flex, "_create", lambda *a: called.append(1) or original(*a))
    flex._build_structure(masking, 256, 256, torch.device("cpu"))
    assert called == [1]
