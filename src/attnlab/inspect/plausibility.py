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

beside a random alignment's, the floor any method should clear. Special tokens (padding,
``<eos>``: ``ignore_ids``) are not scored, whatever the source holds.

:func:`plausibility_of_batches` scores a run's held-out batches (``attnlab inspect RUN
--plausibility``); :func:`plausibility_table` is the table that command prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnlab.errors import ArgumentError

__all__ = [
    "ALIGNMENT_METHODS",
    "Plausibility",
    "plausibility",
    "plausibility_of_batches",
    "plausibility_table",
    "source_alignment",
]

#: the alignments :func:`source_alignment` gives
ALIGNMENT_METHODS = ("weights", "rollout", "norm", "norm_residual", "alti")


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

    - ``"weights"``: the cross-attention weights, averaged over every decoder layer and head,
      ``Ā = mean_l mean_h A^{l,h}``;
    - ``"rollout"``: those weights through the encoder's rolled-out attention (Abnar &
      Zuidema), ``Ā · R_enc`` with ``R_enc = Ã_L ⋯ Ã_1``, ``Ã = 0.5 A + 0.5 I``: the encoder
      output at ``s`` is itself a mixture of the source tokens;
    - ``"norm"``: ``‖Σ_h α^h_is f_h(e_s)‖`` (Kobayashi et al. 2020) of each cross-attention,
      averaged over the decoder layers;
    - ``"norm_residual"``: the same through the residual connection and a post-norm block's
      LayerNorm (Kobayashi et al. 2021), the source columns of each cross-attention block;
    - ``"alti"``: the source part of ALTI+ (:func:`attnlab.inspect.mixing`), through the
      encoder, the decoder's self-attention and its cross-attention.

    Value zeroing, gradient-weighted attention and integrated gradients explain a decoder
    position through one stack's layers (:func:`attnlab.inspect.mixing` with ``layers=``), not
    across the cross-attention: they give no source alignment here.

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
    from attnlab.inspect.mixing import _Rows, mixing, record_layers
    from attnlab.inspect.mixing_rules import rollout

    if method not in ALIGNMENT_METHODS:
        raise ArgumentError(f"method must be one of {', '.join(ALIGNMENT_METHODS)}, got {method!r}")
    s = src.shape[-1]
    if method == "alti":
        total = mixing(model, src, "alti", tgt_in=tgt_in).total
        if total is None:
            raise ArgumentError("ALTI+ needs an encoder-decoder with cross-attention")
        return total[:, :, :s]
    runs, _ = record_layers(model, lambda: model(src, tgt_in))
    cross = [r for r in runs if r.role == "cross_attn"]
    if not cross:
        raise ArgumentError(f"{type(model).__name__} has no cross-attention to align with")
    if method in ("norm", "norm_residual"):
        # norm: ‖Σ_h α^h_is W_O^h v^h_s‖; norm_residual: the source columns of ‖T_i(e_s)‖ (its
        # last column is y_i itself); mixing's own per-layer rows, mean over layers  (B, T, S)
        every = torch.arange(tgt_in.shape[-1])
        with torch.no_grad():
            rows = [_Rows(r, method, False)(every)[0][..., :s] for r in cross]
        return torch.stack(rows).mean(0)
    weights = torch.stack([r.weights for r in cross]).mean(dim=(0, 2))  # layers, heads (B,T,S)
    if method == "weights":
        return weights
    encoder = [r.weights.mean(1) for r in runs if r.role == "self_attn"]
    return weights @ rollout(encoder).to(weights.dtype)  # Ā · R_enc                 (B, T, S)


def _score(
    scores: torch.Tensor, src: torch.Tensor, written: torch.Tensor, ignore: Sequence[int] = ()
) -> tuple[float, float, int]:
    hits, f1, n = _sums(scores, src, written, ignore)
    if n == 0:
        raise ArgumentError("no target token is a copy of a source token: nothing to align")
    return hits / n, f1 / n, n


def _sums(
    scores: torch.Tensor,
    src: torch.Tensor,
    written: torch.Tensor,
    ignore: Sequence[int] | set[int] = (),
) -> tuple[float, float, int]:
    """Top-1 hits, the sum of token F1 and the positions scored."""
    hits, f1, n = 0.0, 0.0, 0
    for b in range(scores.shape[0]):
        for i in range(scores.shape[1]):
            if int(written[b, i]) in ignore:
                continue  # padding, <eos>: not a copy of a source token
            gold = set((src[b] == written[b, i]).nonzero().flatten().tolist())
            if not gold:
                continue  # a token not copied from the source
            ranked = torch.argsort(scores[b, i], descending=True, stable=True).tolist()
            hits += ranked[0] in gold
            top = set(ranked[: len(gold)])
            overlap = len(top & gold) / len(gold)  # precision = recall: both sets hold k
            f1 += overlap
            n += 1
    return hits, f1, n


