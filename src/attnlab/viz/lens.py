"""The lens figure (``attnlab plot lens``): layers × positions, each cell the most probable next
token under the logit or tuned lens (:func:`attnlab.inspect.logit_lens`) and its probability.

The colour is the top token's probability; the bottom row is the embeddings, the top row the
model's own output (the last layer, where every lens equals the logits).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from attnlab.errors import ArgumentError
from attnlab.inspect.lens import LensResult
from attnlab.viz._draw import CMAP, Plot, _draw_matrix, _labels, _new_figure, _short, _shown

__all__ = ["lens_figure"]


def lens_figure(
    lens: LensResult,
    tokens: Sequence[str] | None = None,
    decode: Callable[[int], str] | None = None,
    *,
    batch_index: int = 0,
    title: str | None = None,
) -> Plot:
    """Each layer's top next token at each position, coloured by its probability.

    Args:
        lens: from :func:`attnlab.inspect.logit_lens`.
        tokens: the input tokens (the columns' labels).
        decode: a token id → its text (default: the id).
        batch_index: which sequence of the batch.
        title: the figure's title.

    Returns:
        A :class:`~attnlab.viz.Plot` with ``data["prob"]`` (top-1 probabilities) and
        ``data["token"]`` (top-1 ids), both ``(L + 1, T)``, row 0 the embeddings.

    Raises:
        ValueError: ``batch_index`` out of range.

    Shape:
        lens.logits ``(L + 1, B, T, vocab)``.
    """
    n_rows, batch, t = lens.logits.shape[:3]
    if not 0 <= batch_index < batch:
        raise ArgumentError(f"batch_index must be in [0, {batch}), got {batch_index}")
    probs, ids = lens.top(1)
    p = probs[:, batch_index, :, 0].cpu().numpy()
    top = ids[:, batch_index, :, 0].cpu().numpy()
    cols = _labels("tokens", list(tokens) if tokens is not None else None, t)
    layers = ["embed" if x == "embed" else f"after {x}" for x in lens.layers]
    fig = _new_figure(min(24.0, 2.0 + 0.95 * t), min(30.0, 1.5 + 0.3 * n_rows))
    ax = fig.add_subplot()
    # drawn top to bottom: the output first, the embeddings last
    img = _draw_matrix(ax, p[::-1], layers[::-1], cols, vmin=0.0, vmax=1.0, cmap=CMAP,
                       numbered=(False, True))  # fmt: skip
    ax.set_xlabel("position (input token)")
    ax.set_ylabel("layer (residual stream read after it)")
    size = 7 if t <= 12 else 5
    for i in range(n_rows):
        row = n_rows - 1 - i
        for j in range(t):
            text = _short(_shown(decode(int(top[i, j])) if decode else str(int(top[i, j]))), 9)
            r, g, b, _ = img.cmap(img.norm(p[i, j]))
            light = 0.299 * r + 0.587 * g + 0.114 * b > 0.55
            ax.text(j, row, f"{text}\n{p[i, j]:.2f}", ha="center", va="center", fontsize=size,
                    color="black" if light else "white", parse_math=False)  # fmt: skip
    fig.colorbar(img, ax=ax, shrink=0.6, label="probability of the top token")
    fig.suptitle(title or f"{lens.lens} lens: each layer's most probable next token", fontsize=11)
    return Plot(fig, {"prob": p.astype(np.float64), "token": top})
