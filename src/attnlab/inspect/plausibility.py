"""Plausibility where the truth is known: does an explanation of an encoder-decoder point at the
source token each output token came from (:func:`plausibility`)?

On the copy, reverse and sort tasks every output token is a copy of a source token, so its
sources are known exactly: the source positions holding the token it wrote (one for distinct
tokens; every copy of a repeated one). Each method gives every target position a score per
source position (:func:`source_alignment`); its alignment is then scored by

- **top-1 accuracy**: the share of target positions whose highest-scored source position is a
  true source;
- **token F1**: the F1 of the ``k`` highest-scored source positions against the ``k`` true ones,
  averaged over target positions (equal to top-1 accuracy when every token is distinct);

beside a random alignment's, the floor any method should clear.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from attnlab.errors import ArgumentError

__all__ = ["ALIGNMENT_METHODS", "Plausibility", "plausibility", "source_alignment"]

#: the alignments :func:`source_alignment` gives
ALIGNMENT_METHODS = ("weights", "alti")


@dataclass(frozen=True)
class Plausibility:
    """One method's agreement with the known sources (:func:`plausibility`).

    Attributes:
        method: the method's name (``"random"`` for the random baseline).
        top1: top-1 accuracy.
        f1: token F1.
        positions: the target positions scored (those whose token is in the source).
    """

    method: str
    top1: float
    f1: float
    positions: int


def source_alignment(
    model: nn.Module, src: torch.Tensor, tgt_in: torch.Tensor, method: str
) -> torch.Tensor:
    """What each target position takes from each source position, by one method.

    ``"weights"``: the cross-attention weights, averaged over every decoder layer and head;
    ``"alti"``: the source part of ALTI+ (:func:`attnlab.inspect.mixing`), through the encoder,
    the decoder's self-attention and its cross-attention.

    Args:
        model: an encoder-decoder (:class:`attnlab.Transformer`).
        src: the source ids.
        tgt_in: what the decoder reads (``<bos> y_1 … y_{n−1}``); row ``i`` writes ``y_{i+1}``.
        method: one of :data:`ALIGNMENT_METHODS`.

    Returns:
        The scores.

    Shape:
        src ``(B, S)``, tgt_in ``(B, T)`` → ``(B, T, S)``.
    """
    from attnlab.inspect.mixing import mixing, record_layers

    if method not in ALIGNMENT_METHODS:
        raise ArgumentError(f"method must be one of {', '.join(ALIGNMENT_METHODS)}, got {method!r}")
    s = src.shape[-1]
    if method == "alti":
        total = mixing(model, src, "alti", tgt_in=tgt_in).total
        if total is None:
            raise ArgumentError("ALTI+ needs an encoder-decoder with cross-attention")
        return total[:, :, :s]
    runs, _ = record_layers(model, lambda: model(src, tgt_in))
    cross = [r.weights for r in runs if r.role == "cross_attn"]
    if not cross:
        raise ArgumentError(f"{type(model).__name__} has no cross-attention to align with")
    return torch.stack(cross).mean(dim=(0, 2))  # over layers and heads     (B, T, S)


def _score(
    scores: torch.Tensor, src: torch.Tensor, written: torch.Tensor
) -> tuple[float, float, int]:
    hits, f1, n = 0.0, 0.0, 0
    for b in range(scores.shape[0]):
        for i in range(scores.shape[1]):
            gold = set((src[b] == written[b, i]).nonzero().flatten().tolist())
            if not gold:
                continue  # a token not copied from the source (<eos>, padding)
            ranked = torch.argsort(scores[b, i], descending=True, stable=True).tolist()
            hits += ranked[0] in gold
            top = set(ranked[: len(gold)])
            overlap = len(top & gold) / len(gold)  # precision = recall: both sets hold k
            f1 += overlap
            n += 1
    if n == 0:
        raise ArgumentError("no target token is a copy of a source token: nothing to align")
    return hits / n, f1 / n, n


def plausibility(
    model: nn.Module,
    src: torch.Tensor,
    tgt_in: torch.Tensor,
    written: torch.Tensor,
    methods: Sequence[str] = ALIGNMENT_METHODS,
    *,
    random_draws: int = 5,
    seed: int = 0,
) -> list[Plausibility]:
    """Each method's alignment against the known sources, then a random alignment's.

    Args:
        model: an encoder-decoder trained on copy, reverse or sort.
        src: the source ids.
        tgt_in: what the decoder reads.
        written: what each decoder position wrote (``tgt_in`` shifted: the targets).
        methods: among :data:`ALIGNMENT_METHODS`.
        random_draws: random alignments averaged for the ``"random"`` row.
        seed: their seed.

    Returns:
        One :class:`Plausibility` per method, then ``"random"``.

    Shape:
        src ``(B, S)``; tgt_in, written ``(B, T)``.
    """
    if written.shape != tgt_in.shape:
        raise ArgumentError(
            f"written must have tgt_in's shape {tuple(tgt_in.shape)}, got {tuple(written.shape)}"
        )
    rows = []
    with torch.no_grad():
        for method in methods:
            top1, f1, n = _score(source_alignment(model, src, tgt_in, method), src, written)
            rows.append(Plausibility(method, top1, f1, n))
    generator = torch.Generator().manual_seed(seed)
    shape = (*tgt_in.shape, src.shape[-1])
    draws = [
        _score(torch.rand(shape, generator=generator), src, written) for _ in range(random_draws)
    ]
    rows.append(
        Plausibility(
            "random",
            sum(d[0] for d in draws) / len(draws),
            sum(d[1] for d in draws) / len(draws),
            draws[0][2],
        )
    )
    return rows
