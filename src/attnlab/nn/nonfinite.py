"""Non-finite inputs reach exactly the query rows that may see them, on every backend.

A NaN or an infinity in a query row, or in a key or value that some rows may see, makes those
rows' outputs non-finite, and nothing else. The backends alone cannot promise it: a hidden
entry's weight is ``0`` and ``0 · inf = NaN`` in ``P V``; a fused kernel adds its mask
(``NaN + (−∞) = NaN``) and takes an online-softmax maximum over it. So the non-finite entries
are taken out before the backend runs and put back, as NaN, into the rows that may see them:

    Q̃, K̃, Ṽ = where(finite, Q/K/V, 0)                  every backend sees finite inputs
    bad_j   = K_j or V_j holds a non-finite entry        (..., H, T_k)
    reach_i = Q_i non-finite  or  Σ_j visible_ij · bad_j > 0
    O       = where(reach_i, NaN, attention(Q̃, K̃, Ṽ))

The gradients of the other rows are therefore exact as well. Where every row may see the same
keys (no mask but padding, no window or layout, a causal rule that hides nothing: a decoding
step) a non-finite key or value reaches every row through the backend itself, and only the
queries are checked. On the CPU one sum per checked input decides whether anything is non-finite
(there is no device to wait for) and the usual path runs untouched when all is finite. On another
device, and while ``torch.compile`` traces, the guard does not run: the check would cost a host
synchronisation, and guarding always would cost as much as the attention itself under a mask, so
there the fused kernels' own propagation applies (documented in ``docs/design.md``).
"""

from __future__ import annotations

import math

import torch

from attnlab.nn.mask_spec import Masking

__all__ = ["guard_nonfinite", "poison_rows"]

# query rows per chunk of the dense visibility when a mask or a block layout is involved
_ROW_CHUNK = 512


def guard_nonfinite(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, masking: Masking
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Finite stand-ins for the inputs and the query rows a non-finite entry may reach.

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
    t_q, t_k = query.shape[-2], key.shape[-2]
    # every row sees the same keys (those no row sees are zeroed already): a non-finite key or
    # value then reaches every row through the backend itself, and only the queries are checked
    alike = _rows_alike(masking, t_k)
    if query.device.type != "cpu" or torch.compiler.is_compiling():
        # on an accelerator the check would cost a host sync, and always guarding would cost as
        # much as the attention under a mask: the fused kernels' own propagation applies there
        # (and in compiled code, whose graphs must not branch on values)
        return query, key, value, None
    # a NaN or an inf makes its sum non-finite: one cheap reduction per input (a finite sum
    # that overflows only sends the call down the guarded path, which is exact as well)
    total = query.sum() if alike else query.sum() + key.sum() + value.sum()
    if math.isfinite(total.item()):
        return query, key, value, None
    ok_q = torch.isfinite(query).all(dim=-1)  # (..., H, T_q)
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    query = torch.where(torch.isfinite(query), query, zero)
    if alike:
        return query, key, value, (~ok_q).unsqueeze(-1)
    ok_kv = torch.isfinite(key).all(dim=-1) & torch.isfinite(value).all(dim=-1)  # (..., H_kv, T_k)
    key = torch.where(torch.isfinite(key), key, zero)
    value = torch.where(torch.isfinite(value), value, zero)
    h = query.shape[-3]
    bad = ~ok_kv
    if h != bad.shape[-2] and bad.shape[-2]:  # key/value head g serves query heads g·G … g·G+G−1
        bad = bad.repeat_interleave(h // bad.shape[-2], dim=-2)
    reach = ~ok_q | _sees(masking, bad, t_q)
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


def _rows_alike(masking: Masking, t_k: int) -> bool:
    """Whether every query row may see the same keys: no window, no layout, a mask without rows
    (padding) and a causal rule, if any, that hides no key (a decoding step)."""
    if masking.window is not None or masking.blocks is not None:
        return False
    if masking.allowed is not None and masking.allowed.dim() >= 2 and masking.allowed.shape[-2] > 1:
        return False
    return masking.causal_offset is None or masking.causal_offset >= t_k - 1


def _sees(masking: Masking, bad: torch.Tensor, t_q: int) -> torch.Tensor:
    """``Σ_j visible_ij · bad_j > 0``: whether row ``i`` may see a key marked bad.

    Under the causal rule and a window alone a cumulative sum along the keys counts them per row
    (``O(T)``); a mask or a block layout is read in chunks of query rows (``O(T_q · T_k)``).

    Shape:
        bad ``(..., H, T_k)`` → ``(..., H, T_q)``.
    """
    t_k = bad.shape[-1]
    device = bad.device
    lo, hi = masking.bounds(t_q, t_k)
    if masking.allowed is None and masking.blocks is None:
        # keys lo_i … hi_i of row i, counted from the prefix sums of bad
        c = torch.nn.functional.pad(bad.to(torch.int32).cumsum(-1), (1, 0))  # (..., H, T_k + 1)
        i = torch.arange(t_q, device=device)
        first = torch.zeros_like(i) if lo is None else (i + lo).clamp(0, t_k)
        stop = torch.full_like(i, t_k) if hi is None else (i + hi + 1).clamp(0, t_k)
        stop = torch.maximum(stop, first)
        return (c[..., stop] - c[..., first]) > 0
    bad_f = bad.to(torch.float32).unsqueeze(-1)  # (..., H, T_k, 1)
    parts = []
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
        parts.append(torch.matmul(vis.to(torch.float32), bad_f).squeeze(-1) > 0)
    return torch.cat(parts, dim=-1) if parts else bad.new_zeros((*bad.shape[:-1], 0))
