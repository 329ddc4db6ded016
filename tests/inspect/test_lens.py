"""The logit lens and the tuned lens on tiny random models: the last row is the model's logits
bit for bit (the same modules on the same tensor), every family, LayerNorm and RMSNorm, tied and
untied heads, and an encoder-decoder's decoder; a trained tuned lens is closer to the final
distribution than the logit lens; its folder round-trips exactly and refuses another model."""

from __future__ import annotations

import json

import pytest
import torch

import attnlab as al
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect import (
    TunedLens,
    lens_comparison,
    load_tuned_lens,
    logit_lens,
    train_tuned_lens,
)

VOCAB = 53
FAMILIES = {
    "gpt2": {},  # LayerNorm, learned positions, biases, tied
    "gpt2-untied": dict(tie_embeddings=False),
    "llama": dict(family="llama", positions="rope", num_kv_heads=2, norm="rmsnorm", mlp="gated",
                  activation="silu", bias=False, tie_embeddings=False),
    "mistral": dict(family="mistral", positions="rope", num_kv_heads=2, norm="rmsnorm",
                    mlp="gated", activation="silu", bias=False, attention="sliding", window=3),
    "qwen2": dict(family="qwen2", positions="rope", num_kv_heads=2, norm="rmsnorm", mlp="gated",
                  activation="silu", bias=False, qkv_bias=True),
    "neox": dict(family="neox", positions="rope", rotary_dim=4, parallel_residual=True,
                 tie_embeddings=False),
}  # fmt: skip


def tiny(case: str = "gpt2", dtype: torch.dtype = torch.float64, seed: int = 0) -> al.GPT:
    torch.manual_seed(seed)
    cfg = al.GPTConfig(
        vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=3, n_head=4, **FAMILIES[case]
    )
    model = al.GPT(cfg).to(dtype).eval()
    with torch.no_grad():  # gains and biases away from 1 and 0, weights large enough to matter
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3) if p.dim() == 1 else p.mul_(4.0)
    return model


