"""A self-contained HTML attention viewer: one file, no network, data embedded.

The page (``templates/viewer.html`` with its ``.js`` and ``.css`` inlined at render time) shows
token-to-token lines and the weight matrix (drawn on a canvas, so 1,000 tokens stay usable), lets
one choose the attention group (encoder self, decoder self, decoder cross — or a GPT's self), the
layer and the head (or all heads), shows exact values on hover and the mask on demand.

Weights travel as base64 float32 (exact values), masks as base64 uint8.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from attnlab._checks import shape_str

__all__ = [
    "AttentionGroup",
    "AttentionLayer",
    "ViewerData",
    "render_viewer",
    "viewer_data",
    "write_viewer",
]


@dataclass(frozen=True)
class AttentionLayer:
    """One layer's weights.

    Attributes:
        name: module path, e.g. ``"decoder.layers.0.cross_attn"``.
        weights: ``(H, T_q, T_k)`` float array.
        mask: boolean ``(T_q, T_k)`` (``True = may attend``) or ``None``.
    """

    name: str
    weights: np.ndarray
    mask: np.ndarray | None = None


@dataclass(frozen=True)
class AttentionGroup:
    """Layers of one kind that share query and key tokens.

    Attributes:
        name: shown on the group's tab, e.g. ``"decoder cross-attention"``.
        query: the name of the query token sequence (a key of :attr:`ViewerData.sequences`).
        key: the name of the key token sequence.
        layers: the layers, in order.
    """

    name: str
    query: str
    key: str
    layers: list[AttentionLayer] = field(default_factory=list)


@dataclass(frozen=True)
class ViewerData:
    """Everything the page shows.

    Attributes:
        title: page title.
        sequences: token texts by sequence name (``{"tokens": [...]}`` or
            ``{"source": [...], "target": [...]}``).
        groups: attention groups.
    """

    title: str
    sequences: dict[str, list[str]]
    groups: list[AttentionGroup]

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("groups must hold at least one attention group, got none")
        for g in self.groups:
            for side in (g.query, g.key):
                if side not in self.sequences:
                    raise ValueError(
                        f"group {g.name!r} names sequence {side!r}, not in sequences {list(self.sequences)}"
                    )
            t_q, t_k = len(self.sequences[g.query]), len(self.sequences[g.key])
            for layer in g.layers:
                w = layer.weights
                if w.ndim != 3 or w.shape[1:] != (t_q, t_k):
                    raise ValueError(
                        f"weights of {layer.name!r} must be (H, T_q, T_k) = (H, {t_q}, {t_k}), got {shape_str(w.shape)}"
                    )
                if layer.mask is not None and layer.mask.shape != (t_q, t_k):
                    raise ValueError(
                        f"mask of {layer.name!r} must be ({t_q}, {t_k}), got {shape_str(layer.mask.shape)}"
                    )

    def to_json(self) -> dict:
        """The page's JSON (weights as base64 little-endian float32, masks as base64 uint8)."""

        def b64(a: np.ndarray) -> str:
            return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")

        return {
            "title": self.title,
            "sequences": self.sequences,
            "groups": [
                {
                    "name": g.name,
                    "query": g.query,
                    "key": g.key,
                    "layers": [
                        {
                            "name": layer.name,
                            "heads": int(layer.weights.shape[0]),
                            "weights": b64(layer.weights.astype("<f4")),
                            "mask": None
                            if layer.mask is None
                            else b64(layer.mask.astype(np.uint8)),
                        }
                        for layer in g.layers
                    ],
                }
                for g in self.groups
            ],
        }


