"""The HTML viewer of a :class:`~attnlab.viz.probe_history.ProbeHistory`, with a step slider.

:func:`viewer_data_from_history` turns the recorded weights into the
:class:`~attnlab.viz.viewer.ViewerData` of :mod:`attnlab.viz.viewer`, grouped as the viewer of a
trained model groups them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from attnlab.viz.probe_history import ProbeHistory, _check_history, _is_encoder_name
from attnlab.viz.viewer import AttentionGroup, AttentionLayer, ViewerData, _projected_group

if TYPE_CHECKING:
    from attnlab.inspect.capture import ProjectedKeys

__all__ = ["viewer_data_from_history"]


def _group_name(history: ProbeHistory, kind: str, q_name: str, k_name: str) -> str:
    if len(history.sequences) == 1:
        return f"{kind}-attention"
    if kind == "cross":
        return (
            "decoder cross-attention"
            if (q_name, k_name) == ("target", "source")
            else f"cross-attention ({q_name} → {k_name})"
        )
    return {"source": "encoder self-attention", "target": "decoder self-attention"}.get(
        q_name, f"self-attention ({q_name})"
    )


def viewer_data_from_history(
    history: ProbeHistory, *, title: str = "attnlab: attention during training"
) -> ViewerData:
    """The HTML viewer's data with a step slider (:class:`~attnlab.viz.viewer.ViewerData` with
    ``steps``): every layer's weights ``(S, H, T_q, T_k)``.

    Layers are grouped by kind and token sequences as :func:`~attnlab.viz.viewer.viewer_data`
    groups them; self-attention over the target (or a GPT's tokens) carries the look-ahead mask.
    Layers with projected keys (:attr:`ProbeHistory.projected`, Linformer) form a group of their
    own, as in the viewer of a trained model: the ``"E·K row j"`` columns, the note saying what
    they are, no token-to-token lines, and the effective weights ``A · F`` of every step when
    they were recorded.

    Args:
        history: the recorded :class:`ProbeHistory`.
        title: the page title.

    Returns:
        :class:`~attnlab.viz.viewer.ViewerData`; write it with
        :func:`~attnlab.viz.viewer.write_viewer`.
    """
    history = _check_history(history)
    groups: dict[str, AttentionGroup] = {}
    sequences = {k: list(v) for k, v in history.sequences.items()}
    for name, w in history.attentions.items():
        kind = history.kinds[name]
        q_name, k_name = history.layer_sequences[name]
        if name in history.projected:
            method, tokens = history.projected[name]
            base = AttentionGroup(_group_name(history, kind, q_name, tokens), q_name, tokens)
            # the group, its name and note exactly as viewer_data makes them for a capture
            rows = _Rows(method, w.shape[3], sequences[k_name])
            group = _projected_group(groups, sequences, base, cast("ProjectedKeys", rows))
            effective = history.effective.get(name)
            group.layers.append(
                AttentionLayer(
                    name,
                    w.numpy().astype(np.float32),
                    effective=None if effective is None else effective.numpy().astype(np.float32),
                )
            )
            continue
        label = _group_name(history, kind, q_name, k_name)
        group = groups.setdefault(label, AttentionGroup(label, q_name, k_name))
        t_q, t_k = w.shape[2], w.shape[3]
        mask = None
        if (
            kind == "self"
            and q_name == k_name
            and q_name != "source"
            and not _is_encoder_name(name)
        ):
            mask = np.arange(t_k)[None, :] <= np.arange(t_q)[:, None] + (t_k - t_q)
        group.layers.append(AttentionLayer(name, w.numpy().astype(np.float32), mask))
    return ViewerData(
        title=title, sequences=sequences, groups=list(groups.values()), steps=list(history.steps)
    )


@dataclass(frozen=True)
class _Rows:
    """What :func:`~attnlab.viz.viewer._projected_group` reads of a
    :class:`~attnlab.inspect.capture.ProjectedKeys` (a history keeps no ``E`` or ``F``)."""

    method: str
    k: int
    labels: list[str]
