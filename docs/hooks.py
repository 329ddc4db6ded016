"""MkDocs hooks: the executed notebooks and the API reference pages join the site.

- The learning path is every executed notebook in ``build/notebooks/`` (``notebooks/run.py``
  writes them; ``make docs`` runs it first), titled by its first heading.
- The API reference has one page per public module of ``attnlab`` (no ``_`` in its path, not
  ``cli``), generated here, so a new module is documented without editing a list.
- The home page lists the notebooks in place of its ``<!-- notebooks -->`` line.
- A notebook's link to another notebook (``02_multi_head_attention.ipynb``, which works in Jupyter)
  becomes the link to that notebook's page: nbconvert renders a notebook's markdown, so MkDocs,
  which rewrites the links of its own markdown pages, never sees them.
- The maths is typeset offline: MathJax 2.7 (the ``jupyter-server-mathjax`` package) is copied
  into ``assets/mathjax/`` and each page with maths loads it by a relative URL, so the site works
  from a subfolder and from ``file://``. The notebooks' maths is configured by nbconvert's
  template, the markdown pages' by ``pymdownx.arithmatex``.
- nbconvert's template puts a loader of mermaid (diagrams) in every notebook page, which imports
  mermaid from a CDN when a page holds a diagram; no notebook does, and the site names nothing on
  the network, so :func:`drop_network_scripts` removes it.
- After the build every internal link must resolve (``docs/check_links.py``), or the build fails;
  nothing a page loads, nor any URL its inline scripts name, may come from the network.
"""

from __future__ import annotations

import importlib.util
import json
import pkgutil
import posixpath
import re
import shutil
from pathlib import Path

import check_links  # docs/check_links.py: MkDocs puts the hooks' folder on sys.path
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page
from mkdocs.structure.toc import AnchorLink, TableOfContents

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
NOTEBOOKS = BUILD / "notebooks"
PACKAGES = [
    "nn", "models", "decoding", "training", "distributed", "data", "inspect", "viz", "tasks", "serve"
]  # fmt: skip
# public modules at the top of the package that `import attnlab` gives (one page each)
MODULES = ["errors"]
# MathJax 2.7 in the built site, and the MathJax configuration every page with maths loads
MATHJAX_DIR = "assets/mathjax"
MATHJAX_CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe,local/attnlab"
# config/local/attnlab.js: the package ships the STIX-Web fonts only, so MathJax must not look
# for its default TeX fonts (as Jupyter's own MathJax settings say), nor may the hidden MathML for
# screen readers ask for them (the native-MathML styles name TeX fonts for \mathbb, \mathcal)
MATHJAX_LOCAL = """MathJax.Hub.Config({
  messageStyle: "none",
  "HTML-CSS": {availableFonts: [], preferredFont: null, webFont: "STIX-Web", imageFont: null},
  SVG: {font: "STIX-Web"},
  AssistiveMML: {styles: {".MJX_Assistive_MathML [mathvariant]": {"font-family": "inherit"}}}
});
MathJax.Ajax.loadComplete("[MathJax]/config/local/attnlab.js");
"""
# nbconvert's template writes this URL into every notebook page; on_post_page makes it relative
MATHJAX_PLACEHOLDER = f"__mathjax__/MathJax.js?config={MATHJAX_CONFIG}"
NOTEBOOK_LIST_MARK = "<!-- notebooks -->"
# an inline module script of nbconvert's template that imports mermaid from a CDN
MERMAID_LOADER = re.compile(
    r'<script type="module">(?:(?!</script>).)*?mermaid.*?</script>\s*', re.S
)
# a link in a notebook's rendered markdown to another notebook: href="NN_name.ipynb#anchor"
_NOTEBOOK_HREF = re.compile(r'href="([^":#?]+\.ipynb)(#[^"]*)?"')
_HEADING_ID = re.compile(r'<h([1-6])[^>]*\bid="([^"]+)"')


def _notebooks() -> list[Path]:
    found = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise PluginError(f"no executed notebooks in {NOTEBOOKS}: run `make docs`")
    return found


