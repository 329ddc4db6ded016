"""How ring attention's key/value chunks and gradient shares travel between the ranks.

**Transfers.** A chunk travels in *slices* of keys (``ring_autograd._SLICE`` = 1024 tokens in the backward pass,
4x that in the forward; a zigzag slice pairs a range of the early half with the same range of
the late half, so that every rank has the same work in every slice), and a step is one *tick* per
slice. Each slice comes straight from its owner and just in time: during tick ``(i, j)`` every
rank sends rank ``r + i`` (or ``r + i + 1`` at a step's last slice) the slice of its own chunk
that rank works with at the next tick, and receives its own next slice from the owner
(``dist.batch_isend_irecv``), so that the transfer hides behind the tick's work. The owner sends
from its input and a slice is let go of once worked on: no rank keeps a chunk to pass on. (The
ranks exchange with every other rank, not only with their neighbours: gloo and NCCL reach any rank
of the group; the volume each rank sends and receives is that of the hop-by-hop ring.)

The ring's own rank, peers and transfers (:class:`_Ring`, :class:`_Transfer`), the wire layout a
tensor travels in (:func:`_wire`), the slices a chunk is cut into (:func:`_slices`, :func:`_cut`)
and the key/value slices a rank works with, tick by tick (:class:`_KeyValues`); the work itself is
in :mod:`attnlab.distributed.ring_autograd`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from attnlab.errors import ArgumentError, ArgumentTypeError

# tags of the two streams that travel at the same time in the backward pass
_KV_TAG, _GRAD_TAG = 7300, 7310


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
