"""The HTML viewer in real headless Chromium (Playwright driving Debian's chromium)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import attnlab as al
from attnlab.viz.viewer import render_viewer, viewer_data, write_viewer

CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"chromium not found at {CHROMIUM} (make test installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def _open(browser, path: Path):
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on(
        "request",
        lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None,
    )
    page.goto(path.resolve().as_uri())
    return page, errors, requests


def _seq2seq_weights():
    return {
        "encoder.layers.0.self_attn": torch.softmax(torch.randn(1, 4, 6, 6) * 2, -1),
        "decoder.layers.0.self_attn": torch.softmax(
            (torch.randn(1, 4, 5, 5) * 2).masked_fill(~al.masks.causal_mask(5), float("-inf")), -1
        ),
        "decoder.layers.0.cross_attn": torch.softmax(torch.randn(1, 4, 5, 6) * 2, -1),
    }


def _canvas_hash(page) -> str:
    return page.evaluate("document.getElementById('canvas').toDataURL()")


def test_page_is_self_contained():
    w = _seq2seq_weights()
    html = render_viewer(viewer_data(w, source=list("abcdef"), target=list("vwxyz")))
    assert "http://" not in html and "https://" not in html and "<script src" not in html
    assert "@DATA@" not in html and "@JS@" not in html


def test_viewer_seq2seq_hover_click_screenshot(browser, tmp_path):
    w = _seq2seq_weights()
    data = viewer_data(
        w,
        source="the cat sat on the mat".split(),
        target="<s> le chat est assis".split(),
        kinds={"decoder.layers.0.cross_attn": "cross"},
    )
    page, errors, requests = _open(browser, write_viewer(data, tmp_path / "view.html"))
    assert page.locator("#groups button").count() == 3
    # cross-attention, head 2: hover values equal the captured weights
    page.locator("#groups button", has_text="cross").click()
    page.locator("#heads button", has_text="2").click()
    cross = w["decoder.layers.0.cross_attn"][0, 2]
    for i, j in ((0, 0), (2, 3), (4, 5)):
        c = page.evaluate(f"window.attnlabViewer.cellCenter({i}, {j})")
        page.mouse.move(c["x"], c["y"])
        tip = page.locator("#tip")
        assert int(tip.get_attribute("data-query")) == i and int(tip.get_attribute("data-key")) == j
        assert float(tip.get_attribute("data-value")) == pytest.approx(float(cross[i, j]), rel=1e-6)
        assert f"{float(cross[i, j]):.6f}" in tip.text_content()
    # clicking another head changes the drawing
    before = _canvas_hash(page)
    page.locator("#heads button", has_text="3").click()
    assert _canvas_hash(page) != before
    # the mask and the lines view draw without errors, and change the drawing
    page.locator("#groups button", has_text="decoder self").click()
    before = _canvas_hash(page)
    page.check("#show-mask")
    assert _canvas_hash(page) != before
    page.locator(".view-btn", has_text="lines").click()
    page.locator("#heads button", has_text="all").click()
    shot = tmp_path / "shot.png"
    page.screenshot(path=str(shot))
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert pixels.std() > 10, "the screenshot is blank"
    assert errors == [] and requests == []
    page.close()


def test_viewer_gpt_1000_tokens_fast(browser, tmp_path):
    t = 1000
    w = torch.softmax(
        torch.randn(1, 2, t, t).masked_fill(~al.masks.causal_mask(t), float("-inf")), -1
    )
    data = viewer_data({"transformer.h.0.attn": w}, tokens=[f"t{i}" for i in range(t)])
    path = write_viewer(data, tmp_path / "big.html")
    start = time.perf_counter()
    page, errors, _ = _open(browser, path)
    page.wait_for_function("window.attnlabViewer && window.attnlabViewer.renders > 0")
    load_s = time.perf_counter() - start
    before = _canvas_hash(page)
    start = time.perf_counter()
    page.locator("#heads button", has_text="1").click()
    click_s = time.perf_counter() - start
    assert _canvas_hash(page) != before
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    c = page.evaluate("window.attnlabViewer.cellCenter(999, 500)")
    page.mouse.move(c["x"], c["y"])
    tip = page.locator("#tip")
    i, j = int(tip.get_attribute("data-query")), int(tip.get_attribute("data-key"))
    assert abs(i - 999) <= 1 and abs(j - 500) <= 1
    assert float(tip.get_attribute("data-value")) == pytest.approx(float(w[0, 1, i, j]), rel=1e-6)
    page.locator(".view-btn", has_text="lines").click()
    assert errors == []
    assert load_s < 10 and click_s < 5, (load_s, click_s)
    page.close()
