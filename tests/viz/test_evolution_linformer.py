"""Attention during training of a Linformer encoder (issue 12): the probe history keeps the
``T × k`` weights over the projected ``E·K`` rows and the effective weights ``A · F`` of every
step; its figures and its step-slider viewer show them as the viewer of a trained model does."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab import Transformer, TransformerConfig
from attnlab.inspect import capture
from attnlab.viz.evolution import attention_evolution, head_entropy_curves
from attnlab.viz.evolution_viewer import viewer_data_from_history
from attnlab.viz.probe_history import ProbeHistory
from attnlab.viz.viewer import viewer_data, write_viewer

# the Chromium fixture and page helpers of the viewer's browser tests
from tests.viz.test_viewer import _canvas_hash, _hover, _open, browser  # noqa: F401

K = 6
SOURCE = ["t", "h", "e", "c", "a", "t", "</s>", "<pad>"]  # 8 positions, the last padding
TARGET = ["<bos>", "t", "a", "c"]
ENCODER = ("encoder.layers.0.self_attn", "encoder.layers.1.self_attn")
ROWS = f"E·K rows (k = {K})"
STEPS = [0, 4, 8]


@pytest.fixture(scope="module")
def recorded():
    """A Linformer encoder-decoder trained a few SGD steps, its probe captured at ``STEPS``."""
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=30, tgt_vocab_size=30, d_model=32, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=1, d_ff=64, dropout=0.0, max_len=24, attention="linformer",
        linformer_k=K, bos_id=1, eos_id=2,
    )  # fmt: skip
    model = Transformer(cfg)
    src = torch.tensor([[5, 6, 7, 8, 9, 5, 2, 0]])  # pad_id 0 at the end
    tgt_in, targets = torch.tensor([[1, 5, 9, 8]]), torch.tensor([[5, 9, 8, 2]])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    history = ProbeHistory.new(source=SOURCE, target=TARGET)
    caches = []
    for step in range(STEPS[-1] + 1):
        if step in STEPS:
            model.eval()
            with torch.no_grad(), capture(model) as cache:
                model(src, tgt_in)
            history.record(step, cache.attentions, cache.kinds, projected=cache.projected)
            caches.append(cache)
        model.train()
        model(src, tgt_in, targets=targets).loss.backward()
        opt.step()
        opt.zero_grad()
    return history, caches


def test_the_history_keeps_the_projected_rows_and_the_effective_weights(recorded) -> None:
    history, caches = recorded
    assert history.steps == STEPS
    assert history.sequences[ROWS] == [f"E·K row {j}" for j in range(K)]
    assert history.projected == {n: ("linformer", "source") for n in ENCODER}
    for name in ENCODER:
        assert history.layer_sequences[name] == ("source", ROWS)
        assert history.tokens(name) == (SOURCE, history.sequences[ROWS])
        assert history.attentions[name].shape == (3, 4, 8, K)
        assert history.effective[name].shape == (3, 4, 8, 8)
        for s, cache in enumerate(caches):
            torch.testing.assert_close(history.attentions[name][s], cache.attentions[name][0])
            torch.testing.assert_close(
                history.effective[name][s], cache.effective_weights(name)[0], rtol=0, atol=0
            )
        eff = history.effective[name]
        assert (eff < 0).any() and torch.all(eff[..., 7] == 0)  # signed; the padding gives nothing
        # F is trained too: the effective weights change with the step
        assert not torch.equal(eff[0], eff[-1])
    # the decoder's layers are as before: token × token, no projection
    assert history.layer_sequences["decoder.layers.0.cross_attn"] == ("target", "source")
    assert "decoder.layers.0.self_attn" not in history.projected
    assert set(history.effective) == set(ENCODER)


def test_the_history_round_trips_and_checks_the_projection(recorded, tmp_path) -> None:
    history, caches = recorded
    back = ProbeHistory.load(history.save(tmp_path / "probe.pt"))
    assert back.projected == history.projected and back.sequences == history.sequences
    for name in ENCODER:
        torch.testing.assert_close(back.effective[name], history.effective[name])
    # a history saved before projected and effective existed still loads
    state = history.state_dict()
    for name in ("projected", "effective"):
        del state[name]
    state["attentions"] = {n: w for n, w in state["attentions"].items() if n not in ENCODER}
    state["layer_sequences"] = {
        n: v for n, v in state["layer_sequences"].items() if n not in ENCODER
    }
    assert ProbeHistory.from_state_dict(state).projected == {}
    # the T × k weights without their projection: the error says what is missing
    plain = ProbeHistory.new(source=SOURCE, target=TARGET)
    with pytest.raises(ValueError, match=r"\(T_q, T_k\) = \(8, 8\).*projected=cache.projected"):
        plain.record(0, caches[0].attentions, caches[0].kinds)
    # the same projected layers at every step
    h = ProbeHistory.new(source=SOURCE, target=TARGET)
    h.record(0, caches[0].attentions, caches[0].kinds, projected=caches[0].projected)
    with pytest.raises(ValueError, match="projected must name the same layers at every step"):
        h.record(1, caches[1].attentions, caches[1].kinds, projected={})


def _state(recorded, **changes):
    state = recorded[0].state_dict()
    state.update(changes)
    return state


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"projected": 3}, TypeError, "projected must be a mapping, got int"),
        ({"projected": {ENCODER[0]: "ab"}}, TypeError,
         r"projected\['encoder.layers.0.self_attn'\] must be a list"),
        ({"projected": {ENCODER[0]: ["linformer"]}}, ValueError,
         r"must be a \(method, token sequence\) pair"),
        ({"projected": {"nope": ["linformer", "source"]}}, ValueError,
         "projected names layer 'nope'"),
        ({"projected": {ENCODER[0]: ["linformer", "nope"]}}, ValueError, "names sequence 'nope'"),
        ({"effective": [1]}, TypeError, "effective must be a mapping, got list"),
        ({"effective": {"decoder.layers.0.self_attn": torch.zeros(3, 4, 4, 4)}}, ValueError,
         "need its projection"),
        ({"effective": {ENCODER[0]: torch.zeros(3, 4, 8, 7)}}, ValueError,
         r"must be \(S, H, T_q, T_tok\) = \(3, 4, 8, 8\), got \(3, 4, 8, 7\)"),
    ],
    ids=["projected-int", "pair-str", "pair-short", "unknown-layer", "unknown-sequence",
         "effective-list", "effective-unprojected", "effective-shape"],
)  # fmt: skip
def test_a_crafted_state_names_the_entry(recorded, changes, error, message) -> None:
    state = _state(recorded, **changes)
    if "projected" in changes and isinstance(changes["projected"], dict):
        state["effective"] = {}
    with pytest.raises(error, match=message):
        ProbeHistory.from_state_dict(state)


def test_the_figures_draw_the_rows_of_e_k(recorded, tmp_path) -> None:
    history, _ = recorded
    plot = attention_evolution(history, layer=ENCODER[1])
    np.testing.assert_array_equal(plot.data["weights"], history.attentions[ENCODER[1]].numpy())
    panel = plot.figure.axes[len(STEPS) * 4 - 4]  # the bottom row, head 0
    assert [t.get_text() for t in panel.get_xticklabels()] == history.sequences[ROWS]
    assert f"the k = {K} rows of E·K across" in plot.figure.get_suptitle()
    curves = head_entropy_curves(history)
    layers = list(curves.data["layers"])
    i = layers.index(ENCODER[0])
    assert curves.data["uniform"][i] == pytest.approx(np.log(K))  # uniform over the k rows
    assert f"over k = {K} E·K rows" in curves.figure.axes[i].get_title()
    plot.save(tmp_path / "evolution.png")
    curves.save(tmp_path / "entropy.png")


def test_viewer_data_from_history_matches_the_viewer_of_a_capture(recorded) -> None:
    history, caches = recorded
    data = viewer_data_from_history(history)
    once = viewer_data(
        caches[-1].attentions, source=SOURCE, target=TARGET, kinds=caches[-1].kinds,
        projected=caches[-1].projected,
    )  # fmt: skip
    # the same groups, names, sequences and note as the viewer of a trained model
    names = [g.name for g in data.groups]
    assert names == [g.name for g in once.groups]
    assert names == [
        f"encoder self-attention (Linformer, k = {K})",
        "decoder self-attention",
        "decoder cross-attention",
    ]
    assert data.sequences == once.sequences
    lin, ref = data.groups[0], once.groups[0]
    assert (lin.query, lin.key, lin.projected_from, lin.note) == (
        ref.query, ref.key, ref.projected_from, ref.note,
    )  # fmt: skip
    assert [layer.name for layer in lin.layers] == list(ENCODER)
    for layer, one in zip(lin.layers, ref.layers):
        assert layer.mask is None and layer.weights.shape == (3, 4, 8, K)
        np.testing.assert_array_equal(layer.weights[-1], one.weights)
        np.testing.assert_array_equal(layer.effective[-1], one.effective)
        np.testing.assert_array_equal(layer.effective, history.effective[layer.name].numpy())
    payload = data.to_json()
    assert payload["steps"] == STEPS and payload["groups"][0]["projected_from"] == "source"


def test_the_step_slider_viewer_in_chromium(browser, recorded, tmp_path) -> None:  # noqa: F811
    history, _ = recorded
    data = viewer_data_from_history(history, title="Linformer encoder during training")
    page, errors, requests = _open(browser, write_viewer(data, tmp_path / "steps.html"))
    api = "window.attnlabViewer"
    assert page.locator("#step-row").is_visible()
    assert page.locator("#groups button").first.inner_text() == (
        f"encoder self-attention (Linformer, k = {K})"
    )
    page.locator("#groups button").first.click()  # the page opens on the cross-attention
    assert f"keys projected to k = {K} rows (Linformer)" in page.locator("#note").inner_text()
    assert page.locator(".view-btn", has_text="lines").is_disabled()
    assert page.evaluate(f"{api}.drawn")["columns"] == history.sequences[ROWS]
    page.locator("#layers button", has_text="1").click()
    page.locator("#heads button", has_text="3").click()
    w = history.attentions[ENCODER[1]]
    for i, j in ((0, 0), (6, 5)):
        qi, kj, value, text = _hover(page, i, j)
        assert (qi, kj) == (i, j) and value == pytest.approx(float(w[-1, 3, i, j]), rel=1e-6)
        assert f"E·K row {j} (a mix of all positions, not a token)" in text
        assert f"training step {STEPS[-1]}" in text
    # the effective weights A·F, at the first step and then the second
    page.locator(".mode-btn", has_text="effective").click()
    drawn = page.evaluate(f"{api}.drawn")
    assert (drawn["mode"], drawn["cols"], drawn["columns"]) == ("effective", 8, SOURCE)
    slider = page.locator("#step")
    slider.focus()
    page.keyboard.press("Home")
    first = _canvas_hash(page)
    eff = history.effective[ENCODER[1]]
    for s in (0, 1):
        if s:
            slider.focus()
            page.keyboard.press("ArrowRight")
            assert _canvas_hash(page) != first
        for i, j in ((2, 1), (5, 4), (3, 7)):
            qi, kj, value, text = _hover(page, i, j)
            assert (qi, kj) == (i, j)
            assert value == pytest.approx(float(eff[s, 3, i, j]), rel=1e-6, abs=1e-12)
            assert page.locator("#tip").get_attribute("data-step") == str(STEPS[s])
            assert "effective weight (A·F)" in text
    assert "blue < 0 < red" in page.locator("#info").inner_text()
    shot = Path(os.environ.get("ATTNLAB_SHOT_DIR", tmp_path)) / "viewer_steps_linformer.png"
    page.screenshot(path=str(shot), full_page=True)
    # the decoder's groups are token × token, with lines, at the same step
    page.locator("#groups button", has_text="cross").click()
    assert not page.locator(".view-btn", has_text="lines").is_disabled()
    assert not page.locator("#note").is_visible()
    assert errors == [] and requests == []
    page.close()
