"""The context-mixing figure (attnlab.viz.mixing) draws the matrices attnlab.inspect.mixing gave."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import ArgumentError
from attnlab.inspect.mixing import mixing
from tests.inspect.test_mixing import tiny


def test_the_figure_draws_the_methods_matrices() -> None:
    from attnlab.viz.mixing import mixing_figure

    model = tiny()
    ids = torch.randint(0, 40, (1, 6))
    mix = mixing(model, ids, "alti")
    plot = mixing_figure(mix, list("abcdef"))
    np_total = mix.total[0].numpy()
    assert (plot.data["main"] == np_total).all()
    assert plot.data["layers"].shape == (2, 6, 6)
    assert "ALTI" in plot.figure.axes[0].figure.texts[0].get_text()
    with pytest.raises(ArgumentError, match="batch_index must be in"):
        mixing_figure(mix, batch_index=1)
