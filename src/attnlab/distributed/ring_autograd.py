"""Ring attention's forward and backward pass: the autograd Function that turns the ring.


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
from types import SimpleNamespace
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from attnlab.distributed.ring_schedule import RingPiece, ring_pieces, split_piece
from attnlab.distributed.ring_transfer import (
    _GRAD_TAG,
    _cut,
    _KeyValues,
    _Ring,
    _Slice,
    _slices,
    _Transfer,
    _wire_zeros,
)
from attnlab.nn.backends.blockwise import KEY_BLOCK, QUERY_BLOCK, _Blockwise
from attnlab.nn.backends.common import compute_dtype, merge_partials_, repeat_kv
from attnlab.nn.backends.fused_tiles import _backward_op, _forward_op, fused_available
from attnlab.nn.backends.plan import TilePlan

#: tokens per slice of the backward pass: with more than one rank the key/value chunks and the
#: dK/dV shares travel in slices of this many keys (the forward's slices are 4x as long), and a
#: backward kernel call takes at most this many query rows. Each slice-sized buffer at T_local =
#: 16384 is 1/16 of a chunk-sized one: smaller slices hold less but make more kernel calls
#: (one measurement, T = 32768, 4 fp32 heads of 64, 2 ranks on a 2-core CPU, per rank: 512 → 5.5
#: chunk-sized buffers, 10.3 s; 1024 → 5.8, 9.2 s; 2048 → 6.3, 8.5 s; whole chunks: 11.2, 8.6 s)
_SLICE = 1024


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
