"""Beam search against brute force over every output of a tiny model."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import attnlab as al
from tests.decoding._models import tiny_gpt, tiny_transformer

V, STEPS, EOS = 5, 3, 4


def _all_outputs(vocab: int, eos: int) -> list[tuple[int, ...]]:
    """Every output generation can end with: EOS after 1..STEPS tokens (the first EOS stops it),
    or STEPS tokens without EOS."""
    outs = []
    for n in range(1, STEPS + 1):
        for seq in itertools.product(range(vocab), repeat=n):
            if eos not in seq[:-1] and (n == STEPS or seq[-1] == eos):
                outs.append(seq)
    return outs


def _best(logp: dict[tuple[int, ...], float], vocab: int, eos: int, alpha: float) -> list[int]:
    """argmax over all outputs of log p / n^α."""
    return list(max(_all_outputs(vocab, eos), key=lambda seq: logp[seq] / len(seq) ** alpha))


def _prefix_logprobs(
    logits: torch.Tensor, full: list[tuple[int, ...]]
) -> dict[tuple[int, ...], float]:
    """log p of every prefix of the ``full`` continuations, from their next-token logits
    ``(N, STEPS, V)`` (causal: a prefix's log-probability does not depend on what follows)."""
    logp = logits.double().log_softmax(-1)
    out: dict[tuple[int, ...], float] = {}
    for row, seq in enumerate(full):
        total = 0.0
        for t, tok in enumerate(seq):
            total += float(logp[row, t, tok])
            out[seq[: t + 1]] = total
    return out


@torch.no_grad()
def _brute_force(model: al.GPT, prompt: torch.Tensor, length_penalty: float) -> list[int]:
    full = list(itertools.product(range(V), repeat=STEPS))
    ids = torch.cat([prompt.expand(len(full), -1), torch.tensor(full)], dim=1)  # (V^3, 3 + 3)
    logits = model(ids).logits[:, prompt.shape[0] - 1 : -1]  # (V^3, STEPS, V)
    return _best(_prefix_logprobs(logits, full), V, EOS, length_penalty)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0, -0.5])
@pytest.mark.parametrize("seed", [0, 1])
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
        return float(logp.gather(1, out[0, 3:, None]).sum().detach())

    greedy = al.generate(model, prompt, max_new_tokens=5)
    beam = al.generate(
        model, prompt, max_new_tokens=5, strategy="beam", num_beams=3, length_penalty=0.0
    )
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
        model,
        prompt,
        max_new_tokens=4,
        strategy="beam",
        num_beams=3,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    assert out.shape[0] == 4 and 3 < out.shape[1] <= 7
    for row in out[:, 3:].tolist():
        if EOS in row:
            assert all(t == 0 for t in row[row.index(EOS) + 1 :])


@torch.no_grad()
def test_seq2seq_wide_beam_equals_brute_force() -> None:
    model = tiny_transformer(6)  # pad 0, bos 1, eos 2
    src = torch.tensor([[3, 4, 5, 3]])
    full = list(itertools.product(range(6), repeat=STEPS))
    tgt_in = torch.cat([torch.ones(len(full), 1, dtype=torch.long), torch.tensor(full)[:, :-1]], 1)
    logits = model(src.expand(len(full), -1), tgt_in).logits  # (6^3, STEPS, 6)
    want = _best(_prefix_logprobs(logits, full), 6, 2, 1.0)
    out = al.generate(
        model, src, max_new_tokens=STEPS, strategy="beam", num_beams=36, early_stopping=False
    )
    got = out[0, 1:].tolist()
    assert out[0, 0] == 1
    assert got[: len(want)] == want and all(t == 0 for t in got[len(want) :])


class _Scripted:
    """A stepper whose next-token distribution depends only on the last token fed."""

    def __init__(self, table: dict[int | None, list[float]], rows: int) -> None:
        self.table = {k: torch.tensor(v).log() for k, v in table.items()}
        self.rows = rows

    def prefill(self) -> torch.Tensor:
        return self.table[None].expand(self.rows, -1).clone()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.table[int(t)] for t in tokens])

    def reorder(self, index: torch.Tensor) -> None:
        pass


def test_live_beams_compete_on_the_last_step() -> None:
    """Tokens a = 0, EOS = 1, b = 2, two beams, two steps, α = 1. On the last step [a, EOS] fills
    the finished list (with [EOS]); early stopping must not hide the live [a, a]:
    log(0.6 · 0.5) / 2 = −0.602 beats log(0.6 · 0.45) / 2 = −0.655."""
    from attnlab.decoding.beam import beam_search

    table = {None: [0.6, 0.3, 0.1], 0: [0.5, 0.45, 0.05], 2: [0.1, 0.1, 0.8], 1: [0.3, 0.3, 0.4]}
    for early in (True, False):
        best = beam_search(
            _Scripted(table, 2),
            batch=1,
            num_beams=2,
            max_new_tokens=2,
            eos_token_ids=[1],
            pad_token_id=1,
            length_penalty=1.0,
            early_stopping=early,
            alternatives=2,
        )
        (won,) = best.best
        assert won.tokens == [0, 0], early
        # by hand: log 0.6, then log(0.6 · 0.5); the score divides by n^α = 2
        assert [cum for _, _, cum in won.trace] == pytest.approx([math.log(0.6), math.log(0.3)])
        assert won.score == pytest.approx(math.log(0.3) / 2)  # (a float32 table)
