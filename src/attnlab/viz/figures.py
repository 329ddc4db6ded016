"""Figures of attention (matplotlib, Agg; PNG and SVG).

Every function returns a :class:`Plot`: the matplotlib ``Figure`` and the arrays it drew, so a test
(or a user) can check that what is on the page equals what the model computed. Figures are built
with ``matplotlib.figure.Figure`` directly — no ``pyplot``, no global state, no display needed.

Long sequences stay readable: :func:`reduce_attention` shrinks a ``T_q × T_k`` matrix to at most
``max_tokens`` per side, either by averaging blocks of positions (``"block"``) or by keeping the
positions that matter most (``"topk"``: the keys that receive the most attention and the queries
with the sharpest rows), with the original positions in the labels.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from attnlab._checks import check_choice, check_positive_int, shape_str

if TYPE_CHECKING:
    from attnlab.nn.multihead import MultiHeadAttention

__all__ = [
    "Plot",
    "Reduced",
    "attention_heatmap",
    "head_grid",
    "layer_head_grid",
    "mask_panel",
    "noam_curve",
    "noam_rate",
    "positional_encoding_figure",
    "reduce_attention",
    "save_figure",
    "step_panel",
    "step_panel_from_model",
    "step_panel_from_module",
]

Reduction = Literal["block", "topk"]
ArrayLike = torch.Tensor | np.ndarray
CMAP = "viridis"  # weights: 0 → dark, 1 → bright
DIVERGING = "RdBu_r"  # signed values: blue < 0 < red, white at 0
MASKED = "#bdbdbd"  # cells a query may not see


@dataclass(frozen=True)
class Plot:
    """A figure and the data it drew.

    Attributes:
        figure: the matplotlib ``Figure`` (Agg canvas attached).
        data: named arrays exactly as drawn, e.g. ``data["weights"]``.
    """

    figure: Figure
    data: dict[str, np.ndarray] = field(default_factory=dict)

    def save(self, path: str | Path, *, dpi: int = 120) -> Path:
        """Write the figure; the format follows the suffix (``.png`` or ``.svg``)."""
        return save_figure(self.figure, path, dpi=dpi)


@dataclass(frozen=True)
class Reduced:
    """A matrix shrunk for display.

    Attributes:
        matrix: the drawn values, ``(R_q, R_k)``.
        row_labels / col_labels: one label per drawn row / column.
        row_index / col_index: for ``"topk"`` the original positions kept; for ``"block"`` the
            first position of each block.
    """

    matrix: np.ndarray
    row_labels: list[str]
    col_labels: list[str]
    row_index: np.ndarray
    col_index: np.ndarray


# ----------------------------------------------------------------------------- helpers


def _to_numpy(name: str, x: object, dims: int | tuple[int, ...]) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        arr = (t.float() if t.is_floating_point() and t.dtype != torch.float64 else t).numpy()
    elif isinstance(x, np.ndarray):
        arr = x
    else:
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    allowed = (dims,) if isinstance(dims, int) else dims
    if arr.ndim not in allowed:
        want = " or ".join(f"{d}-D" for d in allowed)
        raise ValueError(f"{name} must be {want}, got shape {shape_str(arr.shape)}")
    return arr


def _labels(name: str, tokens: Sequence[str] | None, n: int) -> list[str]:
    if tokens is None:
        return [str(i) for i in range(n)]
    tokens = [str(t) for t in tokens]
    if len(tokens) != n:
        raise ValueError(f"{name} must have {n} entries (one per position), got {len(tokens)}")
    return tokens


def save_figure(figure: Figure, path: str | Path, *, dpi: int = 120) -> Path:
    """Save ``figure`` as PNG or SVG (chosen by the suffix), creating parent folders.

    Args:
        figure: a matplotlib ``Figure``.
        path: ``*.png`` or ``*.svg``.
        dpi: resolution for PNG. Default 120.

    Returns:
        The path written.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise ValueError(f"path must end in .png or .svg, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if figure.canvas is None or not isinstance(figure.canvas, FigureCanvasAgg):
        FigureCanvasAgg(figure)
    figure.savefig(path, format=suffix[1:], dpi=dpi, bbox_inches="tight")
    return path


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _short(label: str, n: int = 12) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"


def _tick_labels(
    ax: Axes,
    rows: list[str],
    cols: list[str],
    *,
    max_labels: int = 64,
    max_col_labels: int | None = None,
    show_rows: bool = True,
    show_cols: bool = True,
    fontsize: float | None = None,
    numbered: tuple[bool, bool] = (True, True),
) -> None:
    """Token labels on both axes, thinned to at most ``max_labels`` per axis (every ``k``-th).

    A thinned axis whose labels are one per position (``numbered``: rows, columns) writes each
    label as ``"position token"``, so a reader knows which positions are labelled (reduced sides
    already carry their positions). An axis with ``show_* = False`` keeps its ticks (at the same
    positions) but no text, for panels that share their labels with a neighbour.
    """
    for labels, set_ticks, set_labels, rot, show, most, number in (
        (
            cols,
            ax.set_xticks,
            ax.set_xticklabels,
            90,
            show_cols,
            max_col_labels or max_labels,
            numbered[1],
        ),
        (rows, ax.set_yticks, ax.set_yticklabels, 0, show_rows, max_labels, numbered[0]),
    ):
        step = max(1, math.ceil(len(labels) / most))
        idx = list(range(0, len(labels), step))
        set_ticks(idx)
        size = fontsize if fontsize is not None else (8 if len(idx) <= 32 else 6)
        texts = [
            _short(labels[i])
            if step == 1 or not number or labels[i] == str(i)
            else f"{i} {_short(labels[i], 9)}"
            for i in idx
        ]
        set_labels(texts if show else [], rotation=rot, fontsize=size)
    ax.tick_params(length=2, pad=1)


def _reduced(index: np.ndarray) -> bool:
    """Whether a side of a :class:`Reduced` lost positions (its labels then carry positions)."""
    return not np.array_equal(index, np.arange(len(index)))


def _masked_array(weights: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    if mask is None:
        return weights
    return np.ma.masked_where(~mask.astype(bool), weights)


def _decimals(matrix: np.ndarray) -> int:
    """Decimals that show the largest finite value of ``matrix`` with two significant digits (2–4)."""
    finite = np.abs(matrix[np.isfinite(matrix)])
    top = float(finite.max()) if finite.size else 0.0
    if top <= 0.0:
        return 2
    return int(min(4, max(2, 1 - math.floor(math.log10(top)))))


def _fmt(value: float, decimals: int = 2) -> str:
    """A cell value in few characters: ``0.27``, ``-1.35``, ``0.012``, ``12.4``, ``-318``."""
    a = abs(value)
    if a >= 99.95:
        text = f"{value:.0f}"
    elif a >= 9.995:
        text = f"{value:.1f}"
    else:
        text = f"{value:.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0.0 else text


def _readable(rows: int, cols: int, *, max_cells: int = 120, max_side: int = 16) -> bool:
    """Whether numbers written in the cells can be read: few cells, no long side."""
    return rows * cols <= max_cells and rows <= max_side and cols <= max_side


# ----------------------------------------------------------------------------- reduction


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
        query_tokens / key_tokens: labels, one per position.

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


def _draw_matrix(
    ax: Axes,
    matrix: np.ndarray,
    rows: list[str],
    cols: list[str],
    *,
    mask: np.ndarray | None = None,
    title: str | None = None,
    vmin: float | None = 0.0,
    vmax: float | None = None,
    cmap: str = CMAP,
    annotate: bool = False,
    labels: bool = True,
    show_rows: bool = True,
    show_cols: bool = True,
    max_labels: int = 64,
    max_col_labels: int | None = None,
    fontsize: float | None = None,
    masked_text: str | None = None,
    annotate_size: float = 7,
    numbered: tuple[bool, bool] = (True, True),
) -> AxesImage:
    img = ax.imshow(
        _masked_array(matrix, mask),
        cmap=colormaps[cmap].with_extremes(bad=MASKED),
        vmin=vmin,
        vmax=vmax,
        aspect="auto",
        interpolation="nearest",
    )
    if labels:
        _tick_labels(
            ax,
            rows,
            cols,
            max_labels=max_labels,
            max_col_labels=max_col_labels,
            show_rows=show_rows,
            show_cols=show_cols,
            fontsize=fontsize,
            numbered=numbered,
        )
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=9)
    if annotate and matrix.size <= 400:
        _annotate(ax, img, matrix, mask, masked_text=masked_text, fontsize=annotate_size)
    return img


def _annotate(
    ax: Axes,
    img: AxesImage,
    matrix: np.ndarray,
    mask: np.ndarray | None,
    *,
    masked_text: str | None = None,
    fontsize: float = 7,
) -> None:
    """Write each cell's value in it, black or white by the brightness of the cell's colour."""
    shown = matrix if mask is None else np.where(mask, matrix, np.nan)
    decimals = _decimals(shown)
    for (i, j), value in np.ndenumerate(matrix):
        if mask is not None and not mask[i, j]:
            if masked_text:
                ax.text(
                    j, i, masked_text, ha="center", va="center", fontsize=fontsize, color="#333"
                )
            continue
        r, g, b, _ = img.cmap(img.norm(value))
        light = 0.299 * r + 0.587 * g + 0.114 * b > 0.55
        ax.text(
            j,
            i,
            _fmt(float(value), decimals),
            ha="center",
            va="center",
            fontsize=fontsize,
            color="black" if light else "white",
        )


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
) -> Plot:
    """One head's attention weights as a heatmap with token labels.

    Rows are queries (who looks), columns keys (what is looked at); row ``i`` is
    ``softmax_j(q_i · k_j / √d)``. Masked cells (``mask == False``) are grey.

    Args:
        weights: ``(T_q, T_k)``.
        query_tokens / key_tokens: labels (default: positions).
        mask: boolean ``(T_q, T_k)``, ``True = may attend``; drawn only without reduction.
        title: axes title.
        max_tokens: longer sides are reduced with ``method`` (see :func:`reduce_attention`).
        method: ``"block"`` or ``"topk"``.
        annotate: write the values in the cells (default: when at most 12 × 12).

    Returns:
        :class:`Plot` with ``data["weights"]`` (the drawn matrix), ``data["row_index"]``,
        ``data["col_index"]`` and ``data["mask"]`` when a mask was drawn.
    """
    w = _to_numpy("weights", weights, 2)
    red = reduce_attention(
        w, max_tokens=max_tokens, method=method, query_tokens=query_tokens, key_tokens=key_tokens
    )
    m = None
    if mask is not None:
        m = _to_numpy("mask", mask, 2).astype(bool)
        if m.shape != w.shape:
            raise ValueError(
                f"mask must have the weights' shape {shape_str(w.shape)}, got {shape_str(m.shape)}"
            )
        m = (
            m[np.ix_(red.row_index, red.col_index)]
            if red.matrix.shape == w.shape or method == "topk"
            else None
        )
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
    )
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    fig.colorbar(img, ax=ax, shrink=0.8, label="weight")
    data = {"weights": red.matrix, "row_index": red.row_index, "col_index": red.col_index}
    if m is not None:
        data["mask"] = m
    return Plot(fig, data)


