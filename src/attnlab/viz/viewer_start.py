"""Where the HTML viewer opens: the most informative attention head of what it shows.

A page that opens on encoder layer 0, head 0 usually shows a blur. The viewer opens instead on

1. for an encoder-decoder, the **decoder cross-attention** (where the target looks at the
   source: the alignment), otherwise every group whose keys are tokens;
2. among those heads, the one with the **lowest mean row entropy** ``H(p) = −Σ_j p_j log p_j``
   (the sharpest pattern), leaving out the heads :func:`attnlab.inspect.diagnose` calls
   **sink** (every row ≥ 0.99 on the first key: Xiao et al. 2024's attention sink) or
   **uniform** (every row spreads its weight evenly) — the same rule ``attnlab inspect``
   reports them by — and, more widely, every head that puts on average at least ``sink_share``
   (default 0.5) of its weight on the first key: a sharp head that mostly parks its weight
   there is no good first view either. When every head is left out, the lowest-entropy head of
   all is chosen.

The statistics are :func:`attnlab.inspect.diagnose`'s (``entropy_mean``, ``first_token_share``,
``sink``, ``uniform``), measured on the weights the page shows (with training ``steps``, the
last step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from attnlab.errors import ArgumentError, ArgumentTypeError

if TYPE_CHECKING:
    from attnlab.viz.viewer import ViewerData

__all__ = ["ViewerStart", "most_informative_head"]


@dataclass(frozen=True)
class ViewerStart:
    """The page's initial selection.

    Attributes:
        group: index into :attr:`ViewerData.groups`.
        layer: index into that group's layers.
        head: the head.
        reason: one line saying why, shown on the page (e.g. ``"lowest-entropy cross-attention
            head (mean 0.41 nats), sink heads left out"``).
    """

    group: int
    layer: int
    head: int
    reason: str = ""

    def to_json(self) -> dict:
        """The selection as the page reads it.

        Returns:
            ``{"group", "layer", "head", "reason"}``.
        """
        return {"group": self.group, "layer": self.layer, "head": self.head, "reason": self.reason}


def most_informative_head(data: ViewerData, *, sink_share: float = 0.5) -> ViewerStart:
    """The head the viewer opens on (see the module docstring for the rule).

    Args:
        data: what the page shows.
        sink_share: a head whose mean weight on the first key is at least this is passed over
            like a sink head (unless every head is). Default ``0.5``.

    Returns:
        A :class:`ViewerStart`.

    Raises:
        TypeError: ``sink_share`` is not a float.
        ValueError: ``sink_share`` is not in ``(0, 1]``.

    Examples:
        >>> start = most_informative_head(viewer_data(cache.attentions, tokens=words))
        >>> data.groups[start.group].layers[start.layer].name, start.head
    """
    from attnlab.inspect.diagnostics import diagnose

    if isinstance(sink_share, bool) or not isinstance(sink_share, (int, float)):
        raise ArgumentTypeError(f"sink_share must be a float, got {type(sink_share).__name__}")
    if not 0 < sink_share <= 1:
        raise ArgumentError(f"sink_share must lie in (0, 1], got {sink_share!r}")
    tokens = [i for i, g in enumerate(data.groups) if g.projected_from is None and g.layers]
    cross = [i for i in tokens if data.groups[i].query != data.groups[i].key]
    where, what = (cross, "cross-attention") if cross else (tokens, "")
    if not where:  # only projected-key groups (Linformer): their weights are over E·K rows
        where = [i for i, g in enumerate(data.groups) if g.layers]
    # (group, layer, head, mean entropy, sink, uniform)
    heads: list[tuple[int, int, int, float, bool, bool]] = []
    for gi in where:
        for li, layer in enumerate(data.groups[gi].layers):
            w = np.asarray(layer.weights, dtype=np.float32)
            w = w[-1] if w.ndim == 4 else w  # with training steps: the last step
            report = diagnose({layer.name: torch.from_numpy(np.ascontiguousarray(w))[None]})
            for h in report.heads:
                entropy = h.entropy_mean if np.isfinite(h.entropy_mean) else np.inf
                share = h.first_token_share
                sink = h.sink or bool(np.isfinite(share) and share >= sink_share)
                heads.append((gi, li, h.head, float(entropy), sink, h.uniform))
    kept = [h for h in heads if not h[4] and not h[5]]
    pool, note = (kept, ", sink and uniform heads left out") if kept else (heads, "")
    gi, li, head, entropy, _, _ = min(pool, key=lambda h: h[3])
    kind = f"{what} " if what else ""
    reason = f"lowest-entropy {kind}head (mean {entropy:.2f} nats){note}"
    return ViewerStart(gi, li, head, reason)
