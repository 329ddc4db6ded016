"""Sequence (context) parallel attention: ring attention over the ranks of a process group.

Each of the ``W`` ranks holds one chunk of the sequence — its ``T_local = T / W`` queries, keys and
values (layouts and schedule: :mod:`attnlab.distributed.ring_schedule`) — and no rank ever holds
the whole sequence: every tensor it holds is at most the size of one chunk, and scores exist only
in the kernel's tiles. The key/value chunks visit the ranks in the ring's order (Liu, Zaharia &
Abbeel 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context"; Brandon et
al. 2023, "Striped Attention", for the load-balanced order): at step ``i = 0 … W − 1`` rank ``r``
works with the chunk of rank

    s = (r − i) mod W

**Transfers.** A chunk travels in *slices* of keys (``_SLICE`` = 1024 tokens in the backward pass,
4x that in the forward; a zigzag slice pairs a range of the early half with the same range of
the late half, so that every rank has the same work in every slice), and a step is one *tick* per
slice. Each slice comes straight from its owner and just in time: during tick ``(i, j)`` every
rank sends rank ``r + i`` (or ``r + i + 1`` at a step's last slice) the slice of its own chunk
that rank works with at the next tick, and receives its own next slice from the owner
(``dist.batch_isend_irecv``), so that the transfer hides behind the tick's work. The owner sends
from its input and a slice is let go of once worked on: no rank keeps a chunk to pass on. (The
ranks exchange with every other rank, not only with their neighbours: gloo and NCCL reach any rank
of the group; the volume each rank sends and receives is that of the hop-by-hop ring.)

**Forward.** The attention of rank ``r``'s queries against one slice of chunk ``s`` is one call of
PyTorch's fused CPU kernel per piece of the step
(:func:`~attnlab.distributed.ring_schedule.ring_pieces`, cut to the slice by
:func:`~attnlab.distributed.ring_schedule.split_piece`), which returns the piece's output
normalised over the piece's keys, ``O_p = Σ_p e^{S − L_p} V``, and its log-sum-exp
``L_p = log Σ_p e^{S}``. The pieces are merged by their log-sum-exps — the operations of
:func:`~attnlab.nn.backends.common.merge_partials`, done in place in the rows of ``O`` and ``L``
(:func:`~attnlab.nn.backends.common.merge_partials_`) — the online softmax one level up:

    L = log(e^{L_a} + e^{L_b})                  (logaddexp)
    O = e^{L_a − L} · O_a + e^{L_b − L} · O_b

Starting from ``O = 0, L = −∞`` and merging every piece gives exactly the attention over the whole
sequence, because a softmax over a union of key sets is the ``L``-weighted mix of the softmaxes
over its parts.

**Backward** (FlashAttention's Algorithm 2 split along the keys). With the whole row's ``O`` and
``L`` saved, one piece's share of the gradient needs only that piece's keys:

    P_p = e^{S_p − L},  D = rowsum(dO ∘ O),  dS_p = P_p ∘ (dO V_pᵀ − D)
    dQ += dS_p K_p · scale,   dK_p = dS_pᵀ Q · scale,   dV_p = P_pᵀ dO

which is what the kernel's backward returns when handed the whole row's ``O`` and ``L`` (the
backward's calls take at most ``_SLICE`` query rows, so that its gradient outputs are
slice-sized). The backward pass turns the ring once more, slice by slice: ``dQ`` accumulates at
home, in place; rank ``r``'s share of a slice's ``dK, dV`` is summed over the tick's calls and sent
straight to the chunk's owner ``r − i``, which receives it during the next tick and adds it to
its own ``dK, dV``. Shares travel in fp32 (fp64 for fp64 inputs).

**Memory** per rank is ``O``, ``dO``, ``dQ`` and the own chunk's ``dK``, ``dV`` — the five
chunk-sized tensors of a single process — plus a constant number of slice-sized buffers: the slice
in hand and the next one in flight, the share being summed and the ones being exchanged, the
kernel's gradients of one call (a dozen or so, 1 MiB each for 4 fp32 heads of 64). At
``T = 32768`` (4 heads of 64, fp32) that is about 5.8 chunk-sized buffers per rank on two ranks,
against about five for a single process (``benchmarks/ring_attention.py`` measures it), and the
memory per rank falls as ``1 / W`` plus that constant. Half-precision inputs add their fp32 copies
of ``Q`` and ``dO``.

Grouped-query attention (``H_kv < H``) sends the ``H_kv`` key/value heads; they are repeated to
``H`` heads only for one slice's work, and the gradients are summed back over each group before
they travel. On CUDA, or where the kernel does not apply (``D_v ≠ D``, a PyTorch without it),
each piece is computed by attnlab's online softmax written out in PyTorch
(:mod:`attnlab.nn.backends.blockwise`, the ``"python"`` tile kernel), forward and backward alike.
With one process (no group) the whole chunk is one kernel call, forward and backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from attnlab._checks import check_choice, check_floating, check_tensor, shape_str
from attnlab.distributed.ring_schedule import (
    LAYOUTS,
    RingPiece,
    check_divisible,
    ring_pieces,
    split_piece,
)
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.nn.backends.blockwise import KEY_BLOCK, QUERY_BLOCK, _Blockwise
from attnlab.nn.backends.common import compute_dtype, merge_partials_, repeat_kv
from attnlab.nn.backends.fused_tiles import _backward_op, _forward_op, fused_available
from attnlab.nn.backends.plan import TilePlan

__all__ = ["ring_attention", "unshard_sequence"]

# tags of the two streams that travel at the same time in the backward pass
_KV_TAG, _GRAD_TAG = 7300, 7310
# dtypes by code, for comparing the ranks' arguments
_DTYPES = (
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)
_MAX_DIMS = 8
#: tokens per slice of the backward pass: with more than one rank the key/value chunks and the
#: dK/dV shares travel in slices of this many keys (the forward's slices are 4x as long), and a
#: backward kernel call takes at most this many query rows. Each slice-sized buffer at T_local =
#: 16384 is 1/16 of a chunk-sized one: smaller slices hold less but make more kernel calls
#: (one measurement, T = 32768, 4 fp32 heads of 64, 2 ranks on a 2-core CPU, per rank: 512 → 5.5
#: chunk-sized buffers, 10.3 s; 1024 → 5.8, 9.2 s; 2048 → 6.3, 8.5 s; whole chunks: 11.2, 8.6 s)
_SLICE = 1024


# ----------------------------------------------------------------------------------------------
# the ring: ranks, peers, transfers


@dataclass(frozen=True)
class _Ring:
    """This process's place in the ring: its rank, the number of ranks and every rank's global
    rank (what point-to-point operations address)."""

    group: Any
    rank: int
    world_size: int
    members: tuple[int, ...]

    def swap(self, tensors: tuple[torch.Tensor, ...], ahead: int, tag: int) -> _Transfer:
        """Send ``tensors`` to rank ``r + ahead`` and receive their likes from rank
        ``r − ahead`` (indices mod ``W``), asynchronously (one tag per tensor). Each travels in
        the wire layout: ``(B, H, T, D)`` kept as ``(B, T, H, D)`` in memory (:func:`_wire`),
        whatever its sender's strides."""
        to = self.members[(self.rank + ahead) % self.world_size]
        source = self.members[(self.rank - ahead) % self.world_size]
        ops, sent, received = [], [], []
        for i, t in enumerate(tensors):
            b, h, n, d = t.shape
            into = torch.empty((b, n, h, d), dtype=t.dtype, device=t.device)
            out = _wire(t).transpose(1, 2)
            ops.append(dist.P2POp(dist.isend, out, to, self.group, tag + i))
            ops.append(dist.P2POp(dist.irecv, into, source, self.group, tag + i))
            sent.append(out)
            received.append(into.transpose(1, 2))
        return _Transfer(dist.batch_isend_irecv(ops), tuple(sent), tuple(received))

    def collective_device(self) -> torch.device:
        """Where the group's backend takes tensors for collectives (CUDA for NCCL, else CPU)."""
        if dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


