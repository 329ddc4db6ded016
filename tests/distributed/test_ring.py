"""Ring attention (issue 13): exact against single-process attention, for 1, 2 and 4 processes.

The schedule and the layouts are checked in this process (pure functions); the ring itself in
real process groups (gloo on the CPU, :mod:`tests.distributed._launch`): one launch of 2 ranks
runs the whole grid — dtype (fp64 to ~1e-12, fp32 by the flash-attention rule, one bf16 case),
causal or not, both layouts, MHA/GQA/MQA, odd chunk lengths (5 and 17 tokens per rank, or per
zigzag half), ``D_v ≠ D`` (the written-out fallback) —, one of 4 ranks the part of it that 4 ranks
add to (:data:`GRID_OF_FOUR`), and both the bad inputs that must raise on every rank instead of
hanging, and report back what failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist

import attnlab as al
from attnlab.distributed import (
    RingPiece,
    ring_attention,
    ring_pieces,
    sequence_positions,
    shard_sequence,
    unshard_sequence,
    zigzag_visibility,
)
from attnlab.distributed.ring_schedule import split_piece
from tests.distributed._launch import launch
from tests.reference import FLOOR, attention_ref, max_err

# ----------------------------------------------------------------------------------------------
# the schedule, in this process


def _visible_by_pieces(pieces: tuple[RingPiece, ...], t_local: int) -> torch.Tensor:
    """How many times each (local query, visiting key) pair is computed by the step's pieces."""
    count = torch.zeros(t_local, t_local, dtype=torch.int64)
    for p in pieces:
        block = torch.ones(p.q1 - p.q0, p.k1 - p.k0, dtype=torch.int64)
        if p.causal:
            assert p.q1 - p.q0 == p.k1 - p.k0
            block = block.tril()
        count[p.q0 : p.q1, p.k0 : p.k1] += block
    return count


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_pieces_cover_exactly_the_visible_pairs(layout: str, is_causal: bool) -> None:
    for world in range(1, 6):
        for t_local in (2, 6, 10) if layout == "zigzag" else (1, 5, 6):
            t = world * t_local
            for rank in range(world):
                pq = sequence_positions(t, rank=rank, world_size=world, layout=layout)
                for source in range(world):
                    pk = sequence_positions(t, rank=source, world_size=world, layout=layout)
                    truth = (
                        pk[None, :] <= pq[:, None] if is_causal else torch.ones(t_local, t_local)
                    )
                    pieces = ring_pieces(
                        rank, source, world, t_local, layout=layout, is_causal=is_causal
                    )
                    got = _visible_by_pieces(pieces, t_local)
                    assert torch.equal(got, truth.long()), (world, t_local, rank, source, pieces)
                    assert len(pieces) <= 1  # one kernel call per step


