"""The built site's link check (docs/check_links.py) on a tiny hand-made site."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.site_modules import check_links


def _write(root: Path, rel: str, html: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<!doctype html><html><body>{html}</body></html>", encoding="utf-8")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    _write(tmp_path, "index.html", '<a href="pages/two/">two</a> <a href="pages/two/#sec">sec</a>')
    _write(
        tmp_path,
        "pages/two/index.html",
        '<h2 id="sec">Sec</h2><a href="../../">home</a><a href="#sec">here</a>'
        '<img src="../../img/a%20b.png"><a href="https://example.org/">elsewhere</a>'
        '<link rel="canonical" href="https://example.org/two/">',
    )
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a b.png").write_bytes(b"png")
    _write(tmp_path, "404.html", '<a href="/pages/two/">two</a>')
    return tmp_path


def test_a_site_whose_links_resolve_passes(site: Path) -> None:
    assert check_links.broken_links(site) == []
    assert check_links.main([str(site)]) == 0


def test_each_kind_of_broken_link_is_reported(site: Path, capsys) -> None:
    _write(
        site,
        "pages/three.html",
        '<a href="two/">ok</a><a href="four/">missing page</a><a href="two/#nope">bad anchor</a>'
        '<a href="/pages/two/">from the root</a><a href="../../../etc/passwd">outside</a>'
        '<script src="https://cdn.example.org/x.js"></script>'
        '<link rel="stylesheet" href="//fonts.example.org/f.css">',
    )
    assert check_links.broken_links(site) == [
        "pages/three.html -> ../../../etc/passwd",
        "pages/three.html -> //fonts.example.org/f.css (loaded from the network)",
        "pages/three.html -> /pages/two/ (from the site root)",
        "pages/three.html -> four/",
        "pages/three.html -> https://cdn.example.org/x.js (loaded from the network)",
        "pages/three.html -> two/#nope (no anchor #nope)",
    ]
    assert check_links.main([str(site)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"6 broken links in {site}: ")


def test_the_404_page_links_from_the_root_but_to_real_files(site: Path) -> None:
    _write(site, "404.html", '<a href="/pages/two/">two</a><a href="/gone/">gone</a>')
    assert check_links.broken_links(site) == ["404.html -> /gone/"]


def test_an_inline_script_naming_a_remote_url_is_a_load_from_the_network(site: Path) -> None:
    """nbconvert's dormant mermaid loader (``import("https://cdnjs…")`` in a module script) was
    not seen: only ``src``/``href`` attributes were checked."""
    _write(
        site,
        "nb.html",
        '<script type="module">const m = (await import("https://cdn.example.org/m.mjs"));'
        "</script><script>var here = 'assets/x.js', ns = 'no URL';</script>",
    )
    assert check_links.broken_links(site) == [
        "nb.html -> https://cdn.example.org/m.mjs (loaded from the network)"
    ]