class _Transfer:
    """Sends to one rank and receives from another, in flight. It holds what it sends and the
    receive buffers until :meth:`wait`."""

    def __init__(
        self, works: list[Any], sent: tuple[torch.Tensor, ...], received: tuple[torch.Tensor, ...]
    ) -> None:
        # batch_isend_irecv answers one work per operation (send, receive, send, …), or one
        # for the whole batch (NCCL's coalesced operations)
        paired = len(works) == 2 * len(received)
        self.sends = works[0::2] if paired else list(works)
        self.receives = works[1::2] if paired else list(works)
        self.sent: tuple[torch.Tensor, ...] = sent
        self.received = received

    def wait(self) -> tuple[torch.Tensor, ...]:
        """Wait for everything and let go of what was sent; the received tensors (the transfer
        lets go of them too)."""
        for work in self.sends:
            work.wait()
        self.sends, self.sent = [], ()
        for work in self.receives:
            work.wait()
        self.receives = []
        received, self.received = self.received, ()
        return received


def _wire(t: torch.Tensor) -> torch.Tensor:
    """``(B, H, T, D)`` kept as ``(B, T, H, D)`` in memory — the layout the fused kernel returns
    and a model's ``x.view(B, T, H, D).transpose(1, 2)`` has, so usually no copy."""
    return (
        t if t.transpose(1, 2).is_contiguous() else t.transpose(1, 2).contiguous().transpose(1, 2)
    )