IDS = torch.tensor([3, 17, 5, 40, 9, 22, 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(FAMILIES))
def test_the_last_layer_is_the_models_logits_bit_for_bit(case: str, dtype: torch.dtype) -> None:
    model = tiny(case, dtype)
    lens = logit_lens(model, IDS)
    with torch.no_grad():
        logits = model(IDS[None]).logits
    assert lens.layers == ("embed", "0", "1", "2")
    assert lens.logits.shape == (4, 1, 7, VOCAB) and lens.logits.dtype == dtype
    # the same modules (ln_f, lm_head) on the same (1, 7, d) tensor: the same op sequence
    assert torch.equal(lens.logits[-1], logits) and torch.equal(lens.final, logits)
    assert lens.kl_to_final()[-1].abs().max() == 0
    assert lens.kl_to_final()[:-1].min() > 0  # earlier layers do differ


def test_a_row_is_the_final_norm_and_unembedding_of_the_recorded_stream() -> None:
    # against a float64 reference by hand: layer 1's output, LayerNorm, W_U
    model = tiny("gpt2")
    x = IDS[None]
    seen = []
    handle = model.transformer.h[1].hook_resid_post.register_forward_hook(
        lambda _m, _a, out: seen.append(out.detach())
    )
    with torch.no_grad():
        model(x)
    handle.remove()
    h = seen[0]
    ln = model.transformer.ln_f
    ref = torch.nn.functional.layer_norm(h, (32,), ln.weight, ln.bias, ln.eps)
    ref = ref @ model.lm_head.weight.T
    torch.testing.assert_close(logit_lens(model, x).logits[2], ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("norm_first", [False, True])
def test_an_encoder_decoders_decoder_side(norm_first: bool) -> None:
    torch.manual_seed(1)
    cfg = al.TransformerConfig(
        src_vocab_size=30, tgt_vocab_size=31, d_model=32, num_heads=4, num_encoder_layers=1,
        num_decoder_layers=2, d_ff=48, dropout=0.0, norm_first=norm_first, max_len=16,
    )  # fmt: skip
    model = al.Transformer(cfg).double().eval()
    src, tgt = torch.tensor([[4, 5, 6, 7]]), torch.tensor([[1, 8, 9]])
    lens = logit_lens(model, src, target_ids=tgt)
    with torch.no_grad():
        logits = model(src, tgt).logits
    assert lens.logits.shape == (3, 1, 3, 31)
    assert torch.equal(lens.logits[-1], logits)
    with pytest.raises(ArgumentError, match="target_ids"):
        logit_lens(model, src)


def test_bad_input_is_one_typed_error() -> None:
    model = tiny()
    with pytest.raises(ArgumentTypeError, match="GPT"):
        logit_lens(torch.nn.Linear(2, 2), IDS)
    with pytest.raises(ArgumentTypeError, match="integer"):
        logit_lens(model, IDS.double())
    with pytest.raises(ArgumentError, match="target_ids"):
        logit_lens(model, IDS, target_ids=IDS)


def test_top_and_first_top_and_json() -> None:
    lens = logit_lens(tiny(), IDS)
    probs, ids = lens.top(2)
    assert probs.shape == ids.shape == (4, 1, 7, 2) and bool((probs[..., 0] >= probs[..., 1]).all())
    final_top = int(lens.final[0, -1].argmax())
    first = lens.first_top(final_top)
    assert first is not None and first <= 3
    assert all(int(lens.logits[r, 0, -1].argmax()) != final_top for r in range(first))
    d = lens.to_dict(lambda i: f"<{i}>")
    cell = d["layers"][-1]["positions"][-1]
    assert cell["token"] == f"<{final_top}>" and cell["kl_bits"] == 0.0
    json.dumps(d)


@pytest.fixture(scope="module")
def trained() -> tuple[al.GPT, torch.Tensor, TunedLens]:
    model = tiny("llama", torch.float32, seed=3)
    data = torch.randint(0, VOCAB, (400,), generator=torch.Generator().manual_seed(0))
    lens = train_tuned_lens(model, data, steps=40, seq_len=12, batch_size=4, lr=1e-2)
    return model, data, lens


def test_the_tuned_lens_is_closer_to_the_output_than_the_logit_lens(trained) -> None:
    model, data, lens = trained
    held_out = data[-48:].view(4, 12)
    table = lens_comparison(model, held_out, lens)
    assert table.kl_tuned is not None and table.bits_tuned is not None
    # every layer but the last (the model's own output: 0 for both)
    assert bool((table.kl_tuned[:-1] < table.kl_logit[:-1]).all()), table.rows()
    assert table.kl_logit[-1] == 0 and table.kl_tuned[-1] == 0
    assert table.bits_logit[-1] == pytest.approx(table.bits_model, abs=1e-12)
    assert [r["layer"] for r in table.rows()] == ["embed", "0", "1", "2"]
    assert lens.config["trained"]["steps"] == 40
    # the model was not trained, and its parameters still take gradients
    assert all(p.requires_grad for p in model.parameters())


def test_an_identity_lens_is_the_logit_lens_and_leaves_the_logits(trained) -> None:
    model = trained[0]
    identity = TunedLens.for_model(model)
    tuned, plain = logit_lens(model, IDS, tuned=identity), logit_lens(model, IDS)
    assert tuned.lens == "tuned" and torch.equal(tuned.logits, plain.logits)
    assert torch.equal(tuned.logits[-1], tuned.final)  # no translator on the last row
    assert torch.equal(logit_lens(model, IDS, tuned=trained[2]).logits[-1], tuned.final)


def test_save_and_load_round_trip_exactly_and_refuse_another_model(trained, tmp_path) -> None:
    model, _, lens = trained
    lens.save(tmp_path / "lens")
    back = load_tuned_lens(tmp_path / "lens", model)
    assert back.config == json.loads(json.dumps(lens.config))
    for (k, a), (_, b) in zip(lens.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    assert torch.equal(
        logit_lens(model, IDS, tuned=back).logits, logit_lens(model, IDS, tuned=lens).logits
    )
    other = tiny("llama", torch.float32, seed=4)  # same shape, other weights
    with pytest.raises(ArgumentError, match="another model: its weights"):
        load_tuned_lens(tmp_path / "lens", other)
    with pytest.raises(ArgumentError, match="another model: its n_layer"):
        load_tuned_lens(
            tmp_path / "lens",
            al.GPT(al.GPTConfig(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=4)),
        )
    with pytest.raises(ArgumentError, match="not a tuned lens"):
        load_tuned_lens(tmp_path, model)
