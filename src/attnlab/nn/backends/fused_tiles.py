"""The blockwise backend's tiles computed by PyTorch's fused CPU attention kernel.

The plan (:class:`~attnlab.nn.backends.plan.TilePlan`) decides which keys each block of query
rows visits; each visit is one call of ``aten._scaled_dot_product_flash_attention_for_cpu``, the
kernel behind ``F.scaled_dot_product_attention`` on the CPU, which returns the piece's output
``O_p`` (normalised over the piece's keys) *and its log-sum-exp* ``L_p``. The pieces of a query
block are merged by their log-sum-exps — the online softmax of
:mod:`attnlab.nn.backends.blockwise` one level up, with whole pieces in place of key blocks:

    L = log(e^{L_1} + e^{L_2})                  (logaddexp)
    O = e^{L_1 − L} · O_1 + e^{L_2 − L} · O_2

So the work inside a piece runs in the kernel's cache-sized tiles and vectorised exponentials,
while what is visited stays ours: a causal pass visits the keys below the diagonal unmasked and
the diagonal square with the kernel's own causal rule; a sliding window or a block layout only
the keys its rows see. Pieces that a rule cuts get an explicit ``−∞`` mask for that piece only.

The backward pass calls the kernel's backward per piece with the *whole* row's output and
log-sum-exp: it recomputes ``P_p = e^{S_p − L}`` and ``D = rowsum(dO ∘ O)`` from them, so each
piece returns exactly its share of ``dQ``, ``dK``, ``dV`` (FlashAttention's Algorithm 2 split
along the keys).

Used for fp32/fp64 on the CPU without dropout and without a bias gradient; half types are
upcast to fp32 once, so that scores and statistics are fp32 as on the other paths. Anything else
takes the online softmax written out in PyTorch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from attnlab.nn.backends.common import mask_tile, merge_partials
from attnlab.nn.backends.plan import Tile, TilePlan

_forward_op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_backward_op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)

#: query rows per block of the fused path: a causal pass visits each block's keys in two calls,
#: so larger blocks mean fewer calls (T = 4096 causal, forward against one call for all rows:
#: 1024 rows 1.03x, 512 1.07x, 256 1.07x, 128 1.22x)
FUSED_QUERY_BLOCK = 1024


def fused_available(
    query: torch.Tensor, value: torch.Tensor, dropout_p: float, bias: torch.Tensor | None
) -> bool:
    """Whether the fused tiles can compute this call exactly as the written-out path does.

    Args:
        query: the queries (their device and head size).
        value: the values (the kernel needs their head size to be the queries').
        dropout_p: the dropout probability (the fused kernel's dropout is not replayable per
            piece, so dropout takes the written-out path).
        bias: the additive bias, whose gradient the kernel does not return.

    Returns:
        ``True`` on the CPU, with ``D_v = D``, without dropout or a bias that requires grad,
        when this PyTorch has the kernel.

    Shape:
        query ``(..., H, T_q, D)``, value ``(..., H_kv, T_k, D_v)``.
    """
    return (
        _forward_op is not None
        and _backward_op is not None
        and query.device.type == "cpu"
        and value.shape[-1] == query.shape[-1]
        and dropout_p == 0.0
        and not (bias is not None and bias.requires_grad)
    )


def fused_tiles(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    hidden: torch.Tensor | None,
    plan: TilePlan,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the plan's tiles, one fused kernel call per piece, merged by log-sum-exp.

    Args:
        q: the queries (key/value heads already repeated for grouped-query attention).
        k: the keys.
        v: the values.
        bias: a finite additive bias (no gradient), or ``None``.
        hidden: ``True`` where a key is hidden, or ``None``.
        plan: the tiles to visit.
        scale: the score scale.

    Returns:
        ``(output, lse)``: the output in the query's dtype and each row's log-sum-exp of its
        scaled, biased scores (fp32, fp64 for fp64 inputs).

    Shape:
        q ``(..., H, T_q, D)``, k ``(..., H, T_k, D)``, v ``(..., H, T_k, D_v)``; bias and hidden
        broadcastable to ``(..., H, T_q, T_k)``; output ``(..., H, T_q, D_v)``; lse
        ``(..., H, T_q)``.
    """
    out, lse = _FusedTiles.apply(q, k, v, bias, hidden, plan, scale)
    return out, lse


class _Pieces:
    """The inputs as 4-D tensors in the kernel's dtype, and the pieces of each tile."""

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: torch.Tensor | None,
        hidden: torch.Tensor | None,
        plan: TilePlan,
    ) -> None:
        self.lead = q.shape[:-3]
        self.acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        # (..., H, T, D) -> (N, H, T, D): the kernel takes a batch and heads
        self.q, self.k, self.v = (self._four(t.to(self.acc)) for t in (q, k, v))
        self.bias, self.hidden, self.plan = bias, hidden, plan

    @staticmethod
    def _four(t: torch.Tensor) -> torch.Tensor:
        """``(..., H, T, D)`` as ``(N, H, T, D)``, a view of contiguous inputs: a block of rows
        (and a range of keys) is a strided view the kernel reads as it is, without a copy."""
        return t.reshape(-1, *t.shape[-3:])

    def pieces(self, tile: Tile) -> Iterator[tuple[int, int, bool, torch.Tensor | None]]:
        """``(j0, j1, is_causal, mask)`` per kernel call: a causal tile splits into the keys every
        row sees (unmasked) and the square on the diagonal (the kernel's causal rule when it is
        aligned, else a mask); a tile cut by the window or holding user masks gets a mask."""
        offset = self.plan.causal_offset
        user = self.bias is not None or self.hidden is not None
        if offset is not None and tile.diagonal:
            split = min(max(tile.r0 + offset, tile.j0), tile.j1)  # keys < split: every row sees
            if split > tile.j0:
                yield tile.j0, split, False, self._mask(tile, tile.j0, split) if user else None
            if split < tile.j1:
                square = split == tile.r0 + offset and tile.j1 - split == tile.r1 - tile.r0
                if square and not user:
                    yield split, tile.j1, True, None
                else:
                    yield split, tile.j1, False, self._mask(tile, split, tile.j1, causal=True)
        elif tile.band or user:
            yield tile.j0, tile.j1, False, self._mask(tile, tile.j0, tile.j1)
        else:
            yield tile.j0, tile.j1, False, None

    def _mask(self, tile: Tile, c0: int, c1: int, *, causal: bool = False) -> torch.Tensor:
        """The additive mask of rows ``r0:r1`` against keys ``c0:c1``: the bias, ``−∞`` where a
        key is hidden, by the user, the causal rule or the window   (N, H or 1, rows, cols)."""
        rows, cols = slice(tile.r0, tile.r1), slice(c0, c1)
        m = torch.zeros((tile.r1 - tile.r0, c1 - c0), dtype=self.acc, device=self.q.device)
        if self.bias is not None:
            m = m + mask_tile(self.bias, rows, cols).to(self.acc)
        if self.hidden is not None:
            m = m.masked_fill(mask_tile(self.hidden, rows, cols), float("-inf"))
        i = torch.arange(tile.r0, tile.r1, device=m.device)[:, None]
        j = torch.arange(c0, c1, device=m.device)[None, :]
        if causal:
            m = m.masked_fill(j > i + self.plan.causal_offset, float("-inf"))  # type: ignore[operator]
        if tile.band and self.plan.band is not None:
            lo, hi = self.plan.band
            if lo is not None:
                m = m.masked_fill(j < i + lo, float("-inf"))
            if hi is not None:
                m = m.masked_fill(j > i + hi, float("-inf"))
        return self._as_kernel_mask(m)

    def _as_kernel_mask(self, m: torch.Tensor) -> torch.Tensor:
        """A mask broadcastable to ``(..., H, rows, cols)`` as the kernel's 4-D ``(N, H|1, ·, ·)``."""
        if m.dim() < len(self.lead) + 3:
            m = m.reshape((1,) * (len(self.lead) + 3 - m.dim()) + tuple(m.shape))
        if all(s == 1 for s in m.shape[:-3]):
            return m.reshape(1, *m.shape[-3:])
        return m.expand(*self.lead, *m.shape[-3:]).reshape(-1, *m.shape[-3:])


