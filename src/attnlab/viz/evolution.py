"""Attention during training: the weights of one fixed probe input, recorded every few steps.

A trainer runs the same probe (a sentence, a source/target pair) through the model every ``N``
steps, from step 0 (before training) on, and keeps the attention weights of every layer in a
:class:`~attnlab.viz.probe_history.ProbeHistory`. From it:

* :func:`attention_evolution` — one layer, rows = recorded steps, columns = heads: how each head's
  pattern forms, from the near-uniform attention of the initial weights to its trained role;
* :func:`head_entropy_curves` — the mean row entropy of every head against the step, one panel per
  layer: heads that learn different roles show as curves that separate;
* :func:`~attnlab.viz.evolution_viewer.viewer_data_from_history` — the HTML viewer with a step
  slider.

The record itself (how to record one, its checks, Linformer's projected keys) is
:mod:`attnlab.viz.probe_history`; the viewer, :mod:`attnlab.viz.evolution_viewer`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from attnlab._checks import check_positive_int
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.viz._draw import Plot, _labels_that_fit, _new_figure
from attnlab.viz.attention import Reduced, _draw_grid, reduce_attention
from attnlab.viz.probe_history import ProbeHistory, _check_history, _default_layer

__all__ = ["attention_evolution", "head_entropy_curves", "row_entropy"]


def _chosen_steps(n_steps: int, max_steps: int) -> np.ndarray:
    """Up to ``max_steps`` evenly spread indices into ``n_steps`` records, first and last always."""
    if n_steps <= max_steps:
        return np.arange(n_steps)
    return np.unique(np.round(np.linspace(0, n_steps - 1, max_steps)).astype(int))


# ----------------------------------------------------------------------------- figures


def attention_evolution(
    history: ProbeHistory,
    *,
    layer: str | None = None,
    max_steps: int = 6,
    max_tokens: int = 32,
) -> Plot:
    """How the heads of one layer change during training: rows = steps, columns = heads.

    The rows are up to ``max_steps`` recorded steps spread evenly from the first (usually step 0,
    before training: near-uniform attention) to the last; each panel is one head's weights on the
    probe, queries down and keys across, on one colour scale (0 to 1). Long sides are
    block-averaged to ``max_tokens`` (see :func:`~attnlab.viz.attention.reduce_attention`).

    Args:
        history: the recorded :class:`ProbeHistory`.
        layer: the layer path; default the last cross-attention layer if any, else the last layer.
        max_steps: the most rows (at least 2). Default 6.
        max_tokens: per-side limit before reduction. Default 32.

    Returns:
        :class:`~attnlab.viz.Plot` with ``data["weights"]`` ``(R, H, R_q, R_k)`` (as drawn,
        ``R`` chosen steps), ``data["steps"]`` (their step numbers) and ``data["step_index"]``
        (their positions in ``history.steps``).
    """
    history = _check_history(history)
    layer = _default_layer(history) if layer is None else history._check_layer("layer", layer)
    check_positive_int("max_steps", max_steps)
    if max_steps < 2:
        raise ArgumentError(
            f"max_steps must be at least 2 (the first and the last step), got {max_steps}"
        )
    check_positive_int("max_tokens", max_tokens)
    w = history.attentions[layer].numpy()  # (S, H, T_q, T_k)
    q_tok, k_tok = history.tokens(layer)
    idx = _chosen_steps(w.shape[0], max_steps)
    cells: list[list[Reduced | None]] = [
        [
            reduce_attention(w[s, h], max_tokens=max_tokens, query_tokens=q_tok, key_tokens=k_tok)
            for h in range(w.shape[1])
        ]
        for s in idx
    ]
    n_rows, n_heads = len(idx), w.shape[1]
    cell = 2.0 if n_heads > 4 else 2.5
    fig = _new_figure(cell * n_heads + 2.4, (cell + 0.15) * n_rows + 1.6)
    axes = fig.subplots(n_rows, n_heads, squeeze=False)
    steps = [history.steps[i] for i in idx]
    img = _draw_grid(
        axes,
        cells,
        col_titles=[f"head {h}" for h in range(n_heads)],
        row_names=[f"step {s}" for s in steps],
        max_labels=_labels_that_fit(cell - 0.4),
        vmax=1.0,
    )
    kind = history.kinds.get(layer, "self")
    keys = "keys across"
    if layer in history.projected:  # Linformer: the columns are the k rows of E·K, not tokens
        keys = f"the k = {len(k_tok)} rows of E·K across (mixes of all positions, not tokens)"
    fig.suptitle(
        f"{layer} ({kind}-attention): how the heads change from step {steps[0]} to step {steps[-1]}\n"
        f"rows: training steps (top: first recorded) · columns: heads · queries down, {keys}",
        fontsize=10,
    )
    if img is not None:
        fig.colorbar(img, ax=axes, shrink=0.5, label="weight")
    drawn = np.stack([np.stack([c.matrix for c in row if c is not None]) for row in cells])
    return Plot(fig, {"weights": drawn, "steps": np.array(steps), "step_index": np.asarray(idx)})


def row_entropy(weights: torch.Tensor | np.ndarray) -> np.ndarray:
    """Mean row entropy ``mean_i H_i``, ``H_i = −Σ_j w_ij log w_ij`` in nats (``0 log 0 = 0``),
    over the rows that see a key (rows of zeros — queries that may see nothing — are left out).

    Args:
        weights: attention weights, rows summing to one (or zero).

    Returns:
        The mean entropy over the last two dimensions, float64.

    Shape:
        weights ``(..., T_q, T_k)`` → ``(...)``; NaN where no row sees a key.
    """
    w = np.asarray(weights.numpy() if isinstance(weights, torch.Tensor) else weights, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0)
    h = -plogp.sum(-1)  # (..., T_q)
    live = w.sum(-1) > 0
    count = live.sum(-1)
    total = np.where(live, h, 0.0).sum(-1)
    return np.divide(total, count, out=np.full(total.shape, np.nan), where=count > 0)


def _uniform_entropy(w: np.ndarray) -> float:
    """The mean row entropy of uniform attention over the keys each row ever sees: ``mean log n_i``."""
    seen = (w > 0).any(axis=(0, 1)).sum(-1)  # (T_q,) keys with weight at any step, any head
    seen = seen[seen > 0]
    return float(np.log(seen).mean()) if seen.size else float("nan")


def head_entropy_curves(
    history: ProbeHistory,
    *,
    layers: Sequence[str] | None = None,
) -> Plot:
    """Mean row entropy of every head against the training step, one panel per layer.

    At step 0 attention is near-uniform, so every head sits near the dashed line
    ``mean_i log n_i`` (uniform over the ``n_i`` keys row ``i`` may see). As training goes on the
    heads sharpen at different rates and to different levels: heads that learn different roles
    show as curves that separate (a positional head that looks at one key falls towards 0 nats; a
    head that averages stays high). A layer with projected keys (Linformer) spreads its rows over
    its ``k`` rows of ``E K``: its entropy is over them, and its uniform line is ``log k``.

    Args:
        history: the recorded :class:`ProbeHistory`.
        layers: the layer paths to draw, in order; default all.

    Returns:
        :class:`~attnlab.viz.Plot` with ``data["entropy"]`` ``(L, S, H)`` in nats (NaN for
        heads a layer does not have), ``data["steps"]`` ``(S,)``, ``data["layers"]`` and
        ``data["uniform"]`` ``(L,)``.
    """
    history = _check_history(history)
    if layers is None:
        names = list(history.attentions)
    else:
        if isinstance(layers, str):
            raise ArgumentTypeError(
                "layers must be a sequence of layer paths, got one str; wrap it in a list"
            )
        names = [history._check_layer("layers", n) for n in layers]
        if not names:
            raise ArgumentError("layers must name at least one layer, got none")
    steps = np.asarray(history.steps)
    ent = [row_entropy(history.attentions[n].numpy()) for n in names]  # each (S, H)
    uniform = np.array([_uniform_entropy(history.attentions[n].numpy()) for n in names])
    n_heads = max(e.shape[1] for e in ent)
    grid = np.full((len(names), len(steps), n_heads), np.nan)
    for i, e in enumerate(ent):
        grid[i, :, : e.shape[1]] = e

    ncols = min(len(names), 3)
    nrows = math.ceil(len(names) / ncols)
    fig = _new_figure(4.2 * ncols + 0.4, 3.0 * nrows + 0.9)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    colors = [f"C{i % 10}" for i in range(n_heads)]
    for i, name in enumerate(names):
        ax = axes.flat[i]
        for h in range(ent[i].shape[1]):
            ax.plot(
                steps, ent[i][:, h], color=colors[h], marker="o", ms=2.5, lw=1.5, label=f"head {h}"
            )
        if math.isfinite(uniform[i]):
            ax.axhline(uniform[i], color="0.5", ls="--", lw=1, label="uniform")
        over = ""
        if name in history.projected:  # the entropy of a row over the k projected rows
            over = f", over k = {len(history.tokens(name)[1])} E·K rows"
        ax.set_title(f"{name} ({history.kinds.get(name, 'self')}{over})", fontsize=9)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0.0)
        if i % ncols == 0:
            ax.set_ylabel("mean row entropy (nats)")
        if i // ncols == nrows - 1 or i + ncols >= len(names):
            ax.set_xlabel("training step")
    for ax in axes.flat[len(names) :]:
        ax.axis("off")
    handles, labels = [], []
    for ax in axes.flat[: len(names)]:
        for hd, lb in zip(*ax.get_legend_handles_labels()):
            if lb not in labels:
                handles.append(hd)
                labels.append(lb)
    fig.legend(handles, labels, loc="outside right upper", fontsize=8)
    fig.suptitle(
        "Attention entropy per head during training: curves that separate are heads taking "
        "different roles",
        fontsize=10,
    )
    return Plot(
        fig, {"entropy": grid, "steps": steps, "layers": np.array(names), "uniform": uniform}
    )
