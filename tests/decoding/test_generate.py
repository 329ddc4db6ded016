"""attnlab.generate on GPT: cached decoding, continuation, left padding, stop tokens, errors."""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab.decoding.steppers import CausalStepper
from tests.decoding._models import greedy_without_cache, tiny_gpt


@pytest.mark.parametrize("padded", [False, True])
def test_cached_decoding_equals_full_forward_at_every_step(padded: bool) -> None:
    model = tiny_gpt()
    prompt = torch.randint(0, 61, (3, 6))
    mask = None
    if padded:
        mask = torch.ones_like(prompt)
        mask[0, :2] = 0
        mask[2, :4] = 0
        prompt = prompt.masked_fill(mask == 0, 7)
    out = al.generate(model, prompt, max_new_tokens=9, attention_mask=mask)
    # the same tokens, stepped by hand, and their logits against one full forward
    stepper = CausalStepper(model, prompt, mask, 6 + 9)
    full_mask = None if mask is None else torch.cat([mask, torch.ones(3, 9, dtype=mask.dtype)], 1)
    full = model(out, attention_mask=full_mask).logits  # (B, 15, V)
    logits = stepper.prefill()
    for i in range(9):
        torch.testing.assert_close(logits, full[:, 5 + i], atol=1e-10, rtol=0)
        assert torch.equal(logits.argmax(-1), out[:, 6 + i])
        if i < 8:
            logits = stepper.step(out[:, 6 + i])


def test_four_tokens_equal_three_then_one() -> None:
    model = tiny_gpt()
    prompt = torch.randint(0, 61, (2, 5))
    four = al.generate(model, prompt, max_new_tokens=4)
    three = al.generate(model, prompt, max_new_tokens=3)
    assert torch.equal(al.generate(model, three, max_new_tokens=1), four)
    assert four.shape == (2, 9) and torch.equal(four[:, :5], prompt)