def test_split_piece_covers_the_piece_slice_by_slice() -> None:
    for n in (1, 5, 8, 17):
        pieces = [RingPiece(0, n, 0, n, True), RingPiece(0, n, 0, n, False)]
        if n > 1:
            pieces += [RingPiece(n // 2, n, 0, n, False), RingPiece(0, n, 0, n // 2, False)]
        for piece in pieces:
            for width in (1, 2, 3, 7, 100):
                for block in (1, 2, 5, 100):
                    calls = [
                        c
                        for a in range(0, n, width)
                        for c in split_piece(piece, a, min(a + width, n), block)
                    ]
                    assert all(c.q1 - c.q0 <= block for c in calls)
                    assert torch.equal(
                        _visible_by_pieces(tuple(calls), n), _visible_by_pieces((piece,), n)
                    )
    assert split_piece(RingPiece(0, 4, 0, 4, True), 2, 4, 2) == (RingPiece(2, 4, 2, 4, True),)
    assert split_piece(RingPiece(0, 4, 0, 2, False), 2, 4, 2) == ()


def test_zigzag_balances_the_causal_work_and_contiguous_does_not() -> None:
    world, t_local = 4, 10

    def work(layout: str) -> list[int]:
        return [
            sum(
                int(
                    _visible_by_pieces(
                        ring_pieces(r, s, world, t_local, layout=layout, is_causal=True), t_local
                    ).sum()
                )
                for s in range(world)
            )
            for r in range(world)
        ]

    zigzag, contiguous = work("zigzag"), work("contiguous")
    assert len(set(zigzag)) == 1  # every rank the same number of (query, key) pairs
    assert contiguous == sorted(contiguous) and contiguous[-1] > 3 * contiguous[0]
    assert sum(zigzag) == sum(contiguous) == world * t_local * (world * t_local + 1) // 2


def test_zigzag_visibility_table() -> None:
    # W = 2: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert zigzag_visibility(0, 0, 2) == {
        (0, 0): "causal",
        (0, 1): "hidden",
        (1, 0): "full",
        (1, 1): "causal",
    }
    assert zigzag_visibility(1, 0, 2) == {
        (0, 0): "full",  # chunk 1 sees chunk 0
        (0, 1): "hidden",  # chunk 1 does not see chunk 3
        (1, 0): "full",  # chunk 2 sees chunk 0
        (1, 1): "hidden",  # chunk 2 does not see chunk 3
    }
    assert zigzag_visibility(0, 1, 2) == {
        (0, 0): "hidden",
        (0, 1): "hidden",
        (1, 0): "full",
        (1, 1): "full",
    }
    with pytest.raises(ValueError, match=r"source must be in \[0, world_size\) = \[0, 2\), got 2"):
        zigzag_visibility(0, 2, 2)


def test_shard_sequence_layouts() -> None:
    x = torch.arange(16).reshape(2, 8)
    assert torch.equal(shard_sequence(x, 1, rank=1, world_size=2, layout="contiguous"), x[:, 4:])
    assert shard_sequence(x, -1, rank=1, world_size=2, layout="zigzag").tolist() == [
        [2, 3, 4, 5],
        [10, 11, 12, 13],
    ]
    parts = [shard_sequence(x, 1, rank=r, world_size=4, layout="zigzag") for r in range(4)]
    assert sorted(torch.cat(parts, 1)[0].tolist()) == list(range(8))
    assert sequence_positions(8, rank=3, world_size=4, layout="zigzag").tolist() == [3, 4]


def test_shard_sequence_errors() -> None:
    x = torch.zeros(2, 10)
    with pytest.raises(
        ValueError,
        match=r"x has sequence length T = 10, but layout='zigzag' cuts it into 2·world_size = 4 "
        r"chunks: T must be divisible by 4",
    ):
        shard_sequence(x, 1, rank=0, world_size=2, layout="zigzag")
    with pytest.raises(ValueError, match=r"divisible by 3"):
        shard_sequence(x, 1, rank=0, world_size=3, layout="contiguous")
    with pytest.raises(
        ValueError, match=r"layout must be one of 'contiguous', 'zigzag', got 'ring'"
    ):
        shard_sequence(x, 1, rank=0, world_size=2, layout="ring")
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size\) = \[0, 2\), got 2"):
        shard_sequence(x, 1, rank=2, world_size=2, layout="contiguous")
    with pytest.raises(
        ValueError, match=r"dim must be in \[-2, 2\) for x of shape \(2, 10\), got 2"
    ):
        shard_sequence(x, 2, rank=0, world_size=2, layout="contiguous")


# ----------------------------------------------------------------------------------------------
# one process, no process group: plain attention


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_process_equals_plain_attention(
    layout: str, is_causal: bool, dtype: torch.dtype
) -> None:
    assert not dist.is_initialized()
    for h, h_kv, d_v in ((4, 4, 8), (4, 2, 8), (2, 1, 6)):
        q = torch.randn(2, 3, h, 10, 8, dtype=dtype)  # leading dims (2, 3)
        k = torch.randn(2, 3, h_kv, 10, 8, dtype=dtype)
        v = torch.randn(2, 3, h_kv, 10, d_v, dtype=dtype)
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = ring_attention(*inputs, is_causal=is_causal, layout=layout)
        plain_in = [t.clone().requires_grad_() for t in (q, k, v)]
        plain = al.scaled_dot_product_attention(*plain_in, is_causal=is_causal)
        d_out = torch.randn_like(out)
        got = torch.autograd.grad(out, inputs, d_out)
        want = torch.autograd.grad(plain, plain_in, d_out)
        tol = 1e-12 if dtype == torch.float64 else 2e-6
        assert out.dtype == dtype and out.shape == plain.shape
        assert max_err(out, plain) <= tol
        for g, w in zip(got, want):
            assert max_err(g, w) <= 2 * tol


