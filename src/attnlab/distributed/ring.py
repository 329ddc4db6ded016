"""Sequence (context) parallel attention: ring attention over the ranks of a process group.

Each of the ``W`` ranks holds one chunk of the sequence — its ``T_local = T / W`` queries, keys and
values (layouts and schedule: :mod:`attnlab.distributed.ring_schedule`) — and no rank ever holds
the whole sequence: every tensor it holds is at most the size of one chunk, and scores exist only
in the kernel's tiles. The key/value chunks visit the ranks in the ring's order (Liu, Zaharia &
Abbeel 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context"; Brandon et
al. 2023, "Striped Attention", for the load-balanced order): at step ``i = 0 … W − 1`` rank ``r``
works with the chunk of rank

    s = (r − i) mod W

How the chunks travel: :mod:`attnlab.distributed.ring_transfer`; the forward and backward pass
(the merge of the pieces by their log-sum-exps, FlashAttention's backward split along the keys,
the memory per rank): :mod:`attnlab.distributed.ring_autograd`; the check that every rank passes
arguments of one shape: :mod:`attnlab.distributed.ring_agreement`. This module holds the public
entry points, :func:`ring_attention` and :func:`unshard_sequence`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from attnlab._checks import check_choice, check_floating, check_tensor, shape_str
from attnlab.distributed.ring_agreement import _MAX_DIMS, _agree, _Field
from attnlab.distributed.ring_autograd import _RingAttention
from attnlab.distributed.ring_schedule import LAYOUTS, check_divisible
from attnlab.distributed.ring_transfer import _ring_of
from attnlab.errors import ArgumentError, ArgumentTypeError

__all__ = ["ring_attention", "unshard_sequence"]


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
