"""The scores of a continuation that slides past the context (several ``generate`` calls, one
``Generation``), and their labels."""

from __future__ import annotations

import math

import torch

from attnlab.decoding.scores import Generation
from attnlab.tasks.lm import generate_text
from attnlab.tasks.token_scores import token_scores
from tests.decoding._models import tiny_gpt


def test_scores_of_a_sliding_continuation_are_one_generation() -> None:
    model = tiny_gpt(n_positions=8)  # windows of 4 new tokens: 10 tokens in 3 calls
    prompt = [5, 9, 12]
    kept: list[Generation] = []
    ids = generate_text(model, prompt, max_new_tokens=10, strategy="beam", num_beams=2,
                        scores=kept)  # fmt: skip
    assert ids == generate_text(model, prompt, max_new_tokens=10, strategy="beam", num_beams=2)
    (gen,) = kept
    assert gen.sequences.tolist() == [ids] and gen.token_probs.shape == (1, 10)
    assert gen.beam_scores is None and gen.beam_logprobs is not None  # several calls merged
    # the log-probabilities keep adding up across the calls: each step adds log π(y_t)
    steps = gen.beam_logprobs[0].diff()
    torch.testing.assert_close(steps, gen.token_probs[0, 1:].log(), rtol=0, atol=1e-12)
    labelled = token_scores(None, gen)
    assert [t.position for t in labelled] == list(range(3, 13))
    assert [t.token for t in labelled] == [str(i) for i in ids[3:]]
    assert all(
        math.isclose(t.probability, p) for t, p in zip(labelled, gen.token_probs[0].tolist())
    )