def test_sampling_continuation_with_the_same_generator() -> None:
    model = tiny_gpt()
    prompt = torch.randint(0, 61, (2, 5))
    kw = dict(strategy="sample", temperature=1.5, top_k=20)
    four = al.generate(
        model, prompt, max_new_tokens=4, generator=torch.Generator().manual_seed(3), **kw
    )
    g = torch.Generator().manual_seed(3)
    three = al.generate(model, prompt, max_new_tokens=3, generator=g, **kw)
    assert torch.equal(al.generate(model, three, max_new_tokens=1, generator=g, **kw), four)


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_left_padded_batch_equals_each_row_alone(strategy: str) -> None:
    model = tiny_gpt()
    rows = [torch.randint(0, 61, (n,)) for n in (3, 7, 5)]
    width = max(len(r) for r in rows)
    batch = torch.full((3, width), 0, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for i, r in enumerate(rows):
        batch[i, width - len(r) :] = r
        mask[i, width - len(r) :] = 1
    kw = dict(max_new_tokens=6, strategy=strategy, num_beams=3)
    together = al.generate(model, batch, attention_mask=mask, **kw)
    for i, r in enumerate(rows):
        alone = al.generate(model, r[None], **kw)
        assert torch.equal(together[i, width - len(r) :], alone[0]), f"row {i}"


def test_all_ones_mask_equals_no_mask() -> None:
    model = tiny_gpt()
    prompt = torch.randint(0, 61, (2, 5))
    a = al.generate(model, prompt, max_new_tokens=5)
    b = al.generate(model, prompt, max_new_tokens=5, attention_mask=torch.ones_like(prompt).bool())
    assert torch.equal(a, b)


def test_stop_tokens_end_rows_and_pad_them() -> None:
    model = tiny_gpt()
    prompt = torch.randint(0, 61, (2, 4))

    def run(**kw: object) -> torch.Tensor:  # sampled, so that the tokens vary
        g = torch.Generator().manual_seed(5)
        return al.generate(model, prompt, max_new_tokens=8, strategy="sample", generator=g, **kw)

    free = run()
    new0 = free[0, 4:].tolist()
    j = next(j for j in range(1, 8) if new0[j] not in new0[:j])  # a token not met before
    stop = new0[j]
    out = run(eos_token_id=stop, pad_token_id=60)
    assert torch.equal(out[0, : 4 + j + 1], free[0, : 4 + j + 1])  # up to and including the stop
    assert (out[0, 4 + j + 1 :] == 60).all()
    row1 = free[1, 4:].tolist()
    if stop in row1:  # row 1 stops at its own first stop token
        k = row1.index(stop)
        assert out[1, 4 + k] == stop and (out[1, 4 + k + 1 :] == 60).all()
    else:
        assert torch.equal(out[1], free[1, : out.shape[1]])
    # several stop tokens: the first one met ends the row
    both = run(eos_token_id=[stop, new0[0]])
    assert both[0, 4] == new0[0] and (both[0, 5:] == stop).all()  # pad defaults to the first EOS


def test_generation_ends_when_every_row_stopped() -> None:
    model = tiny_gpt()
    prompt = torch.randint(0, 61, (1, 4))
    first = int(al.generate(model, prompt, max_new_tokens=1)[0, -1])
    out = al.generate(model, prompt, max_new_tokens=10, eos_token_id=first)
    assert out.shape == (1, 5)


def test_eval_mode_during_generation_and_restored() -> None:
    model = tiny_gpt(dropout=0.5).train()
    prompt = torch.randint(0, 61, (2, 4))
    a = al.generate(model, prompt, max_new_tokens=5)
    assert model.training
    assert torch.equal(a, al.generate(model.eval(), prompt, max_new_tokens=5))


def test_decoding_follows_the_weights_after_they_change() -> None:
    model = tiny_gpt()
    prompt = torch.randint(0, 61, (1, 4))
    al.generate(model, prompt, max_new_tokens=3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    assert torch.equal(
        al.generate(model, prompt, max_new_tokens=6),
        greedy_without_cache(model, prompt, 6),
    )


def test_hooks_use_the_model_forward() -> None:
    model = tiny_gpt()
    seen: list[torch.Size] = []
    handle = model.transformer.h[0].hook_attn_out.register_forward_hook(
        lambda m, i, o: seen.append(o.shape)
    )
    al.generate(model, torch.randint(0, 61, (1, 4)), max_new_tokens=3)
    handle.remove()
    assert len(seen) == 3  # the prompt and two one-token steps


@pytest.mark.parametrize("positions", ["rope", "alibi"])
def test_other_position_schemes_generate_like_the_full_forward(positions: str) -> None:
    model = tiny_gpt(positions=positions)
    prompt = torch.randint(0, 61, (2, 5))
    out = al.generate(model, prompt, max_new_tokens=6)
    full = model(out).logits
    assert torch.equal(full[:, 4:-1].argmax(-1), out[:, 5:])


def test_bf16_model_generates() -> None:
    model = tiny_gpt(dtype=torch.bfloat16)
    prompt = torch.randint(0, 61, (2, 5))
    a = al.generate(model, prompt, max_new_tokens=6)
    b = greedy_without_cache(model, prompt, 6)
    assert a.shape == (2, 11)
    # bf16 sums in another order can flip a near tie; most tokens agree
    assert (a == b).float().mean() > 0.8


# -- bad input --


def test_too_long_names_the_position_limit() -> None:
    model = tiny_gpt(n_positions=16)
    prompt = torch.randint(0, 61, (1, 10))
    al.generate(model, prompt, max_new_tokens=6)  # exactly fits
    with pytest.raises(ValueError, match="n_positions = 16"):
        al.generate(model, prompt, max_new_tokens=7)
    with pytest.raises(ValueError, match="n_positions = 16"):
        al.generate(model, torch.randint(0, 61, (1, 17)), max_new_tokens=1)


@pytest.mark.parametrize("bad", [61, 1000, -1])
def test_token_id_out_of_range(bad: int) -> None:
    model = tiny_gpt()
    prompt = torch.randint(0, 61, (2, 5))
    prompt[1, 2] = bad
    with pytest.raises(ValueError, match=rf"vocab_size = 61\), got token id {bad}"):
        al.generate(model, prompt, max_new_tokens=2)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"strategy": "topk"}, ValueError, "strategy must be one of"),
        ({"num_beams": 0, "strategy": "beam"}, ValueError, "num_beams must be a positive int"),
        ({"num_beams": 2.0}, TypeError, "num_beams must be an int"),
        ({"temperature": 0.0, "strategy": "sample"}, ValueError, "temperature must be > 0"),
        ({"temperature": -1, "strategy": "sample"}, ValueError, "temperature must be > 0"),
        ({"temperature": "hot"}, TypeError, "temperature must be a float"),
        ({"top_k": 0, "strategy": "sample"}, ValueError, "top_k must be a positive int"),
        ({"top_p": 0.0, "strategy": "sample"}, ValueError, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5, "strategy": "sample"}, ValueError, r"top_p must be in \(0, 1\]"),
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens must be a positive int"),
        ({"eos_token_id": 61}, ValueError, "eos_token_id must lie in"),
        ({"eos_token_id": [3, "x"]}, TypeError, "eos_token_id must be an int"),
        ({"pad_token_id": -1}, ValueError, "pad_token_id must lie in"),
        ({"generator": 3}, TypeError, "generator must be a torch.Generator"),
        ({"length_penalty": "long"}, TypeError, "length_penalty must be a float"),
        ({"length_penalty": float("nan")}, ValueError, "length_penalty must be finite, got nan"),
        ({"length_penalty": float("inf")}, ValueError, "length_penalty must be finite, got inf"),
        ({"temperature": float("inf")}, ValueError, "temperature must be > 0 and finite"),
        ({"temperature": float("nan")}, ValueError, "temperature must be > 0 and finite"),
        ({"early_stopping": "yes"}, TypeError, "early_stopping must be a bool"),
    ],
)
def test_bad_arguments_name_themselves(kwargs: dict, error: type[Exception], words: str) -> None:
    model = tiny_gpt()
    kwargs = {"max_new_tokens": 2, **kwargs}
    with pytest.raises(error, match=words):
        al.generate(model, torch.randint(0, 61, (1, 4)), **kwargs)


