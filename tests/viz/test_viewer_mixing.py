"""The viewer's method switch (attnlab.viz.viewer_mixing): the page embeds exactly what
attnlab.inspect.mixing computed, per head where the method has heads, else one matrix per layer
(rolled-out methods: the product up to each layer); an encoder-decoder's encoder only."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
import torch

import attnlab as al
from attnlab.errors import ArgumentError
from attnlab.inspect import capture
from attnlab.inspect.mixing import mixing
from attnlab.viz.viewer import AttentionLayer, ViewerData, render_viewer, viewer_data
from attnlab.viz.viewer_mixing import METHODS, MixingView, add_mixing, page_factor

#: what the page shows of each method: the Mixing field, and whether per head
SOURCE = {
    "norm": ("per_head", True),
    "norm_residual": ("per_layer", False),
    "value_zeroing": ("per_layer", False),
    "rollout": ("cumulative", False),
    "alti": ("cumulative", False),
    "grad_weights": ("cumulative", False),
}


def gpt() -> al.GPT:
    torch.manual_seed(0)  # float32, as the page stores: equality is exact
    cfg = al.GPTConfig(vocab_size=30, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                       num_kv_heads=2, positions="rope")  # fmt: skip
    model = al.GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model


def page_json(data: ViewerData) -> dict:
    html = render_viewer(data)
    m = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', html, re.S)
    assert m
    return json.loads(m.group(1))


def gpt_page(t: int) -> tuple[al.GPT, torch.Tensor, ViewerData]:
    """The tiny GPT, ``t`` random tokens, and the page of its weights (no method yet)."""
    model = gpt()
    ids = torch.randint(0, 30, (1, t))
    with torch.no_grad(), capture(model) as cache:
        model(ids)
    return model, ids, viewer_data(cache.attentions, tokens=list("abcdefgh"[:t]))


def decode(entry: dict, t_q: int, t_k: int) -> np.ndarray:
    a = np.frombuffer(base64.b64decode(entry["values"]), dtype="<f4")
    return a.reshape(entry["heads"], t_q, t_k)


def test_the_page_embeds_mixings_tensors_exactly() -> None:
    model, ids, data = gpt_page(6)
    methods = [m for m in METHODS if m != "weights"]
    page = page_json(add_mixing(data, model, ids, methods))
    shown = {m["name"]: m for m in page["methods"]}
    assert list(shown) == methods  # weights is the page's own data, not a method entry
    assert shown["alti"]["meaning"] == "ALTI contribution (Ferrando et al. 2022)"
    assert shown["norm"]["meaning"] == "‖α_ij f(x_j)‖ (Kobayashi et al. 2020)"
    assert shown["rollout"]["scope"] == "through" and shown["norm"]["scope"] == "head"
    assert not any(m["signed"] for m in shown.values())  # every one of these is ≥ 0
    layers = page["groups"][0]["layers"]
    # the weights the page always had are mixing's "weights", per head
    ref = mixing(model, ids, "weights", heads=True).per_head
    for li, layer in enumerate(layers):
        w = np.frombuffer(base64.b64decode(layer["weights"]), "<f4").reshape(4, 6, 6)
        assert np.array_equal(w, ref[li, 0].numpy())
    for name, (field, per_head) in SOURCE.items():
        mix = mixing(model, ids, name, heads=per_head)
        expected = getattr(mix, field)
        assert [layer["name"] for layer in layers] == mix.layers
        for li, layer in enumerate(layers):
            got = decode(layer["mixing"][name], 6, 6)
            want = expected[li, 0] if per_head else expected[li, 0][None]
            assert got.shape == ((4,) if per_head else (1,)) + (6, 6), name
            assert np.array_equal(got, want.numpy()), name
    # the rolled-out methods' last layer is the total through every layer
    last = decode(layers[-1]["mixing"]["alti"], 6, 6)[0]
    assert np.array_equal(last, mixing(model, ids, "alti").total[0].numpy())


def test_an_encoder_decoder_shows_its_encoders_methods_only() -> None:
    torch.manual_seed(1)
    cfg = al.TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, num_heads=2,
                               num_encoder_layers=2, num_decoder_layers=1, d_ff=32, max_len=16)  # fmt: skip
    model = al.Transformer(cfg).eval()
    src, tgt = torch.randint(3, 20, (1, 5)), torch.randint(3, 20, (1, 4))
    with torch.no_grad(), capture(model) as cache:
        model(src, tgt)
    data = viewer_data(
        cache.attentions, source=list("abcde"), target=list("wxyz"), kinds=cache.kinds
    )
    page = page_json(add_mixing(data, model, src, ["alti", "norm"], layers="encoder.", tgt_in=tgt))
    groups = {g["name"]: g for g in page["groups"]}
    rolled = mixing(model, src, "alti", layers="encoder.", tgt_in=tgt).cumulative
    for li, layer in enumerate(groups["encoder self-attention"]["layers"]):
        assert np.array_equal(
            decode(layer["mixing"]["alti"], 5, 5)[0], rolled[li, 0].detach().numpy()
        )
    for name in ("decoder self-attention", "decoder cross-attention"):
        assert all(layer["mixing"] == {} for layer in groups[name]["layers"])
    # without a stack the cross-attention is refused in one line, naming layers=
    with pytest.raises(ArgumentError, match="choose one stack with layers="):
        add_mixing(data, model, src, ["rollout"], tgt_in=tgt)
    with pytest.raises(ArgumentError, match="encoder-decoder's encoder layers"):
        add_mixing(data, model, src, ["grad_weights"], layers="encoder.", tgt_in=tgt)


def test_bad_methods_and_shapes_are_one_line_errors() -> None:
    model, ids, data = gpt_page(4)
    with pytest.raises(ArgumentError, match="method must be one of weights, rollout"):
        add_mixing(data, model, ids, ["nope"])
    with pytest.raises(ArgumentError, match="no matrix per layer"):
        add_mixing(data, model, ids, "flow")
    w = np.full((4, 4, 4), 0.25, dtype=np.float32)
    with pytest.raises(ArgumentError, match=r"must be \(H or 1, T_q, T_k\)"):
        ViewerData("t", {"tokens": list("abcd")}, [al.viz.viewer.AttentionGroup(
            "g", "tokens", "tokens", [AttentionLayer("l", w, mixing={"norm": w[:2]})])],
            methods=[MixingView("norm", "norm", "n", "head")])  # fmt: skip
    with pytest.raises(ArgumentError, match="not in methods"):
        ViewerData("t", {"tokens": list("abcd")}, [al.viz.viewer.AttentionGroup(
            "g", "tokens", "tokens", [AttentionLayer("l", w, mixing={"norm": w})])])  # fmt: skip


def test_page_factor_counts_heads_and_layers() -> None:
    assert page_factor([], 9) == 1.0
    assert page_factor(["norm"], 9) == 2.0
    assert page_factor(["alti", "rollout", "weights"], 4) == 1.5
    every = [m for m in METHODS if m != "weights"]
    assert page_factor(every, 9) == pytest.approx(2 + 5 / 9)  # SmolLM2: about 2.6×
