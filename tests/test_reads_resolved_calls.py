"""Inspection and figures read the call an attention layer resolved, never its forward arguments.

Every attention layer emits what it ran through ``hook_call``
(:class:`attnlab.nn.resolved_call.ResolvedCall`); capture, ablation, ``plot steps`` and the viewer
read that. A forward pre-hook — above all one ``with_kwargs=True``, which sees ``mask=``,
``is_causal=``, ``window=``… — would re-derive what the layer does from how it was called (and
get windows, layouts and the non-softmax kinds wrong, as ``plot steps`` once did). This test reads
the source (ast) of ``attnlab.inspect`` and ``attnlab.viz`` and allows none, but for:

* ``inspect/nonfinite.py``: ``first_nonfinite`` hooks *every* module (attention or not) and only
  looks for NaN/inf among whatever tensors each one receives and returns, to name the module
  where a non-finite value first appears; it reads no attention option and decides nothing from
  the arguments' meaning.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "attnlab"
PACKAGES = ("inspect", "viz")
# file (relative to src/attnlab) → why its forward pre-hooks are not argument parsing
EXEMPT = {
    "inspect/nonfinite.py": "generic NaN/inf search over every module's tensors, not attention's",
}


def _pre_hooks(path: Path) -> list[tuple[int, bool]]:
    """``(line, with_kwargs)`` of each ``register_forward_pre_hook`` call in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("register_forward_pre_hook", "register_module_forward_pre_hook")
        ):
            kw = any(
                k.arg == "with_kwargs"
                and not (isinstance(k.value, ast.Constant) and not k.value.value)
                for k in node.keywords
            )
            found.append((node.lineno, kw))
    return found


FILES = sorted(p for pkg in PACKAGES for p in (SRC / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_forward_pre_hook_parses_an_attention_layers_arguments(path: Path) -> None:
    rel = str(path.relative_to(SRC))
    hooks = _pre_hooks(path)
    if rel in EXEMPT:
        assert hooks, f"{rel} no longer registers pre-hooks: drop its exemption"
        return
    assert not hooks, (
        f"{rel} registers forward pre-hooks at lines {[line for line, _ in hooks]} "
        f"(with_kwargs: {[kw for _, kw in hooks]}): read the layer's hook_call (ResolvedCall) "
        f"instead of its forward arguments"
    )


def test_the_rule_sees_a_pre_hook(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("layer.register_forward_pre_hook(pre, with_kwargs=True)\n", encoding="utf-8")
    assert _pre_hooks(bad) == [(1, True)]
