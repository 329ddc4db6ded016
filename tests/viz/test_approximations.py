"""approximation_error_figure draws exactly the errors the library measures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.nn.approximation_errors import favor_errors, linformer_errors
from attnlab.viz import Plot
from attnlab.viz.approximations import approximation_error_figure, approximation_inputs


def test_data_equals_what_was_measured(tmp_path) -> None:
    ks, ms = [4, 16, 32], [16, 128, 1024]
    q, k, v = approximation_inputs(seq_len=32, d_head=8, heads=1, seed=3)
    plot = approximation_error_figure(q, k, v, ks=ks, num_features=ms, trials=3, fit_steps=20,
                                      seed=5)  # fmt: skip
    assert isinstance(plot, Plot)

    def gen(i: int) -> torch.Generator:
        return torch.Generator().manual_seed(5 + i)

    want = {
        "linformer/jl": linformer_errors(q, k, v, ks, trials=3, generator=gen(1)),
        "linformer/random": linformer_errors(q, k, v, ks, projections="random", trials=3,
                                             generator=gen(2)),
        "linformer/fitted": linformer_errors(q, k, v, ks, projections="fitted", trials=1,
                                             steps=20, generator=gen(3)),
        "performer/orthogonal": favor_errors(q, k, v, ms, trials=3, generator=gen(4)),
        "performer/iid": favor_errors(q, k, v, ms, trials=3, orthogonal=False, generator=gen(5)),
        "performer/causal": favor_errors(q, k, v, ms, trials=3, is_causal=True, generator=gen(6)),
    }  # fmt: skip
    assert set(plot.data) == {"k", "num_features", *want}
    np.testing.assert_array_equal(plot.data["k"], ks)
    np.testing.assert_array_equal(plot.data["num_features"], ms)
    for name, errors in want.items():
        np.testing.assert_allclose(plot.data[name], errors.numpy(), rtol=1e-12, err_msg=name)
    assert plot.data["linformer/fitted"].shape == (3, 1)
    # what is drawn: the mean of each series, one line per series (plus the 1/√x guides)
    ax_l, ax_p = plot.figure.axes
    lines = {ln.get_label(): ln.get_ydata() for ln in ax_p.get_lines()}
    np.testing.assert_allclose(lines["orthogonal features (FAVOR+)"],
                               plot.data["performer/orthogonal"].mean(1))  # fmt: skip
    lines = {ln.get_label(): ln.get_ydata() for ln in ax_l.get_lines()}
    np.testing.assert_allclose(lines["layer, E, F fitted to the inputs"],
                               plot.data["linformer/fitted"][:, 0])  # fmt: skip
    # the measured trend: more features, less error
    orth = plot.data["performer/orthogonal"].mean(1)
    assert orth[-1] < orth[0]
    assert plot.save(tmp_path / "approx.png").stat().st_size > 0


def test_bad_inputs() -> None:
    q, k, v = approximation_inputs(seq_len=8, d_head=4, heads=1)
    with pytest.raises(ValueError, match="given together"):
        approximation_error_figure(q, k)
    with pytest.raises(ValueError, match=r"query must have shape \(B, H, T, d\)"):
        approximation_error_figure(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="trials must be a positive int"):
        approximation_error_figure(q, k, v, trials=0)
