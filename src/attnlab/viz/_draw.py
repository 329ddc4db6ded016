"""The drawing shared by every figure of :mod:`attnlab.viz` (matplotlib, Agg; PNG and SVG).

Every figure function returns a :class:`Plot`: the matplotlib ``Figure`` and the arrays it drew, so
a test (or a user) can check that what is on the page equals what the model computed. Figures are
built with ``matplotlib.figure.Figure`` directly — no ``pyplot``, no global state, no display
needed. This module holds what the figure modules share: :class:`Plot` and :func:`save_figure`,
input conversion and token labels, and drawing a labelled (optionally annotated) matrix.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from attnlab._checks import shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.viz.files import write_file
from attnlab.viz.fonts import fit_figure

__all__ = ["ArrayLike", "Plot", "save_figure"]

ArrayLike = torch.Tensor | np.ndarray
CMAP = "viridis"  # weights: 0 → dark, 1 → bright
DIVERGING = "RdBu_r"  # signed values: blue < 0 < red, white at 0
MASKED = "#bdbdbd"  # cells a query may not see


@dataclass(frozen=True)
class Plot:
    """A figure and the data it drew.

    When it is made, every text of the figure gets a font that draws it
    (:func:`~attnlab.viz.fonts.fit_figure`: Japanese token labels and titles too).

    Attributes:
        figure: the matplotlib ``Figure`` (Agg canvas attached).
        data: named arrays exactly as drawn, e.g. ``data["weights"]``.
    """

    figure: Figure
    data: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # every text in a font that draws it, e.g. Japanese tokens in titles and tick labels
        fit_figure(self.figure)

    def save(self, path: str | Path, *, dpi: int = 120) -> Path:
        """Write the figure; the format follows the suffix (``.png`` or ``.svg``).

        Args:
            path: the file to write (parent folders are created).
            dpi: dots per inch of a PNG.

        Returns:
            The path written.
        """
        return save_figure(self.figure, path, dpi=dpi)

    def _repr_png_(self) -> bytes:
        """The figure as PNG bytes: a notebook shows a :class:`Plot` inline."""
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        return buf.getvalue()


# ----------------------------------------------------------------------------- inputs and labels


def _to_numpy(name: str, x: object, dims: int | tuple[int, ...]) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        arr = (t.float() if t.is_floating_point() and t.dtype != torch.float64 else t).numpy()
    elif isinstance(x, np.ndarray):
        arr = x
    else:
        raise ArgumentTypeError(
            f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}"
        )
    allowed = (dims,) if isinstance(dims, int) else dims
    if arr.ndim not in allowed:
        want = " or ".join(f"{d}-D" for d in allowed)
        raise ArgumentError(f"{name} must be {want}, got shape {shape_str(arr.shape)}")
    return arr


def _labels(name: str, tokens: Sequence[str] | None, n: int) -> list[str]:
    if tokens is None:
        return [str(i) for i in range(n)]
    tokens = [str(t) for t in tokens]
    if len(tokens) != n:
        raise ArgumentError(f"{name} must have {n} entries (one per position), got {len(tokens)}")
    return tokens


def save_figure(figure: Figure, path: str | Path, *, dpi: int = 120) -> Path:
    """Save ``figure`` as PNG or SVG (chosen by the suffix), creating parent folders.

    The file is replaced only once it is complete (see :func:`attnlab.viz.files.write_file`):
    a full disk or a read-only folder raises an ``OSError`` naming ``path`` and leaves any file
    already there unchanged.

    Args:
        figure: a matplotlib ``Figure``.
        path: ``*.png`` or ``*.svg``.
        dpi: resolution for PNG. Default 120.

    Returns:
        The path written.

    Raises:
        ValueError: ``path`` does not end in ``.png`` or ``.svg``, or a parent of it is a file.
        OSError: the file could not be written.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise ArgumentError(f"path must end in .png or .svg, got {str(path)!r}")
    if figure.canvas is None or not isinstance(figure.canvas, FigureCanvasAgg):
        FigureCanvasAgg(figure)
    return write_file(
        path, lambda f: figure.savefig(f, format=suffix[1:], dpi=dpi, bbox_inches="tight")
    )


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _short(label: str, n: int = 12) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"


# how a tick label shows a token made only of white space (a character model's " "), else blank
_VISIBLE_SPACE = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"})


def _shown(label: str) -> str:
    """A token as a tick label shows it: white space alone made visible (``" "`` → ``"␣"``,
    ``"\\n"`` → ``"↵"``); every other label unchanged (its ``$`` is drawn as a ``$``: tick labels
    are not parsed as mathtext, see :func:`_tick_labels`)."""
    return label.translate(_VISIBLE_SPACE) if label and not label.strip() else label


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

    Labels in a script the default font cannot draw (Japanese, …) get a font that can when the
    :class:`Plot` is made (:func:`~attnlab.viz.fonts.fit_figure`). A thinned axis whose labels are
    one per position (``numbered``: rows, columns) writes each label as ``"position token"``, so a
    reader knows which positions are labelled (reduced sides already carry their positions). An
    axis with ``show_* = False`` keeps its ticks (at the same positions) but no text, for panels
    that share their labels with a neighbour.

    Labels are drawn as the tokens read: never parsed as mathtext (a ``$`` token, or ``$$``, is a
    dollar sign, not an error at drawing), and a token of white space alone is drawn visibly
    (``␣`` for a space, :func:`_shown`).
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
            _short(_shown(labels[i]))
            if step == 1 or not number or labels[i] == str(i)
            else f"{i} {_short(_shown(labels[i]), 9)}"
            for i in idx
        ]
        set_labels(texts if show else [], rotation=rot, fontsize=size, parse_math=False)
    ax.tick_params(length=2, pad=1)


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


def _labels_that_fit(inches: float, per_label: float = 0.1) -> int:
    """How many small (≈6 pt) tick labels fit along ``inches`` of axis."""
    return max(4, int(inches / per_label))


# ----------------------------------------------------------------------------- a labelled matrix


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
