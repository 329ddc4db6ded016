"""GPT.decode_step: the one forward, without host reads, so torch.compile captures a whole step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnlab as al
from tests.decoding._models import tiny_gpt


@pytest.mark.parametrize("padded", [False, True], ids=["plain", "left-padded"])
@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
def test_torch_compile_captures_a_whole_step(positions: str, padded: bool) -> None:
    """fullgraph=True fails on any graph break, and a host read (``int(t)``, ``bool(t)``,
    ``.item()``, ``.cpu()``) is one: a captured step reads nothing back from the device."""
    model = tiny_gpt(positions=positions)
    prompt = torch.randint(0, 61, (2, 5))
    mask = torch.ones_like(prompt)
    if padded:
        mask[0, :2] = 0
    want = al.generate(model, prompt, max_new_tokens=6, attention_mask=mask)
    step = torch.compile(model.decode_step, fullgraph=True, backend="eager", dynamic=True)
    keep = torch.ones(2, 11, dtype=torch.bool)
    keep[:, :5] = mask.bool()
    with torch.no_grad():
        cache = model.new_cache(2, 11)
        logits = model(prompt, attention_mask=mask, cache=cache).logits[:, -1]
        tokens = [prompt]
        for i in range(6):
            tokens.append(logits.argmax(-1)[:, None])
            if i < 5:
                logits = step(tokens[-1], cache, keep[:, : 6 + i] if padded else None)
    assert torch.equal(torch.cat(tokens, dim=1), want)


def test_decode_step_equals_forward_with_the_cache() -> None:
    model = tiny_gpt()
    prompt = torch.randint(0, 61, (3, 4))
    a, b = model.new_cache(3, 6), model.new_cache(3, 6)
    with torch.no_grad():
        model(prompt, cache=a)
        model(prompt, cache=b)
        nxt = torch.randint(0, 61, (3, 1))
        got = model.decode_step(nxt, a)
        want = model(nxt, cache=b).logits[:, -1]
    assert torch.equal(got, want)


def test_decode_step_checks_shapes_and_the_position_table() -> None:
    model = tiny_gpt(n_positions=5)
    cache = model.new_cache(1, 6)
    with torch.no_grad():
        model(torch.randint(0, 61, (1, 5)), cache=cache)
        with pytest.raises(ValueError, match=r"tokens must have shape \(B, 1\), got \(1, 2\)"):
            model.decode_step(torch.zeros(1, 2, dtype=torch.long), cache)
        with pytest.raises(ValueError, match=r"position 5 is past .* n_positions = 5"):
            model.decode_step(torch.zeros(1, 1, dtype=torch.long), cache)


def test_decoding_lays_the_matrices_out_and_nothing_else_changes(tmp_path: Path) -> None:
    """The (in, out) layout is an explicit step of decoding (attnlab.decoding.layout): a new
    model is plain nn.Linear; generate lays fp32 matrices out (in, out) and half types (out, in);
    shapes, values, the tie and saved checkpoints are nn.Linear's."""
    from safetensors.torch import load_model

    from attnlab.decoding.layout import lay_out_for_decoding
    from attnlab.training.files import safetensors_bytes

    model = tiny_gpt()
    w = model.transformer.h[0].attn.c_attn.weight
    assert w.is_contiguous()  # nothing happens behind the user's back
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 61, (1, 7))
    logits = model(ids).logits
    al.generate(model, ids, max_new_tokens=2)
    assert w.shape == (32 + 2 * 32, 32) and w.t().is_contiguous()
    assert model.transformer.h[0].attn.c_attn.weight is w  # the same parameter, new strides
    assert model.lm_head.weight is model.transformer.wte.weight
    state = model.state_dict()
    assert all(torch.equal(state[k], before[k]) for k in before)
    torch.testing.assert_close(model(ids).logits, logits, rtol=1e-12, atol=1e-12)
    lay_out_for_decoding(model)  # idempotent
    assert w.t().is_contiguous()
    half = lay_out_for_decoding(tiny_gpt().to(torch.bfloat16))  # half types: (out, in)
    assert all(m.weight.is_contiguous() for m in half.modules() if isinstance(m, torch.nn.Linear))
    assert half.lm_head.weight is half.transformer.wte.weight
    (tmp_path / "m.safetensors").write_bytes(safetensors_bytes(model.state_dict()))
    other = tiny_gpt(seed=1)
    load_model(other, str(tmp_path / "m.safetensors"))
    saved = other.state_dict()
    assert all(torch.equal(saved[k], state[k]) for k in state)  # the values, exactly
    assert other.transformer.h[0].attn.c_attn.weight.is_contiguous()  # (out, in) as loaded
    # the other layout is another BLAS kernel: its rounding may differ (it does on an AMD EPYC),
    # so the two layouts agree to float64 rounding; the same layout is the same kernel, bit for bit
    torch.testing.assert_close(other(ids).logits, model(ids).logits, rtol=1e-12, atol=1e-12)
    lay_out_for_decoding(other)
    assert torch.equal(other(ids).logits, model(ids).logits)
