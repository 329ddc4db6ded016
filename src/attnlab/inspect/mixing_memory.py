"""The memory of context mixing (:func:`attnlab.inspect.mixing`), stated before it runs, and
the query rows it computes.

The per-layer methods go through the query rows block by block, so their memory is what they
keep of each layer (``O(T)``), the result (``L · B · R · T`` numbers for ``R`` rows) and one
block; :func:`mixing_memory` gives each part's formula and bytes, and refuses in
one line an input whose sum exceeds the machine's memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.capture import attention_modules
from attnlab.inspect.stats import TILE_ELEMENTS

__all__ = [
    "FORMULA",
    "block_rows",
    "method_kind",
    "mixing_bytes",
    "mixing_memory",
    "row_positions",
]

#: the memory formula of each kind of method (:func:`mixing_bytes`), for the refusal
FORMULA = {
    "streamed": "L·B·T·(3·d + 2·H·d_head + 3·H_kv·d_head) recorded + L·B·R·T (·H per head) "
    "result + one block",
    "value_zeroing": "B·(T+1)·(H·T² + 8·T·d) one layer at a time",
    "gradient": "3·L·B·H·T² weights and their graph",
}


def method_kind(method: str) -> str:
    """How a method of :func:`~attnlab.inspect.mixing.mixing` spends memory.

    Args:
        method: a method's name.

    Returns:
        ``"streamed"`` (the per-layer methods), ``"value_zeroing"`` or ``"gradient"``.
    """
    if method == "value_zeroing":
        return method
    return "gradient" if method in ("grad_weights", "integrated_gradients") else "streamed"


def row_positions(rows: int | slice | Sequence[int] | torch.Tensor | None, t: int) -> torch.Tensor:
    """The query positions ``rows=`` names (:func:`~attnlab.inspect.mixing.mixing`), increasing.

    Args:
        rows: an int (negative counts from the end), a slice, indices, or ``None`` (all).
        t: the number of positions ``T``.

    Returns:
        The positions.

    Raises:
        ValueError: an index outside ``[−T, T)``, repeated positions, or no position.
        TypeError: another type.

    Shape:
        ``(R,)`` int64.
    """
    if rows is None:
        return torch.arange(t)
    if isinstance(rows, slice):
        idx = torch.arange(t)[rows]
    elif isinstance(rows, int) and not isinstance(rows, bool):
        idx = torch.tensor([rows])
    elif isinstance(rows, torch.Tensor) and not rows.is_floating_point() and rows.dim() <= 1:
        idx = rows.reshape(-1).cpu().long()
    elif isinstance(rows, Sequence) and all(isinstance(r, int) for r in rows):
        idx = torch.tensor(list(rows), dtype=torch.long)
    else:
        raise ArgumentTypeError(
            f"rows must be an int, a slice or a sequence of ints, got {type(rows).__name__}"
        )
    if idx.numel() and (idx.min() < -t or idx.max() >= t):
        raise ArgumentError(f"rows must lie in [-{t}, {t}) for T = {t} positions, got {rows!r}")
    idx = torch.where(idx < 0, idx + t, idx)
    if idx.numel() == 0 or idx.unique().numel() != idx.numel():
        raise ArgumentError(f"rows must name distinct positions, at least one, got {rows!r}")
    return idx.sort().values


def mixing_bytes(model: nn.Module, method: str, batch: int, t: int, **options: Any) -> int:
    """The memory :func:`~attnlab.inspect.mixing.mixing` certainly holds, from the model's
    sizes, before it runs: :func:`mixing_memory`'s parts summed (the forward's own transient
    activations, one layer's at a time, come on top: measured on SmolLM2 at ``T = 2048``,
    the peak was about 0.6 GiB above this).

    Args:
        model: the model.
        method: the method.
        batch: ``B``.
        t: ``T``.
        **options: :func:`mixing_memory`'s ``rows`` and ``heads``.

    Returns:
        Bytes.
    """
    return sum(mixing_memory(model, method, batch, t, **options).values())


def mixing_memory(
    model: nn.Module,
    method: str,
    batch: int,
    t: int,
    *,
    rows: int | None = None,
    heads: bool = False,
) -> dict[str, int]:
    """The memory of :func:`~attnlab.inspect.mixing.mixing`, part by part (``L`` layers,
    ``H`` heads, ``H_kv`` key/value heads, ``d`` = d_model, ``R`` rows; in bytes of the
    model's dtype, at least 4 for the result and the block):

    - per-layer methods (streamed): ``recorded`` = ``L·B·T·(3·d + 2·H·d_head + 3·H_kv·d_head)``
      (each layer's input, residual stream and what it added; its queries, outputs, keys and
      values; the forward stops after the last attention layer, so no logits); ``result`` =
      ``L·B·R·T`` (``·(1 + H)`` with ``heads`` for ``weights``/``norm``) plus ``B·R·T`` for a
      rolled-out total (``flow`` computes every row: ``R = T``), or ``L·B·T²`` for the
      cumulative products of ``rollout``/``alti`` over every row; ``block`` = ``B·b·T·2·H``
      (a block of ``b`` rows' scores and weights; ``weights``, ``rollout``, ``flow``) or
      ``B·b·T·(2·H + 3·d) + B·H·T·d`` (and its token vectors, and the heads' outputs; the
      decompositions), ``b`` from :func:`block_rows` (about
      :data:`~attnlab.inspect.stats.TILE_ELEMENTS` numbers), plus ``B·R·T`` for a rollout of
      some rows;
    - ``value_zeroing``: one layer at a time, ``B·(T+1)·(H·T² + 8·T·d)``;
    - ``grad_weights``, ``integrated_gradients``: ``3·L·B·H·T²`` (the weights and their graph).

    Args:
        model: the model.
        method: the method.
        batch: ``B``.
        t: ``T``.
        rows: ``R``; default ``T``.
        heads: per-head matrices asked for.

    Returns:
        ``{"recorded": …, "result": …, "block": …}`` in bytes.
    """
    modules = attention_modules(model)
    if not modules:
        return {"recorded": 0, "result": 0, "block": 0}
    first = next(iter(modules.values()))
    param = next(iter(model.parameters()), None)
    size = param.element_size() if param is not None else 4
    acc = max(size, 4)
    n_layers, h, h_kv, d = len(modules), first.num_heads, first.num_kv_heads, first.d_model
    dh = first.d_head
    kind = method_kind(method)
    if kind == "value_zeroing":
        return {
            "recorded": 0,
            "result": 0,
            "block": batch * (t + 1) * (h * t * t + 8 * t * d) * size,
        }
    if kind == "gradient":
        return {"recorded": 3 * n_layers * batch * h * t * t * size, "result": 0, "block": 0}
    r = t if rows is None or method == "flow" else rows
    recorded = n_layers * batch * t * (3 * d + 2 * h * dh + 3 * h_kv * dh) * size
    per_head = h if heads and method in ("weights", "norm") else 0
    total = batch * r * t if method in ("rollout", "flow", "alti") else 0
    if method in ("rollout", "alti") and r == t:  # every layer's product (the last is total)
        total = n_layers * batch * t * t
    result = (n_layers * batch * r * t * (1 + per_head) + total) * acc
    if method in ("weights", "rollout", "flow"):  # a block's scores and weights
        b = block_rows(batch, t, h, 0)
        block = batch * b * t * 2 * h
    else:  # and its token vectors, and the heads' outputs f
        b = block_rows(batch, t, h, d)
        block = batch * b * t * (2 * h + 3 * d) + batch * h * t * d
    block += batch * r * t if method in ("rollout", "alti") and r < t else 0
    return {"recorded": recorded, "result": result, "block": block * acc}


def block_rows(batch: int, t: int, heads: int, d_model: int) -> int:
    """Query rows per block by default: a block's weights and token vectors,
    ``B · b · T · (H + d_model)`` numbers, near :data:`~attnlab.inspect.stats.TILE_ELEMENTS`.

    Args:
        batch: ``B``.
        t: ``T``.
        heads: ``H``.
        d_model: ``d_model`` (``0`` for the methods that form no token vectors).

    Returns:
        ``b >= 1``.
    """
    return max(1, min(t, TILE_ELEMENTS // max(1, batch * t * (heads + d_model))))
