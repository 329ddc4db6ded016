"""Decoding a batch of sources with an encoder-decoder, and scoring the outputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from attnlab.data.batching import pad_batch
from attnlab.decoding.generate import generate

__all__ = ["decode_sources", "exact_match_accuracy", "strip_special"]


def strip_special(ids: Sequence[int], *, bos_id: int, eos_id: int, pad_id: int) -> list[int]:
    """The tokens of a decoded row: ``<bos>`` dropped, cut at the first ``<eos>``, no padding."""
    out = []
    for i, t in enumerate(int(x) for x in ids):
        if t == eos_id:
            break
        if (i == 0 and t == bos_id) or t == pad_id:
            continue
        out.append(t)
    return out


@torch.no_grad()
def decode_sources(
    model: nn.Module,
    sources: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    strategy: str = "greedy",
    num_beams: int = 4,
    batch_size: int = 256,
) -> list[list[int]]:
    """Decode every source with :func:`attnlab.generate` (KV cache), in batches.

    Args:
        model: an encoder-decoder (:class:`attnlab.Transformer`).
        sources: source token lists (no ``<bos>``/``<eos>``).
        max_new_tokens: the most target tokens (``<eos>`` included).
        strategy: ``"greedy"`` or ``"beam"``.
        num_beams: beams for ``"beam"``.
        batch_size: sources per call.

    Returns:
        One token list per source, without special tokens.
    """
    cfg: Any = model.config
    device = next(model.parameters()).device
    out: list[list[int]] = []
    for start in range(0, len(sources), batch_size):
        chunk = sources[start : start + batch_size]
        src = pad_batch(chunk, cfg.pad_id).to(device)
        ids = generate(
            model,
            src,
            max_new_tokens=max_new_tokens,
            strategy=strategy,
            num_beams=num_beams,
        )
        for row in ids.tolist():
            out.append(strip_special(row, bos_id=cfg.bos_id, eos_id=cfg.eos_id, pad_id=cfg.pad_id))
    return out


def exact_match_accuracy(
    predictions: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
) -> float:
    """The fraction of predictions equal to their target, token for token.

    Args:
        predictions: decoded token lists.
        targets: the correct token lists (same count).

    Returns:
        A number in [0, 1].
    """
    if len(predictions) != len(targets):
        raise ValueError(
            f"predictions and targets must have the same count, got {len(predictions)} and "
            f"{len(targets)}"
        )
    if not targets:
        raise ValueError("targets must not be empty")
    hits = sum(list(p) == list(t) for p, t in zip(predictions, targets))
    return hits / len(targets)