def _sees_nothing(mask: torch.Tensor | None) -> torch.Tensor | None:
    """Rows of a piece whose every key is hidden: the kernel returns ``O = 0`` but ``L = 0`` for
    them, where the merge needs ``L = −∞``   (N, H|1, rows)."""
    if mask is None:
        return None
    return torch.isneginf(mask).all(dim=-1)


class _FusedTiles(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: torch.Tensor | None,
        hidden: torch.Tensor | None,
        plan: TilePlan,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ops = _Pieces(q, k, v, bias, hidden, plan)
        # each query block's output and log-sum-exp, joined once at the end: one copy in all,
        # not one per block (a copy per block costs a thread hand-off each on a busy machine)
        outs, lses = [], []
        for tiles in plan.blocks:
            rows = slice(tiles[0].r0, tiles[0].r1)
            q_b = ops.q[:, :, rows]
            parts = []
            for tile in tiles:
                for j0, j1, causal, mask in ops.pieces(tile):
                    o, l_p = _forward_op(  # type: ignore[misc]
                        q_b, ops.k[:, :, j0:j1], ops.v[:, :, j0:j1], 0.0, causal,
                        attn_mask=mask, scale=scale,
                    )  # fmt: skip
                    empty = _sees_nothing(mask)
                    parts.append((o, l_p if empty is None else l_p.masked_fill(empty, -math.inf)))
            o_b, l_b = parts[0]
            for o, l_p in parts[1:]:
                o_b, l_b = merge_partials(o_b, l_b, o, l_p)
            outs.append(o_b)
            lses.append(l_b)
        # (N, H, T_q, D_v) and (N, H, T_q), contiguous as the other backends' outputs
        out = outs[0].contiguous() if len(outs) == 1 else torch.cat(outs, dim=2)
        lse = lses[0].contiguous() if len(lses) == 1 else torch.cat(lses, dim=2)
        ctx.save_for_backward(q, k, v, bias, hidden, out, lse)
        ctx.params = (plan, scale)
        out_shape = (*q.shape[:-1], v.shape[-1])
        lse_v = lse.reshape(q.shape[:-1])
        ctx.mark_non_differentiable(lse_v)
        return out.to(q.dtype).reshape(out_shape), lse_v

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor, _d_lse: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        q, k, v, bias, hidden, out, lse = ctx.saved_tensors
        plan, scale = ctx.params
        ops = _Pieces(q, k, v, bias, hidden, plan)
        d_o = ops._four(d_out.to(ops.acc))
        dq, dk, dv = (torch.zeros_like(t) for t in (ops.q, ops.k, ops.v))
        for tiles in plan.blocks:
            rows = slice(tiles[0].r0, tiles[0].r1)
            q_b, do_b, o_b = ops.q[:, :, rows], d_o[:, :, rows], out[:, :, rows]
            lse_b = lse[:, :, rows].contiguous()
            for tile in tiles:
                for j0, j1, causal, mask in ops.pieces(tile):
                    # the row's whole O and L: P_p = e^{S_p − L}, D = rowsum(dO ∘ O)
                    g_q, g_k, g_v = _backward_op(  # type: ignore[misc]
                        do_b, q_b, ops.k[:, :, j0:j1], ops.v[:, :, j0:j1], o_b, lse_b, 0.0,
                        causal, attn_mask=mask, scale=scale,
                    )  # fmt: skip
                    dq[:, :, rows] += g_q
                    dk[:, :, j0:j1] += g_k
                    dv[:, :, j0:j1] += g_v
        return (
            dq.reshape(q.shape).to(q.dtype),
            dk.reshape(k.shape).to(k.dtype),
            dv.reshape(v.shape).to(v.dtype),
            None,
            None,
            None,
            None,
        )
