"""Locating the first module whose output holds a NaN/inf (``find_nonfinite``)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from attnlab import GPT, GPTConfig, Transformer, TransformerConfig
from attnlab.inspect import (
    NonFiniteOrigin,
    diagnose,
    diagnose_model,
    find_nonfinite,
    watch_nonfinite,
)


def _gpt() -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=50, n_positions=16, n_embd=32, n_layer=3, n_head=4)
    return GPT(cfg).eval()


def _no_hooks_left(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_healthy_model_gives_none() -> None:
    model = _gpt()
    x = torch.randint(0, 50, (2, 6))
    assert find_nonfinite(model, x) is None
    assert _no_hooks_left(model)
    # hook points are left alone: attention keeps its fast path (no weights are formed)
    with watch_nonfinite(model) as watch:
        assert not any(b.attn.hook_weights.active for b in model.transformer.h)
        out = model(x).logits
    assert watch.origin is None and torch.equal(out, model(x).logits)


def test_inf_in_one_c_attn_weight_names_that_c_attn() -> None:
    model = _gpt()
    x = torch.randint(0, 50, (2, 6))
    before = model(x).logits
    with torch.no_grad():
        model.transformer.h[1].attn.c_attn.weight[40, 7] = float("inf")  # a key weight
    origin = find_nonfinite(model, x)
    assert origin is not None
    assert origin.module == "transformer.h.1.attn.c_attn" and origin.module_type == "Linear"
    assert (origin.layer, origin.stack, origin.layer_name) == (1, "transformer.h", "layer 1")
    assert origin.seen_in is None and origin.tensor == "output" and origin.produced
    assert origin.shape == (2, 6, 96) and origin.index[2] == 40 and origin.index[:2] == (0, 0)
    assert origin.value in ("inf", "-inf") and origin.count == 12  # column 40 of every position
    assert origin.parameter == "transformer.h.1.attn.c_attn.weight"
    assert origin.parameter_index == (40, 7) and origin.parameter_value == "inf"
    text = str(origin)
    assert "\n" not in text
    assert text.startswith(
        f"{origin.value} first appears in the output of transformer.h.1.attn.c_attn"
    )
    assert "(Linear, layer 1) at index (0, 0, 40); made there (its inputs were finite)" in text
    assert text.endswith("its parameter transformer.h.1.attn.c_attn.weight holds inf at (40, 7)")
    d = origin.to_dict()
    assert d["layer_name"] == "layer 1" and d["index"] == [0, 0, 40]
    json.dumps(d, allow_nan=False)
    assert _no_hooks_left(model)
    # inspection changes nothing: layer 0 ran as before
    with torch.no_grad():
        model.transformer.h[1].attn.c_attn.weight[40, 7] = 0.0
    assert torch.equal(model(x).logits.isfinite(), before.isfinite())


def test_inf_in_an_embedding_row_names_wte() -> None:
    model = _gpt()
    x = torch.tensor([[3, 9, 4, 9], [1, 2, 3, 4]])
    with torch.no_grad():
        model.transformer.wte.weight[9, 5] = float("inf")
    origin = find_nonfinite(model, x)
    assert origin is not None and origin.module == "transformer.wte"
    assert origin.module_type == "Embedding" and origin.layer is None and origin.layer_name is None
    assert origin.index == (0, 1, 5) and origin.value == "inf"  # batch 0, position 1 holds token 9
    assert origin.count == 2 and origin.produced
    assert origin.parameter == "transformer.wte.weight" and origin.parameter_index == (9, 5)
    assert "(Embedding) at index (0, 1, 5)" in str(origin)


def test_nan_in_a_decoder_cross_attention_projection_names_that_module() -> None:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=20, tgt_vocab_size=20, d_model=16, num_heads=2, num_encoder_layers=2,
        num_decoder_layers=2, d_ff=32, max_len=16,
    )  # fmt: skip
    model = Transformer(cfg).eval()
    src, tgt = torch.randint(4, 20, (2, 5)), torch.randint(4, 20, (2, 4))
    assert find_nonfinite(model, src, tgt) is None
    # the key projection of decoder layer 1's cross-attention (rows d_model … 2·d_model)
    with torch.no_grad():
        model.decoder.layers[1].cross_attn.in_proj_weight[20, 3] = float("nan")
    origin = find_nonfinite(model, src, tgt)
    assert origin is not None
    assert origin.module == "decoder.layers.1.cross_attn"
    assert origin.module_type == "MultiHeadAttention" and origin.layer_name == "decoder layer 1"
    assert (origin.layer, origin.stack) == (1, "decoder.layers") and origin.produced
    # attention projects with its own in_proj_weight: the value is first seen entering out_proj
    assert origin.seen_in == "decoder.layers.1.cross_attn.out_proj" and origin.tensor == "input[0]"
    assert origin.value == "nan" and origin.shape == (2, 4, 16) and origin.index == (0, 0, 0)
    assert origin.parameter == "decoder.layers.1.cross_attn.in_proj_weight"
    assert origin.parameter_index == (20, 3)
    assert str(origin).startswith(
        "nan first appears in decoder.layers.1.cross_attn (MultiHeadAttention, decoder layer 1), "
        "made by its own forward (its inputs were finite): seen in the input[0] of "
        "decoder.layers.1.cross_attn.out_proj at index (0, 0, 0)"
    )
    # a Linear inside cross-attention is named itself
    with torch.no_grad():
        model.decoder.layers[1].cross_attn.in_proj_weight[20, 3] = 0.0
        model.decoder.layers[1].cross_attn.out_proj.weight[2, 2] = float("nan")
    origin = find_nonfinite(model, src, tgt)
    assert origin is not None and origin.module == "decoder.layers.1.cross_attn.out_proj"
    assert origin.seen_in is None and origin.index == (0, 0, 2)
    # and an encoder layer reads as such
    with torch.no_grad():
        model.decoder.layers[1].cross_attn.out_proj.weight[2, 2] = 0.0
        model.encoder.layers[0].ff.linear1.bias[0] = float("-inf")
    origin = find_nonfinite(model, src, tgt)
    assert origin is not None and origin.module == "encoder.layers.0.ff.linear1"
    assert origin.layer_name == "encoder layer 0" and origin.value == "-inf"


@dataclass
class _Out:
    hidden: torch.Tensor
    extra: tuple[torch.Tensor, ...]


class _Parts(nn.Module):
    """Outputs of every shape: a dataclass holding a tuple; a module whose input is already bad."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x: torch.Tensor) -> _Out:
        h = self.a(x)
        return _Out(hidden=h, extra=(h * self.scale, self.b(h)))