def test_bad_prompts_and_masks() -> None:
    model = tiny_gpt()
    with pytest.raises(TypeError, match=r"model must be an attnlab\.GPT"):
        al.generate(torch.nn.Linear(2, 2), torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2)
    ids = torch.randint(0, 61, (2, 4))
    with pytest.raises(TypeError, match="input_ids must hold integer"):
        al.generate(model, ids.float(), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"input_ids must have shape \(B, T\)"):
        al.generate(model, ids[0], max_new_tokens=2)
    with pytest.raises(ValueError, match="attention_mask must have the shape of input_ids"):
        al.generate(model, ids, max_new_tokens=2, attention_mask=torch.ones(2, 5, dtype=torch.long))
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match="attention_mask must be left-padded"):
        al.generate(model, ids, max_new_tokens=2, attention_mask=right)
    with pytest.raises(ValueError, match="no real token"):
        al.generate(model, ids, max_new_tokens=2, attention_mask=torch.tensor([[0] * 4, [1] * 4]))
    with pytest.raises(ValueError, match="only 0 and 1"):
        al.generate(model, ids, max_new_tokens=2, attention_mask=torch.full((2, 4), 2))


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
def test_non_finite_weights_are_refused(strategy: str) -> None:
    """A diverged model's NaN logits used to decode as token 0 over and over."""
    model = tiny_gpt()
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] = float("nan")
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(al.errors.ArgumentError, match="not finite"):
        al.generate(model, ids, max_new_tokens=2, strategy=strategy)


def test_all_finite_is_exact_where_sums_are_not() -> None:
    """``all_finite`` decides from each tensor's sum where that proves finiteness and falls back
    to the exact check where a finite tensor's sum overflows: NaN, +inf, -inf and both infinities
    in one tensor are found in every floating dtype; huge finite values are finite."""
    from attnlab._checks import all_finite

    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        big = torch.finfo(dtype).max
        assert all_finite([torch.randn(300).to(dtype), torch.arange(5)])
        assert all_finite([torch.full((1000,), big, dtype=dtype)])  # the sum overflows
        assert all_finite([torch.tensor([big, -big, big], dtype=dtype)])
        for bad in ([float("nan")], [float("inf")], [float("-inf")], [float("inf"), float("-inf")]):
            t = torch.zeros(7, dtype=dtype)
            t[2 : 2 + len(bad)] = torch.tensor(bad, dtype=dtype)
            assert not all_finite([torch.ones(3), t]), (dtype, bad)
    assert all_finite([]) and all_finite([torch.tensor([True]), torch.arange(3)])
