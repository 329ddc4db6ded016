"""attnlab.viz.training: the label-smoothing figure and a run's training curves."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab.viz.training import label_smoothing_figure, training_curves


def test_label_smoothing_figure_draws_the_target_and_the_losses(tmp_path: Path) -> None:
    v, eps = 12, 0.1
    plot = label_smoothing_figure(v, eps, target=3, points=101)
    q = plot.data["smoothed"]
    want = np.full(v, eps / v)
    want[3] += 1 - eps
    np.testing.assert_allclose(q, want)
    np.testing.assert_array_equal(plot.data["one_hot"], np.eye(v)[3])
    c = plot.data["confidence"]
    assert c.shape == (101,) and math.isclose(c[0], 1 / v) and math.isclose(c[-1], 0.999)
    # the same numbers by hand: p(target) = c, the rest spread evenly
    p = np.repeat(((1 - c) / (v - 1))[:, None], v, axis=1)
    p[:, 3] = c
    np.testing.assert_allclose(plot.data["cross_entropy"], -np.log(c), rtol=1e-6)
    np.testing.assert_allclose(plot.data["smoothed_loss"], -(np.log(p) * q).sum(1), rtol=1e-6)
    # and by PyTorch's label smoothing
    ref = F.cross_entropy(
        torch.from_numpy(np.log(p)), torch.full((101,), 3), label_smoothing=eps, reduction="none"
    )
    np.testing.assert_allclose(plot.data["smoothed_loss"], ref.numpy(), rtol=1e-6)
    # the smoothed loss is lowest where p = q', and there it is H(q')
    entropy = -(q * np.log(q)).sum()
    assert math.isclose(float(plot.data["best_confidence"]), 1 - eps + eps / v)
    assert math.isclose(float(plot.data["entropy"]), entropy, rel_tol=1e-12)
    assert plot.data["smoothed_loss"].min() >= entropy - 1e-9
    # what is drawn is what is in data
    ax2 = plot.figure.axes[1]
    np.testing.assert_array_equal(ax2.lines[1].get_ydata(), plot.data["smoothed_loss"])
    assert plot.save(tmp_path / "ls.png").stat().st_size > 1000


def test_label_smoothing_figure_without_smoothing_and_bad_input() -> None:
    plot = label_smoothing_figure(4, 0.0)
    np.testing.assert_allclose(plot.data["smoothed_loss"], plot.data["cross_entropy"])
    assert float(plot.data["entropy"]) == 0.0
    with pytest.raises(ValueError, match="num_classes must be at least 2"):
        label_smoothing_figure(1)
    with pytest.raises(ValueError, match="smoothing must be in"):
        label_smoothing_figure(5, 1.0)
    with pytest.raises(ValueError, match=r"target must lie in \[0, num_classes=5\), got 5"):
        label_smoothing_figure(5, target=5)
    with pytest.raises(TypeError, match="target must be an int"):
        label_smoothing_figure(5, target=1.0)  # type: ignore[arg-type]


def _records() -> list[dict[str, object]]:
    train = [
        {"kind": "train", "step": s, "loss": 3.0 / s, "lr": 1e-3 * min(s, 2), "tokens": 10}
        for s in range(1, 6)
    ]
    train[2]["loss"] = None  # a non-finite loss is logged as null
    evals = [
        {"kind": "eval", "step": 2, "exact_match": 0.25},
        {"kind": "eval", "step": 5, "exact_match": 0.75, "bleu": 10.0},
    ]
    return [*train[:2], evals[0], *train[2:], evals[1]]


def test_training_curves_from_records_a_file_and_a_run_folder(tmp_path: Path) -> None:
    records = _records()
    plot = training_curves(records, loss_floor=0.5)
    np.testing.assert_array_equal(plot.data["step"], [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(plot.data["loss"], [3.0, 1.5, np.nan, 0.75, 0.6])
    np.testing.assert_array_equal(plot.data["lr"], [1e-3, 2e-3, 2e-3, 2e-3, 2e-3])
    np.testing.assert_array_equal(plot.data["eval_step"], [2, 5])
    np.testing.assert_array_equal(plot.data["eval/exact_match"], [0.25, 0.75])
    np.testing.assert_array_equal(plot.data["eval/bleu"], [np.nan, 10.0])
    axes = plot.figure.axes
    assert len(axes) == 3
    np.testing.assert_array_equal(axes[0].lines[0].get_ydata(), plot.data["loss"])
    assert axes[0].lines[1].get_ydata()[0] == 0.5  # the floor
    np.testing.assert_array_equal(axes[1].lines[0].get_ydata(), plot.data["lr"])
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for source in (tmp_path, tmp_path / "metrics.jsonl"):
        again = training_curves(source)
        assert again.data.keys() == plot.data.keys()
        for key in plot.data:
            np.testing.assert_array_equal(again.data[key], plot.data[key])
    assert plot.save(tmp_path / "curves.png").stat().st_size > 1000
    only_train = training_curves([r for r in records if r["kind"] == "train"])
    assert "eval_step" not in only_train.data and len(only_train.figure.axes) == 2


def test_training_curves_refuses_bad_metrics(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one train record"):
        training_curves([{"kind": "eval", "step": 1, "exact_match": 1.0}])
    with pytest.raises(ValueError, match=r"run folder holding metrics\.jsonl"):
        training_curves(tmp_path)
    with pytest.raises(TypeError, match="dict records"):
        training_curves([1, 2])
    with pytest.raises(TypeError, match="numbers"):
        training_curves([{"kind": "train", "step": 1, "loss": "x", "lr": 1.0}])
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train"\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:1 is not a JSON record"):
        training_curves(tmp_path)
