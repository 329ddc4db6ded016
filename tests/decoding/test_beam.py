"""Beam search against brute force over every output of a tiny model."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import attnlab as al
from tests.decoding._models import tiny_gpt, tiny_transformer

V, STEPS, EOS = 5, 3, 4


def _brute_force(model: al.GPT, prompt: torch.Tensor, length_penalty: float) -> list[int]:
    """The best of all outputs: those ending in EOS after 1..STEPS tokens and those of STEPS
    tokens without EOS, scored log p / n^α with full forwards (no cache)."""
    best, best_score = None, -math.inf
    for n in range(1, STEPS + 1):
        for seq in itertools.product(range(V), repeat=n):
            if EOS in seq[:-1]:
                continue  # generation stops at the first EOS
            if n < STEPS and seq[-1] != EOS:
                continue  # a shorter output must end in EOS
            ids = torch.cat([prompt, torch.tensor(seq)])[None]
            logp = model(ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)  # (n, V)
            total = float(logp.gather(1, torch.tensor(seq)[:, None]).sum())
            score = total / n**length_penalty
            if score > best_score:
                best, best_score = list(seq), score
    assert best is not None
    return best


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0, -0.5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wide_beam_equals_brute_force(length_penalty: float, seed: int) -> None:
    model = tiny_gpt(V, seed=seed)
    prompt = torch.randint(0, V, (3,))
    want = _brute_force(model, prompt, length_penalty)
    out = al.generate(
        model,
        prompt[None],
        max_new_tokens=STEPS,
        strategy="beam",
        num_beams=V ** (STEPS - 1),  # wide enough to keep every prefix
        length_penalty=length_penalty,
        early_stopping=False,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    got = out[0, 3:].tolist()
    got = got[: got.index(EOS) + 1] if EOS in got else got
    assert got == want


def test_narrow_beam_is_at_least_as_good_as_greedy() -> None:
    model = tiny_gpt(V, seed=3)
    prompt = torch.randint(0, V, (1, 3))

    def logprob(out: torch.Tensor) -> float:
        logp = model(out).logits[0, 2:-1].log_softmax(-1)
        return float(logp.gather(1, out[0, 3:, None]).sum())

    greedy = al.generate(model, prompt, max_new_tokens=5)
    beam = al.generate(model, prompt, max_new_tokens=5, strategy="beam", num_beams=3, length_penalty=0.0)
    assert logprob(beam) >= logprob(greedy) - 1e-12


def test_one_beam_without_eos_is_greedy() -> None:
    model = tiny_gpt()
    prompt = torch.randint(0, 61, (2, 4))
    greedy = al.generate(model, prompt, max_new_tokens=6)
    beam = al.generate(model, prompt, max_new_tokens=6, strategy="beam", num_beams=1)
    assert torch.equal(greedy, beam)


def test_beam_rows_are_padded_after_eos() -> None:
    model = tiny_gpt(V, seed=0)
    prompt = torch.randint(0, V, (4, 3))
    out = al.generate(
        model, prompt, max_new_tokens=4, strategy="beam", num_beams=3, eos_token_id=EOS, pad_token_id=0
    )
    assert out.shape[0] == 4 and 3 < out.shape[1] <= 7
    for row in out[:, 3:].tolist():
        if EOS in row:
            assert all(t == 0 for t in row[row.index(EOS) + 1 :])


def test_seq2seq_wide_beam_equals_brute_force() -> None:
    model = tiny_transformer(6)  # pad 0, bos 1, eos 2
    src = torch.tensor([[3, 4, 5, 3]])
    memory_out = []
    for n in range(1, STEPS + 1):
        for seq in itertools.product(range(6), repeat=n):
            if 2 in seq[:-1] or (n < STEPS and seq[-1] != 2):
                continue
            tgt = torch.tensor([[1, *seq]])
            logp = model(src, tgt[:, :-1]).logits[0].log_softmax(-1)
            memory_out.append((float(logp.gather(1, tgt[0, 1:, None]).sum()) / n, list(seq)))
    want = max(memory_out)[1]
    out = al.generate(model, src, max_new_tokens=STEPS, strategy="beam", num_beams=36, early_stopping=False)
    got = out[0, 1:].tolist()
    assert out[0, 0] == 1
    assert got[: len(want)] == want and all(t == 0 for t in got[len(want) :])
