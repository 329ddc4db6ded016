"""Lesson figures: masks, the Noam schedule and positional encodings, drawn from the library."""

from __future__ import annotations

import numpy as np

import attnlab as al
from attnlab.viz.lessons import mask_panel, noam_curve, positional_encoding_figure


def test_masks_noam_positions(tmp_path):
    m = mask_panel("a b c <pad>".split())
    assert not m.data["padding"][:, 3].any() and m.data["look_ahead"][0, 1] == 0
    assert (m.data["combined"] == (m.data["padding"] & m.data["look_ahead"])).all()
    n = noam_curve(((512, 400),), steps=1000)
    assert int(np.argmax(n.data["lr"][0])) + 1 == 400
    np.testing.assert_allclose(n.data["lr"][0, 399], 512**-0.5 * 400**-0.5)
    p = positional_encoding_figure(50, 16)
    np.testing.assert_array_equal(
        p.data["table"], al.nn.positional.sinusoidal_table(50, 16).numpy()
    )
    for plot, name in ((m, "m.png"), (n, "n.svg"), (p, "p.png")):
        assert plot.save(tmp_path / name).stat().st_size > 1000
