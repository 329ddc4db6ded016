"""The site's hooks (docs/hooks.py): notebook links, the notebook list, MathJax's URL, the TOC."""

from __future__ import annotations

import json
from pathlib import Path

from mkdocs.structure.files import File, Files
from mkdocs.structure.toc import get_toc

from tests.docs.site_modules import hooks


def _notebook(folder: Path, name: str, title: str) -> Path:
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["intro\n", f"# {title}\n"]},
        {"cell_type": "code", "metadata": {}, "source": "", "outputs": [], "execution_count": 1},
    ]
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = folder / name
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def _site_files(tmp_path: Path, names: list[str]) -> Files:
    # imported here, not at collection: it costs each test worker seconds (nbconvert, jsonschema)
    from mkdocs_jupyter.plugin import NotebookFile

    files = []
    for name in names:
        plain = File(name, src_dir=str(tmp_path), dest_dir="site", use_directory_urls=True)
        files.append(NotebookFile(plain, use_directory_urls=True, site_dir="site"))
    files.append(File("img/a.png", src_dir=str(tmp_path), dest_dir="site", use_directory_urls=True))
    return Files(files)


def test_a_notebooks_link_to_a_notebook_becomes_its_page(tmp_path: Path) -> None:
    files = _site_files(tmp_path, ["notebooks/01_a.ipynb", "notebooks/02_b.ipynb", "c.ipynb"])
    html = (
        '<a href="02_b.ipynb">Next</a> <a href="02_b.ipynb#Sec-1">there</a> '
        '<a href="../c.ipynb">up</a> <a href="03_missing.ipynb">later</a> '
        '<a href="https://x.org/n.ipynb">web</a> <a href="../img/a.png">img</a>'
    )
    assert hooks.link_notebooks(html, "notebooks/01_a.ipynb", files) == (
        '<a href="../02_b/">Next</a> <a href="../02_b/#Sec-1">there</a> '
        '<a href="../../c/">up</a> <a href="03_missing.ipynb">later</a> '
        '<a href="https://x.org/n.ipynb">web</a> <a href="../img/a.png">img</a>'
    )


def test_the_notebook_list_links_each_title(tmp_path: Path) -> None:
    paths = [
        _notebook(tmp_path, "01_a.ipynb", "1 · First"),
        _notebook(tmp_path, "02_b.ipynb", "2 · B"),
    ]
    assert hooks.notebook_list(paths) == (
        "- [1 · First](notebooks/01_a.ipynb)\n- [2 · B](notebooks/02_b.ipynb)\n"
    )
    index = (hooks.ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert index.count(hooks.NOTEBOOK_LIST_MARK) == 1


def test_mathjax_is_found_relative_to_every_page() -> None:
    assert (hooks.mathjax_source() / "MathJax.js").is_file()
    query = f"MathJax.js?config={hooks.MATHJAX_CONFIG}"
    assert hooks.mathjax_url("index.html") == f"assets/mathjax/{query}"
    assert hooks.mathjax_url("404.html") == f"assets/mathjax/{query}"
    assert hooks.mathjax_url("notebooks/01_a/index.html") == f"../../assets/mathjax/{query}"
    assert hooks.mathjax_url("api/nn/index.html") == f"../../assets/mathjax/{query}"


def test_the_notebooks_toc_takes_the_ids_of_its_headings() -> None:
    toc = get_toc(
        [
            {"level": 1, "id": "title", "name": "Title", "children": [
                {"level": 2, "id": "2-same-numbers", "name": "2", "children": []},
            ]},
        ]
    )  # fmt: skip
    html = '<h1 id="Title">Title</h1><p>x</p><h2 class="a" id="2-backend-same-numbers">2</h2>'
    hooks.align_toc(html, toc)
    [top] = list(toc)
    assert (top.id, top.children[0].id) == ("Title", "2-backend-same-numbers")
    hooks.align_toc("<h1 id='x'>only one</h1>", toc)  # levels differ: left alone
    assert top.id == "Title"


def test_a_notebook_page_names_nothing_on_the_network(tmp_path: Path) -> None:
    """nbconvert's template loads mermaid from a CDN (dormant: no notebook holds a diagram); the
    page the hooks write holds no such loader, and the link check finds no remote URL."""
    from types import SimpleNamespace

    from mkdocs_jupyter.nbconvert2 import nb2html

    from tests.docs.site_modules import check_links

    source = _notebook(tmp_path, "t.ipynb", "T")
    html = nb2html(str(source), custom_mathjax_url=hooks.MATHJAX_PLACEHOLDER)
    assert "cdnjs.cloudflare.com" in html  # what nbconvert writes
    page = SimpleNamespace(file=SimpleNamespace(dest_uri="notebooks/t/index.html"))
    out = hooks.on_post_page(html, page, config=None)
    assert "cdnjs" not in out and "mermaid.esm" not in out and "import(" not in out
    site = tmp_path / "site"
    (site / "notebooks" / "t").mkdir(parents=True)
    (site / "notebooks" / "t" / "index.html").write_text(out, encoding="utf-8")
    assert not [b for b in check_links.broken_links(site) if "network" in b]
