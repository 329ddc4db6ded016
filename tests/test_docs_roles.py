"""The docs site's Griffe extension (docs/griffe_roles.py): roles become code, ``::`` one colon."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import griffe

SPEC = importlib.util.spec_from_file_location(
    "griffe_roles", Path(__file__).resolve().parents[1] / "docs" / "griffe_roles.py"
)
assert SPEC is not None and SPEC.loader is not None
roles = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(roles)


def test_roles_become_code_and_literal_block_markers_one_colon() -> None:
    text = (
        "See :func:`~attnlab.inspect.capture` and :class:`attnlab.GPT`, laid out so::\n\n"
        "    step-00000040/\n\nA ratio 1::2 inside a line, and a lone line\n\n::\n\n    code"
    )
    obj = griffe.Function("f", docstring=griffe.Docstring(text))
    roles.ReSTRoles().on_object(obj=obj)
    assert obj.docstring is not None
    assert obj.docstring.value.rstrip() == (
        "See `capture` and `attnlab.GPT`, laid out so:\n\n"
        "    step-00000040/\n\nA ratio 1::2 inside a line, and a lone line\n\n::\n\n    code"
    )
