"""The page of ``attnlab serve`` in Debian's Chromium (Playwright), against a real uvicorn on a
free port of 127.0.0.1 serving a tiny model: type, see the grid change, move a slider, generate,
click a head and see its card — one page load."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.viz.test_viewer import browser  # noqa: F401 (the fixture)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    import uvicorn

    from tests.serve._app import tiny_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(tiny_app(), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def _grid(page) -> str:
    frame = page.query_selector("#grid-frame").content_frame()
    return frame.evaluate("() => document.getElementById('canvas').toDataURL()")


def test_type_slide_generate_and_choose_a_head(server, browser) -> None:  # noqa: F811
    page = browser.new_page(viewport={"width": 1400, "height": 1500})
    errors: list[str] = []
    foreign: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: None if r.url.startswith((server, "data:", "blob:", "about:"))
            else foreign.append(r.url))  # fmt: skip
    page.goto(server)
    # the page's default text is longer than this server runs (24 tokens): refused in the page
    page.wait_for_selector("#error:not([hidden])")
    assert "more than the 24 this server runs" in page.inner_text("#error")
    assert errors == ["Failed to load resource: the server responded with a status of 413 "
                      "(Request Entity Too Large)"]  # fmt: skip
    errors.clear()
    stats = "window.attnlabServe.stats"
    page.fill("#text", "abc bad")
    page.wait_for_function(f"() => {stats}.views >= 1 && {stats}.nexts >= 1 && {stats}.steps >= 1")
    page.wait_for_function(
        "() => { const f = document.getElementById('grid-frame').contentWindow;"
        " return f.attnlabViewer && f.attnlabViewer.chosen.view === 'grid'; }"
    )
    assert page.is_hidden("#error")
    before = _grid(page)
    # type: the grid is drawn again for the new tokens
    page.fill("#text", "bad cafe <b>")
    page.wait_for_function(
        f"() => {stats}.views >= 2 && window.attnlabServe.state.tokens.length === 12"
    )
    page.wait_for_function(
        "() => { const v = document.getElementById('grid-frame').contentWindow.attnlabViewer;"
        " return !!v && v.chosen.view === 'grid' && v.chosen.rows === 12; }"
    )
    assert _grid(page) != before
    # a slider: the bars are asked again under the new temperature
    bars = page.inner_text("#bars")
    nexts = page.evaluate(f"() => {stats}.nexts")
    page.eval_on_selector(
        "#temperature", "e => { e.value = '0.3'; e.dispatchEvent(new Event('input')); }"
    )
    page.wait_for_function(f"() => {stats}.nexts > {nexts}")
    assert page.inner_text("#temperature-value") == "0.30" and page.inner_text("#bars") != bars
    # generate N: three tokens appended, marked as generated on the page and in the viewer
    page.fill("#n", "3")
    page.click("#generate-n")
    page.wait_for_function(
        f"() => {stats}.views >= 3 && document.querySelectorAll('#generated .gen').length === 3"
    )
    assert page.evaluate("() => window.attnlabServe.state.prompt") == 12
    # a head clicked in the grid: the matrix frame and the step panel follow
    frame = page.query_selector("#grid-frame")
    page.wait_for_function(
        "() => { const v = document.getElementById('grid-frame').contentWindow.attnlabViewer;"
        " return !!v && v.chosen.view === 'grid' && v.chosen.rows === 15; }"
    )
    page.wait_for_function(f"() => {stats}.steps >= 3")  # the view's own step panel is back
    # the card's mixing and lens are asked for when ticked (seconds on a pretrained model)
    assert page.eval_on_selector("#card-lens", "t => t.rows.length") == 0
    page.check("#card-mixing-on")
    page.check("#card-lens-on")
    page.wait_for_function("() => document.getElementById('card-lens').rows.length > 0")
    steps = page.evaluate(f"() => {stats}.steps")
    cards = page.evaluate(f"() => {stats}.cards")
    head = 2 if page.evaluate("() => window.attnlabServe.state.head") != 2 else 1
    tile = frame.content_frame().evaluate(f"() => attnlabViewer.tileCenter(1, {head})")
    box = frame.bounding_box()
    page.mouse.click(box["x"] + tile["x"], box["y"] + tile["y"])
    page.wait_for_function(f"() => {stats}.steps > {steps}")
    matrix = page.query_selector("#matrix-frame").content_frame()
    chosen = "() => [attnlabViewer.chosen.layer, attnlabViewer.chosen.head]"
    assert matrix.evaluate(chosen) == [1, head]
    assert f"transformer.h.1.attn · head {head}" in page.inner_text("#steps-where")
    # its card follows: role scores, entropy and sink share, spectra, mixing row, lens column
    page.wait_for_function(f"() => {stats}.cards > {cards}")
    assert f"transformer.h.1.attn · head {head}" in page.inner_text("#card-where")
    assert page.eval_on_selector("#card-roles", "t => t.rows.length") == 4
    assert "sink share" in page.inner_text("#card-health")
    assert (
        page.eval_on_selector("#card-spectrum", "t => t.querySelectorAll('.spectrum div').length")
        == 16
    )
    assert page.eval_on_selector("#card-mixing", "t => t.rows.length") == 1 + 15  # a row a key
    assert page.eval_on_selector("#card-lens", "t => t.rows.length") == 1 + 3  # embed, 0, 1
    # the plot steps figure is drawn only on demand: no broken image before
    assert page.is_hidden("#steps-image")
    # text is shown as text: the typed markup is a token label, not an element
    assert page.query_selector("#generated b") is None
    assert not errors and not foreign
    page.close()
