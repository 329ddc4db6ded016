"""Token choice: top-k / top-p filters on hand-made logits, seeded sampling."""

from __future__ import annotations

import math

import pytest
import torch

import attnlab as al
from attnlab.decoding.strategies import greedy_choice, sample_choice, top_k_filter, top_p_filter
from tests.decoding._models import tiny_gpt

INF = math.inf


def test_top_k_keeps_the_k_largest() -> None:
    z = torch.tensor([[1.0, 4.0, 2.0, 3.0, 0.0], [5.0, 1.0, 1.0, 1.0, 2.0]])
    out = top_k_filter(z, 2)
    assert out.tolist() == [[-INF, 4.0, -INF, 3.0, -INF], [5.0, -INF, -INF, -INF, 2.0]]
    assert torch.equal(top_k_filter(z, 5), z)
    assert torch.equal(top_k_filter(z, 99), z)
    # ties at the k-th value are all kept
    assert top_k_filter(torch.tensor([[3.0, 1.0, 3.0, 3.0]]), 2).tolist() == [[3.0, -INF, 3.0, 3.0]]


def test_top_p_keeps_the_smallest_nucleus() -> None:
    probs = torch.tensor([[0.05, 0.5, 0.2, 0.25]])
    z = probs.log()
    # sorted: 0.5, 0.25, 0.2, 0.05; mass before each: 0, 0.5, 0.75, 0.95
    assert torch.isinf(top_p_filter(z, 0.5)).tolist() == [[True, False, True, True]]
    assert torch.isinf(top_p_filter(z, 0.6)).tolist() == [[True, False, True, False]]
    assert torch.isinf(top_p_filter(z, 0.75)).tolist() == [[True, False, True, False]]
    assert torch.isinf(top_p_filter(z, 0.8)).tolist() == [[True, False, False, False]]
    assert torch.isinf(top_p_filter(z, 0.96)).tolist() == [[False, False, False, False]]
    assert torch.isinf(top_p_filter(z, 0.01)).tolist() == [[True, False, True, True]]  # top one
    assert torch.equal(top_p_filter(z, 1.0), z)
    kept = top_p_filter(z, 0.8)
    assert torch.equal(kept[0, 1:], z[0, 1:])  # kept logits unchanged


def test_top_p_rows_are_independent() -> None:
    z = torch.tensor([[0.0, 0.0, 0.0, 0.0], [10.0, 0.0, 0.0, 0.0]])
    out = top_p_filter(z, 0.6)
    assert torch.isinf(out[0]).sum() == 1  # uniform: 3 of 4 needed for 0.6
    assert torch.isinf(out[1]).sum() == 3  # one token holds > 0.99


def test_filter_arguments_are_checked() -> None:
    z = torch.zeros(1, 4)
    with pytest.raises(ValueError, match="top_k must be a positive int"):
        top_k_filter(z, 0)
    with pytest.raises(ValueError, match=r"top_p must be a float in \(0, 1\]"):
        top_p_filter(z, 0.0)


def test_sampling_follows_the_filtered_distribution() -> None:
    probs = torch.tensor([0.05, 0.5, 0.2, 0.25])
    z = probs.log().expand(4000, 4)
    g = torch.Generator().manual_seed(0)
    draws = sample_choice(z, top_p=0.8, generator=g)
    counts = torch.bincount(draws, minlength=4).double()
    assert counts[0] == 0  # filtered out
    want = torch.tensor([0.0, 0.5, 0.2, 0.25]) / 0.95 * 4000
    sigma = (want * (1 - want / 4000)).sqrt()
    assert ((counts[1:] - want[1:]).abs() < 4 * sigma[1:]).all(), (counts, want)
    # temperature sharpens: τ → small is the argmax
    cold = sample_choice(z[:50], temperature=1e-4, generator=g)
    assert (cold == 1).all()
    assert (sample_choice(z[:50], top_k=1, generator=g) == greedy_choice(z[:50])).all()


def test_seeded_sampling_is_reproducible() -> None:
    model = tiny_gpt()
    prompt = torch.randint(0, 61, (3, 4))
    kw = dict(max_new_tokens=10, strategy="sample", top_p=0.9)

    def run(seed: int) -> torch.Tensor:
        return al.generate(model, prompt, generator=torch.Generator().manual_seed(seed), **kw)

    a, b, c = run(1), run(1), run(2)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_top_k_one_sampling_is_greedy() -> None:
    model = tiny_gpt()
    prompt = torch.randint(0, 61, (2, 4))
    greedy = al.generate(model, prompt, max_new_tokens=6)
    sampled = al.generate(
        model, prompt, max_new_tokens=6, strategy="sample", top_k=1, temperature=3.0
    )
    assert torch.equal(greedy, sampled)
