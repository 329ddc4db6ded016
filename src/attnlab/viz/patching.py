"""Figures of activation patching and direct logit attribution.

- :func:`patching_figure`: the normalised patching score
  ``(m_patched − m_corrupted) / (m_clean − m_corrupted)`` as a layers × heads or a
  layers × positions heatmap (token labels under the positions), on a diverging colour map
  centred at 0: red restores the clean answer, blue pushes further towards the corrupted one.
- :func:`attribution_figure`: the ``k`` heads with the largest direct logit attribution, as
  horizontal bars.

Both take the results of :mod:`attnlab.inspect.patching` and :mod:`attnlab.inspect.attribution`
and return a :class:`~attnlab.viz.Plot` holding the arrays they drew.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from attnlab._checks import check_positive_int
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.viz._draw import (
    DIVERGING,
    Plot,
    _annotate,
    _draw_matrix,
    _new_figure,
    _readable,
    _shown,
)

if TYPE_CHECKING:
    from attnlab.inspect.attribution import LogitAttribution
    from attnlab.inspect.patching import PatchResult

__all__ = ["attribution_figure", "patching_figure"]


def patching_figure(
    result: PatchResult, *, tokens: Sequence[str] | None = None, title: str | None = None
) -> Plot:
    """The normalised patching score of every site as a heatmap, each cell annotated when the
    grid is small enough to read.

    Args:
        result: a :class:`~attnlab.inspect.patching.PatchResult` (heads or positions).
        tokens: the prompt's token labels (one a position), shown under the positions of a
            ``"positions"`` result; default the positions' numbers.
        title: the figure title. Default names what was patched and the two baselines.

    Returns:
        :class:`~attnlab.viz.Plot` with ``data["normalized"]`` ``(rows, columns)``.

    Raises:
        ValueError: ``tokens`` of another length than the positions.

    Examples:
        >>> patching_figure(patch_heads(model, clean, corrupted, metric)).save("heads.png")
    """
    for attr in ("normalized", "rows", "kind", "clean", "corrupted"):
        if not hasattr(result, attr):
            raise ArgumentTypeError(f"result must be a PatchResult, got {type(result).__name__}")
    scores = result.normalized.detach().double().cpu().numpy()
    n_rows, n_cols = scores.shape
    heads = result.kind == "heads"
    if heads:
        cols = [str(h) for h in range(n_cols)]
    elif tokens is None:
        cols = [str(t) for t in range(n_cols)]
    else:
        if len(tokens) != n_cols:
            raise ArgumentError(
                f"tokens must label the {n_cols} positions, got {len(tokens)} labels"
            )
        cols = [f"{t} {_shown(tok)}" for t, tok in enumerate(tokens)]
    rows = [r if r == "final" else f"layer {r}" for r in result.rows]
    finite = np.abs(scores[np.isfinite(scores)])
    lim = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    width = max(4.5, 2.2 + (0.55 if heads else 0.5) * n_cols)
    fig = _new_figure(min(width, 16.0), min(max(2.6, 1.2 + 0.3 * n_rows), 14.0))
    ax = fig.add_subplot()
    img = _draw_matrix(
        ax, scores, rows, cols, vmin=-lim, vmax=lim, cmap=DIVERGING, numbered=(False, False),
        max_labels=48,
    )  # fmt: skip
    if _readable(n_rows, n_cols, max_cells=400, max_side=40):
        _annotate(ax, img, scores, np.isfinite(scores), fontsize=6 if n_cols > 12 else 7)
    where = "every position" if result.position is None else f"position {result.position}"
    ax.set_xlabel(f"head (patched at {where})" if heads else "position")
    ax.set_ylabel("layer" if heads else "residual stream entering")
    fig.colorbar(img, ax=ax, label="normalised score (1 = clean restored)")
    what = "head outputs (hook_z)" if heads else "residual stream (hook_resid_pre)"
    default = (
        f"Patching {what}, clean → corrupted\n"
        f"m_clean = {result.clean:.3g}, m_corrupted = {result.corrupted:.3g}"
    )
    ax.set_title(default if title is None else title, fontsize=9)
    return Plot(fig, {"normalized": scores})


def attribution_figure(
    attribution: LogitAttribution, *, k: int = 10, title: str | None = None
) -> Plot:
    """The ``k`` heads that write most directly into the logit, largest ``|DLA|`` on top, red
    for a positive part and blue for a negative one; the model's logit in the title.

    Args:
        attribution: a :class:`~attnlab.inspect.attribution.LogitAttribution`.
        k: how many heads (default 10).
        title: the figure title. Default names the token(s) and the logit.

    Returns:
        :class:`~attnlab.viz.Plot` with ``data["dla"]`` ``(k,)`` and ``data["heads"]``
        ``(k, 2)`` (layer, head), largest first.

    Examples:
        >>> attribution_figure(direct_logit_attribution(model, ids, paris, against=rome)).save("dla.png")
    """
    if not hasattr(attribution, "top") or not hasattr(attribution, "heads"):
        raise ArgumentTypeError(
            f"attribution must be a LogitAttribution, got {type(attribution).__name__}"
        )
    check_positive_int("k", k)
    top = attribution.top(k)
    values = np.array([h["dla"] for h in top], dtype=np.float64)
    labels = [f"L{h['layer']}.H{h['head']}" for h in top]
    fig = _new_figure(5.5, max(2.4, 0.9 + 0.28 * len(top)))
    ax = fig.add_subplot()
    y = np.arange(len(top))
    ax.barh(y, values, color=["#b2182b" if v >= 0 else "#2166ac" for v in values])
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0.0, color="black", linewidth=0.6)
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.3g} ", va="center", ha="left" if v >= 0 else "right", fontsize=7)
    lim = float(np.abs(values).max()) if values.size else 1.0
    ax.set_xlim(-1.35 * lim, 1.35 * lim)
    what = "logit" if attribution.against is None else "logit difference"
    ax.set_xlabel(f"direct contribution to the {what}")
    tokens = f"token {attribution.token}" + (
        "" if attribution.against is None else f" − token {attribution.against}"
    )
    default = (
        f"Direct logit attribution, top {len(top)} heads\n{tokens} at position "
        f"{attribution.position}: {what} {attribution.logit:.3g}"
    )
    ax.set_title(default if title is None else title, fontsize=9)
    heads = np.array([[h["layer"], h["head"]] for h in top], dtype=np.int64).reshape(-1, 2)
    return Plot(fig, {"dla": values, "heads": heads})
