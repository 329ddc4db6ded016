"""The context-mixing figure: what each position takes from each token, by one method
(:func:`mixing_figure`, ``attnlab plot mixing``).

Left, the matrix through every layer (rollout, flow, ALTI, gradient-weighted relevance,
integrated gradients) or the last layer's; right, each layer's matrix as a small multiple. The
colour bar says what a number means (:attr:`attnlab.inspect.Mixing.meaning`); a key a position
cannot see (a later token of a causal model) is grey, not 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from attnlab.errors import ArgumentError
from attnlab.inspect.mixing import Mixing
from attnlab.viz._draw import CMAP, DIVERGING, Plot, _draw_matrix, _labels, _new_figure

__all__ = ["mixing_figure"]


def _panel(matrix: torch.Tensor, causal: bool) -> tuple[np.ndarray, np.ndarray | None]:
    a = matrix.detach().double().cpu().numpy()
    if not causal or a.shape[0] != a.shape[1]:
        return a, None
    return a, np.tril(np.ones(a.shape, dtype=bool))  # a later key: grey, not 0


def mixing_figure(
    mix: Mixing,
    tokens: Sequence[str] | None = None,
    *,
    batch_index: int = 0,
    causal: bool = True,
    title: str | None = None,
) -> Plot:
    """One method's mixing: the matrix through every layer (or the last layer's) and each
    layer's.

    Args:
        mix: from :func:`attnlab.inspect.mixing`.
        tokens: the token labels (both axes).
        batch_index: which sequence of the batch.
        causal: the model is causal: keys after a query are drawn grey (nothing reaches them).
        title: the figure's title (default the method and what it means).

    Returns:
        A :class:`~attnlab.viz.Plot` with ``data["main"]`` (the left matrix) and
        ``data["layers"]`` (every layer's, when the method has them).

    Raises:
        ValueError: ``batch_index`` out of range.
    """
    main = mix.total if mix.total is not None else mix.per_layer[-1]  # type: ignore[index]
    if not 0 <= batch_index < main.shape[0]:
        raise ArgumentError(f"batch_index must be in [0, {main.shape[0]}), got {batch_index}")
    t_q, t_k = main.shape[-2:]
    rows = _labels("tokens", list(tokens)[-t_q:] if tokens is not None else None, t_q)
    cols = _labels("tokens", list(tokens)[:t_k] if tokens is not None else None, t_k)
    layers = [] if mix.per_layer is None else [m[batch_index] for m in mix.per_layer]
    side = min(9.0, max(3.5, 0.35 * t_k))
    grid = math.ceil(math.sqrt(len(layers))) if layers else 0
    small = min(2.2, side / max(grid, 1) * 1.6) if layers else 0.0
    fig = _new_figure(side + 1.5 + grid * small, max(side, grid * small) + 1.0)
    outer = fig.add_gridspec(
        1, 2 if layers else 1, width_ratios=[side + 1.5, grid * small] if layers else None
    )
    a, visible = _panel(main[batch_index], causal)
    signed = bool((a < 0).any())
    lim = float(np.abs(a).max()) or 1.0
    ax = fig.add_subplot(outer[0, 0])
    where = "through every layer" if mix.total is not None else f"in {mix.layers[-1]}"
    img = _draw_matrix(
        ax, a, rows, cols, mask=visible, title=where,
        vmin=-lim if signed else 0.0, vmax=lim, cmap=DIVERGING if signed else CMAP,
        annotate=t_q * t_k <= 144,
    )  # fmt: skip
    ax.set_ylabel("position i (takes)")
    ax.set_xlabel("token j (gives)")
    fig.colorbar(img, ax=ax, shrink=0.8, label=mix.meaning)
    if layers:
        inner = outer[0, 1].subgridspec(grid, grid)
        top = max(float(np.abs(m.detach().double().cpu().numpy()).max()) for m in layers) or 1.0
        for n, m in enumerate(layers):
            sub = fig.add_subplot(inner[n // grid, n % grid])
            b, vis = _panel(m, causal)
            _draw_matrix(
                sub, b, rows, cols, mask=vis, title=f"layer {n}", vmin=0.0, vmax=top,
                labels=False,
            )  # fmt: skip
    fig.suptitle(title or f"{mix.method}: {mix.meaning}", fontsize=11)
    data: dict[str, np.ndarray] = {"main": a}
    if layers:
        data["layers"] = np.stack([m.detach().double().cpu().numpy() for m in layers])
    return Plot(fig, data)
