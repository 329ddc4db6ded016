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
