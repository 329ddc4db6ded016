"""Who holds which tokens, and which kernel calls each step of the ring makes.

A sequence of ``T`` tokens is spread over the ``W`` ranks of a ring, ``T_local = T / W`` tokens
each, in one of two layouts:

* ``"contiguous"``: rank ``r`` holds tokens ``r·T_local … (r+1)·T_local − 1``;
* ``"zigzag"``: the sequence is cut into ``2W`` chunks of ``c = T / 2W`` tokens and rank ``r``
  holds chunk ``r`` (its *early* half) followed by chunk ``2W − 1 − r`` (its *late* half).

The ring schedule: at step ``i = 0 … W − 1`` rank ``r`` holds the key/value chunk of rank

    s(r, i) = (r − i) mod W

(its own first, then the one its left neighbour held one step earlier) and computes the attention
of its queries against those keys. Without a causal rule every step is one kernel call over all
pairs. Under the causal rule, with the contiguous layout,

    s < r:  every local query sees every key of chunk s     one call, no mask
    s = r:  the aligned square T_local × T_local            one call, the kernel's causal rule
    s > r:  no query sees any key                           no call (the chunk is only passed on)

so rank ``W − 1`` works on ``W`` chunks and rank 0 on half of one: the ranks wait for the slowest.
The zigzag layout balances this. With ``a`` the early and ``b`` the late half (chunk ``r`` and
``2W − 1 − r`` for the queries, ``s`` and ``2W − 1 − s`` for the keys), chunk ``r ≤ W − 1 < W ≤
2W − 1 − s`` gives (:func:`zigzag_visibility`)

    (query a, key a): s < r full,  s = r causal,  s > r hidden
    (query a, key b): always hidden      (an early chunk never sees a late one)
    (query b, key a): always full        (a late chunk sees every early one)
    (query b, key b): s > r full,  s = r causal,  s < r hidden

which makes one kernel call per step (:func:`ring_pieces`): ``s < r``, every query against the
early key half; ``s > r``, the late query half against every key; ``s = r``, the local square
with the kernel's causal rule (the local order is increasing in position, so the two causal
diagonals and the full ``(b, a)`` block together are exactly the causal square). Every step is
``2c²`` query-key pairs of work (``2c² + c`` at ``s = r``), on every rank.

With more than one rank the chunks travel in *slices* of keys, and each kernel call takes a block
of query rows: :func:`split_piece` cuts a step's piece into the calls that fall in one key slice
(a causal square into its diagonal squares and the full blocks below them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab._checks import check_choice, check_positive_int, check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError

__all__ = [
    "LAYOUTS",
    "RingPiece",
    "ring_pieces",
    "sequence_positions",
    "shard_sequence",
    "split_piece",
    "zigzag_visibility",
]

#: the ways of spreading a sequence over the ranks
LAYOUTS = ("contiguous", "zigzag")


@dataclass(frozen=True)
class RingPiece:
    """One kernel call of a ring step: local query rows ``q0:q1`` against keys ``k0:k1`` of the
    visiting key/value chunk.

    Args:
        q0: first local query row.
        q1: one past the last local query row.
        k0: first key of the visiting chunk.
        k1: one past its last key.
        causal: the kernel's causal rule on the square (then ``q1 − q0 = k1 − k0`` and query row
            ``i`` sees key ``j`` for ``j − k0 <= i − q0``); ``False``: every row sees every key.
    """

    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool


def _check_rank(name: str, value: object, world_size: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value < world_size:
        raise ArgumentError(f"{name} must be in [0, world_size) = [0, {world_size}), got {value}")
    return value


def zigzag_visibility(rank: int, source: int, world_size: int) -> dict[tuple[int, int], str]:
    """Under the causal rule and the zigzag layout: what rank ``rank``'s query halves see of the
    key halves of rank ``source``.

    Half 0 of rank ``r`` is chunk ``r`` of the ``2W`` chunks, half 1 is chunk ``2W − 1 − r``.
    Query chunk ``x`` sees key chunk ``y`` fully when ``y < x``, causally when ``y = x`` and not at
    all when ``y > x``.

    Args:
        rank: the rank holding the queries.
        source: the rank whose keys visit.
        world_size: the number of ranks ``W``.

    Returns:
        ``{(query half, key half): "full" | "causal" | "hidden"}`` for the four pairs.

    Examples:
        >>> zigzag_visibility(0, 1, 2)[(1, 0)], zigzag_visibility(0, 1, 2)[(0, 1)]
        ('full', 'hidden')
    """
    world_size = check_positive_int("world_size", world_size)
    rank = _check_rank("rank", rank, world_size)
    source = _check_rank("source", source, world_size)

    def chunks(r: int) -> tuple[int, int]:
        return r, 2 * world_size - 1 - r

    out = {}
    for qh, x in enumerate(chunks(rank)):
        for kh, y in enumerate(chunks(source)):
            out[(qh, kh)] = "full" if y < x else "causal" if y == x else "hidden"
    return out


def ring_pieces(
    rank: int, source: int, world_size: int, t_local: int, *, layout: str, is_causal: bool
) -> tuple[RingPiece, ...]:
    """The kernel calls rank ``rank`` makes while it holds rank ``source``'s keys and values.

    See the module docstring for the schedule. The pieces of a step never overlap, and together
    they cover exactly the (query, key) pairs the causal rule leaves visible.

    Args:
        rank: the rank holding the queries.
        source: the rank whose key/value chunk visits.
        world_size: the number of ranks ``W``.
        t_local: tokens per rank (even for ``layout="zigzag"``).
        layout: ``"contiguous"`` or ``"zigzag"``.
        is_causal: the causal rule on the whole sequence.

    Returns:
        The pieces, ``()`` when no query of ``rank`` sees any key of ``source``.

    Examples:
        >>> ring_pieces(1, 0, 2, 4, layout="zigzag", is_causal=True)
        (RingPiece(q0=0, q1=4, k0=0, k1=2, causal=False),)
    """
    world_size = check_positive_int("world_size", world_size)
    rank = _check_rank("rank", rank, world_size)
    source = _check_rank("source", source, world_size)
    t_local = check_positive_int("t_local", t_local)
    check_choice("layout", layout, LAYOUTS)
    if layout == "zigzag" and t_local % 2:
        raise ArgumentError(f"layout='zigzag' needs an even t_local (two halves), got {t_local}")
    if not is_causal:
        return (RingPiece(0, t_local, 0, t_local, False),)
    if source == rank:  # the local square: increasing positions in both layouts
        return (RingPiece(0, t_local, 0, t_local, True),)
    if layout == "contiguous":
        return (RingPiece(0, t_local, 0, t_local, False),) if source < rank else ()
    half = t_local // 2
    if source < rank:  # both query halves see the early key half; nobody its late half
        return (RingPiece(0, t_local, 0, half, False),)
    return (RingPiece(half, t_local, 0, t_local, False),)  # the late query half sees everything


def split_piece(piece: RingPiece, k0: int, k1: int, block: int) -> tuple[RingPiece, ...]:
    """The part of ``piece`` whose keys lie in ``k0:k1``, as kernel calls of at most ``block``
    query rows each.

    A non-causal piece gives the row blocks against the keys it shares with ``k0:k1``. A causal
    square gives, per row block of its diagonal inside the slice, a full call against the slice's
    keys left of the block's diagonal and a causal square on it; the rows below the slice's
    diagonal see all of its keys (full calls); the rows above see none of them (no call).

    Args:
        piece: a piece of :func:`ring_pieces`.
        k0: first key of the slice.
        k1: one past its last key.
        block: the most query rows of one call.

    Returns:
        The calls, in increasing row order; together they cover exactly the (query, key) pairs
        of ``piece`` with a key in ``k0:k1``. ``()`` when there are none.

    Examples:
        >>> split_piece(RingPiece(0, 4, 0, 4, True), 2, 4, 2)
        (RingPiece(q0=2, q1=4, k0=2, k1=4, causal=True),)
    """
    block = check_positive_int("block", block)
    x, y = max(piece.k0, k0), min(piece.k1, k1)
    if x >= y or piece.q0 >= piece.q1:
        return ()
    calls = []
    if not piece.causal:
        for u in range(piece.q0, piece.q1, block):
            calls.append(RingPiece(u, min(u + block, piece.q1), x, y, False))
        return tuple(calls)
    shift = piece.q0 - piece.k0  # the query row whose diagonal is key k: k + shift
    for u in range(x + shift, y + shift, block):
        w = min(u + block, y + shift)
        if u - shift > x:  # keys of the slice left of this block's diagonal: all seen
            calls.append(RingPiece(u, w, x, u - shift, False))
        calls.append(RingPiece(u, w, u - shift, w - shift, True))
    for u in range(y + shift, piece.q1, block):
        calls.append(RingPiece(u, min(u + block, piece.q1), x, y, False))
    return tuple(calls)


def _check_dim(x: torch.Tensor, dim: object) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise ArgumentTypeError(f"dim must be an int, got {type(dim).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise ArgumentError(
            f"dim must be in [-{x.dim()}, {x.dim()}) for x of shape {shape_str(x.shape)}, got {dim}"
        )
    return dim % x.dim()


def check_divisible(name: str, length: int, world_size: int, layout: str) -> None:
    """Raise unless a sequence of ``length`` tokens can be spread over ``world_size`` ranks."""
    parts = 2 * world_size if layout == "zigzag" else world_size
    if length % parts:
        how = (
            f"layout='zigzag' cuts it into 2·world_size = {parts} chunks"
            if layout == "zigzag"
            else f"layout='contiguous' cuts it into world_size = {parts} chunks"
        )
        raise ArgumentError(
            f"{name} has sequence length T = {length}, but {how}: T must be divisible by {parts}"
        )


def shard_sequence(
    x: torch.Tensor, dim: int, *, rank: int, world_size: int, layout: str
) -> torch.Tensor:
    """The part of a whole sequence that rank ``rank`` holds.

    ``"contiguous"``: positions ``r·T/W … (r+1)·T/W − 1``; ``"zigzag"``: chunk ``r`` and chunk
    ``2W − 1 − r`` of ``2W`` equal chunks, in that order (see the module docstring).

    Args:
        x: the whole sequence (e.g. token ids ``(B, T)`` or per-head tensors ``(B, H, T, d)``).
        dim: the sequence dimension of ``x``.
        rank: this process's rank in the ring, ``0 <= rank < world_size``.
        world_size: the number of ranks ``W``.
        layout: ``"contiguous"`` or ``"zigzag"``.

    Returns:
        The local part (a view for ``"contiguous"``, a new tensor for ``"zigzag"``).

    Raises:
        ValueError: ``T`` is not divisible by ``W`` (contiguous) or ``2W`` (zigzag), or
            ``rank``/``dim`` out of range.

    Shape:
        ``x`` with ``T`` along ``dim`` → the same with ``T / W`` along ``dim``.

    Examples:
        >>> shard_sequence(torch.arange(8), 0, rank=0, world_size=2, layout="zigzag")
        tensor([0, 1, 6, 7])
    """
    x = check_tensor("x", x)
    world_size = check_positive_int("world_size", world_size)
    rank = _check_rank("rank", rank, world_size)
    check_choice("layout", layout, LAYOUTS)
    dim = _check_dim(x, dim)
    length = x.shape[dim]
    check_divisible("x", length, world_size, layout)
    if layout == "contiguous":
        t_local = length // world_size
        return x.narrow(dim, rank * t_local, t_local)
    c = length // (2 * world_size)
    early = x.narrow(dim, rank * c, c)
    late = x.narrow(dim, (2 * world_size - 1 - rank) * c, c)
    return torch.cat([early, late], dim=dim)


def sequence_positions(
    seq_len: int,
    *,
    rank: int,
    world_size: int,
    layout: str,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The global positions of the tokens rank ``rank`` holds, in local order: what a model's
    positional embeddings (learned, sinusoidal, rotary) must be indexed with on that rank.

    Args:
        seq_len: the whole sequence length ``T``.
        rank: this process's rank in the ring.
        world_size: the number of ranks ``W``.
        layout: ``"contiguous"`` or ``"zigzag"``.
        device: where to put the positions (default: the CPU).

    Returns:
        ``int64`` positions, increasing.

    Shape:
        ``(T / W,)``.

    Examples:
        >>> sequence_positions(8, rank=1, world_size=2, layout="zigzag")
        tensor([2, 3, 4, 5])
    """
    seq_len = check_positive_int("seq_len", seq_len)
    positions = torch.arange(seq_len, device=device)
    return shard_sequence(positions, 0, rank=rank, world_size=world_size, layout=layout)
