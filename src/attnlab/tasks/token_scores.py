"""Each generated token with its probability, its alternatives and the entropy, labelled by the
tokenizer: what ``attnlab generate --show-probs`` prints and the viewer shows on generated rows.

The numbers are :class:`attnlab.decoding.scores.Generation`'s (the distribution the token was
chosen from: temperature, top-k and top-p applied when sampling); this module only labels them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from attnlab.decoding.scores import Generation
from attnlab.tasks.base import token_labels

__all__ = ["TokenScore", "token_scores"]


@dataclass(frozen=True)
class TokenScore:
    """One generated token.

    Attributes:
        position: its position in the whole sequence (prompt first).
        id: its token id.
        token: its label.
        probability: ``π_t(y_t)``, under the distribution it was chosen from.
        entropy: ``H(π_t)`` in nats (processed distribution).
        raw_entropy: ``H(softmax(z_t))`` in nats (temperature 1, no filter).
        alternatives: the most likely tokens under ``π_t`` with a non-zero probability,
            ``(id, label, probability)``, most likely first.
        cumulative_logprob: beam search: the hypothesis' log-probability after this token
            (else ``None``).
    """

    position: int
    id: int
    token: str
    probability: float
    entropy: float
    raw_entropy: float
    alternatives: tuple[tuple[int, str, float], ...]
    cumulative_logprob: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The token as a JSON object (alternatives as ``{"id", "token", "probability"}``).

        Returns:
            A dict of JSON values.
        """
        return {
            "position": self.position,
            "id": self.id,
            "token": self.token,
            "probability": self.probability,
            "entropy": self.entropy,
            "raw_entropy": self.raw_entropy,
            "alternatives": [
                {"id": i, "token": t, "probability": p} for i, t, p in self.alternatives
            ],
            "cumulative_logprob": self.cumulative_logprob,
        }


def token_scores(tokenizer: Any, generation: Generation, row: int = 0) -> list[TokenScore]:
    """The generated tokens of one row of ``generation``, labelled.

    Args:
        tokenizer: the run's tokenizer, or ``None`` (labels are then the ids).
        generation: what :func:`attnlab.generate` returned with ``return_scores=True``.
        row: the batch row. Default 0.

    Returns:
        One :class:`TokenScore` per generated token; the padding after a row stopped is left out.
    """
    start = generation.sequences.shape[1] - generation.token_probs.shape[1]
    new = generation.new_tokens[row].tolist()
    probs = generation.token_probs[row].tolist()
    ent, raw = generation.entropy[row].tolist(), generation.raw_entropy[row].tolist()
    top_ids, top_probs = generation.top_ids[row].tolist(), generation.top_probs[row].tolist()
    beam = None if generation.beam_logprobs is None else generation.beam_logprobs[row].tolist()
    out = []
    for t, (token, p) in enumerate(zip(new, probs)):
        if math.isnan(p):
            break  # the row had stopped
        kept = [(i, q) for i, q in zip(top_ids[t], top_probs[t]) if q > 0]
        labels = token_labels(tokenizer, [token] + [i for i, _ in kept])
        alts = tuple((i, label, q) for (i, q), label in zip(kept, labels[1:]))
        cumulative = None if beam is None else beam[t]
        out.append(TokenScore(start + t, token, labels[0], p, ent[t], raw[t], alts, cumulative))
    return out
