"""Non-finite inputs reach exactly the query rows that may see them, on every backend.

A NaN or an infinity in a query row, or in a key or value that some rows may see, makes those
rows' outputs non-finite, and nothing else. The backends alone cannot promise it: a hidden
entry's weight is ``0`` and ``0 · inf = NaN`` in ``P V``; a fused kernel adds its mask
(``NaN + (−∞) = NaN``) and takes an online-softmax maximum over it. So the non-finite entries
are taken out before the backend runs and put back, as NaN, into the rows that may see them:

    Q̃, K̃, Ṽ = where(finite, Q/K/V, 0)                  every backend sees finite inputs
    bad_j   = K_j or V_j holds a non-finite entry        (..., H, T_k)
    reach_i = (Q_i non-finite  or  Σ_j visible_ij · bad_j > 0)  and  row i sees some key
    O       = where(reach_i, NaN, attention(Q̃, K̃, Ṽ))

Backward, the rule is the plain equation's: a reached row's output is NaN, and NaN times
anything (zero included) is NaN, so whatever the gradient of the loss with respect to that row,

    dQ_i = NaN                      for every reached row i
    dK_j = dV_j = NaN               for every key j that some reached row may see (its key/value
                                    head: any query head of the group)

and every other gradient is that of the same call without the non-finite entry (it reads only
finite inputs). The backward pass of ``where`` would instead hand the reached rows a zero
gradient, so the inputs pass first through an identity whose backward writes those NaNs
(:class:`_NaNGrad`). Keys no row may see (padding) and rows that see no key get no NaN.

Where every row may see the same keys (no mask but padding, no window or layout, a causal rule
that hides nothing: a decoding step) and no gradient is wanted, only the queries are checked
(reading the keys and values again would cost 15–40 % of a call with a few query rows): a NaN
key or a non-finite value reaches every row through the backend itself, an infinite key the
rows whose score it makes ``+∞`` or NaN (a ``−∞`` score gives it weight 0). On the CPU one sum
decides whether anything is non-finite (there is no device to wait for) and the usual path runs
untouched when all is finite. On another device, and while ``torch.compile`` traces, the guard
does not run: the check would cost a host synchronisation, and guarding always would cost as
much as the attention itself under a mask, so there the fused kernels' own propagation applies
(documented in ``docs/design.md``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from attnlab.nn.mask_spec import Masking

__all__ = ["guard_nonfinite", "poison_rows"]

# query rows per chunk of the dense visibility when a mask or a block layout is involved
_ROW_CHUNK = 512


def guard_nonfinite(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, masking: Masking
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Finite stand-ins for the inputs and the query rows a non-finite entry may reach.

    When a gradient is wanted, the stand-ins carry the backward rule: the reached rows' queries,
    and the keys and values those rows may see, get NaN gradients (see the module docstring).

    Args:
        query: the queries.
        key: the keys (``H_kv`` heads; keys no query sees already zeroed).
        value: the values.
        masking: the normalised mask, before empty rows are opened.

    Returns:
        ``(query, key, value, reach)``: the inputs with non-finite entries set to zero, and
        ``True`` for the rows whose output must be NaN — or the inputs unchanged and ``None``
        when every entry is finite (checked on the CPU only).

    Shape:
        query ``(..., H, T_q, D)``, key ``(..., H_kv, T_k, D)``, value ``(..., H_kv, T_k, D_v)``;
        reach ``(..., H, T_q, 1)``.
    """
    if query.device.type != "cpu" or torch.compiler.is_compiling():
        # on an accelerator the check would cost a host sync, and always guarding would cost as
        # much as the attention under a mask: the fused kernels' own propagation applies there
        # (and in compiled code, whose graphs must not branch on values)
        return query, key, value, None
    t_q, t_k = query.shape[-2], key.shape[-2]
    grad = torch.is_grad_enabled() and (
        query.requires_grad or key.requires_grad or value.requires_grad
    )
    # every row sees the same keys (those no row sees are zeroed already): a non-finite key or
    # value then reaches the rows through the backend itself, and only the queries are checked —
    # without a gradient only: an infinite key scored −∞ leaves a row finite, and the backends'
    # backward passes do not keep the rule
    alike = not grad and _rows_alike(masking, t_k)
    # a NaN or an inf makes its sum non-finite: one cheap reduction per input, read on the host
    # (no device to wait for; a finite sum that overflows only sends the call down the guarded
    # path, which is exact as well)
    if math.isfinite(query.sum().item()) and (
        alike or (math.isfinite(key.sum().item()) and math.isfinite(value.sum().item()))
    ):
        return query, key, value, None
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    bad_q = ~torch.isfinite(query).all(dim=-1)  # (..., H, T_q)
    if alike:
        return torch.where(torch.isfinite(query), query, zero), key, value, bad_q.unsqueeze(-1)
    h, h_kv = query.shape[-3], key.shape[-3]
    bad_kv = ~(torch.isfinite(key).all(dim=-1) & torch.isfinite(value).all(dim=-1))
    reach = _spread(masking, _by_query_head(bad_kv, h), t_q, t_k, to_keys=False)
    if bool(bad_q.any()):
        # a non-finite query row that sees no key stays zeros, its gradient zero
        every = torch.ones((*bad_q.shape[:-1], t_k), dtype=torch.bool, device=query.device)
        reach |= bad_q & _spread(masking, every, t_q, t_k, to_keys=False)
    if grad:
        seen = _spread(masking, reach, t_q, t_k, to_keys=True)  # (..., H, T_k)
        if h_kv and h != h_kv:  # a key/value head reaches the query heads of its group
            seen = seen.unflatten(-2, (h_kv, h // h_kv)).any(dim=-2)
        query = _NaNGrad.apply(query, reach)
        key = _NaNGrad.apply(key, seen)
        value = _NaNGrad.apply(value, seen)
    query = torch.where(torch.isfinite(query), query, zero)
    key = torch.where(torch.isfinite(key), key, zero)
    value = torch.where(torch.isfinite(value), value, zero)
    return query, key, value, reach.unsqueeze(-1)


def poison_rows(out: torch.Tensor, reach: torch.Tensor | None) -> torch.Tensor:
    """``where(reach, NaN, out)``: the rows a non-finite input may reach.

    Args:
        out: the backend's output (or weights).
        reach: the rows to set to NaN, from :func:`guard_nonfinite`, or ``None``.

    Returns:
        ``out`` with those rows NaN (``out`` itself when ``reach`` is ``None``).

    Shape:
        out ``(..., H, T_q, D_v)``, reach ``(..., H, T_q, 1)``.
    """
    if reach is None:
        return out
    return out.masked_fill(reach, float("nan"))


class _NaNGrad(torch.autograd.Function):
    """The identity forward; backward, the gradient with the marked rows set to NaN."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(rows)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (rows,) = ctx.saved_tensors
        return grad.masked_fill(rows.unsqueeze(-1), float("nan")), None


def _by_query_head(bad: torch.Tensor, h: int) -> torch.Tensor:
    """Marks per key/value head as marks per query head: head ``g`` serves query heads
    ``g·G … g·G+G−1``.   ``(..., H_kv, T_k)`` → ``(..., H, T_k)``."""
    if h != bad.shape[-2] and bad.shape[-2]:
        return bad.repeat_interleave(h // bad.shape[-2], dim=-2)
    return bad


def _rows_alike(masking: Masking, t_k: int) -> bool:
    """Whether every query row may see the same keys: no window, no layout, a mask without rows
    (padding) and a causal rule, if any, that hides no key (a decoding step)."""
    if masking.window is not None or masking.blocks is not None:
        return False
    if masking.allowed is not None and masking.allowed.dim() >= 2 and masking.allowed.shape[-2] > 1:
        return False
    return masking.causal_offset is None or masking.causal_offset >= t_k - 1


def _spread(
    masking: Masking, marks: torch.Tensor, t_q: int, t_k: int, *, to_keys: bool
) -> torch.Tensor:
    """Marks carried along the visibility: ``Σ_j visible_ij · marks_j > 0`` (whether row ``i``
    may see a marked key), or with ``to_keys`` ``Σ_i visible_ij · marks_i > 0`` (whether a marked
    row may see key ``j``).

    Under the causal rule and a window alone, row ``i`` sees keys ``i + lo … i + hi`` and key
    ``j`` is seen by rows ``j − hi … j − lo``: a cumulative sum counts the marks per interval
    (``O(T)``); a mask or a block layout is read in chunks of query rows (``O(T_q · T_k)``).

    Shape:
        marks ``(..., H, T_k)`` → ``(..., H, T_q)``; with ``to_keys`` ``(..., H, T_q)`` →
        ``(..., H, T_k)``.
    """
    device = marks.device
    lo, hi = masking.bounds(t_q, t_k)
    if masking.allowed is None and masking.blocks is None:
        # intervals [first, stop) along the marked axis, one per position of the other axis
        n_out, n_in = (t_k, t_q) if to_keys else (t_q, t_k)
        at = torch.arange(n_out, device=device)
        if to_keys:  # rows j − hi … j − lo see key j
            first = torch.zeros_like(at) if hi is None else (at - hi).clamp(0, n_in)
            stop = torch.full_like(at, n_in) if lo is None else (at - lo + 1).clamp(0, n_in)
        else:  # row i sees keys i + lo … i + hi
            first = torch.zeros_like(at) if lo is None else (at + lo).clamp(0, n_in)
            stop = torch.full_like(at, n_in) if hi is None else (at + hi + 1).clamp(0, n_in)
        stop = torch.maximum(stop, first)
        c = torch.nn.functional.pad(marks.to(torch.int32).cumsum(-1), (1, 0))  # (..., n_in + 1)
        return (c[..., stop] - c[..., first]) > 0
    marks_f = marks.to(torch.float32).unsqueeze(-1)  # (..., H, T_k or T_q, 1)
    out: torch.Tensor | None = None
    parts = []
    for r0, r1, vis in _visible_rows(masking, t_q, t_k, device):
        vis_f = vis.to(torch.float32)  # (..., r, T_k)
        if to_keys:
            part = torch.matmul(vis_f.transpose(-2, -1), marks_f[..., r0:r1, :]).squeeze(-1)
            out = part if out is None else out + part
        else:
            parts.append(torch.matmul(vis_f, marks_f).squeeze(-1) > 0)
    if to_keys:
        if out is None:
            return marks.new_zeros((*marks.shape[:-1], t_k))
        return (out > 0).expand(*marks.shape[:-1], t_k)
    return torch.cat(parts, dim=-1) if parts else marks.new_zeros((*marks.shape[:-1], 0))


def _visible_rows(masking: Masking, t_q: int, t_k: int, device: torch.device) -> Any:
    """``(r0, r1, visible[..., r0:r1, :])`` for chunks of ``_ROW_CHUNK`` query rows: the mask,
    the causal rule, the window and the block layout together."""
    lo, hi = masking.bounds(t_q, t_k)
    j = torch.arange(t_k, device=device)[None, :]
    for r0 in range(0, t_q, _ROW_CHUNK):
        r1 = min(r0 + _ROW_CHUNK, t_q)
        i = torch.arange(r0, r1, device=device)[:, None]
        vis = torch.ones(r1 - r0, t_k, dtype=torch.bool, device=device)
        if lo is not None:
            vis &= j >= i + lo
        if hi is not None:
            vis &= j <= i + hi
        if masking.blocks is not None:
            b = masking.blocks.block_size
            grid = masking.blocks.blocks.to(device)
            vis &= grid[(i.squeeze(1) + t_k - t_q) // b][:, j.squeeze(0) // b]
        if masking.allowed is not None:
            a = masking.allowed
            vis = vis & (a[..., r0:r1, :] if a.shape[-2] > 1 else a)
        yield r0, r1, vis
