"""MkDocs hooks: the executed notebooks and the API reference pages join the site.

- The learning path is every executed notebook in ``build/notebooks/`` (``notebooks/run.py``
  writes them; ``make docs`` runs it first), titled by its first heading.
- The API reference has one page per public module of ``attnlab`` (no ``_`` in its path, not
  ``cli``), generated here, so a new module is documented without editing a list.
"""

from __future__ import annotations

import json
import pkgutil
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
NOTEBOOKS = BUILD / "notebooks"
PACKAGES = [
    "nn", "models", "decoding", "training", "distributed", "data", "inspect", "viz", "tasks"
]  # fmt: skip
# public modules at the top of the package that `import attnlab` gives (one page each)
MODULES = ["errors"]


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