def _ring_of(group: Any) -> _Ring:
    """The ring of ``group`` (``None``: the default group, or a single process without one)."""
    initialised = dist.is_available() and dist.is_initialized()
    if group is None:
        if not initialised:
            return _Ring(None, 0, 1, (0,))
        group = dist.group.WORLD
    elif not initialised:
        raise ArgumentError(
            f"group was given ({type(group).__name__}) but no process group is initialised: call "
            "torch.distributed.init_process_group first, or pass group=None for a single process"
        )
    elif not isinstance(group, dist.ProcessGroup):
        raise ArgumentTypeError(
            f"group must be a torch.distributed ProcessGroup or None, got {group!r}"
        )
    rank = dist.get_rank(group)
    if rank < 0:
        raise ArgumentError(
            f"group does not contain this process (global rank {dist.get_rank()}): call "
            "ring_attention only on the ranks of the ring's group"
        )
    world = dist.get_world_size(group)
    members = tuple(dist.get_global_rank(group, i) for i in range(world))
    return _Ring(group, rank, world, members)


# ----------------------------------------------------------------------------------------------
# every rank must pass arguments of one shape: checked with one small all-gather, so that a bad
# argument raises the same error on every rank instead of leaving the others waiting


@dataclass(frozen=True)
class _Field:
    name: str
    kind: str  # "shape" | "dtype" | "bool" | "layout" | "float" | "int"
    value: Any
    seq_dim: int = -2  # a shape's sequence dimension

    def encode(self) -> list[float]:
        if self.kind == "shape":
            dims = list(self.value)
            return [float(len(dims)), *map(float, dims), *[0.0] * (_MAX_DIMS - len(dims))]
        if self.kind == "dtype":
            return [float(_DTYPES.index(self.value) if self.value in _DTYPES else len(_DTYPES))]
        if self.kind == "layout":
            return [float(LAYOUTS.index(self.value))]
        if self.kind == "float":
            return [0.0, 0.0] if self.value is None else [1.0, float(self.value)]
        return [float(self.value)]

    def decode(self, values: list[float]) -> Any:
        if self.kind == "shape":
            return tuple(int(d) for d in values[1 : 1 + int(values[0])])
        if self.kind == "dtype":
            i = int(values[0])
            return _DTYPES[i] if i < len(_DTYPES) else "another dtype"
        if self.kind == "layout":
            return LAYOUTS[int(values[0])]
        if self.kind == "float":
            return None if values[0] == 0.0 else values[1]
        if self.kind == "bool":
            return bool(values[0])
        return int(values[0])

    @property
    def width(self) -> int:
        return {"shape": 1 + _MAX_DIMS, "float": 2}.get(self.kind, 1)


def _agree(
    ring: _Ring,
    what: str,
    kinds: list[tuple[str, str]],
    fields: list[_Field] | None,
    problem: Exception | None,
) -> None:
    """All-gather every rank's arguments (``None`` with ``problem`` where its own checks failed)
    and raise, on every rank alike, when a rank failed or the ranks disagree."""
    width = 1 + sum(_Field(n, k, None).width for n, k in kinds)
    mine = torch.zeros(width, dtype=torch.float64)
    if problem is None and fields is not None:
        mine[0] = 1.0
        mine[1:] = torch.tensor([x for f in fields for x in f.encode()], dtype=torch.float64)
    where = ring.collective_device()
    gathered = [
        torch.empty(width, dtype=torch.float64, device=where) for _ in range(ring.world_size)
    ]
    dist.all_gather(gathered, mine.to(where), group=ring.group)
    rows = [g.cpu().tolist() for g in gathered]
    if problem is not None:
        raise problem
    failed = [r for r, row in enumerate(rows) if row[0] != 1.0]
    if failed:
        ranks = ", ".join(map(str, failed))
        raise ArgumentError(
            f"{what}: rank {ranks} of {ring.world_size} rejected its arguments (see the error "
            "raised there); every rank raises, so that none waits on the ring"
        )
    if fields is None:  # every rank passed its checks, this one included, so it has fields
        raise RuntimeError(f"{what}: a rank that passed its checks sent no arguments")
    for r, row in enumerate(rows[1:], start=1):
        at = 1
        for f in fields:
            here, first = f.decode(row[at : at + f.width]), f.decode(rows[0][at : at + f.width])
            at += f.width
            if here == first:
                continue
            if f.kind == "shape":
                differ = [i for i, (a, b) in enumerate(zip(here, first)) if a != b]
                seq = f.seq_dim % max(len(here), 1)
                if len(here) == len(first) and differ == [seq]:
                    raise ArgumentError(
                        f"{what}: {f.name} holds T_local = {here[seq]} tokens on rank {r} but "
                        f"{first[seq]} on rank 0: every rank must hold a chunk of the same length "
                        "(T_local = T / world_size)"
                    )
                raise ArgumentError(
                    f"{what}: {f.name} has shape {shape_str(here)} on rank {r} but "
                    f"{shape_str(first)} on rank 0: every rank must hold a chunk of the same shape"
                )
            raise ArgumentError(
                f"{what}: {f.name} is {here!r} on rank {r} but {first!r} on rank 0: every rank "
                f"must pass the same {f.name}"
            )