def _draw_grid(
    axes: np.ndarray,
    cells: list[list[Reduced | None]],
    *,
    col_titles: Sequence[str] | None = None,
    row_names: Sequence[str] | None = None,
    max_labels: int = 24,
    vmax: float = 1.0,
) -> AxesImage | None:
    """Heatmaps in a grid; each panel carries token labels unless its neighbour shows the same.

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
                vmax=vmax,
                show_rows=left is None or left.row_labels != cell.row_labels,
                show_cols=below is None or below.col_labels != cell.col_labels,
                max_labels=max_labels,
                fontsize=7 if min(n, max_labels) <= 16 else 5.5,
                title=col_titles[c] if col_titles is not None and r == 0 else None,
                numbered=(not _reduced(cell.row_index), not _reduced(cell.col_index)),
            )
            if row_names is not None and c == 0:
                ax.set_ylabel(row_names[r], fontsize=8)
    return img


def head_grid(
    weights: ArrayLike,
    *,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    title: str | None = None,
    max_tokens: int = 48,
    method: Reduction = "block",
    ncols: int | None = None,
) -> Plot:
    """All heads of one layer, one small heatmap each, with token labels on both axes.

    Query labels are written on the left column and key labels on the bottom panel of each
    column (the heads share them); past about 30 positions every ``k``-th label is written.
    Reduced sides (see :func:`reduce_attention`) carry the reduced labels: a block's positions
    ``"8–15"`` for ``"block"``, ``"position:token"`` for ``"topk"`` (then every panel is labelled,
    as each head keeps other positions).

    Args:
        weights: ``(H, T_q, T_k)`` (or ``(1, H, T_q, T_k)``).
        query_tokens / key_tokens: labels (default: positions).
        title: figure title.
        max_tokens: per-side limit before reduction.
        method: ``"block"`` or ``"topk"``.
        ncols: heads per row (default ``min(H, 4)``).

    Returns:
        :class:`Plot` with ``data["weights"]`` ``(H, R_q, R_k)`` as drawn.
    """
    w = _to_numpy("weights", weights, (3, 4))
    if w.ndim == 4:
        if w.shape[0] != 1:
            raise ValueError(
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
    fig = _new_figure(3.2 * ncols + 1.4, 3.3 * nrows + 0.6 + (0.4 if title else 0.0))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    cells: list[list[Reduced | None]] = [
        [reds[r * ncols + c] if r * ncols + c < h else None for c in range(ncols)]
        for r in range(nrows)
    ]
    img = _draw_grid(axes, cells, col_titles=None, max_labels=_labels_that_fit(3.0), vmax=1.0)
    for i, ax in enumerate(axes.flat[:h]):
        ax.set_title(f"head {i}", fontsize=9)
    if title:
        fig.suptitle(title)
    if img is not None:
        fig.colorbar(img, ax=axes, shrink=0.6, label="weight")
    return Plot(fig, {"weights": np.stack([r.matrix for r in reds])})


def _labels_that_fit(inches: float, per_label: float = 0.1) -> int:
    """How many small (≈6 pt) tick labels fit along ``inches`` of axis."""
    return max(4, int(inches / per_label))


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
        raise ValueError(
            f"{side} has {len(labels)} entries but layer {name!r} has {n} positions on that side; "
            f"pass a mapping layer -> tokens when layers differ (e.g. self- and cross-attention)"
        )
    return labels


def layer_head_grid(
    attentions: Mapping[str, ArrayLike] | Sequence[ArrayLike],
    *,
    query_tokens: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
    key_tokens: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
    batch_index: int = 0,
    title: str | None = None,
    max_tokens: int = 32,
    method: Reduction = "block",
) -> Plot:
    """Layers × heads: one row per layer, one column per head, token labels on both axes.

    Each row carries its own labels, so layers of different lengths (an encoder-decoder's
    self-attention ``T × T`` and cross-attention ``T × S``) share one figure. Labels shared with the
    neighbouring panel (left, or below) are written once; long sides are thinned and reduced sides
    show the reduced labels (see :func:`head_grid`).

    Args:
        attentions: per layer ``(B, H, T_q, T_k)`` or ``(H, T_q, T_k)`` — a mapping
            ``module path -> weights`` (e.g. ``cache.attentions`` from
            :func:`attnlab.inspect.capture`, in its order) or a list.
        query_tokens / key_tokens: labels of the queries / keys — one sequence for every layer
            (a GPT), or a mapping ``layer name -> tokens`` (layer names are the mapping's keys,
            or ``"layer i"`` for a list); layers missing from a mapping are labelled by position.
        batch_index: which sequence of the batch to draw. Default 0.
        title: figure title.
        max_tokens: per-side limit before reduction.
        method: ``"block"`` or ``"topk"``.

    Returns:
        :class:`Plot` with ``data["weights"]`` ``(L, H, R_q, R_k)`` (drawn; heads missing in a
        layer with fewer heads, and cells past a shorter layer's side, are NaN) and the row names
        in ``data["layers"]``.
    """
    if isinstance(attentions, Mapping):
        names, items = list(attentions.keys()), list(attentions.values())
    else:
        items = list(attentions)
        names = [f"layer {i}" for i in range(len(items))]
    if not items:
        raise ValueError("attentions must hold at least one layer, got none")
    reds: list[list[Reduced]] = []
    for name, a in zip(names, items):
        arr = _to_numpy(f"attentions[{name!r}]", a, (3, 4))
        if arr.ndim == 4:
            if not 0 <= batch_index < arr.shape[0]:
                raise ValueError(f"batch_index must be in [0, {arr.shape[0]}), got {batch_index}")
            arr = arr[batch_index]
        q_lab = _layer_labels("query_tokens", query_tokens, name, arr.shape[1])
        k_lab = _layer_labels("key_tokens", key_tokens, name, arr.shape[2])
        reds.append(
            [
                reduce_attention(
                    x, max_tokens=max_tokens, method=method, query_tokens=q_lab, key_tokens=k_lab
                )
                for x in arr
            ]
        )
    mats = [np.stack([r.matrix for r in row]) for row in reds]
    n_layers = len(mats)
    n_heads = max(m.shape[0] for m in mats)
    r = max(m.shape[1] for m in mats)
    c = max(m.shape[2] for m in mats)
    grid = np.full((n_layers, n_heads, r, c), np.nan, dtype=mats[0].dtype)
    for i, m in enumerate(mats):
        grid[i, : m.shape[0], : m.shape[1], : m.shape[2]] = m
    cell = 1.8 if n_heads > 6 else 2.4
    fig = _new_figure(cell * n_heads + 2.2, (cell + 0.25) * n_layers + 1.0)
    axes = fig.subplots(n_layers, n_heads, squeeze=False)
    cells: list[list[Reduced | None]] = [
        [row[h] if h < len(row) else None for h in range(n_heads)] for row in reds
    ]
    img = _draw_grid(
        axes,
        cells,
        col_titles=[f"head {h}" for h in range(n_heads)],
        row_names=names,
        max_labels=_labels_that_fit(cell - 0.4),
        vmax=1.0,
    )
    if title:
        fig.suptitle(title)
    if img is not None:
        fig.colorbar(img, ax=axes, shrink=0.5, label="weight")
    return Plot(fig, {"weights": grid, "layers": np.array(names)})


# ----------------------------------------------------------------------------- the step panel


def _split_mask(
    mask: ArrayLike | None, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray | None]:
    """A boolean or additive mask as ``(allowed, bias)``; ``bias`` is ``None`` for boolean masks.

    Hidden entries of an additive mask are ``-inf`` or at most the minimum of its own dtype (the
    rule of :func:`attnlab.masks.is_masked_bias`), decided before any conversion to float64.
    """
    if mask is None:
        return np.ones(shape, dtype=bool), None
    if isinstance(mask, torch.Tensor):
        t = mask.detach().cpu()
        if t.is_floating_point():
            hidden = t <= torch.finfo(t.dtype).min
            m = _to_numpy("mask", ~hidden, 2)
            bias = _to_numpy("mask", t.masked_fill(hidden, 0.0).double(), 2)
        elif t.dtype == torch.bool:
            m, bias = _to_numpy("mask", t, 2), None
        else:
            raise TypeError(f"mask must be bool or floating (additive), got dtype {t.dtype}")
    else:
        a = _to_numpy("mask", mask, 2)
        if a.dtype == np.bool_:
            m, bias = a, None
        elif np.issubdtype(a.dtype, np.floating):
            hidden = a <= np.finfo(a.dtype).min
            m, bias = ~hidden, np.where(hidden, 0.0, a).astype(np.float64)
        else:
            raise TypeError(f"mask must be bool or floating (additive), got dtype {a.dtype}")
    if m.shape != shape:
        raise ValueError(
            f"mask must have shape (T_q, T_k) = {shape_str(shape)}, got {shape_str(m.shape)}"
        )
    return m, bias


def _signed_limit(a: np.ndarray) -> float:
    finite = a[np.isfinite(a)]
    lim = float(np.abs(finite).max()) if finite.size else 1.0
    return lim if lim > 0 else 1.0


def step_panel(
    x: ArrayLike,
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    *,
    mask: ArrayLike | None = None,
    tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    title: str | None = None,
    x_title: str = "x (token vectors)",
    cross: bool = False,
) -> Plot:
    """One head of attention, step by step, in seven panels (Vaswani et al. 2017, §3.2.1).

    Top row: the input ``x`` and the head's ``Q = x W^Q``, ``K = x W^K``, ``V = x W^V``. Bottom
    row: the scaled scores, the weights and the output,

        S = Q Kᵀ / √d_head (+ B),    A = softmax_rows(S),    Z = A V,

    where masked cells (``mask`` False, or a hidden entry of an additive mask ``B``) are grey and
    ``-inf`` in ``S``; a row that may see no key has zero weights. The values are computed here in
    float64 from ``q``, ``k``, ``v``. Every panel has its own colour bar, token labels on the rows
    (and on the columns of ``S`` and ``A``), and numbers in the cells when the panel is small
    (at most 120 cells, at most 16 per side).

    Args:
        x: the layer's (query) input, ``(T_q, d_model)``.
        q: one head's queries ``(T_q, d_head)``.
        k, v: that head's keys ``(T_k, d_head)`` and values ``(T_k, d_v)``.
        mask: boolean ``(T_q, T_k)`` (``True = may attend``) or an additive float bias (ALiBi;
            ``-inf``/the dtype's minimum hide a key), added to the scores.
        tokens: query labels; ``key_tokens`` key labels (default ``tokens`` when ``T_q == T_k``
            and not ``cross``).
        title: figure title.
        x_title: title of the ``x`` panel. Default ``"x (token vectors)"``.
        cross: keys and values come from another sequence (the encoder memory ``m``): the panels
            say ``K = m W^K``, ``V = m W^V``.

    Returns:
        :class:`Plot` with ``data`` ``x``, ``q``, ``k``, ``v``, ``scores`` (masked entries
        ``-inf``; the bias included), ``weights``, ``output``, ``mask`` (boolean, True = may
        attend) and, for an additive mask, ``bias``.
    """
    xa = _to_numpy("x", x, 2).astype(np.float64)
    qa = _to_numpy("q", q, 2).astype(np.float64)
    ka = _to_numpy("k", k, 2).astype(np.float64)
    va = _to_numpy("v", v, 2).astype(np.float64)
    if qa.shape[0] != xa.shape[0]:
        raise ValueError(
            f"q must have one row per row of x ({xa.shape[0]}), got {shape_str(qa.shape)}"
        )
    if ka.shape[1] != qa.shape[1] or va.shape[0] != ka.shape[0]:
        raise ValueError(
            f"k must be (T_k, d_head={qa.shape[1]}) and v (T_k, d_v), got {shape_str(ka.shape)} and {shape_str(va.shape)}"
        )
    t_q, d_head = qa.shape
    t_k = ka.shape[0]
    m, bias = _split_mask(mask, (t_q, t_k))
    rows = _labels("tokens", tokens, t_q)
    cols = _labels(
        "key_tokens",
        key_tokens if key_tokens is not None else (tokens if t_q == t_k and not cross else None),
        t_k,
    )

    # S = Q Kᵀ / √d_head + B, masked entries -inf
    raw = qa @ ka.T / math.sqrt(d_head)
    if bias is not None:
        raw = raw + bias
    scores = np.where(m, raw, -np.inf)
    # A = softmax(S) row-wise; a row with no visible key is all zeros
    row_max = np.max(scores, axis=1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.where(m, np.exp(np.where(m, scores, 0.0) - row_max), 0.0)
    denom = e.sum(axis=1, keepdims=True)
    weights = np.divide(e, denom, out=np.zeros_like(e), where=denom > 0)
    # Z = A V
    output = weights @ va

    src = "m" if cross else "x"
    dims = [f"d{i}" for i in range(d_head)]
    dims_v = [f"d{i}" for i in range(va.shape[1])]
    dims_x = [f"d{i}" for i in range(xa.shape[1])]
    s_title = rf"$S = QK^\top/\sqrt{{{d_head}}}$" + (r" $+$ bias" if bias is not None else "")
    top = [
        (f"1  {x_title}   ({t_q} × {xa.shape[1]})", xa, rows, dims_x, None),
        (rf"2  $Q = x\,W^Q$   ({t_q} × {d_head})", qa, rows, dims, None),
        (rf"3  $K = {src}\,W^K$   ({t_k} × {d_head})", ka, cols, dims, None),
        (rf"4  $V = {src}\,W^V$   ({t_k} × {va.shape[1]})", va, cols, dims_v, None),
    ]
    bottom = [
        (f"5  {s_title}   ({t_q} × {t_k})", scores, rows, cols, m),
        (r"6  $A = \mathrm{softmax}(S)$, rows sum to 1", weights, rows, cols, m),
        (rf"7  $Z = A\,V$   ({t_q} × {va.shape[1]})", output, rows, dims_v, None),
    ]

    # numbers in the cells of small panels; when a row of panels would be too wide to view,
    # the widest group of numbered panels (x, then Q/K/V/Z) is drawn without numbers
    numbered = {id(p[1]): _readable(*p[1].shape) for p in (*top, *bottom)}
    cell_w = 0.38  # inches per numbered column

    def width(a: np.ndarray) -> float:
        c = a.shape[1]
        return cell_w * c if numbered[id(a)] else min(5.0, max(1.6, 0.14 * c))

    def height(panels: list) -> float:
        h = [p[1].shape[0] * (0.3 if numbered[id(p[1])] else 0.14) for p in panels]
        return min(7.0, max(1.6, *h))

    overhead = 1.6  # row labels, colour bar, padding (inches per panel)
    max_width = 24.0
    for group in ((xa,), (qa, ka, va, output)):
        if max(sum(width(p[1]) + overhead for p in row) for row in (top, bottom)) <= max_width:
            break
        for a in group:
            numbered[id(a)] = False
    w_top = [width(p[1]) + overhead for p in top]
    w_bot = [width(p[1]) + overhead for p in bottom]
    h_top, h_bot = height(top) + 1.0, height(bottom) + 1.0
    fig = _new_figure(max(sum(w_top), sum(w_bot), 8.0), h_top + h_bot + (0.5 if title else 0.2))
    fig_width = fig.get_figwidth()
    subs: Any = fig.subfigures(2, 1, height_ratios=[h_top, h_bot])  # an array of two
    for sub, panels, widths in ((subs[0], top, w_top), (subs[1], bottom, w_bot)):
        spare = fig_width - sum(widths)  # an empty slot on the right keeps each panel's width
        axes = sub.subplots(
            1, len(panels) + (spare > 0.3), width_ratios=widths + ([spare] if spare > 0.3 else [])
        )
        if spare > 0.3:
            axes[-1].axis("off")
        for ax, (name, a, r_lab, c_lab, pm) in zip(axes, panels):
            is_weights = a is weights
            square = a is scores or a is weights  # T_q × T_k: tokens on both axes
            lim = _signed_limit(a)
            img = _draw_matrix(
                ax,
                np.where(pm, a, 0.0) if pm is not None else a,
                r_lab,
                c_lab,
                mask=pm,
                title=name,
                vmin=0.0 if is_weights else -lim,
                vmax=1.0 if is_weights else lim,
                cmap=CMAP if is_weights else DIVERGING,
                annotate=numbered[id(a)],
                max_labels=_labels_that_fit(max(1.6, 0.14 * a.shape[0]), 0.12),
                max_col_labels=_labels_that_fit(width(a), 0.12),
                masked_text="−∞" if a is scores else None,
                numbered=(True, square),
            )
            ax.set_ylabel("key" if a is ka or a is va else "query", fontsize=8)
            sub.colorbar(
                img,
                ax=ax,
                shrink=0.9,
                pad=0.02,
                label="weight" if is_weights else ("score" if a is scores else "value"),
            )
    if title:
        fig.suptitle(title, fontsize=11)
    data = {
        "x": xa,
        "q": qa,
        "k": ka,
        "v": va,
        "scores": scores,
        "weights": weights,
        "output": output,
        "mask": m,
    }
    if bias is not None:
        data["bias"] = bias
    return Plot(fig, data)


def _check_head_and_batch(module: MultiHeadAttention, head: int, batch_index: int, b: int) -> None:
    num_heads = module.num_heads
    if isinstance(head, bool) or not isinstance(head, int):
        raise TypeError(f"head must be an int, got {type(head).__name__}")
    if not 0 <= head < num_heads:
        raise ValueError(f"head must be in [0, {num_heads}), got {head}")
    if not 0 <= batch_index < b:
        raise ValueError(f"batch_index must be in [0, {b}), got {batch_index}")


def _panel_from_call(
    module: MultiHeadAttention,
    query: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    *,
    mask: torch.Tensor | None,
    is_causal: bool,
    positions: torch.Tensor | None,
    head: int,
    batch_index: int,
    tokens: Sequence[str] | None,
    key_tokens: Sequence[str] | None,
    title: str | None,
    x_title: str,
) -> Plot:
    """Recompute one call of ``module`` (as its ``forward`` does) and draw one head of it."""
    from attnlab.nn.masks import causal_mask

    _check_head_and_batch(module, head, batch_index, query.shape[0])
    cross = key is not None and key is not query
    with torch.no_grad():
        q, k_m, v_m = module.project_qkv(query, key if cross else None, value if cross else None)
        if k_m is None or v_m is None:
            raise ValueError(
                "module.project_qkv returned no keys/values; cannot draw the step panel"
            )
        dh = module.d_head
        q = q.unflatten(-1, (module.num_heads, dh)).transpose(1, 2)  # (B, H, T_q, d_head)
        k = k_m.unflatten(-1, (module.num_kv_heads, dh)).transpose(1, 2)  # (B, H_kv, T_k, d_head)
        v = v_m.unflatten(-1, (module.num_kv_heads, dh)).transpose(1, 2)  # (B, H_kv, T_k, d_head)
        if module.rotary is not None and not cross:
            pos = positions if positions is not None else torch.arange(q.shape[2], device=q.device)
            q, k = module.rotary(q, pos), module.rotary(k, pos)
    kv_head = head // (module.num_heads // module.num_kv_heads)
    b, t_q, t_k = q.shape[0], q.shape[2], k.shape[2]
    head_mask: torch.Tensor | None = None
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
        try:
            full = torch.broadcast_to(mask, (b, module.num_heads, t_q, t_k))
        except RuntimeError:
            raise ValueError(
                f"mask has shape {shape_str(mask.shape)} but must broadcast to (B, H, T_q, T_k) = "
                f"{shape_str((b, module.num_heads, t_q, t_k))}"
            ) from None
        head_mask = full[batch_index, head].detach().cpu()
    if is_causal:
        look_ahead = causal_mask(t_q, t_k)
        if head_mask is None:
            head_mask = look_ahead
        elif head_mask.dtype == torch.bool:
            head_mask = head_mask & look_ahead
        else:  # an additive bias: hide the future with the dtype's minimum
            head_mask = head_mask.masked_fill(~look_ahead, torch.finfo(head_mask.dtype).min)
    return step_panel(
        query[batch_index],
        q[batch_index, head],
        k[batch_index, kv_head],
        v[batch_index, kv_head],
        mask=head_mask,
        tokens=tokens,
        key_tokens=key_tokens,
        title=title,
        x_title=x_title,
        cross=cross,
    )


def step_panel_from_module(
    module: torch.nn.Module,
    x: torch.Tensor,
    *,
    head: int = 0,
    memory: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    positions: torch.Tensor | None = None,
    tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    batch_index: int = 0,
) -> Plot:
    """:func:`step_panel` for one head of a :class:`~attnlab.MultiHeadAttention`.

    Uses the module's own projections (``project_qkv``, rotary embeddings, grouped heads), so the
    drawn weights equal what the module computes with ``need_weights=True`` for the same call.

    Args:
        module: a ``MultiHeadAttention``.
        x: its query input ``(B, T_q, d_model)``.
        head: the query head to draw. Default 0.
        memory: keys/values input for cross-attention ``(B, T_k, d_model)`` (default: ``x``).
        mask: boolean (``True = may attend``) or additive float, broadcastable to
            ``(B, H, T_q, T_k)``.
        is_causal: bottom-right look-ahead mask.
        positions: rotary position ids ``(T_q,)`` or ``(B, T_q)`` (default ``arange(T_q)``).
        tokens / key_tokens: labels.
        batch_index: which sequence. Default 0.

    Returns:
        See :func:`step_panel`.
    """
    from attnlab.nn.multihead import MultiHeadAttention

    if not isinstance(module, MultiHeadAttention):
        raise TypeError(
            f"module must be an attnlab.MultiHeadAttention, got {type(module).__name__}"
        )
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        got = shape_str(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a tensor (B, T_q, d_model), got {got}")
    return _panel_from_call(
        module,
        x,
        memory,
        memory,
        mask=mask,
        is_causal=is_causal,
        positions=positions,
        head=head,
        batch_index=batch_index,
        tokens=tokens,
        key_tokens=key_tokens,
        title=f"head {head}",
        x_title="x (layer input)",
    )


@dataclass
class _Call:
    """What one attention layer was called with (cloned, detached)."""

    name: str
    query: torch.Tensor
    key: torch.Tensor | None
    value: torch.Tensor | None
    mask: torch.Tensor | None
    is_causal: bool
    positions: torch.Tensor | None
    sources: dict[str, str] = field(default_factory=dict)  # "query"/"key" -> producing module


def step_panel_from_model(
    model: torch.nn.Module,
    run: Callable[[], object],
    *,
    layer: str | None = None,
    head: int = 0,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    batch_index: int = 0,
) -> Plot:
    """:func:`step_panel` of one head of an attention layer inside a model, as the model ran it.

    ``run()`` runs the model's forward once (e.g. ``lambda: model(src, tgt_in)``). A forward
    pre-hook on the layer records the exact input ``x`` it received (the query; the key/value
    memory of a cross-attention), the ``mask`` and ``is_causal`` it was called with and its rotary
    ``positions``; the panel is then computed from the layer's own projections, so the drawn
    weights equal what :func:`attnlab.inspect.capture` records for that layer and head. Boolean
    and additive (ALiBi) masks both work; an additive mask is drawn as part of the scores. The
    hooks are removed when ``run`` returns or raises. For a GPT the input of
    ``transformer.h.0.attn`` is ``ln_1`` of the embeddings: the figure names the module that
    produced ``x``.

    Args:
        model: a module containing :class:`~attnlab.nn.multihead.MultiHeadAttention` layers.
        run: a zero-argument callable that runs the model once (called under ``no_grad``).
        layer: the attention module's path (e.g. ``"decoder.layers.0.cross_attn"``); default the
            first attention layer in execution order.
        head: the query head to draw. Default 0.
        query_tokens / key_tokens: labels (``key_tokens`` defaults to ``query_tokens`` for
            self-attention).
        batch_index: which sequence of the batch. Default 0.

    Returns:
        See :func:`step_panel`; the title names the layer, the head and where ``x`` came from.

    Raises:
        ValueError: no such layer, the layer never ran, or it ran with a filled KV cache (the
            panel shows one forward over the whole sequence).

    Example:
        >>> plot = step_panel_from_model(model, lambda: model(ids), head=1, query_tokens=words)
        >>> plot.save("steps.png")
    """
    from attnlab.inspect.capture import attention_modules
    from attnlab.nn.hooks import HookPoint

    if not callable(run):
        raise TypeError(f"run must be a zero-argument callable, got {type(run).__name__}")
    modules = attention_modules(model)
    if not modules:
        raise ValueError(f"model ({type(model).__name__}) has no MultiHeadAttention layer")
    if layer is not None and layer not in modules:
        known = ", ".join(list(modules)[:8])
        raise ValueError(
            f"layer must be an attention module path of the model ({known}), got {layer!r}"
        )
    watched = modules if layer is None else {layer: modules[layer]}

    calls: list[_Call] = []
    produced: dict[int, tuple[str, weakref.ref[torch.Tensor]]] = {}
    handles: list[torch.utils.hooks.RemovableHandle] = []

    def producer(t: object) -> str | None:
        if not isinstance(t, torch.Tensor):
            return None
        hit = produced.get(id(t))
        return hit[0] if hit is not None and hit[1]() is t else None

    def make_pre(name: str) -> Callable[..., None]:
        def pre(mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if calls:
                return  # the first call of the first watched layer is the one drawn
            bound = dict(zip(("query", "key", "value"), args))
            bound.update({k: v for k, v in kwargs.items() if k in ("query", "key", "value")})
            query, key, value = bound.get("query"), bound.get("key"), bound.get("value")
            cache = kwargs.get("cache")
            if cache is not None and (
                getattr(cache, "static", False) or getattr(cache, "length", 0)
            ):
                raise ValueError(
                    f"{name} was first called with a KV cache already holding {cache.length} "
                    "positions; run the model once over the whole sequence without a cache"
                )
            if key is query:
                key = value = None

            def keep(t: object) -> Any:
                return t.detach().clone() if isinstance(t, torch.Tensor) else t

            calls.append(
                _Call(
                    name,
                    keep(query),
                    keep(key),
                    keep(value),
                    keep(kwargs.get("mask")),
                    bool(kwargs.get("is_causal", False)),
                    keep(kwargs.get("positions")),
                    {
                        side: src
                        for side, t in (("query", query), ("key", key))
                        if (src := producer(t)) is not None
                    },
                )
            )

        return pre

    def post(name: str) -> Callable[..., None]:
        def hook(mod: torch.nn.Module, args: Any, out: Any) -> None:
            if isinstance(out, torch.Tensor):
                old = produced.get(id(out))
                if old is None or old[1]() is not out:  # the first module to return it names it
                    produced[id(out)] = (name, weakref.ref(out))

        return hook

    try:
        for name, sub in model.named_modules():
            if name and not isinstance(sub, HookPoint):
                handles.append(sub.register_forward_hook(post(name)))
        for name, mod in watched.items():
            handles.append(mod.register_forward_pre_hook(make_pre(name), with_kwargs=True))
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    if not calls:
        raise ValueError(
            f"run() did not call layer {layer!r}" if layer else "run() called no attention layer"
        )
    call = calls[0]
    module = modules[call.name]
    q_src = call.sources.get("query")
    k_src = call.sources.get("key")
    origin = f"x = output of {q_src}" if q_src else "x = the layer's input"
    if call.key is not None:
        origin += f"; keys/values from {k_src}" if k_src else "; keys/values from the memory"
    return _panel_from_call(
        module,
        call.query,
        call.key,
        call.value if call.value is not None else call.key,
        mask=call.mask,
        is_causal=call.is_causal,
        positions=call.positions,
        head=head,
        batch_index=batch_index,
        tokens=query_tokens,
        key_tokens=key_tokens,
        title=f"{call.name} · head {head}   ({origin})",
        x_title="x (layer input)",
    )


# ----------------------------------------------------------------------------- masks


def mask_panel(
    tokens: Sequence[str],
    *,
    pad_token: str = "<pad>",
) -> Plot:
    """Padding and look-ahead masks side by side, and their combination.

    ``padding[i, j] = token_j != pad``; ``look_ahead[i, j] = j <= i``;
    ``combined = padding ∧ look_ahead`` (``True = may attend``, drawn dark).

    Args:
        tokens: one sequence, possibly ending in padding.
        pad_token: the padding token's text. Default ``"<pad>"``.

    Returns:
        :class:`Plot` with ``data`` ``padding``, ``look_ahead``, ``combined`` (boolean ``(T, T)``).
    """
    from attnlab.nn.masks import causal_mask, combine

    toks = [str(t) for t in tokens]
    if not toks:
        raise ValueError("tokens must hold at least one token, got none")
    t = len(toks)
    real = torch.tensor([tok != pad_token for tok in toks])
    padding = real[None, :].expand(t, t)
    look_ahead = causal_mask(t)
    combined = combine(padding, look_ahead)
    data = {
        "padding": padding.numpy().copy(),
        "look_ahead": look_ahead.numpy().copy(),
        "combined": combined.numpy().copy(),
    }
    side = min(6.0, max(2.8, 0.3 * t + 1.2))
    fig = _new_figure(3 * side, side + 0.5)
    axes = fig.subplots(1, 3)
    for ax, (name, m) in zip(axes, data.items()):
        ax.imshow(m.astype(float), cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
        _tick_labels(ax, toks, toks)
        ax.set_title(
            {
                "padding": "padding mask",
                "look_ahead": "look-ahead mask",
                "combined": "combined (decoder self-attention)",
            }[name],
            fontsize=9,
        )
        ax.set_xlabel("key")
    axes[0].set_ylabel("query")
    fig.suptitle("True = may attend (dark)")
    return Plot(fig, data)


# ----------------------------------------------------------------------------- schedules, positions


def noam_rate(step: np.ndarray, d_model: int, warmup_steps: int, factor: float = 1.0) -> np.ndarray:
    """Vaswani et al. (2017), §5.3:

        lrate = factor · d_model^{-0.5} · min(step^{-0.5}, step · warmup_steps^{-1.5})

    Args:
        step: step numbers (≥ 1).
        d_model: model width.
        warmup_steps: linear warm-up length.
        factor: overall scale. Default 1.

    Returns:
        The learning rate at each step, same shape as ``step``.
    """
    s = np.maximum(np.asarray(step, dtype=np.float64), 1.0)
    return factor * d_model**-0.5 * np.minimum(s**-0.5, s * warmup_steps**-1.5)


def noam_curve(
    configs: Sequence[tuple[int, int]] = ((512, 4000), (512, 8000), (256, 4000)),
    *,
    steps: int = 20000,
    factor: float = 1.0,
) -> Plot:
    """The Noam learning-rate schedule for a few ``(d_model, warmup_steps)`` pairs.

    Args:
        configs: ``(d_model, warmup_steps)`` pairs. Default the Annotated Transformer's three.
        steps: how many steps to draw. Default 20000.
        factor: overall scale. Default 1.

    Returns:
        :class:`Plot` with ``data["step"]`` ``(steps,)`` and ``data["lr"]`` ``(len(configs), steps)``.
    """
    check_positive_int("steps", steps)
    if not configs:
        raise ValueError("configs must hold at least one (d_model, warmup_steps) pair, got none")
    step = np.arange(1, steps + 1)
    lrs = []
    fig = _new_figure(7.0, 4.0)
    ax = fig.add_subplot()
    for d_model, warmup in configs:
        check_positive_int("d_model", d_model)
        check_positive_int("warmup_steps", warmup)
        lr = noam_rate(step, d_model, warmup, factor)
        lrs.append(lr)
        ax.plot(step, lr, label=f"d_model={d_model}, warmup={warmup}")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title("Noam schedule: linear warm-up, then ∝ 1/√step")
    ax.legend()
    ax.grid(alpha=0.3)
    return Plot(fig, {"step": step, "lr": np.stack(lrs)})


def positional_encoding_figure(
    max_len: int = 100, d_model: int = 64, *, dims: Sequence[int] = (4, 5, 6, 7)
) -> Plot:
    """Sinusoidal positional encodings: the table as a heatmap, and a few dimensions as curves.

    ``PE(pos, 2i) = sin(pos / 10000^{2i/d})``, ``PE(pos, 2i+1) = cos(pos / 10000^{2i/d})``
    (:func:`attnlab.nn.positional.sinusoidal_table`).

    Args:
        max_len: positions to draw. Default 100.
        d_model: encoding width. Default 64.
        dims: dimensions drawn as curves. Default ``(4, 5, 6, 7)``.

    Returns:
        :class:`Plot` with ``data["table"]`` ``(max_len, d_model)`` and ``data["curves"]``
        ``(len(dims), max_len)``.
    """
    from attnlab.nn.positional import sinusoidal_table

    table = sinusoidal_table(max_len, d_model).numpy()
    for d in dims:
        if not 0 <= d < d_model:
            raise ValueError(f"dims must lie in [0, d_model={d_model}), got {d}")
    fig = _new_figure(12.0, 4.0)
    ax1, ax2 = fig.subplots(1, 2)
    img = ax1.imshow(table, cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax1.set_xlabel("dimension")
    ax1.set_ylabel("position")
    ax1.set_title("PE table")
    fig.colorbar(img, ax=ax1)
    curves = table[:, list(dims)].T
    for d, curve in zip(dims, curves):
        ax2.plot(np.arange(max_len), curve, label=f"dim {d}")
    ax2.set_xlabel("position")
    ax2.set_title("a few dimensions")
    ax2.legend()
    return Plot(fig, {"table": table, "curves": curves})
