"""The page of ``attnlab view --generate`` in headless Chromium: another layer and head chosen in
the page change what is drawn, generated tokens are marked, the layers × heads grid is labelled."""

from __future__ import annotations

from pathlib import Path

from attnlab.cli import main
from tests.cli.test_view_generate import PROMPT, _gpt, _save
from tests.viz.test_viewer import _canvas_hash, _open, browser  # noqa: F401 (the fixture)


def test_generated_page_layers_heads_and_grid(browser, tmp_path: Path) -> None:  # noqa: F811
    run = _save(tmp_path / "gpt", _gpt())
    out = tmp_path / "v.html"
    assert main(["view", str(run), "--text", PROMPT, "--generate", "3", "-o", str(out)]) == 0
    page, errors, requests = _open(browser, out)
    drawn = page.evaluate("window.attnlabViewer.chosen")
    n = drawn["rows"]
    start = page.evaluate("window.attnlabViewer.start")  # the head Python chose to open on
    assert drawn["promptLength"] == n - 3
    assert (drawn["layer"], drawn["head"]) == (start["layer"], start["head"])
    assert "3 generated" in page.inner_text("#info") and "%" in page.inner_text("#info")
    page.click("#layers button:has-text('0')")
    page.click("#heads button[data-value='0']")
    before = _canvas_hash(page)
    page.click("#layers button:has-text('1')")
    page.click("#heads button[data-value='2']")
    drawn = page.evaluate("window.attnlabViewer.chosen")
    assert (drawn["layer"], drawn["head"], drawn["layerName"]) == (1, 2, "transformer.h.1.attn")
    assert _canvas_hash(page) != before
    # hover a generated query row: the tip names it as generated, with the probability it was
    # generated with, the entropy and the alternatives (those of generate(return_scores=True))
    c = page.evaluate(f"window.attnlabViewer.cellCenter({n - 1}, 0)")
    page.mouse.move(c["x"], c["y"])
    tip = page.inner_text("#tip")
    scores = page.evaluate("window.attnlabViewer.tokenScores")
    assert len(scores) == 3 and "(generated)" in tip
    last = scores[-1]
    assert f"generated with p = {last['probability']:.4f}" in tip
    assert f"entropy {last['entropy']:.3f} nats" in tip and "alternatives: " in tip
    # a prompt row has no such line
    c = page.evaluate("window.attnlabViewer.cellCenter(1, 0)")
    page.mouse.move(c["x"], c["y"])
    assert "generated with" not in page.inner_text("#tip")
    # the layers × heads grid: layer and head numbers on its axes, tokens on the others
    page.click(".view-btn[data-view='grid']")
    drawn = page.evaluate("window.attnlabViewer.chosen")
    assert drawn["view"] == "grid"
    labels = drawn["labels"]
    assert labels["layers"] == ["layer 0", "layer 1"] and labels["heads"] == ["0", "1", "2", "3"]
    assert len(labels["queries"]) == n and len(labels["keys"]) == n
    page.screenshot(path=str(tmp_path / "grid.png"))
    # a click on a tile opens that layer and head
    t = page.evaluate("window.attnlabViewer.tileCenter(0, 3)")
    page.mouse.click(t["x"], t["y"])
    drawn = page.evaluate("window.attnlabViewer.chosen")
    assert (drawn["view"], drawn["layer"], drawn["head"]) == ("matrix", 0, 3)
    assert errors == [] and requests == []
    page.close()
