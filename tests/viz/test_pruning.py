"""attnlab.viz.pruning: the pruning curve and the head-importance heatmap."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import attnlab as al
from attnlab.inspect import HeadImportance, PruningCurve
from attnlab.viz.pruning import importance_figure, pruning_figure


def curve(metric: bool = True) -> PruningCurve:
    order = (("a", 0), ("b", 1), ("a", 1))
    return PruningCurve(
        order=order,
        num_pruned=(0, 1, 2, 3),
        loss=(0.1, 0.2, 0.5, 1.5),
        metric=(1.0, 0.9, 0.6, 0.1) if metric else None,
        total_heads=4,
    )


def importance() -> HeadImportance:
    return HeadImportance(
        layers=("encoder.layers.0.self_attn", "decoder.layers.0.cross_attn"),
        kinds=("self", "cross"),
        base_loss=0.3,
        ablation=torch.tensor([[0.01, -0.02], [0.5, math.nan]], dtype=torch.float64),
        gradient=torch.tensor([[0.6, 0.8], [1.0, math.nan]], dtype=torch.float64),
        normalized=True,
        num_batches=1,
        pruned=(("decoder.layers.0.cross_attn", 1),),
    )


def test_pruning_figure_draws_the_curve_and_the_metric(tmp_path: Path) -> None:
    plot = pruning_figure(curve(), metric_label="exact match")
    np.testing.assert_array_equal(plot.data["num_pruned"], [0, 1, 2, 3])
    np.testing.assert_array_equal(plot.data["loss"], [0.1, 0.2, 0.5, 1.5])
    np.testing.assert_array_equal(plot.data["metric"], [1.0, 0.9, 0.6, 0.1])
    axes = plot.figure.axes
    assert axes[0].get_ylabel() == "loss" and any(a.get_ylabel() == "exact match" for a in axes)
    np.testing.assert_array_equal(axes[0].lines[0].get_ydata(), [0.1, 0.2, 0.5, 1.5])
    path = plot.save(tmp_path / "pruning.png")
    assert path.stat().st_size > 1000
    no_metric = pruning_figure(curve(metric=False))
    assert "metric" not in no_metric.data


def test_importance_figure_is_layers_by_heads(tmp_path: Path) -> None:
    imp = importance()
    plot = importance_figure(imp)
    np.testing.assert_array_equal(plot.data["scores"], imp.ablation.numpy())
    labels = [t.get_text() for t in plot.figure.axes[0].get_yticklabels()]
    assert labels == ["encoder.layers.0.self_attn (self)", "decoder.layers.0.cross_attn (cross)"]
    texts = [t.get_text() for t in plot.figure.axes[0].texts]
    assert "pruned" in texts and "0.5" in texts
    grad = importance_figure(imp, by="gradient")
    np.testing.assert_array_equal(grad.data["scores"], imp.gradient.numpy())
    assert grad.save(tmp_path / "importance.svg").stat().st_size > 1000


def test_figures_from_a_real_model_and_bad_arguments() -> None:
    from attnlab.inspect import head_importance, pruning_curve

    gpt = al.GPT(al.GPTConfig(vocab_size=30, n_positions=16, n_embd=16, n_layer=2, n_head=2))
    ids = [torch.randint(0, 30, (2, 8))]
    imp = head_importance(gpt, ids)
    plot = pruning_figure(pruning_curve(gpt, ids, imp.order()))
    assert plot.data["loss"].shape == (5,)
    assert importance_figure(imp).data["scores"].shape == (2, 2)
    with pytest.raises(TypeError, match="curve must be a PruningCurve, got dict"):
        pruning_figure({"loss": [1.0]})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="by must be one of 'ablation', 'gradient', got 'entropy'"):
        importance_figure(imp, by="entropy")
    with pytest.raises(TypeError, match="importance must be a HeadImportance, got list"):
        importance_figure([1.0])  # type: ignore[arg-type]
