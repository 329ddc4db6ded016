"""Pieces the backends share."""

from __future__ import annotations

import torch


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Grouped-query attention: key/value head ``g`` serves query heads ``g·G … g·G + G − 1``.

    Shape:
        ``(..., H_kv, T, D)`` → ``(..., H_kv · groups, T, D)``.
    """
    if groups == 1:
        return x
    return x.repeat_interleave(groups, dim=-3)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax statistics are kept in fp32 for half types, fp64 stays fp64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def head_groups(query: torch.Tensor, key: torch.Tensor) -> int:
    """``G = H / H_kv``: query heads per key/value head (1 when there are no heads at all)."""
    return query.shape[-3] // key.shape[-3] if key.shape[-3] else 1


def _merge_weights(
    lse_a: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(L, e^{L_a − L}, e^{L_b − L})`` of :func:`merge_partials`, the weights ``(..., T_q, 1)``."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = lse.masked_fill(torch.isneginf(lse), 0.0)  # no key in either part: any shift will do
    weight_a = torch.exp(lse_a - safe).unsqueeze(-1)
    weight_b = torch.exp(lse_b - safe).unsqueeze(-1)
    return lse, weight_a, weight_b


def merge_partials(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the keys of two parts, from each part's normalised output and log-sum-exp.

    Each part's output is normalised over its own keys, ``O_a = Σ_a e^{s − L_a} v``; the whole is

        L = log(e^{L_a} + e^{L_b})
        O = e^{L_a − L} · O_a + e^{L_b − L} · O_b

    A part in which a row sees no key carries ``L = −∞`` (and weighs 0); a row that sees no key
    in either part keeps ``L = −∞`` and ``O = 0``.

    Args:
        out_a: the first part's output.
        lse_a: its log-sum-exp per row.
        out_b: the second part's output.
        lse_b: its log-sum-exp per row.

    Returns:
        ``(output, lse)`` of both parts together.

    Shape:
        outputs ``(..., T_q, D_v)``, log-sum-exps ``(..., T_q)``.
    """
    lse, weight_a, weight_b = _merge_weights(lse_a, lse_b)
    return out_a * weight_a + out_b * weight_b, lse


def merge_partials_(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> None:
    """:func:`merge_partials` in place: ``(out_a, lse_a)`` become the merge of both parts (and
    ``out_b`` is overwritten), by the same operations, so the same numbers, without a temporary
    the size of the output.

    Shape:
        outputs ``(..., T_q, D_v)``, log-sum-exps ``(..., T_q)``.
    """
    lse, weight_a, weight_b = _merge_weights(lse_a, lse_b)
    out_a.mul_(weight_a).add_(out_b.mul_(weight_b))
    lse_a.copy_(lse)


def mask_tile(t: torch.Tensor, rows: slice, cols: slice) -> torch.Tensor:
    """Rows and columns of a mask that may be broadcast (size 1) along either of its last two dims.

    Shape:
        ``(..., T_q | 1, T_k | 1)`` → ``(..., rows | 1, cols | 1)``.
    """
    return t[
        ..., rows if t.shape[-2] > 1 else slice(None), cols if t.shape[-1] > 1 else slice(None)
    ]