# ----------------------------------------------------------------------------------------------
# one piece: the fused CPU kernel, or attnlab's online softmax written out in PyTorch


class _Pieces:
    """Forward ``(O_p, L_p)`` and backward ``(dQ_p, dK_p, dV_p)`` of one piece, the backward
    given the whole row's ``O`` and ``L``. All operands 4-D in the accumulation dtype."""

    def __init__(self, fused: bool, scale: float) -> None:
        self.fused, self.scale = fused, scale

    def _plan(self, t_q: int, t_k: int, causal: bool) -> TilePlan:
        return TilePlan.make(t_q, t_k, QUERY_BLOCK, KEY_BLOCK, 0 if causal else None)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fused:
            out, lse = _forward_op(  # type: ignore[misc]
                q, k, v, 0.0, causal, attn_mask=None, scale=self.scale
            )
            return out, lse
        plan = self._plan(q.shape[-2], k.shape[-2], causal)
        out, lse = _Blockwise.apply(q, k, v, None, None, plan, self.scale, 0.0, 0)
        return out, lse

    def backward(
        self,
        d_out: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        causal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.fused:
            dq, dk, dv = _backward_op(  # type: ignore[misc]
                d_out, q, k, v, out, lse, 0.0, causal, attn_mask=None, scale=self.scale
            )
            return dq, dk, dv
        # the blockwise backward recomputes P = e^{S − L} from what it is handed as saved: the
        # whole row's O and L give this piece's share of the gradients
        plan = self._plan(q.shape[-2], k.shape[-2], causal)
        saved = SimpleNamespace(
            saved_tensors=(q, k, v, None, None, out, lse),
            params=(plan, self.scale, 0.0, 0),
            needs_input_grad=(True, True, True, False),
        )
        dq, dk, dv = _Blockwise.backward(saved, d_out, None)[:3]  # type: ignore[arg-type]
        return dq, dk, dv


def _operands(
    kv: tuple[torch.Tensor, ...], acc: torch.dtype, groups: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values for the local work: in the accumulation dtype, the ``H_kv`` heads repeated
    to ``H`` (views, no copy, for fp32/fp64 without groups; with a ring only a slice's worth)."""
    k, v = kv
    return repeat_kv(k.to(acc), groups), repeat_kv(v.to(acc), groups)


def _sum_groups(grad: torch.Tensor, groups: int) -> torch.Tensor:
    """The gradient of repeated heads summed back over each group   (B, H, T, D) → (B, H_kv, T, D)."""
    if groups == 1:
        return grad
    b, h, t, d = grad.shape
    return grad.reshape(b, h // groups, groups, t, d).sum(dim=2)


def _wire_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros of shape ``(B, H, T, D)`` in the wire layout (``(B, T, H, D)`` in memory)."""
    b, h, n, d = shape
    return torch.zeros((b, n, h, d), dtype=dtype, device=device).transpose(1, 2)


#: a slice: the key ranges ``(k0, k1)`` of a chunk that travel together
_Slice = tuple[tuple[int, int], ...]


def _slices(t_local: int, layout: str, size: int) -> list[_Slice]:
    """The slices a chunk travels in, about ``size`` keys each (the last one may be shorter).
    A zigzag slice pairs a range of the early half with the same range of the late half, so that
    every rank has the same work in every tick (a rank that sees only the early half of the keys
    sees them with all its queries, one that sees all keys with its late half of the queries)."""
    if layout != "zigzag":
        return [((a, min(a + size, t_local)),) for a in range(0, t_local, size)]
    half, step = t_local // 2, max(size // 2, 1)
    return [
        ((a, min(a + step, half)), (half + a, half + min(a + step, half)))
        for a in range(0, half, step)
    ]


def _cut(t: tuple[torch.Tensor, ...], where: _Slice) -> tuple[torch.Tensor, ...]:
    """The slice ``where`` of each tensor ``(B, H, T, D)``: ``(t₀ range₀, t₀ range₁, …, t₁ …)``."""
    return tuple(x[:, :, a:b] for x in t for a, b in where)


class _KeyValues:
    """The key/value slices this rank works with, tick by tick: the tick ``(i, j)`` is slice ``j``
    of the chunk of step ``i``, as ``(K range₀, …, V range₀, …)``.

    A slice comes *just in time* and straight from its owner: during tick ``t`` every rank sends
    the slice of its own chunk that rank ``r + i`` needs at tick ``t + 1 = (i, j)`` and receives
    the one it needs itself from rank ``r − i``, so that the transfer hides behind the tick's
    work. An owner sends from its input (through a slice-sized copy where the input is not in the
    wire layout), and a slice that was worked on is let go of: no rank keeps a chunk to pass on,
    and at most two slices are here at a time.
    """

    def __init__(self, ring: _Ring, k: torch.Tensor, v: torch.Tensor, slices: list[_Slice]) -> None:
        self.ring, self.n = ring, len(slices)
        self.own = [_cut((k, v), s) for s in slices]
        self.transfer: _Transfer | None = None

    def take(self, step: int, j: int) -> tuple[torch.Tensor, ...]:
        """Slice ``j`` of step ``step``'s chunk (the ticks are taken in order); posts the next
        tick's transfer."""
        if step == 0:
            here = self.own[j]
        else:  # it was received during the last tick
            if self.transfer is None:
                raise RuntimeError("ring attention: a key/value slice was taken out of order")
            here = self.transfer.wait()
            self.transfer = None
        step_next, j_next = (step, j + 1) if j + 1 < self.n else (step + 1, 0)
        if 1 <= step_next < self.ring.world_size:
            self.transfer = self.ring.swap(self.own[j_next], step_next, _KV_TAG)
        return here


def _calls(todo: tuple[RingPiece, ...], where: _Slice, rows: int) -> list[tuple[int, RingPiece]]:
    """The kernel calls of a step's pieces with keys in the slice, at most ``rows`` query rows
    each: ``(range index, call)``."""
    return [
        (m, c) for m, (a, b) in enumerate(where) for p in todo for c in split_piece(p, a, b, rows)
    ]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        ring: _Ring,
        is_causal: bool,
        layout: str,
        scale: float,
    ) -> torch.Tensor:
        acc = compute_dtype(q.dtype)
        groups = q.shape[1] // k.shape[1]
        pieces = _Pieces(fused_available(q, v, 0.0, None), scale)
        t_local = q.shape[2]
        q_a = q.to(acc)
        if ring.world_size == 1:  # plain attention: the one piece, no ring
            (p,) = ring_pieces(0, 0, 1, t_local, layout=layout, is_causal=is_causal)
            out, lse = pieces.forward(q_a, *_operands((k, v), acc, groups), p.causal)
        else:
            # O = 0, L = −∞: merging a piece into them gives the piece itself
            out = _wire_zeros((*q.shape[:-1], v.shape[-1]), acc, q.device)
            lse = torch.full(q.shape[:-1], -math.inf, dtype=acc, device=q.device)
            # slices 4x as long as the backward's: the forward holds fewer tensors, and a kernel
            # call over more keys is faster
            slices = _slices(t_local, layout, 4 * _SLICE)
            kv = _KeyValues(ring, k, v, slices)
            for step in range(ring.world_size):
                source = (ring.rank - step) % ring.world_size
                todo = ring_pieces(
                    ring.rank, source, ring.world_size, t_local, layout=layout, is_causal=is_causal
                )
                for j, where in enumerate(slices):
                    here, n = kv.take(step, j), len(where)
                    # all the rows a call can take: the forward's only temporary is its output
                    for m, c in _calls(todo, where, t_local):
                        k_m, v_m = _operands((here[m], here[n + m]), acc, groups)
                        rows, keys = (
                            slice(c.q0, c.q1),
                            slice(c.k0 - where[m][0], c.k1 - where[m][0]),
                        )
                        o_p, l_p = pieces.forward(
                            q_a[:, :, rows], k_m[:, :, keys], v_m[:, :, keys], c.causal
                        )
                        merge_partials_(out[:, :, rows], lse[:, :, rows], o_p, l_p)
                        del o_p, l_p, k_m, v_m
                    del here
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.params = (ring, is_causal, layout, pieces)
        return out.to(q.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, d_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        ring, is_causal, layout, pieces = ctx.params
        acc = out.dtype
        groups = q.shape[1] // k.shape[1]
        t_local = q.shape[2]
        q_a, d_o = q.to(acc), d_out.to(acc)
        if ring.world_size == 1:  # plain attention: the one piece, no ring
            (p,) = ring_pieces(0, 0, 1, t_local, layout=layout, is_causal=is_causal)
            k_a, v_a = _operands((k, v), acc, groups)
            dq, g_k, g_v = pieces.backward(d_o, q_a, k_a, v_a, out, lse.contiguous(), p.causal)
            del k_a, v_a
            dk, dv = _sum_groups(g_k, groups), _sum_groups(g_v, groups)
            return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None
        dq = torch.zeros_like(q_a)  # q's strides: autograd hands it on without a copy
        # the own chunk's dK, dV: this rank's share now, the others' when they come home
        dk, dv = _wire_zeros(k.shape, acc, k.device), _wire_zeros(v.shape, acc, v.device)
        slices = _slices(t_local, layout, _SLICE)
        kv = _KeyValues(ring, k, v, slices)
        # the last tick's exchange of shares: (the slice it brings home, the transfer)
        pending: tuple[_Slice, _Transfer] | None = None
        for step in range(ring.world_size):
            source = (ring.rank - step) % ring.world_size
            todo = ring_pieces(
                ring.rank, source, ring.world_size, t_local, layout=layout, is_causal=is_causal
            )
            for j, where in enumerate(slices):
                here, n = kv.take(step, j), len(where)
                # the last tick's exchange (it travelled while that tick's kernel calls ran):
                # rank r + i's share of the own chunk's slice joins the sums at home
                if pending is not None:
                    _add_home(pending, dk, dv)
                    pending = None
                # this rank's share of slice j, (dK range₀, …, dV range₀, …): added to the sums
                # at home for the own chunk, else made here and sent to the chunk's owner
                share = (
                    _cut((dk, dv), where)
                    if step == 0
                    else tuple(_wire_zeros(t.shape, acc, t.device) for t in here)
                )
                for m, c in _calls(todo, where, _SLICE):
                    k_m, v_m = _operands((here[m], here[n + m]), acc, groups)
                    rows, keys = slice(c.q0, c.q1), slice(c.k0 - where[m][0], c.k1 - where[m][0])
                    g_q, g_k, g_v = pieces.backward(
                        d_o[:, :, rows], q_a[:, :, rows], k_m[:, :, keys], v_m[:, :, keys],
                        out[:, :, rows], lse[:, :, rows].contiguous(), c.causal,
                    )  # fmt: skip
                    dq[:, :, rows] += g_q
                    share[m][:, :, keys] += _sum_groups(g_k, groups)
                    share[n + m][:, :, keys] += _sum_groups(g_v, groups)
                    del g_q, g_k, g_v, k_m, v_m
                del here
                if step > 0:  # to the owner r − i; rank r + i's share of the own chunk comes
                    pending = (where, ring.swap(share, -step, _GRAD_TAG))
                del share
        if pending is not None:
            _add_home(pending, dk, dv)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def _add_home(pending: tuple[_Slice, _Transfer], dk: torch.Tensor, dv: torch.Tensor) -> None:
    """Wait for an exchange of shares and add the one that came, of the own chunk's slice, to the
    sums at home."""
    where, transfer = pending
    for home, part in zip(_cut((dk, dv), where), transfer.wait()):
        home += part


# ----------------------------------------------------------------------------------------------
# the public entry points


def _check_local(
    query: object,
    key: object,
    value: object,
    is_causal: object,
    layout: object,
    scale: object,
    world_size: int,
) -> float:
    """This rank's own checks of :func:`ring_attention`'s arguments; returns the scale."""
    q = check_tensor("q", query)
    k = check_tensor("k", key)
    v = check_tensor("v", value)
    if not isinstance(is_causal, bool):
        raise ArgumentTypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    check_choice("layout", layout, LAYOUTS)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_floating(name, t)
        if t.dim() < 3 or t.dim() > _MAX_DIMS:
            raise ArgumentError(
                f"{name} must have shape (..., H, T_local, D) with 3 to {_MAX_DIMS} dims, got "
                f"{shape_str(t.shape)}"
            )
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ArgumentError(
                f"{name} is on {t.device} but q is on {q.device}: q, k and v must be on one device"
            )
        if t.dtype != q.dtype:
            raise ArgumentTypeError(
                f"{name} has dtype {t.dtype} but q has {q.dtype}: q, k and v must share one dtype"
            )
    h, t_local, d = q.shape[-3:]
    if k.dim() != q.dim() or k.shape[:-3] != q.shape[:-3] or k.shape[-2:] != (t_local, d):
        want = shape_str((*q.shape[:-3], k.shape[-3], t_local, d))
        raise ArgumentError(
            f"k has shape {shape_str(k.shape)} but must be (..., H_kv, T_local, D) = {want} "
            "(the keys of the same tokens as the queries)"
        )
    if v.shape[:-1] != k.shape[:-1]:
        want = shape_str((*k.shape[:-1], v.shape[-1]))
        raise ArgumentError(
            f"v has shape {shape_str(v.shape)} but must be (..., H_kv, T_local, D_v) = {want}"
        )
    h_kv = k.shape[-3]
    if h_kv == 0 or h % h_kv:
        raise ArgumentError(f"q has H = {h} heads, not a multiple of k's H_kv = {h_kv} heads")
    if t_local == 0:
        raise ArgumentError("q holds T_local = 0 tokens: every rank must hold at least one")
    if layout == "zigzag" and t_local % 2:
        raise ArgumentError(
            f"layout='zigzag' cuts the sequence into 2·world_size = {2 * world_size} chunks, so "
            f"T = world_size · T_local must be divisible by {2 * world_size}; got T_local = "
            f"{t_local} (T = {world_size * t_local}): use an even T_local or layout='contiguous'"
        )
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise ArgumentTypeError(f"scale must be a float or None, got {type(scale).__name__}")
    return float(scale)


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    group: Any = None,
    layout: str = "contiguous",
    scale: float | None = None,
) -> torch.Tensor:
    """Attention over a sequence spread across the ranks of ``group``, each rank holding a chunk.

    Every rank of the group calls it together with its own chunk (and, if it trains, calls
    backward on a loss that depends on the result: the backward pass turns the ring too). The
    result on each rank is the attention of its queries over the *whole* sequence's keys,
    ``softmax(Q_r Kᵀ · scale) V`` — equal, within floating-point rounding, to single-process
    attention of the whole sequence cut the same way — and the gradients with respect to each
    rank's ``q``, ``k``, ``v`` are that rank's shares of the single-process gradients. The
    schedule and the merge are in the module docstring and in
    :mod:`attnlab.distributed.ring_schedule`.

    Before the ring turns, one small all-gather compares the ranks' shapes, dtypes and options:
    a rank with a bad argument raises its error and every other rank a ``ValueError`` naming it,
    so no rank is left waiting.

    Args:
        q: this rank's queries.
        k: this rank's keys; ``H`` must be a multiple of ``H_kv`` (grouped-query attention).
        v: this rank's values.
        is_causal: the causal rule on the *whole* sequence (query at position ``p`` sees keys at
            positions ``<= p``); keys no local query sees are not computed with, but still passed
            on. Default ``False``.
        group: the process group of the ring (default: the default group; without an
            initialised process group, one process: plain attention).
        layout: which tokens each rank holds — ``"contiguous"`` (default; rank ``r`` holds tokens
            ``r·T_local … (r+1)·T_local − 1``) or ``"zigzag"`` (chunks ``r`` and ``2W − 1 − r`` of
            ``2W``: every rank does the same causal work; ``T_local`` must be even). Shard inputs
            with :func:`~attnlab.distributed.ring_schedule.shard_sequence`.
        scale: the score scale (default ``1 / √D``).

    Returns:
        This rank's output, in the inputs' dtype.

    Raises:
        ValueError: a shape, device, layout or option is wrong on this rank, or the ranks
            disagree (e.g. chunks of different lengths), or ``group`` is given without an
            initialised process group.
        TypeError: an argument has the wrong type or dtype.

    Shape:
        - q: ``(..., H, T_local, D)``, with ``T = world_size · T_local`` the whole length.
        - k: ``(..., H_kv, T_local, D)``.
        - v: ``(..., H_kv, T_local, D_v)``.
        - output: ``(..., H, T_local, D_v)``.

    Examples:
        >>> q = k = v = torch.randn(1, 2, 6, 8)
        >>> out = ring_attention(q, k, v, is_causal=True)  # one process: plain attention
        >>> out.shape
        torch.Size([1, 2, 6, 8])
    """
    ring = _ring_of(group)
    problem: Exception | None = None
    fields = None
    resolved = 1.0
    try:
        resolved = _check_local(q, k, v, is_causal, layout, scale, ring.world_size)
        fields = [
            _Field("q", "shape", tuple(q.shape)),
            _Field("k", "shape", tuple(k.shape)),
            _Field("v", "shape", tuple(v.shape)),
            _Field("dtype", "dtype", q.dtype),
            _Field("is_causal", "bool", is_causal),
            _Field("layout", "layout", layout),
            _Field("scale", "float", scale),
        ]
    except (TypeError, ValueError) as e:
        if ring.world_size == 1:
            raise
        problem = e
    if ring.world_size > 1:
        kinds = [
            ("q", "shape"),
            ("k", "shape"),
            ("v", "shape"),
            ("dtype", "dtype"),
            ("is_causal", "bool"),
            ("layout", "layout"),
            ("scale", "float"),
        ]
        _agree(ring, "ring_attention", kinds, fields, problem)
    lead = q.shape[:-3]
    # (..., H, T, D) -> (B, H, T, D)
    q4, k4, v4 = (t.reshape(-1, *t.shape[-3:]) for t in (q, k, v))
    out = _RingAttention.apply(q4, k4, v4, ring, is_causal, layout, resolved)
    return out.reshape(*lead, *out.shape[-3:])


def unshard_sequence(
    x_local: torch.Tensor, dim: int, *, group: Any = None, layout: str
) -> torch.Tensor:
    """The whole sequence from every rank's part: an all-gather, put back in sequence order.

    The inverse of :func:`~attnlab.distributed.ring_schedule.shard_sequence` (for evaluation,
    inspection and tests: it is not differentiable, and every rank ends up holding the whole).

    Args:
        x_local: this rank's part of the sequence.
        dim: the sequence dimension.
        group: the process group (default: the default group; without an initialised process
            group, one process: ``x_local`` itself holds the whole sequence).
        layout: the layout the parts were cut by, ``"contiguous"`` or ``"zigzag"``.

    Returns:
        The whole sequence, on every rank.

    Raises:
        ValueError: the ranks' parts differ in shape, or (zigzag) a part has an odd length.

    Shape:
        ``x_local`` with ``T / W`` along ``dim`` → the same with ``T`` along ``dim``.
    """
    ring = _ring_of(group)
    problem: Exception | None = None
    fields = None
    d = 0
    try:
        x_local = check_tensor("x_local", x_local)
        check_choice("layout", layout, LAYOUTS)
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise ArgumentTypeError(f"dim must be an int, got {type(dim).__name__}")
        if not -x_local.dim() <= dim < x_local.dim() or x_local.dim() > _MAX_DIMS:
            raise ArgumentError(
                f"dim must be in [-{x_local.dim()}, {x_local.dim()}) for x_local of shape "
                f"{shape_str(x_local.shape)}, got {dim}"
            )
        d = dim % x_local.dim()
        check_divisible("x_local", x_local.shape[d] * ring.world_size, ring.world_size, layout)
        fields = [
            _Field("x_local", "shape", tuple(x_local.shape), seq_dim=d),
            _Field("dtype", "dtype", x_local.dtype),
            _Field("layout", "layout", layout),
            _Field("dim", "int", d),
        ]
    except (TypeError, ValueError) as e:
        if ring.world_size == 1:
            raise
        problem = e
    if ring.world_size == 1:
        return x_local
    kinds = [("x_local", "shape"), ("dtype", "dtype"), ("layout", "layout"), ("dim", "int")]
    _agree(ring, "unshard_sequence", kinds, fields, problem)
    parts = [torch.empty_like(x_local) for _ in range(ring.world_size)]
    dist.all_gather(parts, x_local.contiguous(), group=ring.group)
    if layout == "contiguous":
        return torch.cat(parts, dim=d)
    w = ring.world_size
    c = x_local.shape[d] // 2
    chunks: list[torch.Tensor] = [x_local] * (2 * w)
    for r, part in enumerate(parts):
        chunks[r] = part.narrow(d, 0, c)
        chunks[2 * w - 1 - r] = part.narrow(d, c, c)
    return torch.cat(chunks, dim=d)
