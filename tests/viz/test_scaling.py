"""attnlab.viz.scaling: softmax saturation and its gradient against d_k."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.viz.scaling import (
    SoftmaxScaling,
    softmax_jacobian_norm,
    softmax_scaling_figure,
    softmax_scaling_stats,
)


def test_jacobian_norm_equals_autograd() -> None:
    torch.manual_seed(0)
    s = torch.randn(5, dtype=torch.float64) * 3
    p = torch.softmax(s, -1)
    jac = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), s)  # (5, 5)
    torch.testing.assert_close(softmax_jacobian_norm(p), torch.linalg.matrix_norm(jac))
    one_hot = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    assert float(softmax_jacobian_norm(one_hot)) == 0.0
    assert softmax_jacobian_norm(torch.full((2, 3, 4), 0.25)).shape == (2, 3)


def test_stats_are_the_measurement_and_the_figure_draws_them(tmp_path: Path) -> None:
    stats = softmax_scaling_stats((4, 64, 1024), num_keys=8, samples=64, seed=3)
    # the first d_k recomputed by hand with the same generator
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(64, 1, 4, generator=gen, dtype=torch.float64)
    k = torch.randn(64, 8, 4, generator=gen, dtype=torch.float64)
    raw = (q * k).sum(-1)
    for row, s in enumerate((raw, raw / 2.0)):
        p = torch.softmax(s, -1)
        assert stats.score_std[row, 0] == pytest.approx(float(s.std()))
        assert stats.max_weight[row, 0] == pytest.approx(float(p.max(-1).values.mean()))
        assert stats.jacobian_norm[row, 0] == pytest.approx(float(softmax_jacobian_norm(p).mean()))
    # unscaled: the spread grows like √d_k and the softmax saturates; scaled: it does not
    np.testing.assert_allclose(stats.score_std[0], np.sqrt([4, 64, 1024]), rtol=0.15)
    np.testing.assert_allclose(stats.score_std[1], 1.0, rtol=0.15)
    assert stats.max_weight[0, -1] > 0.9 > stats.max_weight[1, -1]
    assert stats.jacobian_norm[0, -1] < 0.2 * stats.jacobian_norm[1, -1]

    plot = softmax_scaling_figure(stats)
    np.testing.assert_array_equal(plot.data["d_k"], [4, 64, 1024])
    for key in ("score_std", "max_weight", "jacobian_norm"):
        assert plot.data[key] is getattr(stats, key)
    ax = plot.figure.axes[1]
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), stats.max_weight[0])
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), stats.max_weight[1])
    assert plot.save(tmp_path / "scaling.png").stat().st_size > 1000


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="d_ks must be a non-empty sequence"):
        softmax_scaling_stats(())
    with pytest.raises(ValueError, match="num_keys must be a positive int, got 0"):
        softmax_scaling_stats((4,), num_keys=0)
    with pytest.raises(TypeError, match=r"d_ks\[i\] must be an int, got float"):
        softmax_scaling_stats((4.0,))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="stats must be a SoftmaxScaling, got dict"):
        softmax_scaling_figure({})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"p must be a torch\.Tensor, got list"):
        softmax_jacobian_norm([0.5, 0.5])  # type: ignore[arg-type]
    assert isinstance(softmax_scaling_stats((4,), samples=2), SoftmaxScaling)
