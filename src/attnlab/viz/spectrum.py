"""Figures of heads as low-rank relations: the spectra of their QK or OV circuits
(:mod:`attnlab.inspect.qk_circuits`).

:func:`head_spectrum_figure` draws, for a few layers, the singular values of every head's circuit
(one line per head, log scale), and beside them the effective rank of every head as a layers ×
heads heatmap; it returns a :class:`~attnlab.viz.Plot` holding what it drew.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from matplotlib import colormaps

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.viz._draw import CMAP, Plot, _new_figure

if TYPE_CHECKING:
    from attnlab.inspect.qk_circuits import CircuitSpectrum

__all__ = ["head_spectrum_figure"]

_NAMES = {"qk": "W_Q W_Kᵀ/√d_head", "ov": "W_Vᵀ W_Oᵀ"}


def head_spectrum_figure(
    spectrum: CircuitSpectrum,
    *,
    circuit: str = "qk",
    layers: Sequence[int] | None = None,
    title: str | None = None,
) -> Plot:
    """Singular values per head for a few layers, and the effective rank of every head.

    One panel per shown layer: the ``d_head`` singular values of each head's circuit, largest
    first, one line per head (log scale; values below ``1e-12`` of the largest are clipped
    there). The last panel is the effective rank (:meth:`CircuitSpectrum.effective_rank`) of
    every head, layers down, heads across, on a scale from 0 to ``d_head`` (cells annotated when
    the grid has at most 16 rows).

    Args:
        spectrum: a :class:`~attnlab.inspect.CircuitSpectrum` (:func:`~attnlab.inspect.qk_spectrum`).
        circuit: ``"qk"`` (default) or ``"ov"``.
        layers: rows of the spectrum to draw the singular values of (positions in
            ``spectrum.layers``, at most 4). Default the first, middle and last.
        title: the figure title. Default names the circuit.

    Returns:
        :class:`~attnlab.viz.Plot` with ``data["singular_values"]`` ``(shown, H, d_head)``,
        ``data["shown"]`` (the rows drawn) and ``data["effective_rank"]`` ``(n_layers, H)``.

    Raises:
        TypeError: ``spectrum`` is not a ``CircuitSpectrum``.
        ValueError: a bad ``circuit``, or ``layers`` empty, longer than 4 or out of range.

    Examples:
        >>> head_spectrum_figure(attnlab.inspect.qk_spectrum(model)).save("spectrum.png")
    """
    if not all(hasattr(spectrum, a) for a in ("qk", "ov", "effective_rank", "layers")):
        raise ArgumentTypeError(
            f"spectrum must be a CircuitSpectrum, got {type(spectrum).__name__}"
        )
    values = spectrum.values(circuit).double().numpy()  # (L, H, d_head)
    n_layers, n_heads, d_head = values.shape
    shown = sorted({0, n_layers // 2, n_layers - 1}) if layers is None else [int(i) for i in layers]
    if not 1 <= len(shown) <= 4 or not all(0 <= i < n_layers for i in shown):
        raise ArgumentError(
            f"layers must be 1 to 4 rows of the spectrum in [0, {n_layers}), got {list(shown)}"
        )
    eff = spectrum.effective_rank(circuit).double().numpy()  # (L, H)
    fig = _new_figure(3.2 * len(shown) + max(3.0, 0.35 * n_heads + 1.6), 3.6)
    grid = fig.add_gridspec(1, len(shown) + 1, width_ratios=[1.0] * len(shown) + [1.1])
    colours = colormaps["tab10" if n_heads <= 10 else "tab20"]
    index = np.arange(1, d_head + 1)
    for p, row in enumerate(shown):
        ax = fig.add_subplot(grid[0, p])
        for h in range(n_heads):
            s = values[row, h]
            floor = max(float(s[0]), 1e-300) * 1e-12
            ax.plot(index, np.maximum(s, floor), color=colours(h % colours.N), lw=1.0,
                    label=f"H{h}")  # fmt: skip
        ax.set_yscale("log")
        ax.set_xlabel("i (singular value index)")
        if p == 0:
            ax.set_ylabel(f"σ_i of {_NAMES[circuit]}")
        ax.set_title(f"{spectrum.layers[row]} (layer {spectrum.indices[row]})", fontsize=9)
        ax.grid(True, alpha=0.3)
    if n_heads <= 12:
        fig.axes[0].legend(fontsize=6, ncol=2, title="head", title_fontsize=7)
    ax = fig.add_subplot(grid[0, len(shown)])
    img = ax.imshow(eff, cmap=CMAP, vmin=0.0, vmax=float(d_head), aspect="auto",
                    interpolation="nearest")  # fmt: skip
    if n_layers <= 16 and n_heads <= 16:
        for i in range(n_layers):
            for j in range(n_heads):
                ax.text(j, i, f"{eff[i, j]:.0f}", ha="center", va="center", fontsize=6,
                        color="white" if eff[i, j] < d_head / 2 else "black")  # fmt: skip
    ax.set_xlabel("head")
    ax.set_xticks(range(n_heads))
    ax.set_xticklabels([str(h) for h in range(n_heads)], fontsize=7)
    step = max(1, n_layers // 15)
    ax.set_yticks(range(0, n_layers, step))
    ax.set_yticklabels([str(spectrum.indices[i]) for i in range(0, n_layers, step)], fontsize=7)
    ax.set_ylabel("layer")
    ax.set_title(f"effective rank (of at most {d_head})", fontsize=9)
    fig.colorbar(img, ax=ax, shrink=0.85, label="effective rank exp(−Σ p log p), p = σ / Σσ")
    fig.suptitle(
        title
        or f"Every head as a bilinear relation of rank ≤ d_head = {d_head}: {_NAMES[circuit]}",
        fontsize=10,
    )
    return Plot(
        fig,
        {
            "singular_values": values[shown],
            "shown": np.asarray(shown),
            "effective_rank": eff,
        },
    )
