"""Marian and BART read into attnlab's Transformer: tiny random-config parity with transformers'
MarianMTModel and BartForConditionalGeneration in float64 (logits, encoder / decoder / cross attention weights, gradients, with a
padded source), a round trip through a save_pretrained folder, cached decoding equal to
transformers' generate (greedy and beam), and bad input refused with typed errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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

V = 40
#: family → (its transformers config class, model class, pad, decoder start, eos, own options)
FAMILIES = {
    "marian": ("MarianConfig", "MarianMTModel", 39, 39, 0,
               {"activation_function": "swish", "scale_embedding": True}),
    "bart": ("BartConfig", "BartForConditionalGeneration", 1, 2, 2, {}),
}  # fmt: skip


def _hf(family: str) -> Any:
    config_class, model_class, pad, start, eos, own = FAMILIES[family]
    cfg = getattr(transformers, config_class)(
        vocab_size=V, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=64, pad_token_id=pad,
        decoder_start_token_id=start, eos_token_id=eos, forced_eos_token_id=None,
        dropout=0.0, attn_implementation="eager", **own,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = getattr(transformers, model_class)(cfg).double().eval()
    with torch.no_grad():  # nothing left at its initial value: norms, biases, the logits bias
        for name, p in hf.named_parameters():
            if "layer_norm" in name or "layernorm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.3)
        hf.final_logits_bias.normal_()
    hf.generation_config.forced_eos_token_id = None
    return hf


HF = {family: _hf(family) for family in FAMILIES}
MODELS = {family: transformer_from_hf(hf) for family, hf in HF.items()}
SRC = torch.tensor([[5, 9, 3, 7, 11, 4], [8, 3, 3, 12, 0, 0]])  # 0: the padding, set per family
TGT = torch.tensor([[0, 6, 22, 17, 9], [0, 13, 13, 4, 31]])  # 0: the decoder's start


def _ids(family: str) -> tuple[int, torch.Tensor, torch.Tensor]:
    """The family's pad id, a source padded with it, a target started from its start id."""
    _, _, pad, start, _, _ = FAMILIES[family]
    src = SRC.clone()
    src[1, 4:] = pad
    tgt = TGT.clone()
    tgt[:, 0] = start
    return pad, src, tgt


def _forward(family: str, model: al.Transformer) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    pad, src, tgt = _ids(family)
    with capture(model) as cache:
        logits = model(src, tgt, src_mask=masks.padding_mask(src, pad)).logits
    return logits, dict(cache.attentions)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_attention_weights_equal_transformers(family: str) -> None:
    pad, src, tgt = _ids(family)
    with torch.no_grad():
        ref = HF[family](input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=tgt,
                         output_attentions=True)  # fmt: skip
        logits, attn = _forward(family, MODELS[family])
    assert MODELS[family].config.family == family
    assert (logits - ref.logits).abs().max() <= 1e-10
    for kind, theirs_all in (
        ("encoder.layers.{}.self_attn", ref.encoder_attentions),
        ("decoder.layers.{}.self_attn", ref.decoder_attentions),
        ("decoder.layers.{}.cross_attn", ref.cross_attentions),
    ):
        for i, theirs in enumerate(theirs_all):
            ours = attn[kind.format(i)]
            assert (ours - theirs).abs().max() <= 1e-10, kind.format(i)


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_equal_transformers(family: str) -> None:
    hf, model = HF[family], transformer_from_hf(HF[family])
    pad, src, tgt = _ids(family)
    weight = tgt.roll(-1, 1).ne(5).unsqueeze(-1)
    hf.zero_grad()
    out = hf(input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=tgt)
    out.logits.pow(2).mul(weight).sum().backward()
    logits = model(src, tgt, src_mask=masks.padding_mask(src, pad)).logits
    logits.pow(2).mul(weight).sum().backward()
    theirs = dict(hf.named_parameters())
    pairs = [
        (model.src_embed.weight, theirs["model.shared.weight"]),
        (model.encoder.layers[0].ff.linear1.weight, theirs["model.encoder.layers.0.fc1.weight"]),
        (model.decoder.layers[1].norm2.weight,
         theirs["model.decoder.layers.1.encoder_attn_layer_norm.weight"]),
    ]  # fmt: skip
    if family == "bart":
        pairs.append((model.tgt_positions.weight, theirs["model.decoder.embed_positions.weight"]))
    assert model.lm_head.weight is model.src_embed.weight  # one tied matrix, one gradient
    for ours, hf_param in pairs:
        assert ours.grad is not None and hf_param.grad is not None
        # transformers' embedding has padding_idx: the pad row gets no gradient from lookups
        keep = torch.arange(len(ours)) != pad if ours.shape[0] == V else slice(None)
        assert (ours.grad[keep] - hf_param.grad[keep]).abs().max() <= 1e-10
    cross = model.decoder.layers[0].cross_attn.in_proj_weight.grad
    q = theirs["model.decoder.layers.0.encoder_attn.q_proj.weight"].grad
    assert cross is not None and q is not None and (cross[:16] - q).abs().max() <= 1e-10
    hf.zero_grad()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_folder_round_trips_both_ways(family: str, tmp_path: Path) -> None:
    hf, model = HF[family], MODELS[family]
    pad, src, tgt = _ids(family)
    save_transformer_hf(model, tmp_path / "ours")
    assert check_seq2seq_directory(tmp_path / "ours") == model.config
    back = transformer_from_hf(tmp_path / "ours")
    hf.save_pretrained(tmp_path / "theirs")
    theirs = transformer_from_hf(tmp_path / "theirs")
    again = type(hf).from_pretrained(tmp_path / "ours").double().eval()
    with torch.no_grad():
        want = _forward(family, model)[0]
        for other in (back, theirs):
            assert torch.equal(_forward(family, other)[0], want)
        got = again(input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=tgt)
    assert (got.logits - want).abs().max() <= 1e-10
    exported = transformer_to_hf(model)
    assert torch.equal(exported.final_logits_bias, hf.final_logits_bias)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("beams", [1, 3])
