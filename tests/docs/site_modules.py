"""The documentation site's hooks and link check (docs/*.py), loaded as MkDocs loads them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

DOCS = Path(__file__).resolve().parents[2] / "docs"


def load(name: str) -> ModuleType:
    """Import ``docs/<name>.py`` with ``docs/`` on ``sys.path`` (hooks.py imports check_links)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(DOCS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(DOCS))
    return module


check_links = load("check_links")
hooks = load("hooks")
