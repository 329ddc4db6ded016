"""Figures of head roles: one layers × heads heatmap per score (:mod:`attnlab.inspect.roles`).

:func:`head_roles_figure` draws the previous-token, duplicate-token, induction and copying scores
of every head side by side, on one colour scale from 0 to 1 (every score is a fraction), each
panel titled with its best head, and returns a :class:`~attnlab.viz.Plot` holding the matrices it
drew.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnlab.errors import ArgumentTypeError
from attnlab.viz._draw import CMAP, Plot, _new_figure

if TYPE_CHECKING:
    from attnlab.inspect.roles import HeadRoles

__all__ = ["head_roles_figure"]

#: the panels' titles
_TITLES = {
    "previous": "previous token",
    "duplicate": "duplicate token",
    "induction": "induction (prefix matching)",
    "copying": "copying (OV circuit, top-{k})",
}


def head_roles_figure(roles: HeadRoles, *, title: str | None = None) -> Plot:
    """Every role score as a layers × heads heatmap, one panel per score.

    Rows are the attention layers (layer 0 at the top), columns the query heads; the colour runs
    from 0 to 1 on every panel (viridis, one colour bar). Each panel's title names its best head
    (``L3 H1 0.91``); cells are annotated with their value when the grid is small enough to read
    (at most 16 layers).

    Args:
        roles: a :class:`~attnlab.inspect.roles.HeadRoles` (:func:`~attnlab.inspect.head_roles`).
        title: the figure title. Default names the input (``n`` random tokens repeated, batch).
            A second line always names the BOS convention
            (:attr:`~attnlab.inspect.roles.HeadRoles.convention`).

    Returns:
        :class:`~attnlab.viz.Plot` with ``data[score]`` ``(n_layer, n_head)`` for each score of
        :data:`~attnlab.inspect.roles.ROLES`.

    Raises:
        TypeError: ``roles`` is not a ``HeadRoles``.

    Examples:
        >>> head_roles_figure(attnlab.inspect.head_roles(model)).save("roles.png")
    """
    from attnlab.inspect.roles import ROLES

    if not all(hasattr(roles, name) for name in (*ROLES, "layers", "top")):
        raise ArgumentTypeError(f"roles must be a HeadRoles, got {type(roles).__name__}")
    data = {name: roles.score(name).detach().double().cpu().numpy() for name in ROLES}
    n_layers, n_heads = data["previous"].shape
    panel_w = max(1.6, 0.32 * n_heads + 0.6)
    fig = _new_figure(len(ROLES) * panel_w + 1.6, max(3.0, 1.4 + 0.2 * n_layers))
    axes = fig.subplots(1, len(ROLES), sharey=True)
    annotate = n_layers <= 16 and n_heads <= 16
    images = []
    for ax, name in zip(axes, ROLES):
        scores = data[name]
        img = ax.imshow(scores, cmap=CMAP, vmin=0.0, vmax=1.0, aspect="auto",
                        interpolation="nearest")  # fmt: skip
        images.append(img)
        best = roles.top(name, 1)[0]
        ax.set_title(
            f"{_TITLES[name].format(k=roles.top_k)}\nbest: L{best[0]} H{best[2]} {best[3]:.2f}",
            fontsize=9,
        )
        ax.set_xlabel("head")
        ax.set_xticks(range(n_heads))
        ax.set_xticklabels([str(h) for h in range(n_heads)], fontsize=7)
        if annotate:
            for i in range(n_layers):
                for j in range(n_heads):
                    v = scores[i, j]
                    if np.isnan(v):
                        continue
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if v < 0.5 else "black")  # fmt: skip
    step = max(1, n_layers // 30)
    axes[0].set_yticks(range(0, n_layers, step))
    axes[0].set_yticklabels([str(i) for i in range(0, n_layers, step)], fontsize=7)
    axes[0].set_ylabel("layer")
    fig.colorbar(images[-1], ax=list(axes), label="score (fraction)", shrink=0.8)
    if title is None:
        title = (
            f"Head roles on {roles.seq_len} random tokens repeated once "
            f"(batch {roles.tokens.shape[0]})"
        )
    convention = getattr(roles, "convention", None)  # the scores depend on it: say which
    fig.suptitle(title if convention is None else f"{title}\n{convention}", fontsize=10)
    return Plot(fig, data)