def test_cached_decoding_equals_transformers_generate(family: str, beams: int) -> None:
    pad, src, _ = _ids(family)
    ours = al.generate(
        MODELS[family], src, max_new_tokens=4, strategy="greedy" if beams == 1 else "beam",
        num_beams=beams, eos_token_id=[],
    )  # fmt: skip
    theirs = HF[family].generate(
        input_ids=src, attention_mask=(src != pad).long(), max_new_tokens=4, num_beams=beams,
        do_sample=False, eos_token_id=None, forced_eos_token_id=None,
    )  # fmt: skip
    assert torch.equal(ours, theirs)


def test_bad_input_is_a_typed_error_naming_the_argument(tmp_path: Path) -> None:
    save_transformer_hf(MODELS["bart"], tmp_path / "bart")
    config = HF["marian"].config.to_dict()
    with pytest.raises(ArgumentError, match="decoder_vocab_size"):
        al.models.seq2seq_hf.transformer_from_state({**config, "decoder_vocab_size": 7}, {})
    with pytest.raises(ArgumentError, match="decoder_attention_heads"):
        al.models.seq2seq_hf.transformer_from_state({**config, "decoder_attention_heads": 2}, {})
    with pytest.raises(ArgumentError, match=r"no tensor 'shared\.weight'"):
        al.models.seq2seq_hf.transformer_from_state(config, {})
    with pytest.raises(ArgumentTypeError, match="model must be an attnlab Transformer"):
        save_transformer_hf(HF["marian"], tmp_path)  # type: ignore[arg-type]
    own = al.Transformer(al.TransformerConfig(src_vocab_size=8, tgt_vocab_size=8, d_model=8,
                                              num_heads=2, d_ff=8))  # fmt: skip
    with pytest.raises(ArgumentError, match="family must be one of"):
        save_transformer_hf(own, tmp_path)
    with pytest.raises(ArgumentError, match="'bart' is an encoder-decoder, not a decoder"):
        al.GPT.from_hf(tmp_path / "bart")
    small = {"src_vocab_size": 8, "tgt_vocab_size": 8, "d_model": 8, "num_heads": 2, "d_ff": 8}
    for field, value, error in (
        ("positions", "rope", ArgumentError), ("position_offset", -1, ArgumentError),
        ("sinusoid_layout", "pairs", ArgumentError), ("family", 3, ArgumentTypeError),
        ("norm_embeddings", 1, ArgumentTypeError), ("activation", "tanh", ArgumentError),
    ):  # fmt: skip
        with pytest.raises(error, match=field):
            al.TransformerConfig(**small, **{field: value})
    with pytest.raises(ArgumentError, match="path must be a Hugging Face folder"):
        check_seq2seq_directory(tmp_path / "nowhere")
