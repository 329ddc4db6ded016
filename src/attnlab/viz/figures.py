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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnlab._checks import check_choice, check_positive_int, shape_str

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
    "step_panel_from_module",
]

Reduction = Literal["block", "topk"]
ArrayLike = torch.Tensor | np.ndarray
CMAP = "viridis"


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


def _tick_labels(ax: Axes, rows: list[str], cols: list[str], *, max_labels: int = 64) -> None:
    """Token labels on both axes (thinned when there are too many to read)."""
    for labels, set_ticks, set_labels, rot in (
        (cols, ax.set_xticks, ax.set_xticklabels, 90),
        (rows, ax.set_yticks, ax.set_yticklabels, 0),
    ):
        step = max(1, math.ceil(len(labels) / max_labels))
        idx = list(range(0, len(labels), step))
        set_ticks(idx)
        set_labels([labels[i] for i in idx], rotation=rot, fontsize=8 if len(labels) <= 32 else 6)


def _masked_array(weights: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    if mask is None:
        return weights
    return np.ma.masked_where(~mask.astype(bool), weights)


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
):
    img = ax.imshow(
        _masked_array(matrix, mask),
        cmap=colormaps[cmap].with_extremes(bad="#d9d9d9"),
        vmin=vmin,
        vmax=vmax,
        aspect="auto",
        interpolation="nearest",
    )
    if labels:
        _tick_labels(ax, rows, cols)
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=9)
    if annotate and matrix.size <= 400:
        for (i, j), value in np.ndenumerate(matrix):
            if mask is not None and not mask[i, j]:
                continue
            ax.text(
                j,
                i,
                f"{value:.2f}",
                ha="center",
                va="center",
                fontsize=6,
                color="white" if value < 0.5 * (vmax or matrix.max() or 1) else "black",
            )
    return img


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
        ax, red.matrix, red.row_labels, red.col_labels, mask=m, title=title, annotate=annotate
    )
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    fig.colorbar(img, ax=ax, shrink=0.8, label="weight")
    data = {"weights": red.matrix, "row_index": red.row_index, "col_index": red.col_index}
    if m is not None:
        data["mask"] = m
    return Plot(fig, data)


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
    """All heads of one layer, one small heatmap each.

    Args:
        weights: ``(H, T_q, T_k)`` (or ``(1, H, T_q, T_k)``).
        query_tokens / key_tokens: labels.
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
    fig = _new_figure(3.2 * ncols + 0.8, 3.2 * nrows + (0.4 if title else 0.0))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    small = reds[0].matrix.shape[0] <= 16 and reds[0].matrix.shape[1] <= 16
    img = None
    for i, ax in enumerate(axes.flat):
        if i >= h:
            ax.axis("off")
            continue
        img = _draw_matrix(
            ax,
            reds[i].matrix,
            reds[i].row_labels,
            reds[i].col_labels,
            title=f"head {i}",
            vmax=1.0,
            labels=small,
        )
    if title:
        fig.suptitle(title)
    if img is not None:
        fig.colorbar(img, ax=axes, shrink=0.6, label="weight")
    return Plot(fig, {"weights": np.stack([r.matrix for r in reds])})


def layer_head_grid(
    attentions: Mapping[str, ArrayLike] | Sequence[ArrayLike],
    *,
    batch_index: int = 0,
    title: str | None = None,
    max_tokens: int = 32,
    method: Reduction = "block",
) -> Plot:
    """Layers × heads: one row per layer, one column per head.

    Args:
        attentions: per layer ``(B, H, T_q, T_k)`` or ``(H, T_q, T_k)`` — a mapping
            ``module path -> weights`` (e.g. ``cache.attentions`` from
            :func:`attnlab.inspect.capture`, in its order) or a list.
        batch_index: which sequence of the batch to draw. Default 0.
        title: figure title.
        max_tokens: per-side limit before reduction.
        method: ``"block"`` or ``"topk"``.

    Returns:
        :class:`Plot` with ``data["weights"]`` ``(L, H, R_q, R_k)`` (drawn; heads missing in a
        layer with fewer heads are NaN) and the row names in ``data["layers"]``.
    """
    if isinstance(attentions, Mapping):
        names, items = list(attentions.keys()), list(attentions.values())
    else:
        items = list(attentions)
        names = [f"layer {i}" for i in range(len(items))]
    if not items:
        raise ValueError("attentions must hold at least one layer, got none")
    mats: list[np.ndarray] = []
    for name, a in zip(names, items):
        arr = _to_numpy(f"attentions[{name!r}]", a, (3, 4))
        if arr.ndim == 4:
            if not 0 <= batch_index < arr.shape[0]:
                raise ValueError(f"batch_index must be in [0, {arr.shape[0]}), got {batch_index}")
            arr = arr[batch_index]
        mats.append(
            np.stack(
                [reduce_attention(x, max_tokens=max_tokens, method=method).matrix for x in arr]
            )
        )
    n_layers = len(mats)
    n_heads = max(m.shape[0] for m in mats)
    r = max(m.shape[1] for m in mats)
    c = max(m.shape[2] for m in mats)
    grid = np.full((n_layers, n_heads, r, c), np.nan, dtype=mats[0].dtype)
    for i, m in enumerate(mats):
        grid[i, : m.shape[0], : m.shape[1], : m.shape[2]] = m
    cell = 1.8 if n_heads > 6 else 2.4
    fig = _new_figure(cell * n_heads + 1.5, cell * n_layers + 0.6)
    axes = fig.subplots(n_layers, n_heads, squeeze=False)
    img = None
    for li in range(n_layers):
        for hi in range(n_heads):
            ax = axes[li, hi]
            if hi >= mats[li].shape[0]:
                ax.axis("off")
                continue
            img = _draw_matrix(
                ax,
                mats[li][hi],
                [],
                [],
                vmax=1.0,
                labels=False,
                title=f"head {hi}" if li == 0 else None,
            )
            if hi == 0:
                ax.set_ylabel(names[li], fontsize=7)
    if title:
        fig.suptitle(title)
    if img is not None:
        fig.colorbar(img, ax=axes, shrink=0.5, label="weight")
    return Plot(fig, {"weights": grid, "layers": np.array(names)})


# ----------------------------------------------------------------------------- the step panel


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
) -> Plot:
    """One head, step by step: ``x → Q Kᵀ/√d → softmax weights → output``.

    The panels draw, left to right, the token vectors ``x``, the scaled scores
    ``S = Q Kᵀ / √d_head`` (masked cells grey), the weights ``A = softmax(S)`` and the output
    ``Z = A V``. The values are computed here in float64 from ``q``, ``k``, ``v``.

    Args:
        x: the layer's input, ``(T_q, d_model)``.
        q: one head's queries ``(T_q, d_head)``.
        k, v: that head's keys and values ``(T_k, d_head)``.
        mask: boolean ``(T_q, T_k)``, ``True = may attend``.
        tokens: query labels; ``key_tokens`` key labels (default ``tokens`` when ``T_q == T_k``).
        title: figure title.

    Returns:
        :class:`Plot` with ``data`` ``x``, ``scores``, ``weights``, ``output`` (as drawn; masked
        scores are ``-inf``).
    """
    xa = _to_numpy("x", x, 2).astype(np.float64)
    qa = _to_numpy("q", q, 2).astype(np.float64)
    ka = _to_numpy("k", k, 2).astype(np.float64)
    va = _to_numpy("v", v, 2).astype(np.float64)
    if qa.shape[0] != xa.shape[0]:
        raise ValueError(
            f"q must have one row per row of x ({xa.shape[0]}), got {shape_str(qa.shape)}"
        )
    if ka.shape != (va.shape[0], qa.shape[1]) or va.shape[0] != ka.shape[0]:
        raise ValueError(
            f"k must be (T_k, d_head={qa.shape[1]}) and v (T_k, d_v), got {shape_str(ka.shape)} and {shape_str(va.shape)}"
        )
    t_q, d_head = qa.shape
    t_k = ka.shape[0]
    m = np.ones((t_q, t_k), dtype=bool) if mask is None else _to_numpy("mask", mask, 2).astype(bool)
    if m.shape != (t_q, t_k):
        raise ValueError(
            f"mask must have shape (T_q, T_k) = {shape_str((t_q, t_k))}, got {shape_str(m.shape)}"
        )
    rows = _labels("tokens", tokens, t_q)
    cols = _labels(
        "key_tokens",
        key_tokens if key_tokens is not None else (tokens if t_q == t_k else None),
        t_k,
    )

    # S = Q Kᵀ / √d_head, masked entries -inf
    scores = np.where(m, qa @ ka.T / math.sqrt(d_head), -np.inf)
    # A = softmax(S) row-wise; a row with no visible key is all zeros
    row_max = np.max(np.where(m, scores, -np.inf), axis=1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.where(m, np.exp(scores - row_max), 0.0)
    denom = e.sum(axis=1, keepdims=True)
    weights = np.divide(e, denom, out=np.zeros_like(e), where=denom > 0)
    # Z = A V
    output = weights @ va

    fig = _new_figure(15.0, 3.6 + 0.12 * max(t_q, 8))
    axes = fig.subplots(1, 4, width_ratios=[max(xa.shape[1], 2), t_k, t_k, max(va.shape[1], 2)])
    dims = [f"d{i}" for i in range(xa.shape[1])]
    dh = [f"d{i}" for i in range(va.shape[1])]
    finite = np.where(m, scores, np.nan)
    lim = float(np.nanmax(np.abs(finite))) if np.isfinite(finite).any() else 1.0
    _draw_matrix(
        axes[0],
        xa,
        rows,
        dims,
        title="x (token vectors)",
        vmin=None,
        cmap="coolwarm",
        labels=xa.shape[1] <= 32,
    )
    _draw_matrix(
        axes[1],
        np.where(m, scores, 0.0),
        rows,
        cols,
        mask=m,
        title="Q Kᵀ / √d",
        vmin=-lim,
        vmax=lim,
        cmap="coolwarm",
        annotate=t_q * t_k <= 100,
    )
    _draw_matrix(
        axes[2],
        weights,
        rows,
        cols,
        mask=m,
        title="softmax → weights",
        vmax=1.0,
        annotate=t_q * t_k <= 100,
    )
    _draw_matrix(
        axes[3],
        output,
        rows,
        dh,
        title="output = weights · V",
        vmin=None,
        cmap="coolwarm",
        labels=va.shape[1] <= 32,
    )
    for ax, arrow in zip(axes[:3], ("→", "→", "→")):
        ax.annotate(arrow, xy=(1.02, 0.5), xycoords="axes fraction", fontsize=16, va="center")
    if title:
        fig.suptitle(title)
    return Plot(fig, {"x": xa, "scores": scores, "weights": weights, "output": output})


def step_panel_from_module(
    module: torch.nn.Module,
    x: torch.Tensor,
    *,
    head: int = 0,
    memory: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    batch_index: int = 0,
) -> Plot:
    """:func:`step_panel` for one head of a :class:`~attnlab.MultiHeadAttention`.

    Uses the module's own projections (``project_qkv``, rotary embeddings, grouped heads), so the
    drawn weights equal what the module computes with ``need_weights=True``.

    Args:
        module: a ``MultiHeadAttention``.
        x: its query input ``(B, T_q, d_model)``.
        head: the query head to draw.
        memory: keys/values input for cross-attention ``(B, T_k, d_model)`` (default: ``x``).
        mask: boolean, broadcastable to ``(B, H, T_q, T_k)``.
        is_causal: bottom-right look-ahead mask.
        tokens / key_tokens: labels.
        batch_index: which sequence.

    Returns:
        See :func:`step_panel`.
    """
    from attnlab.nn.masks import causal_mask
    from attnlab.nn.multihead import MultiHeadAttention

    if not isinstance(module, MultiHeadAttention):
        raise TypeError(
            f"module must be an attnlab.MultiHeadAttention, got {type(module).__name__}"
        )
    if not 0 <= head < module.num_heads:
        raise ValueError(f"head must be in [0, {module.num_heads}), got {head}")
    with torch.no_grad():
        cross = memory is not None
        q, k_m, v_m = module.project_qkv(x, memory if cross else None, memory if cross else None)
        if k_m is None or v_m is None:
            raise ValueError(
                "module.project_qkv returned no keys/values; cannot draw the step panel"
            )
        k, v = k_m, v_m
        dh = module.d_head
        q = q.unflatten(-1, (module.num_heads, dh)).transpose(1, 2)  # (B, H, T_q, d_head)
        k = k.unflatten(-1, (module.num_kv_heads, dh)).transpose(1, 2)  # (B, H_kv, T_k, d_head)
        v = v.unflatten(-1, (module.num_kv_heads, dh)).transpose(1, 2)
        if module.rotary is not None and not cross:
            pos = torch.arange(x.shape[1], device=x.device)
            q, k = module.rotary(q, pos), module.rotary(k, pos)
    kv_head = head // (module.num_heads // module.num_kv_heads)
    t_q, t_k = q.shape[2], k.shape[2]
    allowed = torch.ones(t_q, t_k, dtype=torch.bool)
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be boolean for the step panel, got {mask.dtype}")
        full = mask.expand(x.shape[0], module.num_heads, t_q, t_k)
        allowed = allowed & full[batch_index, head].cpu()
    if is_causal:
        allowed = allowed & causal_mask(t_q, t_k)
    return step_panel(
        x[batch_index],
        q[batch_index, head],
        k[batch_index, kv_head],
        v[batch_index, kv_head],
        mask=allowed,
        tokens=tokens,
        key_tokens=key_tokens,
        title=f"head {head}",
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
