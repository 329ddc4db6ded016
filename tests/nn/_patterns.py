"""What the tests of attention patterns (sliding window, block-sparse) share: the sizes, the
inputs, the masks combined with each pattern, and a blockwise backend with small tiles."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from attnlab.nn.backends import ATTENTION_BACKENDS, band_gather, blockwise, fused_tiles
from attnlab.nn.backends.plan import Tile

BACKENDS = ["math", "sdpa", "blockwise", "blockwise_small", "blockwise_small_python"]
B, H, H_KV, D = 2, 4, 2, 8


def use_small_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register ``blockwise_small``: the blockwise backend with key tiles of 8 and query blocks of
    16, so that a band or a run of visible blocks spans several tiles even at short lengths; and
    ``blockwise_small_python``: the same small tiles computed by the online softmax written out in
    PyTorch instead of the fused kernel."""
    small = functools.partial(blockwise.blockwise_attention, block_size=8, query_block=16)
    monkeypatch.setitem(ATTENTION_BACKENDS, "blockwise_small", small)
    python = functools.partial(small, tile_kernel="python")
    monkeypatch.setitem(ATTENTION_BACKENDS, "blockwise_small_python", python)


def count_scores(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Patch both ways of computing the blockwise tiles to count the scores they compute
    (rows × cols per head, one entry per tile or fused kernel call)."""
    counted: list[int] = []
    scores = blockwise._Operands.scores
    pieces = fused_tiles._Pieces.pieces

    def counting_scores(self: object, tile: Tile, *args: object) -> torch.Tensor:
        counted.append((tile.r1 - tile.r0) * (tile.j1 - tile.j0))
        return scores(self, tile, *args)  # type: ignore[arg-type]

    def counting_pieces(self: object, tile: Tile) -> Iterator[Any]:
        for piece in pieces(self, tile):  # type: ignore[arg-type]
            counted.append((tile.r1 - tile.r0) * (piece[1] - piece[0]))
            yield piece

    band_call = band_gather._band_call

    def counting_band(q: torch.Tensor, k: torch.Tensor, *args: Any) -> Any:
        # one entry per gathered block (and batch element)
        counted.extend([q.shape[-2] * k.shape[-2]] * q.shape[0])
        return band_call(q, k, *args)

    monkeypatch.setattr(band_gather, "_band_call", counting_band)
    monkeypatch.setattr(blockwise._Operands, "scores", counting_scores)
    monkeypatch.setattr(fused_tiles._Pieces, "pieces", counting_pieces)
    return counted


def qkv(
    t_q: int, t_k: int, gen: torch.Generator, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, ...]:
    """Queries ``(B, H, T_q, D)``, keys and values ``(B, H_kv, T_k, D)`` that require grad."""
    q = torch.randn(B, H, t_q, D, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(B, H_KV, t_k, D, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(B, H_KV, t_k, D, generator=gen, dtype=torch.float64).to(dtype)
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_()


def user_mask(kind: str, t_q: int, t_k: int, gen: torch.Generator) -> torch.Tensor | None:
    """``"none"``, ``"padding"`` (row 1's keys from the middle on) or ``"additive"`` (a random
    bias with a fifth of the keys at −inf)."""
    if kind == "none":
        return None
    if kind == "padding":
        m = torch.ones(B, 1, 1, t_k, dtype=torch.bool)
        m[1, ..., t_k // 2 + 1 :] = False
        return m
    bias = torch.randn(B, H, t_q, t_k, generator=gen, dtype=torch.float64)
    return bias.masked_fill(torch.rand(B, H, t_q, t_k, generator=gen) < 0.2, float("-inf"))
