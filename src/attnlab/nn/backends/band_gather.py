"""A sliding window in one call of PyTorch's fused CPU kernel: the band gathered once.

The tile path (:mod:`attnlab.nn.backends.fused_tiles`) calls the kernel once per block of query
rows and copies each block's output into place: dozens of small parallel regions per call, each of
which waits for every thread — on a machine where other processes run, that wait, not the
arithmetic, sets the time. Here the keys each block of ``b`` query rows may see are gathered once
into a batch of blocks and the whole band is one kernel call:

    block r: rows r·b … r·b + b − 1 see keys r·b + lo … r·b + b − 1 + hi   (W = b + hi − lo keys)
    Q̂ (N·n_b, H, b, D),   K̂, V̂ (N·n_b, H, W, D)      (an unfold of the padded keys, one copy)
    M[a, c] = 0 if a <= c <= a + hi − lo and the key exists, else −∞   (the band within a block)
    O, L = flash(Q̂, K̂, V̂, M),  rows put back in order (one copy)

The same arithmetic as the tiles (each row's scores over its own keys, ``−∞`` elsewhere), so the
same numbers; autograd runs the kernel's backward once and scatters the gathered gradients back.
Used by the blockwise backend for a window with both sides bounded, without a user mask or block
layout, where the fused tiles would run.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

_forward_op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def band_gather(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bounds: tuple[int, int],
    scale: float,
    block: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding-window attention, row ``i`` seeing keys ``i + lo <= j <= i + hi``, in one kernel call.

    Args:
        q: the queries (key/value heads already repeated for grouped-query attention).
        k: the keys.
        v: the values.
        bounds: ``(lo, hi)``, both bounded; every row sees some key (``attend`` opens the rest).
        scale: the score scale.
        block: query rows per gathered block ``b`` (each reads ``b + hi − lo`` keys).

    Returns:
        ``(output, lse)``: the output in the query's dtype, contiguous, and each row's
        log-sum-exp (fp32, fp64 for fp64 inputs).

    Shape:
        q ``(..., H, T_q, D)``, k and v ``(..., H, T_k, D)``; output ``(..., H, T_q, D)``, lse
        ``(..., H, T_q)``.
    """
    lead, (h, t_q, d) = q.shape[:-3], q.shape[-3:]
    t_k = k.shape[-2]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    lo, hi = bounds
    b = block
    n_b = math.ceil(t_q / b)
    width = b + hi - lo  # keys a block reads
    # pad the keys so that block r reads padded keys r·b + s0 … r·b + s0 + W − 1
    left = max(0, -lo)
    s0 = lo + left
    right = max(0, (n_b - 1) * b + lo + width - t_k)

    def gather(t: torch.Tensor) -> torch.Tensor:
        t = F.pad(t.reshape(-1, h, t_k, d).to(acc), (0, 0, left, right))[:, :, s0:]
        t = t.unfold(2, width, b)[:, :, :n_b]  # (N, H, n_b, D, W), a view
        return t.permute(0, 2, 1, 4, 3).reshape(-1, h, width, d)  # (N·n_b, H, W, D)

    q_b = F.pad(q.reshape(-1, h, t_q, d).to(acc), (0, 0, 0, n_b * b - t_q))
    n = q_b.shape[0]
    q_b = q_b.unflatten(2, (n_b, b)).transpose(1, 2).reshape(-1, h, b, d)  # (N·n_b, H, b, D)

    # M (n_b, 1, b, W): the band inside a block, the keys outside 0 … T_k − 1 hidden; padded query
    # rows see the whole block (their output is dropped), so that no row sees nothing
    a = torch.arange(b, device=q.device)[:, None]
    c = torch.arange(width, device=q.device)[None, :]
    key = torch.arange(n_b, device=q.device)[:, None, None] * b + lo + c  # (n_b, 1, W)
    row = torch.arange(n_b, device=q.device)[:, None, None] * b + a  # (n_b, b, 1)
    keep = ((c >= a) & (c <= a + hi - lo) & (key >= 0) & (key < t_k)) | (row >= t_q)
    mask = torch.zeros(keep.shape, dtype=acc, device=q.device).masked_fill_(~keep, -math.inf)
    mask = mask.unsqueeze(1)
    if n > 1:
        mask = mask.repeat(n, 1, 1, 1)
    out, lse = _band_call(q_b, gather(k), gather(v), mask, scale)
    # (N·n_b, H, b, ·) → (N, H, n_b · b, ·), the padded rows dropped: one copy
    out = out.unflatten(0, (n, n_b)).transpose(1, 2).reshape(n, h, n_b * b, d)[:, :, :t_q]
    lse = lse.unflatten(0, (n, n_b)).transpose(1, 2).reshape(n, h, n_b * b)[:, :, :t_q]
    out = out.to(q.dtype).contiguous().reshape(*lead, h, t_q, d)
    return out, lse.detach().reshape(*lead, h, t_q)


def _band_call(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The one kernel call over the gathered blocks (differentiable: autograd runs the kernel's
    backward)   q ``(N·n_b, H, b, D)``, k and v ``(N·n_b, H, W, D)`` → ``(O, L)``."""
    out, lse = _forward_op(q, k, v, 0.0, False, attn_mask=mask, scale=scale)  # type: ignore[misc]
    return out, lse
