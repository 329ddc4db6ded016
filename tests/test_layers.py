"""The package's import rules, read from the source tree (ast), so that the layering stays.

The package reads bottom-up:

    nn  ←  models  ←  decoding, training  ←  inspect  ←  viz  ←  tasks  ←  serve  ←  cli

A package may import the ones below it (and ``attnlab._checks``, ``attnlab._budget``,
``attnlab._files`` and ``attnlab.errors``), never one above or beside it;
``data`` is a leaf that every layer may use and that imports nothing of attnlab's but
``_checks``, ``_budget`` and ``errors`` — no model, trainer, figure or console code; nothing imports ``cli`` but
``attnlab.__main__``. Deferred imports inside functions and ``TYPE_CHECKING`` imports count too:
a dependency hidden in a function is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "attnlab"

# a package's rank: it may import packages of a lower rank only
RANK = {
    "nn": 1,
    "models": 2,
    "decoding": 3,
    "training": 3,
    "distributed": 4,
    "inspect": 4,
    "viz": 5,
    "tasks": 6,
    "serve": 7,
    "cli": 8,
}
EVERYONE_MAY_IMPORT = {"_checks", "_budget", "_files", "errors", "data"}
# the root re-exports the public API and __main__ starts the CLI: they sit above everything
ROOT_MODULES = {"__init__", "__main__"}
# the leaf's own rule: third-party packages of figures and consoles stay out of data/
NOT_IN_DATA = {"matplotlib", "rich", "tqdm", "torch.nn"}


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every absolute import in a file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            if node.module == "attnlab":  # `from attnlab import tasks`
                found += [(node.lineno, f"attnlab.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return found


def _package(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _violations() -> list[str]:
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        own = _package(path)
        where = path.relative_to(SRC.parent)
        for line, module in _imports(path):
            parts = module.split(".")
            if own == "data" and any(
                module == banned or module.startswith(banned + ".") for banned in NOT_IN_DATA
            ):
                problems.append(f"{where}:{line} data is a leaf but imports {module}")
            if parts[0] != "attnlab" or len(parts) < 2:
                continue
            target = parts[1]
            if target == own or own in ROOT_MODULES:
                continue
            if target == "cli":
                problems.append(f"{where}:{line} imports {module}: nothing imports cli")
            elif own == "data" and target not in ("_checks", "_budget", "errors"):
                problems.append(f"{where}:{line} data is a leaf but imports {module}")
            elif target in EVERYONE_MAY_IMPORT:
                continue
            elif own == "errors":
                problems.append(f"{where}:{line} errors is the root leaf but imports {module}")
            elif own in ("_checks", "_budget", "_files") and target != "errors":
                problems.append(f"{where}:{line} {own} is a leaf but imports {module}")
            elif target not in RANK or own not in RANK:
                problems.append(f"{where}:{line} {own} → {module}: a package the rules do not know")
            elif RANK[target] >= RANK[own]:
                problems.append(
                    f"{where}:{line} {own} (layer {RANK[own]}) imports {module} "
                    f"(layer {RANK[target]}): imports must point down"
                )
    return problems


def test_imports_point_down_the_layers() -> None:
    assert _violations() == []


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(RANK) | EVERYONE_MAY_IMPORT


@pytest.mark.parametrize(
    ("own", "source", "problem"),
    [
        ("nn", "from attnlab.models.gpt import GPT", "imports must point down"),
        ("decoding", "from attnlab.training import Trainer", "imports must point down"),
        (
            "models",
            "def f():\n    from attnlab.decoding import generate",
            "imports must point down",
        ),
        ("data", "from attnlab.models import gpt", "data is a leaf"),
        ("data", "import rich.progress", "data is a leaf"),
        ("tasks", "from attnlab.cli import main", "nothing imports cli"),
        ("viz", "from attnlab import tasks", "imports must point down"),
    ],
)
def test_the_rules_catch_a_wrong_import(
    own: str, source: str, problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rule can fail: a planted import of each kind is reported."""
    fake = tmp_path / "attnlab"
    (fake / own).mkdir(parents=True)
    (fake / own / "planted.py").write_text(source + "\n", encoding="utf-8")
    monkeypatch.setattr(f"{__name__}.SRC", fake)
    found = _violations()
    assert len(found) == 1 and problem in found[0], found
