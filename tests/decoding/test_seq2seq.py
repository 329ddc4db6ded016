"""attnlab.generate on the encoder-decoder Transformer."""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab.decoding.steppers import Seq2SeqStepper
from tests.decoding._models import tiny_transformer


def _sources() -> torch.Tensor:
    return torch.tensor([[5, 9, 3, 7, 11, 4], [8, 3, 3, 12, 0, 0], [6, 14, 0, 0, 0, 0]])


@torch.no_grad()
def test_cached_decoding_equals_full_forward_at_every_step() -> None:
    model = tiny_transformer()
    src = _sources()
    out = al.generate(model, src, max_new_tokens=8, eos_token_id=[])
    assert out.shape == (3, 9) and (out[:, 0] == model.config.bos_id).all()
    full = model(src, out[:, :-1]).logits  # teacher forcing on the generated target
    stepper = Seq2SeqStepper(model, src, None, 9)
    logits = stepper.prefill()
    for i in range(8):
        torch.testing.assert_close(logits, full[:, i], atol=1e-10, rtol=0)
        assert torch.equal(logits.argmax(-1), out[:, 1 + i])
        if i < 7:
            logits = stepper.step(out[:, 1 + i])


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_padded_batch_equals_each_source_alone(strategy: str) -> None:
    model = tiny_transformer()
    src = _sources()
    lengths = [6, 4, 2]
    together = al.generate(model, src, max_new_tokens=7, strategy=strategy, num_beams=3)
    for i, n in enumerate(lengths):
        alone = al.generate(
            model, src[i : i + 1, :n], max_new_tokens=7, strategy=strategy, num_beams=3
        )
        k = alone.shape[1]
        assert torch.equal(together[i, :k], alone[0]), f"row {i}"
        assert (together[i, k:] == model.config.pad_id).all()


def test_explicit_source_mask_equals_pad_mask() -> None:
    model = tiny_transformer()
    src = _sources()
    a = al.generate(model, src, max_new_tokens=6)
    b = al.generate(model, src, max_new_tokens=6, attention_mask=(src != 0).long())
    assert torch.equal(a, b)


def test_stops_at_eos_and_pads() -> None:
    model = tiny_transformer()
    src = _sources()
    free = al.generate(model, src, max_new_tokens=8, eos_token_id=[])
    stop = int(free[0, 3])
    out = al.generate(model, src, max_new_tokens=8, eos_token_id=stop)
    k = free[0, 1:].tolist().index(stop) + 1
    assert torch.equal(out[0, : k + 1], free[0, : k + 1]) and (out[0, k + 1 :] == 0).all()


def test_sampling_is_reproducible() -> None:
    model = tiny_transformer()
    src = _sources()

    def run(seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return al.generate(
            model, src, max_new_tokens=8, strategy="sample", generator=g, eos_token_id=[]
        )

    assert torch.equal(run(4), run(4))
    assert not torch.equal(run(4), run(5))


def test_limits_name_max_len_and_src_vocab_size() -> None:
    model = tiny_transformer()  # max_len 32, vocab 23
    src = _sources()
    al.generate(model, src, max_new_tokens=31)
    with pytest.raises(ValueError, match="max_len = 32"):
        al.generate(model, src, max_new_tokens=32)
    with pytest.raises(ValueError, match="max_len = 32"):
        al.generate(model, torch.full((1, 33), 5), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"src_vocab_size = 23\), got token id 23"):
        al.generate(model, torch.tensor([[5, 23]]), max_new_tokens=2)
