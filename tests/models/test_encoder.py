"""attnlab's Encoder against transformers' BertModel, RobertaModel, DistilBertModel and
ElectraModel (embeddings narrower than the model, projected) on tiny
random weights in float64, with padding in the batch: every hidden state, every attention
weight, the pooler and every gradient (≤ 1e-10); folders both ways; the families' registration
and the encoder's typed errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import Encoder, EncoderConfig
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect import capture
from attnlab.models.encoder_hf import encoder_from_hf, save_encoder_hf
from attnlab.models.families import encoder_family_named, family_of, supported_model_types
from attnlab.models.pretrained import load_pretrained
from tests.models._encoders import padded_batch, tiny_hf

FAMILIES = ("bert", "roberta", "distilbert", "electra")
TOL = 1e-10


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request: pytest.FixtureRequest) -> tuple[str, Any, Encoder]:
    hf = tiny_hf(request.param)
    return request.param, hf, encoder_from_hf(hf)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def test_forward_hidden_states_attention_and_pooler_equal_transformers(
    pair: tuple[str, Any, Encoder],
) -> None:
    family, hf, model = pair
    ids, mask = padded_batch(hf.config.pad_token_id)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, output_attentions=True,
                 output_hidden_states=True)  # fmt: skip
        with capture(model) as cache:
            out = model(ids, mask, output_hidden_states=True)
    assert out.hidden_states is not None and len(out.hidden_states) == 3
    for ours, theirs in zip(out.hidden_states, ref.hidden_states, strict=True):
        assert _diff(ours, theirs) <= TOL
    for i, theirs in enumerate(ref.attentions):
        weights = cache.attentions[f"layers.{i}.self_attn"]
        assert _diff(weights, theirs) <= TOL
        assert float(weights[1, :, :, 4:].abs().max()) == 0.0  # padding is never attended
    if family in ("distilbert", "electra"):
        assert out.pooler_output is None
    else:
        assert _diff(out.pooler_output, ref.pooler_output) <= TOL


def test_gradients_equal_transformers(pair: tuple[str, Any, Encoder]) -> None:
    family, hf, model = pair
    ids, mask = padded_batch(hf.config.pad_token_id)
    g = torch.Generator().manual_seed(2)
    w = torch.randn(2, 7, 16, generator=g, dtype=torch.float64) * mask[..., None]
    hf.zero_grad()
    model.zero_grad()
    (hf(input_ids=ids, attention_mask=mask).last_hidden_state * w).sum().backward()
    (model(ids, mask).last_hidden_state * w).sum().backward()
    theirs = {n: p.grad for n, p in hf.named_parameters() if p.grad is not None}
    ours = encoder_family_named(family).state_from_hf(theirs, model.config)
    compared = 0
    for name, p in model.named_parameters():
        if name.startswith("pooler"):
            continue  # the pooler is not in the loss
        assert _diff(p.grad, ours[name]) <= TOL, name
        compared += 1
    assert compared == len([n for n, _ in model.named_parameters() if not n.startswith("pooler")])


def test_a_folder_round_trips_both_ways(pair: tuple[str, Any, Encoder], tmp_path: Path) -> None:
    import transformers

    _, hf, model = pair
    ids, mask = padded_batch(hf.config.pad_token_id)
    hf.save_pretrained(tmp_path / "theirs")
    loaded, tokenizer = load_pretrained(tmp_path / "theirs", dtype=torch.float64)
    assert isinstance(loaded, Encoder) and tokenizer is None
    assert loaded.config == model.config
    save_encoder_hf(model, tmp_path / "ours")
    back = transformers.AutoModel.from_pretrained(tmp_path / "ours").double().eval()
    assert type(back).__name__ == type(hf).__name__
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        assert _diff(loaded(ids, mask).last_hidden_state, want) <= 1e-6  # stored as float32
        assert _diff(back(input_ids=ids, attention_mask=mask).last_hidden_state, want) <= 1e-6
        assert _diff(model.to_hf()(input_ids=ids, attention_mask=mask).last_hidden_state, want) == 0


def test_roberta_positions_skip_padding() -> None:
    model = Encoder(EncoderConfig(vocab_size=10, n_positions=12, d_model=8, n_layer=1, n_head=2,
                                  d_ff=8, pad_id=1, position_offset=2, family="roberta"))  # fmt: skip
    ids = torch.tensor([[0, 5, 6, 2], [0, 5, 2, 1]])
    assert model.position_ids(ids).tolist() == [[2, 3, 4, 5], [2, 3, 4, 1]]


def test_encoder_families_are_registered_and_refused_as_decoders() -> None:
    assert {"bert", "roberta", "distilbert", "electra"} <= set(supported_model_types())
    with pytest.raises(ArgumentError, match="'bert' is an encoder"):
        family_of({"model_type": "bert"})


def test_bad_inputs_are_typed_errors_naming_the_argument(pair: tuple[str, Any, Encoder]) -> None:
    family, _, model = pair
    ids = torch.tensor([[4, 5, 6]])
    with pytest.raises(ArgumentTypeError, match="input_ids"):
        model(ids.float())
    with pytest.raises(ArgumentError, match="attention_mask must have the shape"):
        model(ids, torch.ones(1, 2, dtype=torch.long))
    with pytest.raises(ArgumentTypeError, match="attention_mask must hold 0/1"):
        model(ids, torch.ones(1, 3))
    with pytest.raises(ArgumentError, match="input_ids has 40 tokens"):
        model(torch.full((1, 40), 4))
    if family == "distilbert":
        with pytest.raises(ArgumentError, match="token_type_ids must be None"):
            model(ids, token_type_ids=torch.zeros_like(ids))
    with pytest.raises(ArgumentError, match="d_model = 10 must be divisible by n_head = 4"):
        EncoderConfig(vocab_size=5, d_model=10, n_head=4)
    with pytest.raises(ArgumentError, match="hidden_act must be 'gelu'"):
        encoder_family_named("bert").config_from_hf(
            {"model_type": "bert", "hidden_act": "relu", "vocab_size": 5, "hidden_size": 8,
             "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 8}
        )  # fmt: skip
