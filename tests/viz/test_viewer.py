"""The HTML viewer in real headless Chromium (Playwright driving Debian's chromium)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import attnlab as al
from attnlab.viz.evolution_viewer import viewer_data_from_history
from attnlab.viz.viewer import (
    AttentionGroup,
    AttentionLayer,
    ViewerData,
    render_viewer,
    viewer_data,
    write_viewer,
)
from tests.viz.histories import gpt_history, seq2seq_history

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
    page.click("#heads button[data-value='0']")  # the page may open on another head
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


# ----------------------------------------------------------------------------- steps and escaping


def _hover(page, i: int, j: int, head: int | None = None) -> tuple[int, int, float, str]:
    c = page.evaluate(
        f"window.attnlabViewer.cellCenter({i}, {j}{'' if head is None else f', {head}'})"
    )
    page.mouse.move(c["x"], c["y"])
    tip = page.locator("#tip")
    return (
        int(tip.get_attribute("data-query")),
        int(tip.get_attribute("data-key")),
        float(tip.get_attribute("data-value")),
        tip.text_content(),
    )


def test_viewer_without_steps_has_no_slider(browser, tmp_path):
    data = viewer_data(_seq2seq_weights(), source=list("abcdef"), target=list("vwxyz"))
    assert data.steps is None and data.to_json()["steps"] is None
    page, errors, _ = _open(browser, write_viewer(data, tmp_path / "plain.html"))
    assert not page.locator("#step-row").is_visible()
    assert page.evaluate("window.attnlabViewer.steps") is None
    assert "training step" not in page.locator("header").inner_text()
    assert errors == []
    page.close()


def test_viewer_step_slider_redraws_and_hover_matches_that_step(browser, tmp_path):
    history = seq2seq_history()
    data = viewer_data_from_history(history, title="reversal: attention during training")
    assert data.steps == history.steps
    page, errors, requests = _open(browser, write_viewer(data, tmp_path / "steps.html"))
    slider = page.locator("#step")
    assert page.locator("#step-row").is_visible()
    # it opens on the last step
    assert page.locator("#step-label").inner_text() == f"training step {history.steps[-1]}"
    page.locator("#groups button", has_text="cross").click()
    page.locator("#heads button", has_text="1").click()
    w = history.attentions["decoder.layers.0.cross_attn"]  # (S, H, T, S)
    for i, j in ((0, 6), (3, 3), (6, 0)):
        qi, kj, value, text = _hover(page, i, j)
        assert (qi, kj) == (i, j)
        assert value == pytest.approx(float(w[-1, 1, i, j]), rel=1e-6)
        assert f"training step {history.steps[-1]}" in text
    last = _canvas_hash(page)
    # keyboard on the slider: Home → step 0, the drawing changes, hover reads step 0
    slider.focus()
    page.keyboard.press("Home")
    assert page.locator("#step-label").inner_text() == "training step 0"
    assert f"training step {history.steps[0]}" in page.locator("#info").inner_text()
    first = _canvas_hash(page)
    assert first != last
    for i, j in ((0, 6), (2, 5), (6, 1)):
        qi, kj, value, _ = _hover(page, i, j)
        assert (qi, kj) == (i, j)
        assert value == pytest.approx(float(w[0, 1, i, j]), rel=1e-6)
        assert page.locator("#tip").get_attribute("data-step") == "0"
    # one step to the right: step index 1, values of that step, on every head of "all"
    slider.focus()
    page.keyboard.press("ArrowRight")
    assert page.locator("#step-label").inner_text() == f"training step {history.steps[1]}"
    assert _canvas_hash(page) not in (first, last)
    page.locator("#heads button", has_text="all").click()
    for h in (0, 1):
        _, _, value, _ = _hover(page, 4, 2, head=h)
        assert value == pytest.approx(float(w[1, h, 4, 2]), rel=1e-6)
    # other groups and the lines view follow the slider too
    page.locator("#groups button", has_text="decoder self").click()
    page.check("#show-mask")
    page.locator("#heads button", has_text="0").click()
    dec = history.attentions["decoder.layers.0.self_attn"]
    _, _, value, _ = _hover(page, 5, 2)
    assert value == pytest.approx(float(dec[1, 0, 5, 2]), rel=1e-6)
    page.locator(".view-btn", has_text="lines").click()
    before = _canvas_hash(page)
    slider.focus()
    page.keyboard.press("End")
    assert _canvas_hash(page) != before
    assert errors == [] and requests == []
    page.close()


def test_viewer_gpt_history_screenshot(browser, tmp_path):
    history = gpt_history()
    data = viewer_data_from_history(history, title="GPT probe during training")
    assert [g.name for g in data.groups] == ["self-attention"]
    page, errors, _ = _open(browser, write_viewer(data, tmp_path / "gpt.html"))
    page.locator("#heads button", has_text="all").click()
    page.locator("#step").focus()
    page.keyboard.press("Home")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert page.locator("#step-label").inner_text() == f"training step {history.steps[2]}"
    shot = Path(os.environ.get("ATTNLAB_SHOT_DIR", tmp_path)) / "viewer_steps.png"
    page.screenshot(path=str(shot), full_page=True)
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert pixels.std() > 10, "the screenshot is blank"
    assert errors == []
    page.close()


def test_embedded_json_is_escaped_and_round_trips(browser, tmp_path):
    nasty = ["</script><script>window.pwned=1</script>", "a&b", "<!--", "x>y", "é✓"]
    w = torch.softmax(torch.randn(1, 2, 5, 5), -1)
    data = viewer_data({"transformer.h.0.attn": w}, tokens=nasty, title="</title><b>&")
    html = render_viewer(data)
    start = html.index('id="attnlab-data">') + len('id="attnlab-data">')
    payload = html[start : html.index("</script>", start)]
    assert not any(ch in payload for ch in "<>&")
    assert json.loads(payload) == data.to_json()
    assert "<title>&lt;/title&gt;&lt;b&gt;&amp;</title>" in html
    page, errors, _ = _open(browser, write_viewer(data, tmp_path / "nasty.html"))
    assert page.evaluate("window.pwned") is None
    got = page.evaluate("JSON.parse(document.getElementById('attnlab-data').textContent)")
    assert got["sequences"]["tokens"] == nasty
    assert page.title() == "</title><b>&"
    assert errors == []
    page.close()


def test_viewer_data_with_steps_checks_shapes():
    w = np.full((3, 2, 4, 4), 0.25, dtype=np.float32)
    layer = AttentionLayer("a", w)
    ViewerData(
        "t", {"tokens": list("abcd")}, [AttentionGroup("g", "tokens", "tokens", [layer])], [0, 5, 9]
    )
    with pytest.raises(ValueError, match=r"must be \(S, H, T_q, T_k\) = \(2, H, 4, 4\)"):
        ViewerData(
            "t",
            {"tokens": list("abcd")},
            [AttentionGroup("g", "tokens", "tokens", [layer])],
            [0, 5],
        )
    with pytest.raises(ValueError, match="strictly ascending"):
        ViewerData(
            "t",
            {"tokens": list("abcd")},
            [AttentionGroup("g", "tokens", "tokens", [layer])],
            [0, 9, 5],
        )
    with pytest.raises(ValueError, match=r"must be \(H, T_q, T_k\)"):
        ViewerData(
            "t", {"tokens": list("abcd")}, [AttentionGroup("g", "tokens", "tokens", [layer])]
        )


# ----------------------------------------------------------------------------- inline (notebooks)


def test_view_takes_a_cache_a_mapping_or_viewer_data():
    model = al.GPT(al.GPTConfig(vocab_size=11, n_positions=8, n_embd=16, n_head=2, n_layer=2))
    tokens = torch.tensor([[1, 2, 3, 4]])
    with al.inspect.capture(model) as cache:
        model(tokens)
    labels = list("abcd")
    viewer = al.viz.view(cache, tokens=labels, title="t")
    assert [layer.name for g in viewer.data.groups for layer in g.layers] == list(cache.attentions)
    same = al.viz.view(dict(cache.attentions), tokens=labels, title="t")
    assert viewer.html == same.html == render_viewer(viewer.data)
    assert al.viz.view(viewer.data).data is viewer.data
    with pytest.raises(ValueError, match="ViewerData already holds its tokens; got tokens"):
        al.viz.view(viewer.data, tokens=labels)
    with pytest.raises(TypeError, match="attentions must be an ActivationCache"):
        al.viz.view([1, 2], tokens=labels)
    with pytest.raises(ValueError, match="height must be > 0, got 0"):
        al.viz.view(cache, tokens=labels, height=0)


def test_repr_html_is_the_page_in_its_own_sandboxed_frame(tmp_path):
    import html as html_lib

    w = _seq2seq_weights()
    viewer = al.viz.view(w, source=list("abcdef"), target=list("vwxyz"), title='a "<b>" & c')
    out = viewer._repr_html_()
    assert out.startswith('<iframe class="attnlab-viewer"') and out.endswith("></iframe>")
    assert 'sandbox="allow-scripts"' in out and "allow-same-origin" not in out
    srcdoc = out.split('srcdoc="', 1)[1].rsplit('"></iframe>', 1)[0]
    assert '"' not in srcdoc and "<" not in srcdoc  # the attribute cannot be closed early
    assert html_lib.unescape(srcdoc) == viewer.html
    assert viewer.save(tmp_path / "v.html").read_text(encoding="utf-8") == viewer.html


def test_two_inline_viewers_in_one_page_work_independently(browser, tmp_path):
    """Two frames in one notebook-like page: each draws, and a click in one leaves the other."""
    w = _seq2seq_weights()
    first = al.viz.view(w, source=list("abcdef"), target=list("vwxyz"), title="first")
    gpt = {"h.0.attn": torch.softmax(torch.randn(1, 2, 7, 7), -1)}
    second = al.viz.view(gpt, tokens=list("ABCDEFG"), title="second")
    page_path = tmp_path / "notebook.html"
    page_path.write_text(
        f"<html><body><h1>notebook</h1>{first._repr_html_()}<p>text</p>{second._repr_html_()}"
        "</body></html>",
        encoding="utf-8",
    )
    page, errors, requests = _open(browser, page_path)
    frames = [f for f in page.frames if f != page.main_frame]
    assert len(frames) == 2
    for frame in frames:
        frame.wait_for_selector("#canvas")
    titles = sorted(f.evaluate("document.querySelector('h1').textContent") for f in frames)
    assert titles == ["first", "second"]
    by_title = {f.evaluate("document.querySelector('h1').textContent"): f for f in frames}
    a, b = by_title["first"], by_title["second"]
    assert a.locator("#groups button").count() == 3 and b.locator("#groups button").count() == 1

    def canvas(frame):
        return frame.evaluate("document.getElementById('canvas').toDataURL()")

    before_a, before_b = canvas(a), canvas(b)
    other = 2 if a.evaluate("window.attnlabViewer.state.head") == 3 else 3  # not the opening head
    a.locator(f"#heads button[data-value='{other}']").click()
    assert canvas(a) != before_a and canvas(b) == before_b
    # hover in the second frame reads the second model's weights
    # hover the cell (4, 2) of the second frame's canvas; Playwright scrolls and maps the frame
    at = b.evaluate(
        "(() => { const c = window.attnlabViewer.cellCenter(4, 2);"
        " const r = document.getElementById('canvas').getBoundingClientRect();"
        " return {x: c.x - r.left, y: c.y - r.top}; })()"
    )
    b.locator("#canvas").hover(position=at)
    # the frame handles the move on its own event loop: wait for its tooltip (a loaded CPU is slow)
    b.wait_for_function("document.getElementById('tip').getAttribute('data-value') !== null")
    assert int(b.locator("#tip").get_attribute("data-query")) == 4
    assert float(b.locator("#tip").get_attribute("data-value")) == pytest.approx(
        float(gpt["h.0.attn"][0, b.evaluate("window.attnlabViewer.state.head"), 4, 2]), rel=1e-6
    )
    assert errors == [] and requests == []
    page.close()
