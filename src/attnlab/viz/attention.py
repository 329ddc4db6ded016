"""Attention views: one head as a heatmap, the heads of a layer, layers × heads.

Rows are queries (who looks), columns keys (what is looked at), with the tokens on both axes.
Long sequences stay readable: :func:`reduce_attention` shrinks a ``T_q × T_k`` matrix to at most
``max_tokens`` per side, either by averaging blocks of positions (``"block"``) or by keeping the
positions that matter most (``"topk"``: the keys that receive the most attention and the queries
with the sharpest rows), with the original positions in the labels. Every function returns a
:class:`~attnlab.viz.Plot` holding the arrays it drew.

The matrices need not be square, nor their columns tokens: a Linformer layer's weights are
``T × k`` over projected key rows (label the columns with ``cache.key_labels(path)``, i.e.
``"E·K row j"``). A matrix with negative entries — e.g. the effective weights ``A · F`` of
:meth:`attnlab.inspect.ActivationCache.effective_weights` — is drawn on a diverging scale
symmetric about 0 (blue < 0 < red) instead of the ``[0, 1]`` weight scale.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.patches import Patch

from attnlab._checks import check_choice, check_positive_int, shape_str
from attnlab.errors import ArgumentError
from attnlab.viz._draw import (
    CMAP,
    DIVERGING,
    MASKED,
    ArrayLike,
    Plot,
    _draw_matrix,
    _labels,
    _labels_that_fit,
    _new_figure,
    _to_numpy,
)

__all__ = [
    "Reduced",
    "Reduction",
    "attention_heatmap",
    "head_grid",
    "layer_head_grid",
    "reduce_attention",
]

Reduction = Literal["block", "topk"]


@dataclass(frozen=True)
class Reduced:
    """A matrix shrunk for display.

    Attributes:
        matrix: the drawn values, ``(R_q, R_k)``.
        row_labels: one label per drawn row.
        col_labels: one label per drawn column.
        row_index: for ``"topk"`` the original query positions kept; for ``"block"`` the first
            position of each block, ``(R_q,)``.
        col_index: the same for the key positions, ``(R_k,)``.
    """

    matrix: np.ndarray
    row_labels: list[str]
    col_labels: list[str]
    row_index: np.ndarray
    col_index: np.ndarray


# ----------------------------------------------------------------------------- reduction


def _reduced(index: np.ndarray) -> bool:
    """Whether a side of a :class:`Reduced` lost positions (its labels then carry positions)."""
    return not np.array_equal(index, np.arange(len(index)))


def reduce_attention(
    weights: ArrayLike,
    *,
    max_tokens: int = 64,
    method: Reduction = "block",
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
) -> Reduced:
    """Shrink an attention matrix to at most ``max_tokens`` rows and columns.

    ``"block"``: with block size ``b = ceil(T / max_tokens)`` each drawn cell is the attention a
    block of queries pays to a block of keys, ``mean_{i ∈ I} Σ_{j ∈ J} w[i, j]`` (the last blocks
    may be smaller), so each drawn row still sums to 1. ``"topk"``: keeps the ``max_tokens`` keys with the largest received
    attention ``Σ_i w[i, j]`` and the ``max_tokens`` queries with the largest row maximum, in their
    original order; kept cells are the exact weights.

    Args:
        weights: ``(T_q, T_k)``.
        max_tokens: the most rows/columns to draw. Default 64.
        method: ``"block"`` or ``"topk"``. Default ``"block"``.
        query_tokens: query labels, one per position ``T_q``.
        key_tokens: key labels, one per position ``T_k``.

    Returns:
        A :class:`Reduced`; unchanged (a copy) when both sides already fit.
    """
    w = _to_numpy("weights", weights, 2)
    check_positive_int("max_tokens", max_tokens)
    check_choice("method", method, ("block", "topk"))
    t_q, t_k = w.shape
    rows = _labels("query_tokens", query_tokens, t_q)
    cols = _labels("key_tokens", key_tokens, t_k)
    if method == "topk":
        r_idx = np.arange(t_q)
        c_idx = np.arange(t_k)
        if t_q > max_tokens:
            r_idx = np.sort(np.argsort(-w.max(axis=1), kind="stable")[:max_tokens])
        if t_k > max_tokens:
            c_idx = np.sort(np.argsort(-w.sum(axis=0), kind="stable")[:max_tokens])
        return Reduced(
            matrix=w[np.ix_(r_idx, c_idx)].copy(),
            row_labels=[f"{i}:{rows[i]}" if t_q > max_tokens else rows[i] for i in r_idx],
            col_labels=[f"{j}:{cols[j]}" if t_k > max_tokens else cols[j] for j in c_idx],
            row_index=r_idx,
            col_index=c_idx,
        )
    b_q = math.ceil(t_q / max_tokens)
    b_k = math.ceil(t_k / max_tokens)
    r_idx = np.arange(0, t_q, b_q)
    c_idx = np.arange(0, t_k, b_k)
    # sum over each key block, mean over each query block (the true block sizes)
    sums = np.add.reduceat(np.add.reduceat(w.astype(np.float64), r_idx, axis=0), c_idx, axis=1)
    sizes_q = np.diff(np.append(r_idx, t_q))
    matrix = (sums / sizes_q[:, None]).astype(w.dtype)

    def block_labels(labels: list[str], idx: np.ndarray, size: int, total: int) -> list[str]:
        if size == 1:
            return [labels[i] for i in idx]
        return [f"{i}–{min(i + size, total) - 1}" for i in idx]

    return Reduced(
        matrix=matrix,
        row_labels=block_labels(rows, r_idx, b_q, t_q),
        col_labels=block_labels(cols, c_idx, b_k, t_k),
        row_index=r_idx,
        col_index=c_idx,
    )


# ----------------------------------------------------------------------------- heatmaps


def _scale(matrix: np.ndarray, vmax: float | None) -> tuple[float, float | None, str]:
    """``(vmin, vmax, cmap)``: weights on ``[0, vmax]`` (viridis; ``None`` = the largest); a
    matrix with negative entries on ``[-m, m]``, ``m = max |value|`` (diverging, white at 0)."""
    finite = matrix[np.isfinite(matrix)]
    if finite.size and float(finite.min()) < 0.0:
        m = float(np.abs(finite).max())
        return -m, m, DIVERGING
    return 0.0, vmax, CMAP


def attention_heatmap(
    weights: ArrayLike,
    *,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    mask: ArrayLike | None = None,
    title: str | None = None,
    max_tokens: int = 64,
    method: Reduction = "block",
    annotate: bool | None = None,
    value_label: str = "weight",
) -> Plot:
    """One head's attention weights as a heatmap with token labels.

    Rows are queries (who looks), columns keys (what is looked at); row ``i`` is
    ``softmax_j(q_i · k_j / √d)``. Masked cells (``mask == False``) are grey. The columns may be
    something other than key tokens (``T_k = k`` projected rows of a Linformer layer, labelled by
    ``key_tokens``); a matrix with negative entries (effective weights ``A · F``) is drawn on a
    diverging scale symmetric about 0.

    Args:
        weights: ``(T_q, T_k)``.
        query_tokens: query labels (default: positions).
        key_tokens: key labels (default: positions), e.g. ``cache.key_labels(path)`` for a
            layer with projected keys.
        mask: boolean ``(T_q, T_k)``, ``True = may attend``; drawn only without reduction.
        title: axes title.
        max_tokens: longer sides are reduced with ``method`` (see :func:`reduce_attention`).
        method: ``"block"`` or ``"topk"``.
        annotate: write the values in the cells (default: when at most 12 × 12).
        value_label: the colour bar's label. Default ``"weight"``.

    Returns:
        :class:`Plot` with ``data["weights"]`` (the drawn matrix), ``data["row_index"]``,
        ``data["col_index"]`` and ``data["mask"]`` when a mask was drawn.

    Shape:
        weights ``(T_q, T_k)``; mask ``(T_q, T_k)``.
    """
    w = _to_numpy("weights", weights, 2)
    red = reduce_attention(
        w, max_tokens=max_tokens, method=method, query_tokens=query_tokens, key_tokens=key_tokens
    )
    m = None
    if mask is not None:
        m = _to_numpy("mask", mask, 2).astype(bool)
        if m.shape != w.shape:
            raise ArgumentError(
                f"mask must have the weights' shape {shape_str(w.shape)}, got {shape_str(m.shape)}"
            )
        m = (
            m[np.ix_(red.row_index, red.col_index)]
            if red.matrix.shape == w.shape or method == "topk"
            else None
        )
    vmin, vmax, cmap = _scale(red.matrix, None)
    r, c = red.matrix.shape
    side = min(10.0, max(3.5, 0.28 * max(r, c) + 1.5))
    fig = _new_figure(side + 1.0, side)
    ax = fig.add_subplot()
    annotate = (r <= 12 and c <= 12) if annotate is None else annotate
    img = _draw_matrix(
        ax,
        red.matrix,
        red.row_labels,
        red.col_labels,
        mask=m,
        title=title,
        annotate=annotate,
        numbered=(not _reduced(red.row_index), not _reduced(red.col_index)),
        vmin=vmin,
        vmax=vmax,
        cmap=cmap,
    )
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    fig.colorbar(img, ax=ax, shrink=0.8, label=value_label)
    data = {"weights": red.matrix, "row_index": red.row_index, "col_index": red.col_index}
    if m is not None:
        data["mask"] = m
    return Plot(fig, data)


def _masked_legend(fig: Figure) -> None:
    """A legend under the figure: light grey cells are masked keys, not weight 0."""
    grey = Patch(facecolor=MASKED, edgecolor="0.4", linewidth=0.5)
    fig.legend(
        [grey], ["masked: the query cannot see this key (not weight 0)"],
        loc="outside lower center", fontsize=8, frameon=False,
    )  # fmt: skip


def _name_inches(text: str, points: float) -> float:
    """About how long ``text`` runs at ``points`` (an average glyph is 0.6 em wide)."""
    return len(text) * points * 0.6 / 72


def _draw_grid(
    axes: np.ndarray,
    cells: list[list[Reduced | None]],
    *,
    col_titles: Sequence[str] | None = None,
    row_names: Sequence[str] | None = None,
    max_labels: int = 24,
    vmax: float | None = 1.0,
    vmin: float = 0.0,
    cmap: str = CMAP,
    row_height: float | None = None,
) -> AxesImage | None:
    """Heatmaps in a grid; each panel carries token labels unless its neighbour shows the same.

    A row name longer than its panel is high (``row_height``, inches) is written across, left of
    the row, rather than along the panel's side where it would run into its neighbours' names.

    Row labels (queries) are written on a panel when it is the first of its grid row or its
    left neighbour has other row labels; column labels (keys) when no panel below it has the same
    ones. So a GPT's layers × heads grid labels its left column and bottom row, while an
    encoder-decoder's self- and cross-attention rows each carry their own labels.
    """
    img = None
    n_rows, n_cols = axes.shape
    for r in range(n_rows):
        for c in range(n_cols):
            ax = axes[r, c]
            cell = cells[r][c] if c < len(cells[r]) else None
            if cell is None:
                ax.axis("off")
                continue
            left = cells[r][c - 1] if c > 0 else None
            below = cells[r + 1][c] if r + 1 < n_rows and c < len(cells[r + 1]) else None
            n = max(len(cell.row_labels), len(cell.col_labels))
            img = _draw_matrix(
                ax,
                cell.matrix,
                cell.row_labels,
                cell.col_labels,
                vmin=vmin,
                vmax=vmax,
                cmap=cmap,
                show_rows=left is None or left.row_labels != cell.row_labels,
                show_cols=below is None or below.col_labels != cell.col_labels,
                max_labels=max_labels,
                fontsize=7 if min(n, max_labels) <= 16 else 5.5,
                title=col_titles[c] if col_titles is not None and r == 0 else None,
                numbered=(not _reduced(cell.row_index), not _reduced(cell.col_index)),
            )
            if row_names is not None and c == 0:
                name = row_names[r]
                if row_height is not None and _name_inches(name, 8) > row_height:
                    ax.set_ylabel(name, fontsize=7, rotation=0, ha="right", va="center")
                else:
                    ax.set_ylabel(name, fontsize=8)
    return img


def head_grid(
    weights: ArrayLike,
    *,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    mask: ArrayLike | None = None,
    title: str | None = None,
    max_tokens: int = 48,
    method: Reduction = "block",
    ncols: int | None = None,
    value_label: str = "weight",
) -> Plot:
    """All heads of one layer, one small heatmap each, with token labels on both axes.

    Query labels are written on the left column and key labels on the bottom panel of each
    column (the heads share them); past about 30 positions every ``k``-th label is written.
    Reduced sides (see :func:`reduce_attention`) carry the reduced labels: a block's positions
    ``"8–15"`` for ``"block"``, ``"position:token"`` for ``"topk"`` (then every panel is labelled,
    as each head keeps other positions).

    A Linformer layer's ``T_q × k`` weights are drawn as they are, its columns labelled by
    ``key_tokens`` (``cache.key_labels(path)``: ``"E·K row j"``); negative entries (effective
    weights ``A · F``) switch every panel to one diverging scale symmetric about 0.

    Args:
        weights: ``(H, T_q, T_k)`` (or ``(1, H, T_q, T_k)``).
        query_tokens: query labels (default: positions).
        key_tokens: key labels (default: positions).
        mask: boolean ``(T_q, T_k)``, ``True = may attend`` (every head); hidden cells are light
            grey (NaN in ``data["weights"]``) and a legend says so. Default ``None``.
        title: figure title.
        max_tokens: per-side limit before reduction.
        method: ``"block"`` or ``"topk"``.
        ncols: heads per row (default ``min(H, 4)``).
        value_label: the colour bar's label. Default ``"weight"``.

    Returns:
        :class:`Plot` with ``data["weights"]`` ``(H, R_q, R_k)`` as drawn.

    Shape:
        weights ``(H, T_q, T_k)`` or ``(1, H, T_q, T_k)``; mask ``(T_q, T_k)``.
    """
    w = _to_numpy("weights", weights, (3, 4))
    if w.ndim == 4:
        if w.shape[0] != 1:
            raise ArgumentError(
                f"weights must be (H, T_q, T_k) or (1, H, T_q, T_k), got {shape_str(w.shape)}"
            )
        w = w[0]
    h = w.shape[0]
    ncols = min(h, 4) if ncols is None else check_positive_int("ncols", ncols)
    nrows = math.ceil(h / ncols)
    reds = [
        reduce_attention(
            w[i],
            max_tokens=max_tokens,
            method=method,
            query_tokens=query_tokens,
            key_tokens=key_tokens,
        )
        for i in range(h)
    ]
    hidden = None if mask is None else _to_numpy("mask", mask, 2).astype(bool)
    if hidden is not None and hidden.shape != w.shape[1:]:
        raise ArgumentError(
            f"mask must have the weights' shape (T_q, T_k) = {shape_str(w.shape[1:])}, "
            f"got {shape_str(hidden.shape)}"
        )
    if hidden is not None:  # hidden cells are NaN: drawn in the colour map's "bad" grey
        reds = [replace(r, matrix=np.where(_reduce_mask(hidden, r, method), r.matrix, np.nan))
                for r in reds]  # fmt: skip
    fig = _new_figure(3.2 * ncols + 1.4, 3.3 * nrows + 0.6 + (0.4 if title else 0.0))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    cells: list[list[Reduced | None]] = [
        [reds[r * ncols + c] if r * ncols + c < h else None for c in range(ncols)]
        for r in range(nrows)
    ]
    drawn = np.stack([r.matrix for r in reds])
    vmin, vmax, cmap = _scale(drawn, 1.0)
    img = _draw_grid(
        axes,
        cells,
        col_titles=None,
        max_labels=_labels_that_fit(3.0),
        vmax=vmax,
        vmin=vmin,
        cmap=cmap,
    )
    for i, ax in enumerate(axes.flat[:h]):
        ax.set_title(f"head {i}", fontsize=9)
    if title:
        fig.suptitle(title)
    if img is not None:
        fig.colorbar(img, ax=axes, shrink=0.6, label=value_label)
    if hidden is not None and not hidden.all():
        _masked_legend(fig)
    return Plot(fig, {"weights": drawn})


def _layer_labels(
    side: str,
    tokens: Sequence[str] | Mapping[str, Sequence[str]] | None,
    name: str,
    n: int,
) -> list[str] | None:
    if tokens is None:
        return None
    if isinstance(tokens, Mapping):
        got = tokens.get(name)
        return None if got is None else _labels(f"{side}[{name!r}]", got, n)
    labels = [str(t) for t in tokens]
    if len(labels) != n:
        raise ArgumentError(
            f"{side} has {len(labels)} entries but layer {name!r} has {n} positions on that side; "
            f"pass a mapping layer -> tokens when layers differ (e.g. self- and cross-attention)"
        )
    return labels


# layers × heads: the figure's largest side (inches) and the smallest panel it shrinks to
_GRID_MAX_INCHES = 24.0
_GRID_MIN_CELL = 0.5


def _reduce_mask(mask: np.ndarray, red: Reduced, method: Reduction) -> np.ndarray:
    """The cells of a :class:`Reduced` a query may see: for ``"block"`` a block is visible when
    any of its entries is, for ``"topk"`` the kept entries' own."""
    if method == "topk":
        return mask[np.ix_(red.row_index, red.col_index)]
    rows = np.logical_or.reduceat(mask, red.row_index, axis=0)
    return np.logical_or.reduceat(rows, red.col_index, axis=1)


