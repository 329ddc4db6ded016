"""Attention backends. Each takes validated inputs and a :class:`~attnlab.nn.attention.Masking`
in which every query row has at least one visible key, and returns ``(output, weights | None)``."""

from __future__ import annotations

import torch

from attnlab.nn.attention import Masking
from attnlab.nn.backends.blockwise import blockwise_attention
from attnlab.nn.backends.math import math_attention
from attnlab.nn.backends.sdpa import sdpa_attention

__all__ = ["blockwise_attention", "math_attention", "run_backend", "sdpa_attention"]


def run_backend(
    name: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    masking: Masking,
    scale: float,
    dropout_p: float,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if name == "math":
        return math_attention(query, key, value, masking, scale, dropout_p, need_weights)
    if name == "sdpa":
        return sdpa_attention(query, key, value, masking, scale, dropout_p, need_weights)
    return blockwise_attention(query, key, value, masking, scale, dropout_p, need_weights)
