"""Figures of head pruning (Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

- :func:`pruning_figure`: loss (and a metric on a second axis) against the number of heads
  removed, least important first — the paper's Figure 3.
- :func:`importance_figure`: head importance as a layers × heads heatmap.

Both take the results of :mod:`attnlab.inspect.ablation` and return a
:class:`~attnlab.viz.Plot` holding the arrays they drew.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from attnlab._checks import check_choice
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.viz._draw import Plot, _new_figure

if TYPE_CHECKING:
    from attnlab.inspect.ablation import HeadImportance, PruningCurve

__all__ = ["importance_figure", "pruning_figure"]


def pruning_figure(
    curve: PruningCurve,
    *,
    title: str | None = None,
    loss_label: str = "loss",
    metric_label: str = "metric",
) -> Plot:
    """Loss after removing 0, 1, 2, … heads cumulatively; the metric on a second y axis.

    The top axis shows the fraction of all the model's heads removed.

    Args:
        curve: a :class:`~attnlab.inspect.ablation.PruningCurve`.
        title: the figure title. Default ``"Pruning heads, least important first"``.
        loss_label: the left axis label. Default ``"loss"``.
        metric_label: the right axis label (drawn only when ``curve.metric`` is set).
            Default ``"metric"``.

    Returns:
        :class:`~attnlab.viz.Plot` with ``data["num_pruned"]`` ``(N + 1,)``,
        ``data["loss"]`` ``(N + 1,)`` and, with a metric, ``data["metric"]`` ``(N + 1,)``.

    Examples:
        >>> curve = pruning_curve(model, batches, importance.order("gradient"), metric=accuracy)
        >>> pruning_figure(curve, metric_label="exact match").save("pruning.png")
    """
    for attr in ("num_pruned", "loss", "metric", "total_heads"):
        if not hasattr(curve, attr):
            raise ArgumentTypeError(f"curve must be a PruningCurve, got {type(curve).__name__}")
    x = np.asarray(curve.num_pruned, dtype=np.int64)
    loss = np.asarray(curve.loss, dtype=np.float64)
    if x.shape != loss.shape or x.size == 0:
        raise ArgumentError(
            f"curve must have one loss per step, got {x.size} steps and {loss.size} losses"
        )
    data = {"num_pruned": x, "loss": loss}

    fig = _new_figure(7.0, 4.2)
    ax = fig.add_subplot()
    lines = ax.plot(x, loss, color="C0", marker="o", markersize=3, label=loss_label)
    ax.set_xlabel("heads removed (cumulative, least important first)")
    ax.set_ylabel(loss_label, color="C0")
    ax.tick_params(axis="y", colors="C0")
    ax.grid(alpha=0.3)
    if curve.metric is not None:
        metric = np.asarray(curve.metric, dtype=np.float64)
        if metric.shape != x.shape:
            raise ArgumentError(
                f"curve must have one metric value per step, got {x.size} steps and "
                f"{metric.size} values"
            )
        data["metric"] = metric
        ax2 = ax.twinx()
        lines += ax2.plot(x, metric, color="C1", marker="s", markersize=3, label=metric_label)
        ax2.set_ylabel(metric_label, color="C1")
        ax2.tick_params(axis="y", colors="C1")
    total = int(curve.total_heads)
    if total > 0:

        def to_fraction(n: Any) -> Any:
            return np.asarray(n, dtype=np.float64) / total

        def to_count(f: Any) -> Any:
            return np.asarray(f, dtype=np.float64) * total

        top = ax.secondary_xaxis("top", functions=(to_fraction, to_count))
        top.set_xlabel(f"fraction of the {total} heads removed")
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="center left")
    ax.set_title(title if title is not None else "Pruning heads, least important first")
    return Plot(fig, data)


def importance_figure(
    importance: HeadImportance, *, by: str = "ablation", title: str | None = None
) -> Plot:
    """Head importance as a heatmap: one row per attention layer (execution order), one column
    per head, each cell annotated with its score.

    Args:
        importance: a :class:`~attnlab.inspect.ablation.HeadImportance`.
        by: ``"ablation"`` (loss increase when the head alone is removed; a diverging colour
            map centred at 0) or ``"gradient"`` (``E|∂L/∂ξ_h|``). Default ``"ablation"``.
        title: the figure title. Default names the score.

    Returns:
        :class:`~attnlab.viz.Plot` with ``data["scores"]`` ``(L, H)``.
    """
    check_choice("by", by, ("ablation", "gradient"))
    if not hasattr(importance, "scores") or not hasattr(importance, "layers"):
        raise ArgumentTypeError(
            f"importance must be a HeadImportance, got {type(importance).__name__}"
        )
    scores = importance.scores(by).detach().double().cpu().numpy()  # type: ignore[arg-type]
    n_layers, n_heads = scores.shape
    fig = _new_figure(max(4.0, 1.0 + 0.7 * n_heads + 2.5), max(2.5, 0.9 + 0.4 * n_layers))
    ax = fig.add_subplot()
    if by == "ablation":
        lim = float(np.nanmax(np.abs(scores))) if np.isfinite(scores).any() else 1.0
        lim = lim or 1.0
        img = ax.imshow(scores, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        label = "loss increase when removed"
    else:
        img = ax.imshow(scores, cmap="viridis", aspect="auto")
        label = "E|∂L/∂ξ|" + (" (layer-normalised)" if importance.normalized else "")
    for i in range(n_layers):
        for j in range(n_heads):
            v = scores[i, j]
            if np.isnan(v):  # a head pruned before the estimate
                ax.text(j, i, "pruned", ha="center", va="center", fontsize=6, color="gray")
                continue
            r, g, b, _ = img.cmap(img.norm(v))
            dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5  # luminance: white text on dark cells
            ax.text(j, i, f"{v:.2g}", ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")  # fmt: skip
    ax.set_xticks(range(n_heads))
    ax.set_xticklabels([str(h) for h in range(n_heads)], fontsize=8)
    ax.set_yticks(range(n_layers))
    ax.set_yticklabels(
        [f"{p} ({k})" for p, k in zip(importance.layers, importance.kinds)], fontsize=8
    )
    ax.set_xlabel("head")
    fig.colorbar(img, ax=ax, label=label)
    ax.set_title(title if title is not None else f"Head importance ({by})")
    return Plot(fig, {"scores": scores})
