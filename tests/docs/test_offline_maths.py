"""The site's maths is typeset offline: real Chromium, every request off ``file://`` refused.

A notebook page (nbconvert's HTML, as mkdocs-jupyter renders it) and a markdown page
(``pymdownx.arithmatex``) load the MathJax that docs/hooks.py copies into the site, by the
relative URL the hooks give each page.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import markdown
import nbformat
import pytest

from tests.docs.site_modules import hooks
from tests.viz.test_viewer import browser  # noqa: F401 (the Chromium fixture)

pytestmark = pytest.mark.browser

INLINE = r"$\operatorname{softmax}(x)_i = e^{x_i} / \sum_j e^{x_j}$"
DISPLAY = r"$$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V, \quad Q \in \mathbb{R}^{T \times d}$$"


def _page(site: Path, dest: str, body: str) -> Path:
    html = f"<!doctype html><html><head><meta charset='utf-8'></head><body>{body}</body></html>"
    page = SimpleNamespace(file=SimpleNamespace(dest_uri=dest))
    path = site / dest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(hooks.on_post_page(html, page, config=None), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    # imported here, not at collection: nbconvert costs each test worker seconds
    from mkdocs_jupyter.nbconvert2 import nb2html

    root = tmp_path_factory.mktemp("site")
    hooks.copy_mathjax(root / hooks.MATHJAX_DIR)
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell(f"# T\n\n{INLINE}\n\n{DISPLAY}")]
    )
    source = root / "t.ipynb"
    nbformat.write(nb, source)
    _page(
        root,
        "notebooks/t/index.html",
        nb2html(str(source), custom_mathjax_url=hooks.MATHJAX_PLACEHOLDER),
    )
    text = f"Inline {INLINE} and\n\n{DISPLAY}\n\nand `$HOME` stays code."
    _page(root, "design/index.html", markdown.markdown(text, extensions=["pymdownx.arithmatex"]))
    return root


def _typeset(chromium, path: Path) -> dict:
    page = chromium.new_page(viewport={"width": 1000, "height": 700})
    outside: list[str] = []
    failed: list[str] = []

    def route(r) -> None:
        if r.request.url.startswith(("file:", "data:", "blob:")):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("requestfailed", lambda r: failed.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_function("window.MathJax && MathJax.isReady === true", timeout=15_000)
    page.evaluate("() => new Promise(done => MathJax.Hub.Queue(() => done(true)))")
    seen = page.evaluate(
        """() => ({
            inline: document.querySelectorAll('span.MathJax').length,
            display: document.querySelectorAll('div.MathJax_Display').length,
            width: Math.max(0, ...[...document.querySelectorAll('div.MathJax_Display')]
                .map(e => e.getBoundingClientRect().width)),
            errors: document.querySelectorAll('.MathJax .merror, .MathJax_Error').length,
            text: document.body.innerText,
        })"""
    )
    page.close()
    return {**seen, "outside": outside, "failed": [u for u in failed if u != "about:blank"]}


@pytest.mark.parametrize("dest", ["notebooks/t/index.html", "design/index.html"])
def test_maths_is_typeset_with_no_network(browser, site: Path, dest: str) -> None:  # noqa: F811
    seen = _typeset(browser, site / dest)
    assert seen["outside"] == [] and seen["failed"] == []
    assert seen["display"] == 1 and seen["inline"] == 2  # a display's span.MathJax counts too
    assert seen["width"] > 200 and seen["errors"] == 0
    assert "$" not in seen["text"].replace("$HOME", "") and r"\frac" not in seen["text"]