def test_the_fused_kernel_does_the_work_and_the_fallback_takes_what_it_cannot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from attnlab.distributed import ring_autograd as ring

    calls = {"fused": 0, "python": 0}
    fused, python = ring._forward_op, ring._Blockwise.apply

    def count(name: str, fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(ring, "_forward_op", count("fused", fused))
    monkeypatch.setattr(ring._Blockwise, "apply", count("python", python))
    q = torch.randn(1, 2, 6, 8)
    ring_attention(q, q, q, is_causal=True)
    assert calls == {"fused": 1, "python": 0}
    ring_attention(q, q, q[..., :5], is_causal=True)  # D_v != D: the kernel does not apply
    assert calls == {"fused": 1, "python": 1}


def test_one_process_errors() -> None:
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(
        ValueError, match=r"layout must be one of 'contiguous', 'zigzag', got 'ring'"
    ):
        ring_attention(q, q, q, layout="ring")
    with pytest.raises(
        ValueError,
        match=r"layout='zigzag' cuts the sequence into 2·world_size = 2 chunks, so T = "
        r"world_size · T_local must be divisible by 2; got T_local = 5 \(T = 5\)",
    ):
        ring_attention(q, q, q, layout="zigzag")
    with pytest.raises(ValueError, match=r"k is on meta but q is on cpu"):
        ring_attention(q, q.to("meta"), q)
    with pytest.raises(
        ValueError,
        match=r"k has shape \(1, 2, 7, 8\) but must be \(\.\.\., H_kv, T_local, D\) = \(1, 2, 5, 8\)",
    ):
        ring_attention(q, torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8))
    with pytest.raises(ValueError, match=r"q has H = 2 heads, not a multiple of k's H_kv = 3"):
        ring_attention(q, torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8))
    with pytest.raises(TypeError, match=r"v has dtype torch.float64 but q has torch.float32"):
        ring_attention(q, q, q.double())
    with pytest.raises(TypeError, match=r"q must be a torch.Tensor, got list"):
        ring_attention([1.0], q, q)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"is_causal must be a bool, got str"):
        ring_attention(q, q, q, is_causal="yes")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"group was given \(object\) but no process group is initialised"
    ):
        ring_attention(q, q, q, group=object())
    with pytest.raises(ValueError, match=r"group was given .* no process group is initialised"):
        unshard_sequence(q, 2, group=object(), layout="contiguous")
    even = torch.randn(1, 2, 4, 8)
    assert unshard_sequence(even, 2, layout="zigzag") is even  # one process holds the whole
    with pytest.raises(ValueError, match=r"x_local has sequence length T = 5, but layout='zigzag'"):
        unshard_sequence(q, 2, layout="zigzag")


# ----------------------------------------------------------------------------------------------
# real process groups: the workers (run in the launched processes)


@dataclass(frozen=True)
class Case:
    dtype: str
    is_causal: bool
    layout: str
    h: int
    h_kv: int
    d_v: int
    t_local: int

    def __str__(self) -> str:
        return (
            f"{self.dtype}-{'causal' if self.is_causal else 'full'}-{self.layout}-"
            f"H{self.h}/{self.h_kv}-Dv{self.d_v}-T_local{self.t_local}"
        )


def _grid() -> list[Case]:
    cases = []
    for dtype in ("fp64", "fp32"):
        for is_causal in (False, True):
            for layout in ("contiguous", "zigzag"):
                # MHA, GQA, MQA with D_v != D (the written-out fallback)
                for h, h_kv, d_v in ((4, 4, 8), (4, 2, 8), (2, 1, 6)):
                    # odd chunks: 5 and 17 tokens a rank, or a zigzag half
                    for t_local in (10, 34) if layout == "zigzag" else (5, 17):
                        cases.append(Case(dtype, is_causal, layout, h, h_kv, d_v, t_local))
    cases.append(Case("bf16", True, "zigzag", 4, 2, 8, 34))
    cases.append(Case("bf16", False, "contiguous", 4, 4, 8, 17))
    return cases


