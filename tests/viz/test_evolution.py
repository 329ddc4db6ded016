"""Attention during training: the probe history, its figures and its viewer data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlab as al
from attnlab.viz.evolution import attention_evolution, head_entropy_curves, row_entropy
from attnlab.viz.evolution_viewer import viewer_data_from_history
from attnlab.viz.probe_history import ProbeHistory
from tests.viz.histories import GPT_WORDS, SOURCE, TARGET, gpt_history, seq2seq_history


def _panels(plot):
    return [ax for ax in plot.figure.axes if ax.images and ax.get_label() != "<colorbar>"]


def test_history_from_capture_of_a_real_model():
    torch.manual_seed(0)
    model = al.GPT(al.GPTConfig(vocab_size=30, n_positions=16, n_embd=16, n_layer=2, n_head=2))
    ids = torch.randint(0, 30, (1, 6))
    history = ProbeHistory.new(tokens=list("abcdef"))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(4):
        model.eval()
        with torch.no_grad(), al.inspect.capture(model) as cache:
            model(ids)
        history.record(step * 10, cache.attentions, cache.kinds)
        model.train()
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    assert history.steps == [0, 10, 20, 30]
    assert history.layers == ["transformer.h.0.attn", "transformer.h.1.attn"]
    assert history.attentions["transformer.h.1.attn"].shape == (4, 2, 6, 6)
    assert history.layer_sequences["transformer.h.0.attn"] == ("tokens", "tokens")
    assert history.kinds == {"transformer.h.0.attn": "self", "transformer.h.1.attn": "self"}
    np.testing.assert_array_equal(
        history.attentions["transformer.h.1.attn"][-1].numpy(),
        cache.attentions["transformer.h.1.attn"][0].numpy(),
    )


def test_history_sequences_of_an_encoder_decoder():
    h = seq2seq_history()
    assert h.layer_sequences == {
        "encoder.layers.0.self_attn": ("source", "source"),
        "decoder.layers.0.self_attn": ("target", "target"),
        "decoder.layers.0.cross_attn": ("target", "source"),
    }
    assert h.tokens("decoder.layers.0.cross_attn") == (TARGET, SOURCE)


def test_history_checks_and_save_load(tmp_path):
    h = gpt_history([0, 10])
    t = len(GPT_WORDS)
    ok = {n: torch.full((4, t, t), 1.0 / t) for n in h.attentions}
    with pytest.raises(ValueError, match="step must be larger than the last recorded 10, got 10"):
        h.record(10, ok)
    with pytest.raises(ValueError, match="the same layers at every step"):
        h.record(20, {"transformer.h.0.attn": ok["transformer.h.0.attn"]})
    with pytest.raises(ValueError, match=r"must have \(T_q, T_k\) = \(10, 10\)"):
        h.record(20, {n: torch.full((4, 3, 3), 1 / 3) for n in h.attentions})
    with pytest.raises(ValueError, match="has 2 heads, recorded 4"):
        h.record(20, {n: torch.full((2, t, t), 1.0 / t) for n in h.attentions})
    with pytest.raises(ValueError, match="strictly ascending"):
        ProbeHistory([5, 1], {}, {}, {"tokens": ["a"]}, {})
    with pytest.raises(ValueError, match=r"must be \(S, H, T_q, T_k\) = \(1, H, 2, 2\)"):
        ProbeHistory(
            [0],
            {"l": torch.ones(2, 1, 2, 2)},
            {"l": "self"},
            {"tokens": ["a", "b"]},
            {"l": ("tokens", "tokens")},
        )
    with pytest.raises(ValueError, match="pass tokens"):
        ProbeHistory.new()
    h.record(20, ok)
    assert h.steps == [0, 10, 20]
    back = ProbeHistory.load(h.save(tmp_path / "probe.pt"))
    assert back.steps == h.steps and back.layer_sequences == h.layer_sequences
    for n in h.attentions:
        torch.testing.assert_close(back.attentions[n], h.attentions[n])
    again = ProbeHistory.from_records(
        h.steps, [{n: w[s] for n, w in h.attentions.items()} for s in range(3)], tokens=GPT_WORDS
    )
    torch.testing.assert_close(
        again.attentions["transformer.h.1.attn"], h.attentions["transformer.h.1.attn"]
    )


def test_attention_evolution_draws_the_recorded_weights(tmp_path):
    h = gpt_history()  # 7 steps
    plot = attention_evolution(h, layer="transformer.h.0.attn", max_steps=4)
    idx = plot.data["step_index"]
    assert idx[0] == 0 and idx[-1] == len(h.steps) - 1 and len(idx) == 4
    assert plot.data["steps"].tolist() == [h.steps[i] for i in idx]
    np.testing.assert_array_equal(
        plot.data["weights"], h.attentions["transformer.h.0.attn"].numpy()[idx]
    )
    panels = _panels(plot)
    assert len(panels) == 4 * 4
    # the image of each panel holds exactly the weights of its step and head
    for r, s in enumerate(idx):
        for hd in range(4):
            drawn = np.ma.getdata(panels[r * 4 + hd].images[0].get_array())
            np.testing.assert_array_equal(
                drawn, h.attentions["transformer.h.0.attn"][s, hd].numpy()
            )
    assert [t.get_text() for t in panels[0].get_yticklabels()] == GPT_WORDS
    assert [t.get_text() for t in panels[-1].get_xticklabels()] == GPT_WORDS
    assert panels[0].get_ylabel() == "step 0" and panels[-4].get_ylabel() == f"step {h.steps[-1]}"
    colorbars = [ax for ax in plot.figure.axes if ax.get_label() == "<colorbar>"]
    assert len(colorbars) == 1 and colorbars[0].get_ylabel() == "weight"
    title = plot.figure.get_suptitle()
    assert f"from step 0 to step {h.steps[-1]}" in title
    assert plot.save(tmp_path / "evolution.png").stat().st_size > 1000
    # all steps when there are few; bad arguments are named
    assert len(attention_evolution(h, max_steps=10).data["steps"]) == len(h.steps)
    with pytest.raises(ValueError, match="max_steps must be at least 2"):
        attention_evolution(h, max_steps=1)
    with pytest.raises(ValueError, match="layer must be a recorded layer"):
        attention_evolution(h, layer="nope")


def test_attention_evolution_defaults_to_the_last_cross_attention_layer():
    h = seq2seq_history()
    plot = attention_evolution(h)
    assert "decoder.layers.0.cross_attn" in plot.figure.get_suptitle()
    np.testing.assert_array_equal(
        plot.data["weights"], h.attentions["decoder.layers.0.cross_attn"].numpy()
    )
    panels = _panels(plot)
    assert [t.get_text() for t in panels[0].get_yticklabels()] == TARGET
    assert [t.get_text() for t in panels[-1].get_xticklabels()] == SOURCE
    # without cross-attention: the last layer
    assert "transformer.h.1.attn" in attention_evolution(gpt_history()).figure.get_suptitle()


def test_row_entropy():
    w = torch.tensor(
        [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]
    )  # the last row sees nothing
    assert row_entropy(w) == pytest.approx((0 + np.log(2)) / 2)
    assert row_entropy(torch.full((4, 4), 0.25)) == pytest.approx(np.log(4))
    assert np.isnan(row_entropy(torch.zeros(2, 2)))


def test_head_entropy_curves_data_and_separation(tmp_path):
    h = gpt_history()
    plot = head_entropy_curves(h)
    ent = plot.data["entropy"]  # (L, S, H)
    assert ent.shape == (2, len(h.steps), 4)
    w = h.attentions["transformer.h.1.attn"].double()
    manual = -(torch.where(w > 0, w * w.log(), torch.zeros(()))).sum(-1).mean(-1)  # (S, H)
    np.testing.assert_allclose(ent[1], manual.numpy(), rtol=1e-5)
    # at step 0 the heads are close to uniform; by the end they have separated
    uniform = np.mean(np.log(np.arange(1, len(GPT_WORDS) + 1)))
    assert plot.data["uniform"][0] == pytest.approx(uniform)
    assert np.ptp(ent[0, 0]) < 0.1 and np.ptp(ent[0, -1]) > 1.0
    ax = plot.figure.axes[0]
    assert len([ln for ln in ax.get_lines() if ln.get_label().startswith("head")]) == 4
    np.testing.assert_array_equal(ax.get_lines()[2].get_ydata(), ent[0, :, 2])
    assert plot.save(tmp_path / "entropy.png").stat().st_size > 1000
    # a chosen subset, and layers of different heads / lengths
    one = head_entropy_curves(h, layers=["transformer.h.1.attn"])
    np.testing.assert_array_equal(one.data["entropy"][0], ent[1])
    s2s = head_entropy_curves(seq2seq_history())
    assert s2s.data["entropy"].shape == (3, 5, 2)
    with pytest.raises(ValueError, match="layers must be a recorded layer"):
        head_entropy_curves(h, layers=["nope"])
    with pytest.raises(ValueError, match="no recorded step"):
        head_entropy_curves(ProbeHistory.new(tokens=["a"]))


def test_viewer_data_from_history():
    h = seq2seq_history()
    data = viewer_data_from_history(h, title="t")
    assert data.steps == h.steps
    assert [g.name for g in data.groups] == [
        "encoder self-attention",
        "decoder self-attention",
        "decoder cross-attention",
    ]
    cross = data.groups[2].layers[0]
    np.testing.assert_array_equal(
        cross.weights, h.attentions["decoder.layers.0.cross_attn"].numpy()
    )
    assert cross.mask is None and data.groups[0].layers[0].mask is None
    assert data.groups[1].layers[0].mask is not None and not data.groups[1].layers[0].mask[0, 1]
    js = data.to_json()
    assert js["steps"] == h.steps and js["groups"][2]["layers"][0]["heads"] == 2


def _state(**changes):
    state = gpt_history([0, 10], layers=1).state_dict()
    state.update(changes)
    return state


@pytest.mark.parametrize(
    ("state", "error", "message"),
    [
        # what a damaged or crafted probe file holds where a dict or a list belongs: these were
        # "string indices must be integers", "'int' object is not subscriptable", …
        (3, TypeError, "state must be a mapping, got int"),
        ("x", TypeError, "state must be a mapping, got str"),
        ({"steps": [0]}, ValueError, "state is missing"),
        (_state(steps=5), TypeError, "steps must be a list, got int"),
        (_state(steps="0"), TypeError, "steps must be a list, got str"),
        (_state(attentions=[1]), TypeError, "attentions must be a mapping, got list"),
        (_state(kinds=3), TypeError, "kinds must be a mapping, got int"),
        (_state(sequences="abc"), TypeError, "sequences must be a mapping, got str"),
        (
            _state(sequences={"tokens": 3}),
            TypeError,
            r"sequences\['tokens'\] must be a list, got int",
        ),
        (_state(layer_sequences=3), TypeError, "layer_sequences must be a mapping, got int"),
        (
            _state(layer_sequences={"transformer.h.0.attn": 3}),
            TypeError,
            r"layer_sequences\['transformer.h.0.attn'\] must be a list, got int",
        ),
        (
            _state(layer_sequences={"transformer.h.0.attn": "ab"}),
            TypeError,
            r"layer_sequences\['transformer.h.0.attn'\] must be a list, got str",
        ),
        (
            _state(layer_sequences={"transformer.h.0.attn": ["tokens"]}),
            ValueError,
            r"must be a \(query, key\) pair of sequence names, got \['tokens'\]",
        ),
    ],
)
def test_a_crafted_state_names_the_entry(state, error, message):
    with pytest.raises(error, match=message):
        ProbeHistory.from_state_dict(state)


def test_a_state_round_trips_through_json_types():
    h = gpt_history([0, 10], layers=1)
    state = h.state_dict()
    state["layer_sequences"] = {k: list(v) for k, v in state["layer_sequences"].items()}
    back = ProbeHistory.from_state_dict(state)
    assert back.layer_sequences == h.layer_sequences and back.steps == [0, 10]
