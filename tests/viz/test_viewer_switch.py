"""The viewer's method switch in headless Chromium: clicking a method redraws the grid and the
matrix with its scores and relabels the colour bar by what the number means."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.viz.viewer import AttentionGroup, AttentionLayer, ViewerData, write_viewer
from attnlab.viz.viewer_mixing import MixingView, add_mixing
from tests.viz.test_viewer import _canvas_hash, _open, browser  # noqa: F401 (the fixture)
from tests.viz.test_viewer_mixing import gpt_page


def _legend(page) -> dict:
    return page.evaluate("window.attnlabViewer.legend")


def test_the_switch_redraws_grid_and_matrix_and_relabels_the_colour_bar(
    browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    model, ids, data = gpt_page(6)  # 2 layers × 4 heads
    data = add_mixing(data, model, ids, ["norm", "alti"])
    page, errors, requests = _open(browser, write_viewer(data, tmp_path / "v.html"))
    buttons = page.locator("#methods button").all_inner_texts()
    assert buttons == ["weights", "norm", "ALTI"]
    assert page.locator("#methods button.active").inner_text() == "weights"
    assert _legend(page)["label"] == "attention weight α_ij"
    page.click("#heads button[data-value='1']")
    shown = {"weights": _canvas_hash(page)}
    # norm: per head, the same panel, another matrix and colour bar
    page.click("#methods button[data-value='norm']")
    drawn = page.evaluate("window.attnlabViewer.method")
    assert (drawn["method"], drawn["perLayer"], drawn["view"]) == ("norm", False, "matrix")
    assert _legend(page)["label"] == "‖α_ij f(x_j)‖ (Kobayashi et al. 2020)"
    assert "Kobayashi et al. 2020" in page.inner_text("#legend-note")
    assert "per head" in page.inner_text("#method-note")
    shown["norm"] = _canvas_hash(page)
    # ALTI: one matrix per layer, the same whichever head is chosen, and the page says so
    page.click("#methods button[data-value='alti']")
    assert page.evaluate("window.attnlabViewer.method")["perLayer"] is True
    assert _legend(page)["label"] == "ALTI contribution (Ferrando et al. 2022)"
    assert "the same whichever head is chosen" in page.inner_text("#method-note")
    assert "(the layer's max)" in page.inner_text("#legend-note")
    shown["alti"] = _canvas_hash(page)
    page.click("#heads button[data-value='3']")
    assert _canvas_hash(page) == shown["alti"]
    assert len(set(shown.values())) == 3
    # hovering a cell gives the method's exact value, in the chosen layer
    c = page.evaluate("window.attnlabViewer.cellCenter(3, 1)")
    page.mouse.move(c["x"], c["y"])
    tip = page.locator("#tip")
    assert tip.get_attribute("data-method") == "alti"
    layer = page.evaluate("window.attnlabViewer.chosen")["layer"]
    want = data.groups[0].layers[layer].mixing["alti"][0, 3, 1]  # type: ignore[index]
    assert float(tip.get_attribute("data-value")) == float(np.float32(want))
    assert "ALTI contribution (Ferrando et al. 2022)" in tip.inner_text()
    # no token-to-token lines for a method's scores
    assert page.locator(".view-btn[data-view='lines']").is_disabled()
    # the grid: one column for a per-layer method, layers × heads for a per-head one
    page.click(".view-btn[data-view='grid']")
    drawn = page.evaluate("window.attnlabViewer.method")
    assert (drawn["view"], drawn["tiles"]) == ("grid", 2)
    assert page.evaluate("window.attnlabViewer.chosen")["labels"]["heads"] == ["all heads"]
    grid_alti = _canvas_hash(page)
    page.click("#methods button[data-value='norm']")
    assert page.evaluate("window.attnlabViewer.method")["tiles"] == 8
    assert _legend(page)["label"].startswith("‖α_ij f(x_j)‖") and _legend(page)["perHead"]
    assert _canvas_hash(page) != grid_alti
    page.click("#methods button[data-value='weights']")
    assert page.evaluate("window.attnlabViewer.method")["tiles"] == 8
    assert _legend(page)["label"] == "attention weight α_ij"
    assert not page.locator(".view-btn[data-view='lines']").is_disabled()
    assert errors == [] and requests == []
    page.close()


def test_a_signed_method_draws_diverging_and_a_group_without_it_says_so(
    browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    w = np.full((2, 3, 3), 1 / 3, dtype=np.float32)
    signed = np.array([[[-0.5, 0.2, 0.1], [0.3, -0.1, 0.0], [0.0, 0.4, -0.2]]], np.float32)
    groups = [
        AttentionGroup("encoder self-attention", "source", "source",
                       [AttentionLayer("encoder.layers.0.self_attn", w, mixing={"grad": signed})]),
        AttentionGroup("decoder self-attention", "target", "target",
                       [AttentionLayer("decoder.layers.0.self_attn", w)]),
    ]  # fmt: skip
    view = MixingView("grad", "signed grad", "a signed score", "layer", signed=True, note="n")
    data = ViewerData("t", {"source": list("abc"), "target": list("xyz")}, groups, methods=[view])
    page, errors, _ = _open(browser, write_viewer(data, tmp_path / "s.html"))
    page.click("#groups button:has-text('encoder')")
    page.click("#methods button[data-value='grad']")
    legend = _legend(page)
    assert legend["signed"] and legend["min"] == -0.5 and legend["max"] == 0.5
    assert legend["label"] == "a signed score"
    # the decoder has no grad matrices: its button is greyed out, the page shows the weights
    page.click("#groups button:has-text('decoder')")
    assert page.locator("#methods button[data-value='grad']").is_disabled()
    assert page.evaluate("window.attnlabViewer.method")["method"] == "weights"
    assert "computed for the encoder self-attention only" in page.inner_text("#method-note")
    assert errors == []
    page.close()