def plausibility(
    model: nn.Module,
    src: torch.Tensor,
    tgt_in: torch.Tensor,
    written: torch.Tensor,
    methods: Sequence[str] = ALIGNMENT_METHODS,
    *,
    random_draws: int = 5,
    seed: int = 0,
    ignore_ids: Sequence[int] = (),
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
        ignore_ids: tokens not scored (padding, ``<eos>``: in the source too, but copied from
            nowhere).

    Returns:
        One :class:`Plausibility` per method, then ``"random"``.

    Shape:
        src ``(B, S)``; tgt_in, written ``(B, T)``.
    """
    return plausibility_of_batches(
        model, [(src, tgt_in, written)], methods, random_draws=random_draws, seed=seed,
        ignore_ids=ignore_ids,
    )  # fmt: skip


def plausibility_of_batches(
    model: nn.Module,
    batches: Sequence[Any],
    methods: Sequence[str] = ALIGNMENT_METHODS,
    *,
    random_draws: int = 5,
    seed: int = 0,
    ignore_ids: Sequence[int] = (),
) -> list[Plausibility]:
    """:func:`plausibility` over several batches (each target position counted once).

    Args:
        model: an encoder-decoder trained on copy, reverse or sort.
        batches: ``(src, tgt_in, written)`` triples, or batches with ``src``, ``tgt_in`` and
            ``targets`` (a task's held-out batches, :class:`attnlab.data.batching.Seq2SeqBatch`).
        methods: among :data:`ALIGNMENT_METHODS`.
        random_draws: random alignments averaged for the ``"random"`` row.
        seed: their seed.
        ignore_ids: tokens not scored (padding, ``<eos>``).

    Returns:
        One :class:`Plausibility` per method, then ``"random"``.

    Raises:
        ValueError: an unknown method, no batch, ``written`` of another shape than
            ``tgt_in``, or no target token that is a copy of a source token.
    """
    if not batches:
        raise ArgumentError("batches must hold at least one batch, got none")
    triples = [(b.src, b.tgt_in, b.targets) if hasattr(b, "targets") else tuple(b) for b in batches]
    for _, tgt_in, written in triples:
        if written.shape != tgt_in.shape:
            raise ArgumentError(
                f"written must have tgt_in's shape {tuple(tgt_in.shape)}, got "
                f"{tuple(written.shape)}"
            )
    ignore = {int(i) for i in ignore_ids}
    generator = torch.Generator().manual_seed(seed)
    # per row: top-1 hits, the sum of token F1, positions (the random row: mean over draws)
    totals = {name: torch.zeros(3, dtype=torch.float64) for name in [*methods, "random"]}
    with torch.no_grad():
        for src, tgt_in, written in triples:
            for method in methods:
                scores = source_alignment(model, src, tgt_in, method)
                totals[method] += torch.tensor(_sums(scores, src, written, ignore))
            shape = (*tgt_in.shape, src.shape[-1])
            for _ in range(random_draws):
                scores = torch.rand(shape, generator=generator)
                totals["random"] += torch.tensor(_sums(scores, src, written, ignore)) / random_draws
    rows = []
    for name, (hits, f1, n) in totals.items():
        if n == 0:
            raise ArgumentError("no target token is a copy of a source token: nothing to align")
        rows.append(Plausibility(name, float(hits / n), float(f1 / n), round(float(n))))
    return rows


def plausibility_table(rows: Sequence[Plausibility]) -> str:
    """The methods × {top-1, token F1} table as plain text (what ``attnlab inspect RUN
    --plausibility`` prints).

    Args:
        rows: :func:`plausibility`'s.

    Returns:
        The table, one method a line.
    """
    width = max(len("method"), *(len(r.method) for r in rows))
    lines = [f"{'method'.ljust(width)}  top-1 ↑  token F1 ↑"]
    lines += [f"{r.method.ljust(width)}  {r.top1:7.3f}  {r.f1:10.3f}" for r in rows]
    return "\n".join(
        [f"{rows[0].positions} target positions whose token is a copy of a source token", *lines]
    )
