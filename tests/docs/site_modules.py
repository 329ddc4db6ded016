"""The documentation site's hooks and link check (docs/*.py), loaded as MkDocs loads them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

DOCS = Path(__file__).resolve().parents[2] / "docs"


def load(name: str, as_name: str | None = None) -> ModuleType:
    """Import ``docs/<name>.py`` with ``docs/`` on ``sys.path`` (hooks.py imports check_links).

    Args:
        name: the file's stem.
        as_name: the module's name in ``sys.modules`` (default ``name``).

    Returns:
        The module, imported once.
    """
    key = as_name or name
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    sys.path.insert(0, str(DOCS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(DOCS))
    return module


check_links = load("check_links")
hooks = load("hooks", as_name="attnlab_docs_hooks")
