"""The viewer page in headless Chromium opens where Python chose, shows a colour bar and names
the layers, heads and axes of its layers × heads grid."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.cli import main
from attnlab.viz.viewer import viewer_data, write_viewer
from attnlab.viz.viewer_start import most_informative_head
from tests.viz.test_viewer import _canvas_hash, _open, browser  # noqa: F401 (the fixture)


def _seq2seq() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    w = {}
    for layer in range(2):
        w[f"encoder.layers.{layer}.self_attn"] = torch.softmax(
            torch.randn(1, 4, 6, 6, generator=g), -1
        )
        self_logits = torch.randn(1, 4, 5, 5, generator=g).masked_fill(~causal, float("-inf"))
        w[f"decoder.layers.{layer}.self_attn"] = torch.softmax(self_logits, -1)
        w[f"decoder.layers.{layer}.cross_attn"] = torch.softmax(
            torch.randn(1, 4, 5, 6, generator=g), -1
        )
    # decoder layer 1, head 3 aligns target i with source 4 - i: the sharpest cross head
    w["decoder.layers.1.cross_attn"][0, 3] = torch.softmax(torch.eye(5, 6).flip(1) * 8, -1)
    return w


def test_page_opens_on_the_chosen_head_with_a_colour_bar_and_a_labelled_grid(
    browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    w = _seq2seq()
    data = viewer_data(w, source=list("abcdef"), target=list("vwxyz"))
    start = most_informative_head(data)
    assert (data.groups[start.group].name, start.layer, start.head) == (
        "decoder cross-attention",
        1,
        3,
    )
    page, errors, requests = _open(browser, write_viewer(data, tmp_path / "v.html"))
    chosen = page.evaluate("window.attnlabViewer.chosen")
    assert (chosen["layer"], chosen["head"], chosen["layerName"]) == (
        1,
        3,
        "decoder.layers.1.cross_attn",
    )
    assert page.locator("#groups button.active").inner_text() == "decoder cross-attention"
    assert page.locator("#heads button.active").inner_text() == "3"
    assert "lowest-entropy cross-attention head" in page.inner_text("#start")
    # the colour bar: drawn, 0 … the head's max weight
    assert page.locator("#legend").is_visible()
    legend = page.evaluate("window.attnlabViewer.legend")
    head_max = float(w["decoder.layers.1.cross_attn"][0, 3].max())
    assert legend["min"] == 0 and abs(legend["max"] - head_max) < 1e-6 and not legend["perHead"]
    assert [t["text"] for t in legend["ticks"]] == ["0", f"{head_max / 4:.3f}", f"{head_max:.3f}"]
    assert f"0 … {head_max:.3f}" in page.inner_text("#legend-note")
    bar = page.evaluate(
        "(() => { const c = document.getElementById('legend'); const g = c.getContext('2d');"
        " return [Array.from(g.getImageData(15, 8, 1, 1).data),"
        " Array.from(g.getImageData(c.width - 15, 8, 1, 1).data)]; })()"
    )
    assert bar[0][:3] != bar[1][:3] and bar[0][3] == 255  # dark at 0, bright at max
    # the user can still change the selection
    before = _canvas_hash(page)
    page.click("#groups button:has-text('encoder self')")
    page.click("#heads button[data-value='0']")
    chosen = page.evaluate("window.attnlabViewer.chosen")
    assert (chosen["layer"], chosen["head"], chosen["layerName"]) == (
        1,
        0,
        "encoder.layers.1.self_attn",
    )
    assert _canvas_hash(page) != before
    # the layers × heads grid: layer and head numbers, the axes named, tokens on both sides
    page.click("#groups button:has-text('cross')")
    page.click(".view-btn[data-view='grid']")
    labels = page.evaluate("window.attnlabViewer.chosen")["labels"]
    assert labels["layers"] == ["layer 0", "layer 1"] and labels["heads"] == ["0", "1", "2", "3"]
    assert labels["axes"] == ["rows: target queries ↓", "columns: source keys →"]
    assert labels["queries"] == list("vwxyz") and labels["keys"] == list("abcdef")
    assert page.evaluate("window.attnlabViewer.legend")["perHead"] is True
    shot = tmp_path / "grid.png"
    page.screenshot(path=str(shot), full_page=True)
    from PIL import Image

    assert np.asarray(Image.open(shot).convert("L"), dtype=np.float64).std() > 10
    # the lines view has no colour scale
    page.click(".view-btn[data-view='lines']")
    assert page.evaluate("window.attnlabViewer.legend") is None
    assert not page.locator("#legend").is_visible()
    assert errors == [] and requests == []
    page.close()


def test_view_help_describes_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["view", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the description
    assert info.value.code == 0
    assert "capture every attention layer, and write one HTML file" in out
    assert "opens on the most informative head" in out