def _title(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    raise PluginError(f"{path.name}: the first markdown cell must start with a '# ' title")


def notebook_list(paths: list[Path]) -> str:
    """The markdown list of the executed notebooks, each its title linked to its page.

    Args:
        paths: the executed notebooks (``NN_name.ipynb``), in order.

    Returns:
        One ``- [title](notebooks/NN_name.ipynb)`` line per notebook.
    """
    return "\n".join(f"- [{_title(p)}](notebooks/{p.name})" for p in paths) + "\n"


def mathjax_source() -> Path:
    """The folder of MathJax 2.7 that the ``jupyter-server-mathjax`` package ships."""
    spec = importlib.util.find_spec("jupyter_server_mathjax")  # found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise PluginError("MathJax is missing: pip install jupyter-server-mathjax (.[docs])")
    static = Path(next(iter(spec.submodule_search_locations))) / "static"
    if not (static / "MathJax.js").is_file():
        raise PluginError(f"no MathJax.js in {static}")
    return static


def copy_mathjax(dest: Path) -> None:
    """Copy MathJax into ``dest`` with the site's configuration (``config/local/attnlab.js``)."""
    shutil.copytree(mathjax_source(), dest, dirs_exist_ok=True)
    (dest / "config" / "local").mkdir(parents=True, exist_ok=True)
    (dest / "config" / "local" / "attnlab.js").write_text(MATHJAX_LOCAL, encoding="utf-8")


def mathjax_url(page_dest: str) -> str:
    """MathJax's URL relative to the page written at ``page_dest`` (``notebooks/x/index.html``)."""
    here = posixpath.dirname(page_dest) or "."
    return f"{posixpath.relpath(MATHJAX_DIR, here)}/MathJax.js?config={MATHJAX_CONFIG}"


def link_notebooks(html: str, page_src: str, files: Files) -> str:
    """Rewrite a notebook page's links to other notebooks into links to their pages.

    Args:
        html: the page's rendered content.
        page_src: the page's source path in the site (``notebooks/01_x.ipynb``).
        files: the site's files.

    Returns:
        ``html`` with each ``href="NN_name.ipynb#a"`` naming a notebook of the site replaced by
        its page's URL relative to this page; other links unchanged (the link check reports a
        notebook that is not there).
    """
    page_file = files.get_file_from_path(page_src)

    def one(m: re.Match[str]) -> str:
        target = posixpath.normpath(posixpath.join(posixpath.dirname(page_src), m[1]))
        found = files.get_file_from_path(target)
        if found is None or page_file is None:
            return m[0]
        return f'href="{found.url_relative_to(page_file)}{m[2] or ""}"'

    return _NOTEBOOK_HREF.sub(one, html)


def align_toc(html: str, toc: TableOfContents) -> None:
    """Give a notebook page's table of contents the ids its headings have in ``html``.

    mkdocs-jupyter builds the table of contents from the notebook converted to markdown, whose
    ids drop a heading's code (``2-same-numbers-less-memory``), while nbconvert's headings keep
    it (``2-backendblockwise-same-numbers-less-memory``). Where both list the same levels in the
    same order, the entries take the headings' ids; elsewhere nothing changes (the link check
    then reports the anchor).

    Args:
        html: the page's rendered content.
        toc: the page's table of contents, changed in place.
    """
    entries: list[AnchorLink] = []

    def walk(items: list[AnchorLink]) -> None:
        for item in items:
            entries.append(item)
            walk(item.children)

    walk(list(toc))
    headings = [(int(level), id_) for level, id_ in _HEADING_ID.findall(html)]
    if [e.level for e in entries] == [level for level, _ in headings]:
        for entry, (_, id_) in zip(entries, headings):
            entry.id = id_


def _modules(package: str) -> list[str]:
    root = ROOT / "src" / "attnlab" / package
    names = [f"attnlab.{package}"]
    for info in pkgutil.walk_packages([str(root)], prefix=f"attnlab.{package}."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def _api_page(package: str) -> str:
    # the package's docstring (its overview), then each module with its members; the package's
    # re-exports are the modules' objects, documented once, under their module
    package_name, *modules = _modules(package)
    parts = [f"# attnlab.{package}\n", f"::: {package_name}\n    options:\n      members: false\n"]
    parts += [f"::: {name}\n" for name in modules]
    return "\n".join(parts)


def _top_page() -> str:
    import attnlab

    lines = ["# attnlab\n", "The names `import attnlab` gives, and where each is documented.\n"]
    for name in attnlab.__all__:
        obj = getattr(attnlab, name)
        if name.startswith("__"):
            continue
        if isinstance(obj, type(attnlab)):
            lines.append(f"- `attnlab.{name}`: the module [`{obj.__name__}`][{obj.__name__}]")
        else:
            lines.append(f"- [`attnlab.{name}`][{obj.__module__}.{obj.__qualname__}]")
    return "\n".join(lines) + "\n"


def _check_packages() -> None:
    found = {
        p.name
        for p in (ROOT / "src" / "attnlab").iterdir()
        if (p / "__init__.py").exists() and not p.name.startswith("_") and p.name != "cli"
    }
    if found != set(PACKAGES):
        raise PluginError(f"PACKAGES must list the public subpackages {sorted(found)}")


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    _check_packages()
    learning = [{_title(p): f"notebooks/{p.name}"} for p in _notebooks()]
    api = [{"attnlab": "api/attnlab.md"}]
    api += [{f"attnlab.{p}": f"api/{p}.md"} for p in PACKAGES]
    api += [{f"attnlab.{m}": f"api/{m}.md"} for m in MODULES]
    config["nav"] = [
        {"Home": "index.md"},
        {"Conventions": "conventions.md"},
        {"Design": "design.md"},
        {"Learning path": learning},
        {"API reference": api},
    ]
    mathjax_source()  # fail early when the package is missing
    config.plugins["mkdocs-jupyter"].config["custom_mathjax_url"] = MATHJAX_PLACEHOLDER
    return config


@event_priority(100)  # before mkdocs-jupyter, which converts the notebooks it finds
def on_files(files: Files, config: MkDocsConfig) -> Files:
    for path in _notebooks():
        files.append(
            File(
                f"notebooks/{path.name}",
                src_dir=str(BUILD),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    files.append(File.generated(config, "api/attnlab.md", content=_top_page()))
    for package in PACKAGES:
        files.append(File.generated(config, f"api/{package}.md", content=_api_page(package)))
    for module in MODULES:
        page = f"# attnlab.{module}\n\n::: attnlab.{module}\n"
        files.append(File.generated(config, f"api/{module}.md", content=page))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri == "index.md":
        if NOTEBOOK_LIST_MARK not in markdown:
            raise PluginError(f"docs/index.md must hold the line {NOTEBOOK_LIST_MARK}")
        markdown = markdown.replace(NOTEBOOK_LIST_MARK, notebook_list(_notebooks()))
    return markdown


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri.endswith(".ipynb"):
        html = link_notebooks(html, page.file.src_uri, files)
        align_toc(html, page.toc)
    return html


def drop_network_scripts(html: str) -> str:
    """A notebook page without nbconvert's mermaid loader (a module script that imports mermaid
    from ``cdnjs.cloudflare.com`` when the page holds a diagram: none of ours does)."""
    return MERMAID_LOADER.sub("", html)


def on_post_page(output: str, page: Page, config: MkDocsConfig) -> str:
    url = mathjax_url(page.file.dest_uri)
    if MATHJAX_PLACEHOLDER in output:  # a notebook: nbconvert's template loads and configures it
        return drop_network_scripts(output.replace(MATHJAX_PLACEHOLDER, url))
    if '<script type="math/tex' in output:  # a markdown page's maths (pymdownx.arithmatex)
        return output.replace("</body>", f'<script src="{url}"></script></body>', 1)
    return output


@event_priority(-100)  # last: the link check sees every file the plugins wrote
def on_post_build(config: MkDocsConfig) -> None:
    site = Path(config["site_dir"])
    copy_mathjax(site / MATHJAX_DIR)
    broken = check_links.broken_links(site)
    if broken:
        raise PluginError(f"{len(broken)} broken links: {'; '.join(broken)}")