GRID = _grid()
# On 4 ranks, what 4 ranks add to 2: the schedule with 3 visiting ranks (a zigzag rank's two chunks
# far apart, hidden blocks, more partial results merged): every dtype, causal or not, layout and
# odd length, with GQA on the fused kernel, and the written-out fallback (MQA, D_v ≠ D) where its
# merges are loosest (fp32, causal). Which heads a key/value head serves (MHA, GQA, MQA) is decided
# inside each piece's kernel call, alike on 2 ranks and on 4: MHA and the rest of MQA run on 2.
GRID_OF_FOUR = [
    c
    for c in GRID
    if (c.h, c.h_kv) == (4, 2)
    or c.dtype == "bf16"
    or (c.d_v != 8 and c.dtype == "fp32" and c.is_causal)
]
_DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16}


_Refs = tuple[list[torch.Tensor], ...]


def _case_refs(index: int, case: Case, rank: int, world: int) -> _Refs:
    """One case's inputs and this rank's share of what single-process attention computes:
    ``(q, k, v, d_out)`` (whole) and the output and q/k/v gradients in float64 (``ref``), in the
    case's dtype without upcasting (``base``) and by ``attnlab.scaled_dot_product_attention``
    (``plain``), sharded as this rank holds them."""
    dtype = _DTYPES[case.dtype]
    t = case.t_local * world
    gen = torch.Generator().manual_seed(1000 + index)  # the same whole tensors on every rank
    q = torch.randn(2, case.h, t, 8, generator=gen).to(dtype)
    k = torch.randn(2, case.h_kv, t, 8, generator=gen).to(dtype)
    v = torch.randn(2, case.h_kv, t, case.d_v, generator=gen).to(dtype)
    d_out = torch.randn(2, case.h, t, case.d_v, generator=gen).to(dtype)

    def shard(x: torch.Tensor) -> torch.Tensor:
        return shard_sequence(x, 2, rank=rank, world_size=world, layout=case.layout)

    def whole(fn: Any, cast: torch.dtype | None) -> list[torch.Tensor]:
        ins = [(x if cast is None else x.to(cast)).requires_grad_() for x in (q, k, v)]
        o = fn(*ins)
        return [shard(x.detach()) for x in (o, *torch.autograd.grad(o, ins, d_out.to(o.dtype)))]

    ref = whole(lambda *a: attention_ref(*a, is_causal=case.is_causal)[0], torch.float64)
    base = whole(lambda *a: attention_ref(*a, is_causal=case.is_causal, upcast=False)[0], None)
    plain = whole(lambda *a: al.scaled_dot_product_attention(*a, is_causal=case.is_causal), None)
    return [q, k, v, d_out], ref, base, plain


def _check_case(case: Case, rank: int, world: int, refs: _Refs) -> list[str]:
    """One case on this rank: output and q/k/v gradients against single-process attention
    (``refs``: :func:`_case_refs`)."""
    dtype = _DTYPES[case.dtype]
    (q, k, v, d_out), ref, base, plain = refs

    def shard(x: torch.Tensor) -> torch.Tensor:
        return shard_sequence(x, 2, rank=rank, world_size=world, layout=case.layout)

    mine = [shard(x).requires_grad_() for x in (q, k, v)]
    out = ring_attention(*mine, is_causal=case.is_causal, layout=case.layout)
    got = [out, *torch.autograd.grad(out, mine, shard(d_out))]
    problems = []
    for name, g, r, b, p in zip(("output", "dq", "dk", "dv"), got, ref, base, plain):
        if g.dtype != dtype or g.shape != r.shape or torch.isnan(g).any():
            problems.append(f"{name}: dtype {g.dtype}, shape {tuple(g.shape)} or NaN")
            continue
        err, err_plain, err_base = max_err(g, r), max_err(g, p), max_err(b, r)
        if dtype == torch.float64:
            bound = bound_plain = 1e-12
        else:  # err <= 2 * err(plain same-dtype implementation) + floor
            bound = 2 * err_base + FLOOR[dtype]
            bound_plain = 3 * err_base + FLOOR[dtype]
        if err > bound or err_plain > bound_plain:
            problems.append(
                f"{name}: error {err:.3g} vs float64 (bound {bound:.3g}), {err_plain:.3g} vs "
                f"attnlab.scaled_dot_product_attention (bound {bound_plain:.3g})"
            )
    return [f"rank {rank}: {case}: {p}" for p in problems]


