"""Strict JSON in and out: no bare ``NaN``, trees of bounded depth, one-line errors.

Python's ``json`` writes ``NaN`` and ``Infinity``, which are not JSON (other readers, ``jq`` and
browsers among them, refuse the whole file), and reads a document nested a hundred thousand
levels deep only to fail later with a ``RecursionError``. Everything attnlab's training side
writes or reads goes through these helpers:

- :func:`dumps_strict` refuses a non-finite number, naming where it sits (``args.lr``);
- :func:`finite_or_none` replaces non-finite floats by ``None`` (``null``), for logs, where a
  diverged loss is a fact to record rather than an error;
- :func:`read_json` reads a file and refuses a tree nested deeper than :data:`MAX_DEPTH`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

from attnlab._checks import JSON_MAX_DEPTH, json_depth, read_small_bytes
from attnlab.errors import ArgumentError

__all__ = ["MAX_DEPTH", "dumps_strict", "finite_or_none", "read_json", "tree_depth"]

#: the deepest tree :func:`read_json` accepts (attnlab's own files nest fewer than 10 levels)
MAX_DEPTH = JSON_MAX_DEPTH


def _non_finite_path(tree: Any, path: str) -> str | None:
    """Where the first non-finite float of ``tree`` sits (``a.b[2]``), or None."""
    stack: list[tuple[Any, str]] = [(tree, path)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return where or "the value"
        if isinstance(node, Mapping):
            items = [(v, f"{where}.{k}" if where else str(k)) for k, v in node.items()]
            stack.extend(reversed(items))
        elif isinstance(node, (list, tuple)):
            stack.extend(reversed([(v, f"{where}[{i}]") for i, v in enumerate(node)]))
    return None


def dumps_strict(tree: Any, *, what: str = "value", **kwargs: Any) -> str:
    """``json.dumps(tree)`` that refuses NaN and infinities.

    Args:
        tree: a JSON-able tree.
        what: how the message names ``tree`` (e.g. ``"config"``).
        **kwargs: passed to ``json.dumps`` (``indent``, ``sort_keys``…).

    Returns:
        The JSON text.

    Raises:
        ValueError: ``tree`` holds a non-finite number (the message names its key).
        TypeError: ``tree`` holds a value JSON cannot represent.
    """
    where = _non_finite_path(tree, "")
    if where is not None:
        raise ArgumentError(
            f"{what} must hold finite numbers only (JSON has no NaN or infinity), "
            f"got a non-finite number at {where}"
        )
    return json.dumps(tree, allow_nan=False, **kwargs)


def finite_or_none(tree: Any) -> Any:
    """``tree`` with every non-finite float replaced by ``None`` (JSON ``null``).

    Args:
        tree: nested dicts, lists, tuples and scalars.

    Returns:
        A copy of the tree (tuples become lists) without NaN or infinities.
    """
    if isinstance(tree, float):
        return tree if math.isfinite(tree) else None
    if isinstance(tree, Mapping):
        return {k: finite_or_none(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [finite_or_none(v) for v in tree]
    return tree


#: the nesting depth of a JSON tree (:func:`attnlab._checks.json_depth`)
tree_depth = json_depth

#: the largest JSON file :func:`read_json` reads (a training state's tree may list a data order)
MAX_BYTES = 2**30


def read_json(path: str | os.PathLike[str], *, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON document of a UTF-8 file.

    Args:
        path: the file.
        max_depth: the deepest nesting accepted; default ``MAX_DEPTH``.

    Returns:
        The parsed document.

    Raises:
        ValueError: one line — the file is not a regular file of at most
            :data:`MAX_BYTES` (a FIFO, a link to a device), not UTF-8, not JSON, or nested
            deeper than ``max_depth`` (a crafted file).
        OSError: the file cannot be read.
    """
    text = read_small_bytes(path, MAX_BYTES)  # a FIFO or a link to /dev/zero refused unread
    try:
        tree = json.loads(text.decode("utf-8"))
    except UnicodeDecodeError:
        raise ArgumentError("it is not UTF-8 text") from None
    except RecursionError:
        raise ArgumentError(f"it is nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise ArgumentError(f"it is not JSON ({str(exc).splitlines()[0]})") from None
    if tree_depth(tree, max_depth) > max_depth:
        raise ArgumentError(f"it is nested deeper than {max_depth} levels")
    return tree
