"""What :func:`attnlab.generate` returns with ``return_scores=True``: each generated token's
probability, its most likely alternatives and the entropy of the distribution it came from.

The distribution of a step is the one the token was actually chosen from:

- sampling: ``π = softmax(filter(z / τ))``, temperature, top-k and top-p applied
  (:func:`~attnlab.decoding.strategies.sampling_distribution`, the very tensor the token is
  drawn from);
- greedy and beam search: ``π = softmax(z)`` (they ignore temperature and the filters).

Its entropy, in nats, with ``0 · log 0 = 0`` (a filtered token contributes nothing):

    H(π) = − Σ_v π_v log π_v

Both the entropy of ``π`` and that of the raw ``softmax(z)`` are given (equal for greedy and
beam search). Beam search adds the beam's own numbers for the hypothesis it returns: the
cumulative log-probability after each token, ``Σ_{s ≤ t} log softmax(z_s)[y_s]`` in float64 (what
the beam ranks live hypotheses by), and the final score ``log p / n^α``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "Generation",
    "StepScores",
    "entropy",
    "merge_generations",
    "stack_steps",
    "step_scores",
]


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """``H(π) = − Σ_v π_v log π_v`` in nats over the last dimension, ``0 · log 0 = 0``.

    Args:
        probs: probabilities, each row summing to 1.

    Returns:
        The entropy of each row.

    Shape:
        probs ``(..., V)`` → ``(...)``.
    """
    return torch.special.entr(probs).sum(dim=-1)


@dataclass(frozen=True)
class StepScores:
    """One decoding step's numbers for each of its ``N`` rows (see :func:`step_scores`).

    Attributes:
        token_prob: the chosen token's probability under ``π``.
        top_ids: the ``k`` most likely tokens under ``π``.
        top_probs: their probabilities.
        entropy: ``H(π)``, nats.
        raw_entropy: ``H(softmax(z))``, nats.

    Shape:
        token_prob, entropy, raw_entropy ``(N,)``; top_ids, top_probs ``(N, k)``.
    """

    token_prob: torch.Tensor
    top_ids: torch.Tensor
    top_probs: torch.Tensor
    entropy: torch.Tensor
    raw_entropy: torch.Tensor


def step_scores(
    probs: torch.Tensor,
    chosen: torch.Tensor | None,
    k: int,
    raw_probs: torch.Tensor | None = None,
) -> StepScores:
    """The numbers of one step from the distribution the token was chosen from.

    Args:
        probs: ``π``, the processed distribution (what was sampled from, or ``softmax(z)``).
        chosen: the token chosen in each row, or ``None`` (beam search picks them later:
            ``token_prob`` is then zeros).
        k: how many alternatives (at most ``V``).
        raw_probs: ``softmax(z)``, the raw distribution, or ``None`` when it is ``probs``.

    Returns:
        The chosen token's ``π``, the ``k`` most likely tokens under ``π`` and their
        probabilities, ``H(π)`` and ``H(softmax(z))``.

    Shape:
        probs, raw_probs ``(N, V)``; chosen ``(N,)``.
    """
    top = probs.topk(min(k, probs.shape[-1]), dim=-1)
    token_prob = (
        torch.zeros_like(probs[:, 0])
        if chosen is None
        else probs.gather(-1, chosen[:, None]).squeeze(-1)
    )
    h = entropy(probs)
    raw_h = h if raw_probs is None else entropy(raw_probs)
    return StepScores(token_prob, top.indices, top.values, h, raw_h)


@dataclass(frozen=True)
class Generation:
    """The tokens of :func:`attnlab.generate` and, for each generated one, how likely it was.

    ``π_t`` below is the distribution token ``t`` was chosen from: ``softmax(filter(z / τ))``
    when sampling (temperature, top-k and top-p applied exactly), ``softmax(z)`` for greedy
    and beam search. Steps after a row stopped (padding) hold NaN probabilities and entropies
    and ``-1`` ids.

    Attributes:
        sequences: the token ids, as ``generate`` returns them without scores.
        token_probs: ``π_t(y_t)``, the probability of each generated token.
        top_ids: the ``k`` most likely tokens under ``π_t``, most likely first.
        top_probs: their probabilities under ``π_t``.
        entropy: ``H(π_t)`` in nats: of the processed distribution.
        raw_entropy: ``H(softmax(z_t))`` in nats: of the raw distribution (temperature 1,
            no filter); equal to ``entropy`` for greedy and beam search.
        beam_logprobs: beam search only (else ``None``): the cumulative log-probability of the
            returned hypothesis after each of its tokens, float64, as the beam ranks it.
        beam_scores: beam search only: the score the hypothesis won with,
            ``log p / n^α`` (``α = length_penalty``); ``None`` when several calls were merged.

    Shape:
        sequences ``(B, L)``; token_probs, entropy, raw_entropy, beam_logprobs ``(B, n)``;
        top_ids, top_probs ``(B, n, k)``; beam_scores ``(B,)``.
    """

    sequences: torch.Tensor
    token_probs: torch.Tensor
    top_ids: torch.Tensor
    top_probs: torch.Tensor
    entropy: torch.Tensor
    raw_entropy: torch.Tensor
    beam_logprobs: torch.Tensor | None = None
    beam_scores: torch.Tensor | None = None

    @property
    def new_tokens(self) -> torch.Tensor:
        """The generated tokens (the last ``n`` of ``sequences``).

        Shape:
            ``(B, n)``.
        """
        return self.sequences[:, self.sequences.shape[1] - self.token_probs.shape[1] :]


def stack_steps(steps: Sequence[StepScores], stopped: torch.Tensor) -> dict[str, torch.Tensor]:
    """Greedy or sampled steps ``(N, ·)`` stacked along a new step dimension, NaN (``-1`` ids)
    where a row had already stopped.

    Args:
        steps: each step's numbers.
        stopped: whether the row had stopped before the step.

    Returns:
        :class:`Generation`'s per-token fields by name.

    Shape:
        stopped ``(N, n)``; the result's tensors ``(N, n)`` and ``(N, n, k)``.
    """
    out = {
        "token_probs": torch.stack([s.token_prob for s in steps], dim=1),
        "top_ids": torch.stack([s.top_ids for s in steps], dim=1),
        "top_probs": torch.stack([s.top_probs for s in steps], dim=1),
        "entropy": torch.stack([s.entropy for s in steps], dim=1),
        "raw_entropy": torch.stack([s.raw_entropy for s in steps], dim=1),
    }
    for name, value in out.items():
        pad = -1 if name == "top_ids" else math.nan
        where = stopped if value.dim() == 2 else stopped[..., None]
        out[name] = value.masked_fill(where, pad)
    return out


def merge_generations(parts: Sequence[Generation], sequences: torch.Tensor) -> Generation:
    """Several calls' scores as one (a continuation generated in chunks, the context sliding).

    Per-token numbers are concatenated; beam search's cumulative log-probabilities continue
    from the previous chunk's last one, and ``beam_scores`` is ``None`` for more than one part.

    Args:
        parts: the calls' results, in order.
        sequences: the whole sequence they make.

    Returns:
        One :class:`Generation`.

    Shape:
        sequences ``(B, L)``.
    """
    if len(parts) == 1:
        return Generation(**{**parts[0].__dict__, "sequences": sequences})
    fields = ("token_probs", "top_ids", "top_probs", "entropy", "raw_entropy")
    merged = {f: torch.cat([getattr(p, f) for p in parts], dim=1) for f in fields}
    beam = None
    logprobs = [p.beam_logprobs for p in parts if p.beam_logprobs is not None]
    if len(logprobs) == len(parts):
        chunks, offset = [], 0.0
        for lp in logprobs:
            chunks.append(lp + offset)
            done = lp[~lp.isnan()]
            offset += float(done[-1]) if done.numel() else 0.0
        beam = torch.cat(chunks, dim=1)
    return Generation(sequences, **merged, beam_logprobs=beam, beam_scores=None)
