"""Marian read into attnlab's Transformer: tiny random-config parity with transformers'
MarianMTModel in float64 (logits, encoder / decoder / cross attention weights, gradients, with a
padded source), a round trip through a save_pretrained folder, cached decoding equal to
transformers' generate (greedy and beam), and bad input refused with typed errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnlab as al
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect import capture
from attnlab.models.seq2seq_hf import (
    check_seq2seq_directory,
    save_transformer_hf,
    transformer_from_hf,
    transformer_to_hf,
)
from attnlab.nn import masks

transformers = pytest.importorskip("transformers")

PAD, EOS, V = 39, 0, 40


def _hf() -> object:
    cfg = transformers.MarianConfig(
        vocab_size=V, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=64, pad_token_id=PAD,
        decoder_start_token_id=PAD, eos_token_id=EOS, forced_eos_token_id=None,
        activation_function="swish", scale_embedding=True, dropout=0.0,
        attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.MarianMTModel(cfg).double().eval()
    with torch.no_grad():  # nothing left at its initial value: norms, biases, the logits bias
        for name, p in hf.named_parameters():
            if "layer_norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.3)
        hf.final_logits_bias.normal_()
    hf.generation_config.forced_eos_token_id = None
    return hf


HF = _hf()
MODEL = transformer_from_hf(HF)
SRC = torch.tensor([[5, 9, 3, 7, 11, 4], [8, 3, 3, 12, PAD, PAD]])
TGT = torch.tensor([[PAD, 6, 2, 17, 9], [PAD, 13, 13, 4, 1]])


def _forward(model: al.Transformer) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    with capture(model) as cache:
        logits = model(SRC, TGT, src_mask=masks.padding_mask(SRC, PAD)).logits
    return logits, dict(cache.attentions)


def test_logits_and_attention_weights_equal_transformers() -> None:
    with torch.no_grad():
        ref = HF(input_ids=SRC, attention_mask=(SRC != PAD).long(), decoder_input_ids=TGT,
                 output_attentions=True)  # fmt: skip
        logits, attn = _forward(MODEL)
    assert MODEL.config.family == "marian" and MODEL.config.activation == "silu"
    assert (logits - ref.logits).abs().max() <= 1e-10
    for kind, theirs_all in (
        ("encoder.layers.{}.self_attn", ref.encoder_attentions),
        ("decoder.layers.{}.self_attn", ref.decoder_attentions),
        ("decoder.layers.{}.cross_attn", ref.cross_attentions),
    ):
        for i, theirs in enumerate(theirs_all):
            ours = attn[kind.format(i)]
            assert (ours - theirs).abs().max() <= 1e-10, kind.format(i)


def test_gradients_equal_transformers() -> None:
    hf, model = HF, transformer_from_hf(HF)
    hf.zero_grad()
    labels = TGT.roll(-1, 1)
    hf(input_ids=SRC, attention_mask=(SRC != PAD).long(), decoder_input_ids=TGT).logits.pow(2).mul(
        labels.ne(1).unsqueeze(-1)
    ).sum().backward()
    logits = model(SRC, TGT, src_mask=masks.padding_mask(SRC, PAD)).logits
    logits.pow(2).mul(labels.ne(1).unsqueeze(-1)).sum().backward()
    theirs = dict(hf.named_parameters())
    pairs = [
        (model.src_embed.weight, theirs["model.shared.weight"]),
        (model.encoder.layers[0].ff.linear1.weight, theirs["model.encoder.layers.0.fc1.weight"]),
        (model.decoder.layers[1].norm2.weight,
         theirs["model.decoder.layers.1.encoder_attn_layer_norm.weight"]),
    ]  # fmt: skip
    cross = model.decoder.layers[0].cross_attn.in_proj_weight.grad
    q = theirs["model.decoder.layers.0.encoder_attn.q_proj.weight"].grad
    assert cross is not None and q is not None and (cross[:16] - q).abs().max() <= 1e-10
    assert model.lm_head.weight is model.src_embed.weight  # one tied matrix, one gradient
    for ours, hf_param in pairs:
        assert ours.grad is not None and hf_param.grad is not None
        # transformers' embedding has padding_idx: the pad row gets no gradient from lookups
        keep = torch.arange(len(ours)) != PAD if ours.shape[0] == V else slice(None)
        assert (ours.grad[keep] - hf_param.grad[keep]).abs().max() <= 1e-10
    hf.zero_grad()


def test_a_folder_round_trips_both_ways(tmp_path: Path) -> None:
    save_transformer_hf(MODEL, tmp_path / "ours")
    assert check_seq2seq_directory(tmp_path / "ours") == MODEL.config
    back = transformer_from_hf(tmp_path / "ours")
    HF.save_pretrained(tmp_path / "theirs")
    theirs = transformer_from_hf(tmp_path / "theirs")
    again = transformers.MarianMTModel.from_pretrained(tmp_path / "ours").double().eval()
    with torch.no_grad():
        want = _forward(MODEL)[0]
        for other in (back, theirs):
            assert torch.equal(_forward(other)[0], want)
        got = again(input_ids=SRC, attention_mask=(SRC != PAD).long(), decoder_input_ids=TGT)
    assert (got.logits - want).abs().max() <= 1e-10
    exported = transformer_to_hf(MODEL)
    assert torch.equal(exported.final_logits_bias, HF.final_logits_bias)


@pytest.mark.parametrize("beams", [1, 3])
def test_cached_decoding_equals_transformers_generate(beams: int) -> None:
    ours = al.generate(
        MODEL, SRC, max_new_tokens=4, strategy="greedy" if beams == 1 else "beam",
        num_beams=beams, eos_token_id=[],
    )  # fmt: skip
    theirs = HF.generate(
        input_ids=SRC, attention_mask=(SRC != PAD).long(), max_new_tokens=4, num_beams=beams,
        do_sample=False, eos_token_id=None, forced_eos_token_id=None,
    )  # fmt: skip
    assert torch.equal(ours, theirs)


def test_bad_input_is_a_typed_error_naming_the_argument(tmp_path: Path) -> None:
    config = HF.config.to_dict()
    with pytest.raises(ArgumentError, match="decoder_vocab_size"):
        al.models.seq2seq_hf.transformer_from_state({**config, "decoder_vocab_size": 7}, {})
    with pytest.raises(ArgumentError, match="decoder_attention_heads"):
        al.models.seq2seq_hf.transformer_from_state({**config, "decoder_attention_heads": 2}, {})
    with pytest.raises(ArgumentError, match=r"no tensor 'shared\.weight'"):
        al.models.seq2seq_hf.transformer_from_state(config, {})
    with pytest.raises(ArgumentTypeError, match="model must be an attnlab Transformer"):
        save_transformer_hf(HF, tmp_path)  # type: ignore[arg-type]
    own = al.Transformer(al.TransformerConfig(src_vocab_size=8, tgt_vocab_size=8, d_model=8,
                                              num_heads=2, d_ff=8))  # fmt: skip
    with pytest.raises(ArgumentError, match="family must be one of"):
        save_transformer_hf(own, tmp_path)
    with pytest.raises(ArgumentError, match="path must be a Hugging Face folder"):
        check_seq2seq_directory(tmp_path / "nowhere")