def _raised(fn: Any) -> str | None:
    try:
        fn()
    except (ValueError, TypeError) as e:  # attnlab's ArgumentError / ArgumentTypeError
        return f"{'TypeError' if isinstance(e, TypeError) else 'ValueError'}: {e}"
    return None


def _bad_inputs(rank: int, world: int) -> dict[str, str | None]:
    """Each bad call on every rank: the error it raised (``None``: it did not raise)."""
    x = torch.randn(1, 2, 4, 8)
    odd = torch.randn(1, 2, 5, 8)
    seen = {
        # rank 0 holds 4 tokens, the others 5
        "lengths": _raised(lambda: ring_attention(x if rank == 0 else odd, x if rank == 0 else odd, x if rank == 0 else odd)),
        # only rank 1 passes a bad layout name
        "layout name": _raised(lambda: ring_attention(x, x, x, layout="ring" if rank == 1 else "zigzag")),
        "zigzag odd": _raised(lambda: ring_attention(odd, odd, odd, layout="zigzag")),
        "layouts differ": _raised(lambda: ring_attention(x, x, x, layout="contiguous" if rank == 0 else "zigzag")),
        "causal differs": _raised(lambda: ring_attention(x, x, x, is_causal=rank == 0)),
        "devices": _raised(lambda: ring_attention(x, x.to("meta") if rank == world - 1 else x, x)),
        "unshard shapes": _raised(lambda: unshard_sequence(x if rank == 0 else odd, 2, layout="contiguous")),
        "unshard dtypes": _raised(lambda: unshard_sequence(torch.zeros(2, 4, dtype=torch.int64 if rank == 0 else torch.int32), 1, layout="zigzag")),
    }  # fmt: skip
    # the group still works after all of these
    whole = torch.arange(2 * 4 * world * 3).reshape(2, 4 * world, 3)
    for layout in ("contiguous", "zigzag"):
        part = shard_sequence(whole, 1, rank=rank, world_size=world, layout=layout)
        seen[f"round trip {layout}"] = str(
            torch.equal(unshard_sequence(part, 1, layout=layout), whole)
        )
    return seen


def _transfers(rank: int, world: int) -> dict[str, int]:
    """One causal step with slices of 4 tokens, counting what travels: the longest tensor sent
    (tokens) in the forward and in the backward, and the most transfers in flight at once."""
    import weakref

    from attnlab.distributed import ring_autograd as ring

    default, swap = ring._SLICE, ring._Ring.swap
    live: weakref.WeakSet[Any] = weakref.WeakSet()
    seen = {"forward": 0, "backward": 0, "in flight": 0}
    phase = "forward"

    def counting(self: Any, tensors: tuple[torch.Tensor, ...], ahead: int, tag: int) -> Any:
        transfer = swap(self, tensors, ahead, tag)
        live.add(transfer)
        seen[phase] = max(seen[phase], *(t.shape[2] for t in tensors))
        seen["in flight"] = max(seen["in flight"], len(live))
        return transfer

    ring._SLICE, ring._Ring.swap = 4, counting  # type: ignore[method-assign]
    try:
        for layout in ("contiguous", "zigzag"):
            gen = torch.Generator().manual_seed(rank)
            q, k, v = (torch.randn(1, 2, 40, 8, generator=gen).requires_grad_() for _ in range(3))
            phase = "forward"
            out = ring_attention(q, k, v, is_causal=True, layout=layout)
            phase = "backward"
            out.sum().backward()
    finally:
        ring._SLICE, ring._Ring.swap = default, swap  # type: ignore[method-assign]
    return seen


