"""Beam search with a length penalty and early stopping on EOS.

Each batch row keeps ``K = num_beams`` live hypotheses ``y_{1..n}`` ranked by their log-probability

    log p(y_{1..n} | x) = Σ_t log softmax(z_t)[y_t]

Every step extends each live hypothesis by every token, keeps the ``2K`` best candidates, moves
those that end in EOS (and rank among the first ``K``) to the row's finished list, and continues
with the ``K`` best others. A finished hypothesis of ``n`` generated tokens (EOS included) scores

    score = log p(y_{1..n} | x) / n^α          (α = length_penalty; α > 0 favours longer outputs)

and the row's result is its best finished hypothesis (live ones count as finished at
``max_new_tokens``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from attnlab.decoding.scores import StepScores, step_scores
from attnlab.decoding.steppers import Stepper

__all__ = ["BeamResult", "Hypothesis", "beam_search"]

#: a hypothesis' trace, one entry per token: the row it extended, ``log softmax(z)[y]`` of the
#: token, and the cumulative log-probability after it
Trace = list[tuple[int, float, float]]


@dataclass(frozen=True)
class Hypothesis:
    """A batch row's best hypothesis.

    Attributes:
        tokens: its generated tokens.
        score: ``log p / n^α``, what it won with.
        trace: per token, the row it extended, the token's log-probability (NaN unless
            recorded) and the cumulative log-probability after it.
    """

    tokens: list[int]
    score: float
    trace: Trace


@dataclass(frozen=True)
class BeamResult:
    """What :func:`beam_search` found.

    Attributes:
        best: per prompt, its best hypothesis.
        steps: per step, the numbers of every row (with ``alternatives``; else empty).
    """

    best: list[Hypothesis]
    steps: list[StepScores]


@dataclass
class _Finished:
    """The best ``K`` finished hypotheses of one batch row."""

    capacity: int
    items: list[tuple[float, list[int], Trace]] = field(default_factory=list)

    def add(self, score: float, tokens: list[int], trace: Trace) -> None:
        self.items.append((score, tokens, trace))
        self.items.sort(key=lambda item: item[0], reverse=True)
        del self.items[self.capacity :]

    def full(self) -> bool:
        return len(self.items) >= self.capacity

    def worst(self) -> float:
        return self.items[-1][0] if self.items else -math.inf


def _score(logprob: float, length: int, length_penalty: float) -> float:
    return logprob / (length**length_penalty)


def _best_possible(logprob: float, length: int, max_new: int, length_penalty: float) -> float:
    """An upper bound on the score any continuation of a live hypothesis can reach.

    Log-probabilities only decrease as tokens are added, so with ``α > 0`` the best case divides
    today's log-probability by the longest length, with ``α < 0`` by the shortest.
    """
    if length_penalty > 0:
        return _score(logprob, max_new, length_penalty)
    return _score(logprob, min(length + 1, max_new), length_penalty)


def beam_search(
    stepper: Stepper,
    *,
    batch: int,
    num_beams: int,
    max_new_tokens: int,
    eos_token_ids: list[int],
    pad_token_id: int,
    length_penalty: float,
    early_stopping: bool,
    alternatives: int | None = None,
) -> BeamResult:
    """Run beam search; the stepper holds ``batch · num_beams`` rows (each prompt repeated).

    Args:
        stepper: a :class:`~attnlab.decoding.steppers.Stepper` over ``N = batch · num_beams`` rows,
            row ``b · K + k`` being beam ``k`` of prompt ``b``.
        batch: ``B``.
        num_beams: ``K``.
        max_new_tokens: the most tokens to generate.
        eos_token_ids: tokens that end a hypothesis (may be empty).
        pad_token_id: fed to rows whose search is over.
        length_penalty: ``α`` in ``score = log p / n^α``.
        early_stopping: ``True``: a row stops as soon as it has ``K`` finished hypotheses.
            ``False``: it stops only when no live hypothesis can beat the ``K``-th finished one
            (an exact bound, see :func:`_best_possible`), so the result is the best the beam found.
        alternatives: record each step's numbers (:func:`~attnlab.decoding.scores.step_scores`
            of ``softmax(z)``, that many alternatives) and each token's log-probability;
            ``None`` (default): record nothing.

    Returns:
        per prompt, its best hypothesis (tokens, EOS included when it ended so; score; trace),
        and the steps' numbers when ``alternatives`` is set.
    """
    k_beams = num_beams
    logits = stepper.prefill()  # (N, V)
    vocab = logits.shape[-1]
    device = logits.device
    beam_scores = torch.full((batch, k_beams), -math.inf, dtype=torch.float64, device=device)
    beam_scores[:, 0] = 0.0  # all beams start from the same prompt: keep one copy
    sequences: list[list[int]] = [[] for _ in range(batch * k_beams)]
    traces: list[Trace] = [[] for _ in range(batch * k_beams)]
    steps: list[StepScores] = []
    finished = [_Finished(k_beams) for _ in range(batch)]
    done = [False] * batch
    eos = set(eos_token_ids)
    n_cand = min(2 * k_beams, k_beams * vocab)

    for step in range(max_new_tokens):
        length = step + 1
        logp = torch.log_softmax(logits.double(), dim=-1)  # (N, V)
        cand = (beam_scores.view(-1, 1) + logp).view(batch, k_beams * vocab)
        top_scores, top_index = cand.topk(n_cand, dim=-1)  # (B, 2K), best first
        top_scores_l, top_index_l = top_scores.tolist(), top_index.tolist()
        if alternatives:  # each candidate's own log softmax(z)[y], and the step's numbers
            own = logp.view(batch, k_beams * vocab).gather(1, top_index).tolist()
            steps.append(step_scores(logp.exp(), None, alternatives))
        else:  # nothing recorded
            own = [[math.nan] * n_cand] * batch

        new_scores = torch.full((batch, k_beams), -math.inf, dtype=torch.float64)
        new_rows = [0] * (batch * k_beams)
        new_tokens = [pad_token_id] * (batch * k_beams)
        new_traces: list[Trace] = [[] for _ in range(batch * k_beams)]
        for b in range(batch):
            base = b * k_beams
            if done[b]:
                for k in range(k_beams):
                    new_rows[base + k] = base + k
                continue
            kept = 0
            for rank, (s, flat, lp) in enumerate(zip(top_scores_l[b], top_index_l[b], own[b])):
                if s == -math.inf:
                    break  # only the copies of the start beam remain
                beam, token = divmod(flat, vocab)
                trace = traces[base + beam] + [(base + beam, lp, s)] if alternatives else []
                if token in eos:
                    if rank < k_beams:
                        seq = sequences[base + beam] + [token]
                        finished[b].add(_score(s, length, length_penalty), seq, trace)
                    continue
                new_scores[b, kept] = s
                new_rows[base + kept] = base + beam
                new_tokens[base + kept] = token
                new_traces[base + kept] = trace
                kept += 1
                if kept == k_beams:
                    break
            for k in range(kept, k_beams):  # fewer than K live candidates: dead filler beams
                new_rows[base + k] = base
            best_live = float(new_scores[b, 0])
            if best_live == -math.inf:
                done[b] = True  # every candidate ended in EOS
            elif finished[b].full() and length < max_new_tokens:
                # (on the last step the live beams are compared below, as finished ones)
                bound = _best_possible(best_live, length, max_new_tokens, length_penalty)
                done[b] = early_stopping or bound <= finished[b].worst()

        sequences = [sequences[r] + [t] for r, t in zip(new_rows, new_tokens)]
        traces = new_traces
        beam_scores = new_scores.to(device)
        if all(done) or step == max_new_tokens - 1:
            break
        index = torch.tensor(new_rows, dtype=torch.long, device=device)
        stepper.reorder(index)
        logits = stepper.step(torch.tensor(new_tokens, dtype=torch.long, device=device))

    results: list[Hypothesis] = []
    for b in range(batch):
        if not done[b]:  # reached max_new_tokens: live hypotheses count as finished
            for k in range(k_beams):
                s = float(beam_scores[b, k])
                if s > -math.inf:
                    seq = sequences[b * k_beams + k]
                    finished[b].add(
                        _score(s, len(seq), length_penalty), seq, traces[b * k_beams + k]
                    )
        if finished[b].items:
            score, tokens, trace = finished[b].items[0]
            results.append(Hypothesis(tokens, score, trace))
        else:
            results.append(Hypothesis([], -math.inf, []))
    return BeamResult(results, steps)
