"""Attention weights of a small MultiHeadAttention, shared by the figure tests."""

from __future__ import annotations

import torch

import attnlab as al


def capture_weights(t: int = 6) -> tuple[torch.Tensor, al.MultiHeadAttention, torch.Tensor]:
    mha = al.MultiHeadAttention(16, 4).eval()
    x = torch.randn(1, t, 16)
    _, w = mha(x, is_causal=True, need_weights=True)
    return w.detach(), mha, x