def test_outputs_are_looked_into_and_inherited_values_are_told_apart() -> None:
    model = _Parts()
    x = torch.randn(2, 3, 4)
    model.scale[1] = float("inf")
    origin = find_nonfinite(model, x)
    assert origin is not None and origin.module == "" and origin.module_type == "_Parts"
    assert origin.tensor == "output.extra[0]" and origin.seen_in is None and origin.produced
    assert origin.parameter == "scale" and origin.parameter_index == (1,)
    assert "of the model itself (_Parts)" in str(origin)
    # a non-finite model input: the first module is named, as having inherited it
    model.scale[1] = 1.0
    x[1, 2, 0] = float("nan")
    origin = find_nonfinite(model, x)
    assert origin is not None and origin.module == "a" and not origin.produced
    assert origin.index == (1, 2, 0) and "inherited from the model's inputs" in str(origin)
    assert origin.parameter is None


def test_hooks_are_removed_when_forward_raises() -> None:
    model = _gpt()
    with pytest.raises(ValueError):
        find_nonfinite(model, torch.randint(0, 50, (1, 40)))  # longer than n_positions
    assert _no_hooks_left(model)
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module, got int"):
        with watch_nonfinite(3):  # type: ignore[arg-type]
            pass


def test_diagnose_model_reports_the_origin() -> None:
    model = _gpt()
    x = torch.randint(0, 50, (1, 5))
    with torch.no_grad():
        model.transformer.h[2].mlp.c_fc.weight[0, 0] = float("nan")
    _, report = diagnose_model(model, x)
    assert isinstance(report.origin, NonFiniteOrigin) and not report.ok
    assert report.origin.module == "transformer.h.2.mlp.c_fc"
    assert report.problems()[0].startswith("first non-finite output: nan first appears in the ")
    d = report.to_dict()
    assert d["origin"]["module"] == "transformer.h.2.mlp.c_fc" and d["ok"] is False
    json.dumps(d, allow_nan=False)
    # the attention weights themselves are fine: only the last layer's MLP went bad
    assert report.first_nonfinite is None
    # a captured run: watch during capture, hand the origin to diagnose
    from attnlab.inspect import capture

    with torch.no_grad(), capture(model) as cache, watch_nonfinite(model) as watch:
        model(x)
    assert diagnose(cache, origin=watch.origin).origin == report.origin
    assert _no_hooks_left(model)