def _grid_masks(
    masks: Mapping[str, ArrayLike] | Sequence[ArrayLike] | None,
    names: list[str],
    shapes: list[tuple[int, int]],
) -> list[np.ndarray | None]:
    """One boolean ``(T_q, T_k)`` mask per layer (``None``: nothing hidden), shapes checked."""
    if masks is None:
        return [None] * len(names)
    if isinstance(masks, Mapping):
        given = [masks.get(n) for n in names]
    else:
        given = list(masks)
        if len(given) != len(names):
            raise ArgumentError(
                f"masks must hold one mask per layer ({len(names)}), got {len(given)}"
            )
    out: list[np.ndarray | None] = []
    for name, m, shape in zip(names, given, shapes):
        if m is None:
            out.append(None)
            continue
        arr = _to_numpy(f"masks[{name!r}]", m, 2).astype(bool)
        if arr.shape != shape:
            raise ArgumentError(
                f"masks[{name!r}] must have the layer's shape (T_q, T_k) = {shape_str(shape)}, "
                f"got {shape_str(arr.shape)}"
            )
        out.append(arr)
    return out


def layer_head_grid(
    attentions: Mapping[str, ArrayLike] | Sequence[ArrayLike],
    *,
    query_tokens: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
    key_tokens: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
    masks: Mapping[str, ArrayLike] | Sequence[ArrayLike] | None = None,
    batch_index: int = 0,
    title: str | None = None,
    max_tokens: int = 32,
    method: Reduction = "block",
) -> Plot:
    """Layers × heads: one row per layer, one column per head, token labels on both axes.

    Each row carries its own labels, so layers of different lengths (an encoder-decoder's
    self-attention ``T × T`` and cross-attention ``T × S``) share one figure. Labels shared with the
    neighbouring panel (left, or below) are written once; long sides are thinned and reduced sides
    show the reduced labels (see :func:`head_grid`). Cells a query may not see (``masks``: a
    causal model's future) are light grey, not weight 0, and a legend under the grid says so.
    The figure fits in 24 × 24 inches (2,880 pixels at the default 120 dpi): many layers or heads
    (SmolLM2's 30 × 9) shrink the panels, down to half an inch; draw fewer layers for larger ones.

    Args:
        attentions: per layer ``(B, H, T_q, T_k)`` or ``(H, T_q, T_k)`` — a mapping
            ``module path -> weights`` (e.g. ``cache.attentions`` from
            :func:`attnlab.inspect.capture`, in its order) or a list.
        query_tokens: labels of the queries — one sequence for every layer (a GPT), or a
            mapping ``layer name -> tokens`` (layer names are the mapping's keys, or
            ``"layer i"`` for a list); layers missing from a mapping are labelled by position.
        key_tokens: labels of the keys, in the same form as ``query_tokens``.
        masks: per layer a boolean ``(T_q, T_k)``, ``True = may attend`` (every head of the
            layer), as a mapping ``layer name -> mask`` (layers missing from it hide nothing) or
            a list; default ``None``: nothing is drawn as hidden.
        batch_index: which sequence of the batch to draw. Default 0.
        title: figure title.
        max_tokens: per-side limit before reduction.
        method: ``"block"`` or ``"topk"``.

    Returns:
        :class:`Plot` with ``data["weights"]`` ``(L, H, R_q, R_k)`` (drawn; hidden cells, heads
        missing in a layer with fewer heads, and cells past a shorter layer's side, are NaN), the
        row names in ``data["layers"]`` and, with ``masks``, ``data["mask"]`` ``(L, H, R_q, R_k)``
        (``True`` = drawn; ``False`` where hidden, for a missing head or past a shorter side).

    Shape:
        attentions: per layer ``(B, H, T_q, T_k)`` or ``(H, T_q, T_k)``; masks: per layer
        ``(T_q, T_k)``.
    """
    if isinstance(attentions, Mapping):
        names, items = list(attentions.keys()), list(attentions.values())
    else:
        items = list(attentions)
        names = [f"layer {i}" for i in range(len(items))]
    if not items:
        raise ArgumentError("attentions must hold at least one layer, got none")
    arrays = []
    for name, a in zip(names, items):
        arr = _to_numpy(f"attentions[{name!r}]", a, (3, 4))
        if arr.ndim == 4:
            if not 0 <= batch_index < arr.shape[0]:
                raise ArgumentError(
                    f"batch_index must be in [0, {arr.shape[0]}), got {batch_index}"
                )
            arr = arr[batch_index]
        arrays.append(arr)
    hidden = _grid_masks(masks, names, [(a.shape[1], a.shape[2]) for a in arrays])
    reds: list[list[Reduced]] = []
    seen: list[list[np.ndarray] | None] = []  # per layer and head: the cells drawn
    for name, arr, m in zip(names, arrays, hidden):
        q_lab = _layer_labels("query_tokens", query_tokens, name, arr.shape[1])
        k_lab = _layer_labels("key_tokens", key_tokens, name, arr.shape[2])
        row = [
            reduce_attention(
                x, max_tokens=max_tokens, method=method, query_tokens=q_lab, key_tokens=k_lab
            )
            for x in arr
        ]
        shown = None if m is None else [_reduce_mask(m, red, method) for red in row]
        if shown is not None:  # hidden cells are NaN: drawn in the colour map's "bad" grey
            row = [
                replace(red, matrix=np.where(v, red.matrix, np.nan)) for red, v in zip(row, shown)
            ]
        reds.append(row)
        seen.append(shown)
    mats = [np.stack([r.matrix for r in row]) for row in reds]
    n_layers = len(mats)
    n_heads = max(m.shape[0] for m in mats)
    r = max(m.shape[1] for m in mats)
    c = max(m.shape[2] for m in mats)
    grid = np.full((n_layers, n_heads, r, c), np.nan, dtype=mats[0].dtype)
    for i, m in enumerate(mats):
        grid[i, : m.shape[0], : m.shape[1], : m.shape[2]] = m
    cell = min(
        1.8 if n_heads > 6 else 2.4,
        (_GRID_MAX_INCHES - 2.2) / n_heads,
        (_GRID_MAX_INCHES - 1.0) / n_layers - 0.25,
    )
    cell = max(cell, _GRID_MIN_CELL)
    across = [_name_inches(n, 7) for n in names if _name_inches(n, 8) > cell]  # see _draw_grid
    names_width = max(across) + 0.2 if across else 0.0
    fig = _new_figure(cell * n_heads + 2.2 + names_width, (cell + 0.25) * n_layers + 1.0)
    axes = fig.subplots(n_layers, n_heads, squeeze=False)
    cells: list[list[Reduced | None]] = [
        [row[h] if h < len(row) else None for h in range(n_heads)] for row in reds
    ]
    img = _draw_grid(
        axes,
        cells,
        col_titles=[f"head {h}" if cell >= 0.9 else f"H{h}" for h in range(n_heads)],
        row_names=names,
        max_labels=_labels_that_fit(cell - 0.4),
        vmax=1.0,
        row_height=cell,
    )
    if title:
        fig.suptitle(title)
    if img is not None:
        fig.colorbar(img, ax=axes, shrink=0.5, label="weight")
    data = {"weights": grid, "layers": np.array(names)}
    if masks is not None:
        drawn = np.zeros((n_layers, n_heads, r, c), dtype=bool)
        for i, (shown, row) in enumerate(zip(seen, reds)):
            for h, red in enumerate(row):
                q, k = red.matrix.shape
                drawn[i, h, :q, :k] = True if shown is None else shown[h]
        data["mask"] = drawn
        if any(shown is not None and not all(v.all() for v in shown) for shown in seen):
            _masked_legend(fig)
    return Plot(fig, data)
