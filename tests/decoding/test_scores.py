"""``generate(..., return_scores=True)``: each generated token's probability, its alternatives and
the entropy, against a direct float64 softmax of ``model(ids).logits`` (one forward of the whole
decoded sequence, no cache) with temperature, top-k and top-p applied by hand."""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab.errors import ArgumentError, ArgumentTypeError
from tests.decoding._models import filtered_softmax, tiny_gpt, tiny_transformer

T, N = 4, 6  # prompt length, new tokens


@pytest.fixture(scope="module")
def model() -> al.GPT:
    return tiny_gpt(dtype=torch.float64)


def _prompt() -> torch.Tensor:
    return torch.randint(0, 61, (2, T), generator=torch.Generator().manual_seed(7))


def _entropy(p: torch.Tensor) -> torch.Tensor:
    return -torch.where(p > 0, p * p.log(), 0.0).sum(-1)


def _step_logits(model: al.GPT, sequences: torch.Tensor) -> torch.Tensor:
    """``z_t`` of each generated token ``t``, ``(B, n, V)``: one forward, no cache."""
    with torch.no_grad():
        return model(sequences[:, :-1]).logits[:, T - 1 :]


def _check(out, z, temperature=1.0, top_k=None, top_p=None) -> None:  # type: ignore[no-untyped-def]
    pi = filtered_softmax(z, temperature, top_k, top_p)
    new = out.new_tokens
    tol = {"rtol": 0, "atol": 1e-12}
    torch.testing.assert_close(out.token_probs, pi.gather(-1, new[..., None])[..., 0], **tol)
    assert (out.token_probs > 0).all()  # every token drawn lies inside the filters
    want = pi.topk(6, dim=-1)
    torch.testing.assert_close(out.top_probs, want.values[..., :5], **tol)
    # the same ids where the probabilities differ by far more than the two computations (the
    # order of equal zeros, filtered tokens, is topk's to choose)
    top, ids = want.values, want.indices[..., :5]
    assert ((top[..., :-1] - top[..., 1:])[top[..., :-1] > 0] > 1e-9).all()
    positive = top[..., :5] > 0
    assert torch.equal(out.top_ids[positive], ids[positive])
    torch.testing.assert_close(out.entropy, _entropy(pi), **tol)
    torch.testing.assert_close(out.raw_entropy, _entropy(z.softmax(-1)), **tol)


def test_greedy_scores_are_the_softmax_of_the_logits(model: al.GPT) -> None:
    ids = _prompt()
    out = al.generate(model, ids, max_new_tokens=N, return_scores=True)
    assert torch.equal(out.sequences, al.generate(model, ids, max_new_tokens=N))
    assert out.token_probs.dtype == torch.float64 and out.top_ids.shape == (2, N, 5)
    _check(out, _step_logits(model, out.sequences))
    assert torch.equal(out.entropy, out.raw_entropy) and out.beam_scores is None
    # greedy: the chosen token is the first alternative
    assert torch.equal(out.top_ids[..., 0], out.new_tokens)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(0.7, None, None), (1.0, 5, None), (1.0, None, 0.6), (1.4, 7, 0.8), (0.5, 3, 0.95)],
)
def test_sampling_scores_are_the_filtered_softmax(
    model: al.GPT, temperature: float, top_k: int | None, top_p: float | None
) -> None:
    ids = _prompt()
    kw = {"strategy": "sample", "temperature": temperature, "top_k": top_k, "top_p": top_p}

    def run(**more: object):  # type: ignore[no-untyped-def]
        g = torch.Generator().manual_seed(3)
        return al.generate(model, ids, max_new_tokens=N, generator=g, **kw, **more)

    out = run(return_scores=True)
    assert torch.equal(out.sequences, run())  # the same draws with and without scores
    again = run(return_scores=True)  # deterministic under the seed
    assert torch.equal(again.token_probs, out.token_probs)
    _check(out, _step_logits(model, out.sequences), temperature, top_k, top_p)
    if top_k is not None and top_k < 5:  # outside the filter: probability 0
        assert (out.top_probs[..., top_k:] == 0).all()


def test_beam_scores_are_the_cumulative_log_probabilities(model: al.GPT) -> None:
    """By hand: log p(y_{1..t}) = Σ_{s ≤ t} log softmax(z_s)[y_s] of the returned hypothesis, and
    its score log p / n^α."""
    ids = _prompt()
    kw = {"strategy": "beam", "num_beams": 3, "length_penalty": 0.7}
    out = al.generate(model, ids, max_new_tokens=N, return_scores=True, **kw)
    assert torch.equal(out.sequences, al.generate(model, ids, max_new_tokens=N, **kw))
    z = _step_logits(model, out.sequences)
    logp = z.log_softmax(-1).gather(-1, out.new_tokens[..., None])[..., 0]
    tol = {"rtol": 0, "atol": 1e-12}
    assert out.beam_logprobs is not None and out.beam_scores is not None
    torch.testing.assert_close(out.beam_logprobs, logp.cumsum(-1), **tol)
    torch.testing.assert_close(out.beam_scores, logp.sum(-1) / N**0.7, **tol)
    _check(out, z)  # the step's distribution: softmax(z)


def test_rows_that_stopped_hold_nan(model: al.GPT) -> None:
    ids = _prompt()
    free = al.generate(model, ids, max_new_tokens=N)
    eos = int(free[0, T + 1])  # row 0 stops after two tokens
    out = al.generate(model, ids, max_new_tokens=N, eos_token_id=eos, return_scores=True)
    stop = (out.new_tokens[0] == eos).nonzero()[0, 0]
    assert out.token_probs[0, : stop + 1].isfinite().all()
    assert out.token_probs[0, stop + 1 :].isnan().all()
    assert (out.top_ids[0, stop + 1 :] == -1).all()
    # a beam hypothesis that ends on EOS: its own length, NaN after it
    kw = {"strategy": "beam", "num_beams": 2, "eos_token_id": eos, "length_penalty": 0.0}
    beam = al.generate(model, ids, max_new_tokens=N, return_scores=True, **kw)
    assert torch.equal(beam.sequences, al.generate(model, ids, max_new_tokens=N, **kw))
    assert beam.beam_logprobs is not None and beam.beam_scores is not None
    for row, tokens in enumerate(beam.new_tokens.tolist()):
        n = tokens.index(eos) + 1 if eos in tokens else N
        assert (
            beam.token_probs[row, :n].isfinite().all() and beam.token_probs[row, n:].isnan().all()
        )
        assert float(beam.beam_scores[row]) == float(beam.beam_logprobs[row, n - 1])  # α = 0


def test_encoder_decoder_greedy_scores() -> None:
    model = tiny_transformer()
    src = torch.randint(3, 23, (2, 5), generator=torch.Generator().manual_seed(1))
    out = al.generate(model, src, max_new_tokens=4, eos_token_id=None, return_scores=True)
    with torch.no_grad():
        z = model(src, out.sequences[:, :-1]).logits
    torch.testing.assert_close(out.token_probs, z.softmax(-1).max(-1).values, rtol=0, atol=1e-12)


def test_bad_arguments_name_themselves(model: al.GPT) -> None:
    ids = _prompt()
    with pytest.raises(ArgumentTypeError, match="return_scores must be a bool"):
        al.generate(model, ids, max_new_tokens=2, return_scores="yes")  # type: ignore[call-overload]
    with pytest.raises(ArgumentError, match="num_alternatives"):
        al.generate(model, ids, max_new_tokens=2, return_scores=True, num_alternatives=0)