def _np(x: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().float().numpy()
    return np.asarray(x)


def viewer_data(
    attentions: Mapping[str, torch.Tensor | np.ndarray],
    *,
    tokens: Sequence[str] | None = None,
    source: Sequence[str] | None = None,
    target: Sequence[str] | None = None,
    kinds: Mapping[str, str] | None = None,
    batch_index: int = 0,
    title: str = "attnlab attention viewer",
) -> ViewerData:
    """Build :class:`ViewerData` from captured weights (``cache.attentions``).

    A GPT passes ``tokens``; an encoder-decoder passes ``source`` and ``target``. Layers are
    grouped by kind: for the encoder-decoder, paths starting with ``encoder`` are encoder
    self-attention (padding mask only), ``kinds[path] == "cross"`` (or ``cross``/``src_attn`` in the
    path) decoder cross-attention, the rest decoder self-attention (look-ahead mask).

    Args:
        attentions: module path → ``(B, H, T_q, T_k)`` or ``(H, T_q, T_k)``.
        tokens: a GPT's tokens.
        source / target: an encoder-decoder's source and target tokens.
        kinds: module path → ``"self"``/``"cross"`` (``cache.kinds``).
        batch_index: which sequence of the batch.
        title: page title.

    Returns:
        :class:`ViewerData`.
    """
    if tokens is None and (source is None or target is None):
        raise ValueError(
            "pass tokens (GPT) or both source and target (encoder-decoder), got neither"
        )
    kinds = dict(kinds or {})
    seqs: dict[str, list[str]]
    if tokens is not None:
        seqs = {"tokens": [str(t) for t in tokens]}
        groups = {"self-attention": AttentionGroup("self-attention", "tokens", "tokens")}
    else:
        seqs = {"source": [str(t) for t in source], "target": [str(t) for t in target]}  # type: ignore[union-attr]
        groups = {
            "encoder self-attention": AttentionGroup("encoder self-attention", "source", "source"),
            "decoder self-attention": AttentionGroup("decoder self-attention", "target", "target"),
            "decoder cross-attention": AttentionGroup(
                "decoder cross-attention", "target", "source"
            ),
        }
    for name, w in attentions.items():
        arr = _np(w)
        if arr.ndim == 4:
            if not 0 <= batch_index < arr.shape[0]:
                raise ValueError(f"batch_index must be in [0, {arr.shape[0]}), got {batch_index}")
            arr = arr[batch_index]
        if arr.ndim != 3:
            raise ValueError(
                f"attentions[{name!r}] must be (B, H, T_q, T_k) or (H, T_q, T_k), got {shape_str(arr.shape)}"
            )
        cross = kinds.get(name) == "cross" or bool(re.search(r"cross|src_attn|enc_dec", name))
        if tokens is not None:
            group = groups["self-attention"]
        elif cross:
            group = groups["decoder cross-attention"]
        elif name.startswith("encoder") or ".encoder." in name:
            group = groups["encoder self-attention"]
        else:
            group = groups["decoder self-attention"]
        t_q, t_k = arr.shape[1:]
        mask = None
        if group.query == group.key and group.name != "encoder self-attention":
            # the look-ahead mask, bottom-right aligned
            mask = np.arange(t_k)[None, :] <= np.arange(t_q)[:, None] + (t_k - t_q)
        group.layers.append(AttentionLayer(name, arr.astype(np.float32), mask))
    kept = [g for g in groups.values() if g.layers]
    return ViewerData(title=title, sequences=seqs, groups=kept)


def _template(name: str) -> str:
    return resources.files("attnlab.viz").joinpath("templates", name).read_text(encoding="utf-8")


def render_viewer(data: ViewerData) -> str:
    """The viewer page as one HTML string (scripts, styles and data inlined; no network).

    Args:
        data: what to show.

    Returns:
        The HTML text.
    """
    if not isinstance(data, ViewerData):
        raise TypeError(f"data must be a ViewerData, got {type(data).__name__}")
    payload = json.dumps(data.to_json(), separators=(",", ":")).replace("</", "<\\/")
    html = _template("viewer.html")
    # replace in an order where no inserted text can contain a later placeholder
    html = html.replace("/*@CSS@*/", _template("viewer.css"))
    html = html.replace("@TITLE@", _escape(data.title))
    html = html.replace("/*@JS@*/", _template("viewer.js").replace("</", "<\\/"))
    html = html.replace("/*@DATA@*/", payload)
    return html


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_viewer(data: ViewerData, path: str | Path) -> Path:
    """Render the viewer and write it to ``path`` (parent folders created).

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_viewer(data), encoding="utf-8")
    return path