def ring_worker(
    rank: int, world: int, cases: list[Case]
) -> tuple[dict[str, str | None], list[str], dict[str, int]]:
    """What a launched rank runs: the bad inputs first, then every case of the grid, with the
    chunks travelling whole (one slice: the grid's chunks are shorter than a slice) and in slices
    of 4 tokens (uneven last slices, causal squares cut into blocks); then what travels."""
    from attnlab.distributed import ring_autograd as ring

    seen = _bad_inputs(rank, world)
    problems: list[str] = []
    default = ring._SLICE
    # the single-process references do not depend on the slices: computed once a case
    refs = [_case_refs(i, case, rank, world) for i, case in enumerate(cases)]
    try:
        for slice_tokens in (default, 4):
            ring._SLICE = slice_tokens
            for case, case_refs in zip(cases, refs, strict=True):
                problems += [
                    f"{p} (slices of {slice_tokens})"
                    for p in _check_case(case, rank, world, case_refs)
                ]
    finally:
        ring._SLICE = default
    return seen, problems, _transfers(rank, world)


# ----------------------------------------------------------------------------------------------
# the launches


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_in_a_process_group(world: int) -> None:
    results = launch(ring_worker, world, GRID if world == 2 else GRID_OF_FOUR, timeout=150.0)
    problems = [p for _, rank_problems, _ in results for p in rank_problems]
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems[:40])

    # the chunks travel in slices (4 keys in the backward, 16 in the forward: the zigzag pairs
    # two half-length ranges), never whole, and at most two transfers are in flight at once (the
    # next key/value slice and, in the backward, one exchange of dK/dV shares)
    for _, _, travelled in results:
        assert travelled == {"forward": 16, "backward": 4, "in flight": 2}, travelled

    for rank, (seen, _, _) in enumerate(results):
        rejected = f"rank 1 of {world} rejected its arguments"
        expect = {
            "lengths": "ValueError: ring_attention: q holds T_local = 5 tokens on rank 1 but 4 on rank 0",
            "layout name": (
                "ValueError: layout must be one of 'contiguous', 'zigzag', got 'ring'"
                if rank == 1
                else f"ValueError: ring_attention: {rejected}"
            ),
            "zigzag odd": f"must be divisible by {2 * world}; got T_local = 5 (T = {5 * world})",
            "layouts differ": "ValueError: ring_attention: layout is 'zigzag' on rank 1 but 'contiguous' on rank 0",
            "causal differs": "ValueError: ring_attention: is_causal is False on rank 1 but True on rank 0",
            "devices": (
                "ValueError: k is on meta but q is on cpu"
                if rank == world - 1
                else f"rank {world - 1} of {world} rejected its arguments"
            ),
            "unshard shapes": "ValueError: unshard_sequence: x_local holds T_local = 5 tokens on rank 1 but 4 on rank 0",
            "unshard dtypes": "ValueError: unshard_sequence: dtype is torch.int32 on rank 1 but torch.int64 on rank 0",
            "round trip contiguous": "True",
            "round trip zigzag": "True",
        }  # fmt: skip
        for what, text in expect.items():
            assert seen[what] is not None and text in seen[what], (rank, what, seen[what])


def test_the_grid_covers_the_issue() -> None:
    assert {c.layout for c in GRID} == {"contiguous", "zigzag"}
    assert {c.is_causal for c in GRID} == {False, True}
    assert any(c.h_kv < c.h for c in GRID) and any(c.d_v != 8 for c in GRID)
    halves = {c.t_local // 2 if c.layout == "zigzag" else c.t_local for c in GRID}
    assert {5, 17} <= halves and all(n % 2 for n in halves)
    # on 4 ranks: every dtype, causal or not, layout and length, on the kernel and the fallback
    four = {(c.dtype, c.is_causal, c.layout, c.t_local) for c in GRID_OF_FOUR if c.d_v == 8}
    assert four == {(c.dtype, c.is_causal, c.layout, c.t_local) for c in GRID if c.d_v == 8}
    fallback = {(c.layout, c.t_local) for c in GRID_OF_FOUR if c.d_v != 8}
    assert fallback == {(c.layout, c.t_local) for c in GRID if c.d_v != 8}
    assert len(GRID_OF_FOUR) < len(GRID) // 2
