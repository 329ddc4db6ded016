"""The design document lives in the repository (issue 20): ``docs/design.md``, on the site.

- the site's navigation lists it (``docs/hooks.py`` builds the nav);
- every file it names (``src/attnlab/...``, ``tests/...``, ``nn/masks.py`` under ``src/attnlab``)
  and every name it gives (``attnlab.nn.masks``, ``attnlab.errors.ArgumentError``,
  ``al.masks.padding_mask``) exists, so the page cannot drift from the code unnoticed;
- every reference to a section of it (``docs/design.md, "Conventions"``) names a heading it has;
- nothing in the repository points to the design document that used to live outside it, nor to
  an absolute path of the machine it was written on.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "attnlab"
DESIGN = ROOT / "docs" / "design.md"

# Names the page uses that land with a parallel change of issue 20 (`attnlab.tasks.train` and
# its typed options): allowed to be missing until then. The last test fails once
# one of them exists, so that its entry goes too.

REPO_DIRS = ("src", "tests", "benchmarks", "notebooks", "docs")
PACKAGES = ("nn", "models", "decoding", "training", "distributed", "data", "tasks", "inspect", "viz", "serve", "cli")  # fmt: skip
# a path of the repository, or one under src/attnlab written from its package (`nn/masks.py`)
REPO_PATH = re.compile(rf"(?<![\w/.-])((?:{'|'.join(REPO_DIRS)})/[\w./-]*[\w/])")
PACKAGE_PATH = re.compile(rf"(?<![\w/.-])((?:{'|'.join(PACKAGES)})/[\w./-]*[\w/])")
MODULE_NAME = re.compile(r"(?<![\w.])(attnlab(?:\.\w+)+)")
ALIAS_NAME = re.compile(r"(?<![\w.])al((?:\.\w+)+)")  # `import attnlab as al`
SECTION_REF = re.compile(r"docs/design\.md`?,? \"([^\"]+)\"")
TEXT_SUFFIXES = {".py", ".md", ".yml", ".yaml", ".toml", ".txt", ".html", ".js", ".css", ".cfg"}


def _text() -> str:
    return DESIGN.read_text(encoding="utf-8")


def _resolves(name: str) -> bool:
    """``attnlab.a.b.c``: the longest importable module, then attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _headings() -> set[str]:
    return {line.lstrip("#").strip() for line in _text().splitlines() if re.match(r"#{1,6} ", line)}


def _repo_files() -> list[Path]:
    files = [ROOT / name for name in ("README.md", "mkdocs.yml", "Makefile", "pyproject.toml")]
    for folder in REPO_DIRS:
        files += [
            p
            for p in sorted((ROOT / folder).rglob("*"))
            if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts
        ]
    return [p for p in files if p.exists()]


def test_the_design_is_on_the_site() -> None:
    tree = ast.parse((ROOT / "docs" / "hooks.py").read_text(encoding="utf-8"))
    nav: list[object] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Subscript)
            and isinstance(node.targets[0].slice, ast.Constant)
            and node.targets[0].slice.value == "nav"
            and isinstance(node.value, ast.List)
        ):
            for entry in node.value.elts:
                try:
                    nav.append(ast.literal_eval(entry))
                except ValueError:  # built from variables (the notebooks, the API pages)
                    continue
    assert {"Design": "design.md"} in nav, nav
    assert re.search(r"^docs_dir: docs$", (ROOT / "mkdocs.yml").read_text("utf-8"), re.M)
    assert DESIGN.exists()


def test_every_file_it_names_exists() -> None:
    text = _text()
    named = set(REPO_PATH.findall(text))
    named |= {f"src/attnlab/{p}" for p in PACKAGE_PATH.findall(text)}
    assert len(named) > 30  # the rule reads the page
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/design.md names files that do not exist: {missing}"


def test_every_name_it_gives_exists() -> None:
    text = _text()
    names = set(MODULE_NAME.findall(text)) | {f"attnlab{a}" for a in ALIAS_NAME.findall(text)}
    assert len(names) > 20
    missing = sorted(n for n in names if not _resolves(n))
    assert not missing, f"docs/design.md names what attnlab does not have: {missing}"


def test_references_to_its_sections_name_a_heading() -> None:
    headings = _headings()
    found = []
    for path in _repo_files():
        for title in SECTION_REF.findall(path.read_text(encoding="utf-8", errors="replace")):
            found.append(title)
            assert title in headings, f"{path.relative_to(ROOT)}: no section {title!r}"
    assert found  # the benchmarks and the tests cite it


def test_nothing_points_outside_the_repository() -> None:
    # the design file that lived outside the repository, by name (its capitalised name + .md);
    # an absolute path of the machine; ../shared but for the data (its paths move separately)
    old = re.compile(r"\b" + "DESI" + r"GN(\.md|\s*§)")
    outside = re.compile("/" + r"work/|\.\./shared/(?!data\b)")
    offences = []
    for path in _repo_files():
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines()):
            if old.search(line) or outside.search(line):
                offences.append(f"{path.relative_to(ROOT)}:{n + 1}: {line.strip()}")
    assert not offences, offences
