"""Every internal link of a built site resolves: ``python docs/check_links.py build/site``.

An internal link is an ``href`` or ``src`` without a scheme (``https:``, ``mailto:``, ``data:``…):
relative to its page, it must name a file of the site (a folder stands for its ``index.html``),
and its ``#anchor``, where it has one and points at a page, an ``id`` (or ``name``) in that page.
Nothing a page loads (a ``src``, a stylesheet or icon ``<link>``) may come from the network: the
site works offline, and neither may a page's own script name a file on the network: a quoted
``https://…`` (or ``//…``) in an inline ``<script>`` counts as a load (nbconvert's mermaid loader
``import("https://cdnjs…")``, dormant or not). A hyperlink (``<a href>``) to another site is the
reader's choice, not checked.
A link from the site root (``/…``) counts as broken: it breaks when the site is opened from a
subfolder or from ``file://``; only the root's ``404.html``, which a server shows at any depth,
links that way (and its links must name files). ``make docs`` runs this check after the build
(docs/hooks.py).
"""

from __future__ import annotations

import posixpath
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

# the attributes that load or link a file: <a href>, <link href>, <script src>, <img src>, …
LINK_ATTRS = {"href", "src"}
# a <link> of these kinds names a page, not a file the page loads
LINK_NOT_LOADED = {"canonical", "alternate", "next", "prev", "author", "license", "help"}
# the one page that links from the site root: a server shows it for a missing page at any depth
ROOTED = "404.html"
# a quoted remote URL in a page's inline script: what the script could fetch or import
SCRIPT_URL = re.compile(r"""["'`]((?:https?:|wss?:)?//[^"'`\s]+)""")


class _Page(HTMLParser):
    """The links and the anchors (``id``, ``<a name>``) of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.loads: list[str] = []
        self.anchors: set[str] = set()
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        rel = dict(attrs).get("rel") or ""
        self._in_script = tag == "script" and not dict(attrs).get("src")
        for name, value in attrs:
            if value is None:
                continue
            if name in LINK_ATTRS:
                self.links.append(value)
                if name == "src" or (tag == "link" and not LINK_NOT_LOADED & set(rel.split())):
                    self.loads.append(value)
            elif name == "id" or (name == "name" and tag == "a"):
                self.anchors.add(value)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:  # an inline script: the remote URLs it names count as loads
            self.loads += [m.group(1) for m in SCRIPT_URL.finditer(data)]


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    return page


def _remote(url: str) -> bool:
    parts = urlsplit(url)
    return url.startswith("//") or parts.scheme in {"http", "https", "ftp", "ws", "wss"}


def _is_internal(url: str) -> bool:
    parts = urlsplit(url)
    return not parts.scheme and not parts.netloc and not url.startswith("//")


def broken_links(site: Path) -> list[str]:
    """The internal links of ``site``'s HTML pages that resolve to no file or no anchor.

    Args:
        site: the built site's folder.

    Returns:
        One ``"page -> link"`` string per broken link or load from the network (the page
        relative to ``site``), sorted; empty when every link resolves.
    """
    site = site.resolve()
    pages = {p: _parse(p) for p in sorted(site.rglob("*.html"))}
    broken: list[str] = []
    for path, page in pages.items():
        here = path.relative_to(site).as_posix()
        broken += [
            f"{here} -> {url} (loaded from the network)" for url in page.loads if _remote(url)
        ]
        for url in page.links:
            if not url or not _is_internal(url):
                continue
            parts = urlsplit(url)
            if parts.path.startswith("/") and here != ROOTED:
                broken.append(f"{here} -> {url} (from the site root)")
                continue
            if parts.path:
                base = "" if parts.path.startswith("/") else posixpath.dirname(here)
                rel = posixpath.join(base, unquote(parts.path).lstrip("/"))
                target = site / posixpath.normpath(rel)
            else:
                target = path
            if target.is_dir():
                target = target / "index.html"
            if _outside(site, target) or not target.is_file():
                broken.append(f"{here} -> {url}")
                continue
            anchor = unquote(parts.fragment)
            if anchor and target.suffix == ".html":
                known = pages.get(target)
                if known is None or anchor not in known.anchors:
                    broken.append(f"{here} -> {url} (no anchor #{anchor})")
    return sorted(broken)


def _outside(site: Path, target: Path) -> bool:
    """Whether ``target`` lies outside ``site`` (a link climbing out of the site)."""
    try:
        target.resolve().relative_to(site)
    except ValueError:
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    """Check a built site; print the broken links on one line and return 1 if there are any."""
    args = sys.argv[1:] if argv is None else argv
    site = Path(args[0] if args else "build/site")
    if not site.is_dir():
        sys.stderr.write(f"check_links: no site at {site}\n")
        return 2
    broken = broken_links(site)
    if broken:
        sys.stderr.write(f"{len(broken)} broken links in {site}: {'; '.join(broken)}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
