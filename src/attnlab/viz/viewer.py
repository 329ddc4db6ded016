"""A self-contained HTML attention viewer: one file, no network, data embedded.

The page (``templates/viewer.html`` with its ``.js`` and ``.css`` inlined at render time) shows
token-to-token lines and the weight matrix (drawn on a canvas, so 1,000 tokens stay usable), lets
one choose the attention group (encoder self, decoder self, decoder cross — or a GPT's self), the
layer and the head (or all heads), shows exact values on hover and the mask on demand. With
``steps`` (attention recorded during training, see :mod:`attnlab.viz.probe_history`) a slider picks
the training step. The page opens on the most informative head
(:func:`~attnlab.viz.viewer_start.most_informative_head`: an encoder-decoder's sharpest
cross-attention head, else the lowest-entropy head that is no attention sink) and says why; a
colour bar under the controls gives the scale (``0 … max`` of the head shown; colour ∝
``√(weight / max)``), and the layers × heads grid names its layers, heads and axes (rows are the
queries, columns the keys).

**Method switch.** With :func:`~attnlab.viz.viewer_mixing.add_mixing` (``attnlab view
--mixing``) a row of buttons switches the grid and the matrix from the weights to what
:func:`attnlab.inspect.mixing` computed — rollout, norm, norm with the residual, ALTI, value
zeroing, gradient-weighted attention — per head where the method defines it, else one matrix
per layer (the same whichever head is chosen, and the page says so; rollout, ALTI and grad show
layer ``l``'s product through layers ``0 … l``). The colour bar is labelled by what the number
means (e.g. "ALTI contribution (Ferrando et al. 2022)"); the page computes nothing of its own.

**Lens panel.** With :func:`~attnlab.viz.viewer_lens.add_lens` (``attnlab view --lens``) a
"lens" view shows what each layer would predict at each position, layers × positions, each cell
the top token of :func:`attnlab.inspect.logit_lens` (or the tuned lens) and its probability, the
top ``k`` on hover; ``templates/viewer_lens.js`` draws it as a table.

Weights travel as base64 float32 (exact values), masks as base64 uint8. The embedded JSON has
``<``, ``>`` and ``&`` escaped (``\u003c`` …), so no token text can close the script element.

**Projected keys (Linformer).** A :class:`~attnlab.nn.linformer.LinformerAttention` layer attends
over the ``k`` rows of ``E K`` (Wang et al. 2020), each a learned mix of every key position, so its
weights are ``T_q × k`` and their columns are not tokens. Such layers form a group of their own
(e.g. ``"encoder self-attention (Linformer, k = 16)"``) whose key labels are ``"E·K row j"``; the
page says so in a line under the controls and draws no token-to-token lines for them. A second
mode shows the *effective* weights ``A · F`` (``T_q × T_k``, over the source tokens): the layer's
output is exactly ``(A F) V``, so entry ``(i, t)`` is what query ``i`` took from token ``t``
through the value projection ``F``. It may be negative, so it is drawn on a diverging scale
(blue < 0 < red). See :class:`~attnlab.inspect.capture.ProjectedKeys` for why ``A · F`` and not
``A · E``.
"""

from __future__ import annotations

import base64
import html
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from attnlab._checks import shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.viz.files import write_file
from attnlab.viz.viewer_lens import LensView, check_lenses
from attnlab.viz.viewer_mixing import MixingView, check_mixing
from attnlab.viz.viewer_start import ViewerStart, most_informative_head

if TYPE_CHECKING:
    from attnlab.inspect.capture import ProjectedKeys

__all__ = [
    "AttentionGroup",
    "AttentionLayer",
    "Viewer",
    "ViewerData",
    "render_viewer",
    "view",
    "viewer_data",
    "write_viewer",
]


@dataclass(frozen=True)
class AttentionLayer:
    """One layer's weights.

    Attributes:
        name: module path, e.g. ``"decoder.layers.0.cross_attn"``.
        weights: ``(H, T_q, T_k)`` float array, or ``(S, H, T_q, T_k)`` when the
            :class:`ViewerData` has ``steps``. In a group with projected keys ``T_k`` is ``k``,
            the projected rows.
        mask: boolean ``(T_q, T_k)`` (``True = may attend``) or ``None``.
        effective: only in a group with projected keys (:attr:`AttentionGroup.projected_from`):
            the effective weights ``A · F`` over the tokens the rows mix, ``(H, T_q, T_tok)``
            (``(S, H, T_q, T_tok)`` with steps), signed; or ``None``.
        mixing: the method switch's matrices of this layer, method name → ``(H, T_q, T_k)``
            (a per-head method) or ``(1, T_q, T_k)`` (one per layer), see
            :func:`~attnlab.viz.viewer_mixing.add_mixing`; or ``None``.
    """

    name: str
    weights: np.ndarray
    mask: np.ndarray | None = None
    effective: np.ndarray | None = None
    mixing: dict[str, np.ndarray] | None = None


@dataclass(frozen=True)
class AttentionGroup:
    """Layers of one kind that share query and key tokens.

    Attributes:
        name: shown on the group's tab, e.g. ``"decoder cross-attention"``.
        query: the name of the query token sequence (a key of :attr:`ViewerData.sequences`).
        key: the name of the key sequence: the key tokens, or for projected keys the labels of
            the ``k`` rows (``"E·K row j"``).
        layers: the layers, in order.
        projected_from: for a group whose keys are projected rows (Linformer), the name of the
            token sequence every row mixes (the columns of the layers' ``effective`` weights);
            ``None`` (default) when the keys are tokens.
        note: a line the page shows while the group is open (what the columns are), or ``None``.
    """

    name: str
    query: str
    key: str
    layers: list[AttentionLayer] = field(default_factory=list)
    projected_from: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class ViewerData:
    """Everything the page shows.

    Attributes:
        title: page title.
        sequences: token texts by sequence name (``{"tokens": [...]}`` or
            ``{"source": [...], "target": [...]}``).
        groups: attention groups.
        steps: training steps, strictly ascending, when the weights were recorded during
            training; then every layer's weights are ``(S, H, T_q, T_k)`` with
            ``S = len(steps)`` and the page shows a step slider. ``None`` (default): one
            ``(H, T_q, T_k)`` per layer, no slider.
        prompt_length: a language model's text followed by tokens it generated: the number of
            prompt tokens at the start of ``sequences["tokens"]``; the page marks the tokens
            after it as generated (their labels in another colour, a line at the boundary).
            ``None`` (default): nothing was generated.
        token_scores: with ``prompt_length``, one JSON object per generated token (as
            :meth:`attnlab.tasks.token_scores.TokenScore.to_json`: ``probability``,
            ``entropy``, ``alternatives`` of ``token`` and ``probability``): the page shows
            each generated token's probability in its label and the rest on hover. ``None``
            (default): none.
        start: the group, layer and head the page opens on; ``None`` (default): the most
            informative head, chosen by :func:`~attnlab.viz.viewer_start.most_informative_head`
            (the cross-attention of an encoder-decoder, the lowest-entropy head that is no sink).
        methods: the context-mixing methods of the page's method switch (their matrices are
            the layers' :attr:`AttentionLayer.mixing`); ``None`` (default): weights only.
        special: the positions of special tokens (``[CLS]``, ``[SEP]``, ``<s>``) by sequence
            name: the page marks their labels; ``None`` (default): none marked.
        lenses: the lens panel's lenses (:func:`~attnlab.viz.viewer_lens.add_lens`: what each
            layer would predict at each position, top ``k`` and KL to the output); ``None``
            (default): no lens panel.
    """

    title: str
    sequences: dict[str, list[str]]
    groups: list[AttentionGroup]
    steps: list[int] | None = None
    prompt_length: int | None = None
    start: ViewerStart | None = None
    methods: list[MixingView] | None = None
    token_scores: list[dict[str, Any]] | None = None
    special: dict[str, list[int]] | None = None
    lenses: list[LensView] | None = None

    def __post_init__(self) -> None:
        if not self.groups:
            raise ArgumentError("groups must hold at least one attention group, got none")
        if self.steps is not None:
            steps = list(self.steps)
            if not steps:
                raise ArgumentError("steps must hold at least one step (or be None), got none")
            for s in steps:
                if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
                    raise ArgumentTypeError(f"steps must hold ints, got {type(s).__name__}")
            if any(b <= a for a, b in itertools.pairwise(steps)):
                raise ArgumentError(f"steps must be strictly ascending, got {steps[:8]}")
        if self.prompt_length is not None:
            n = self.prompt_length
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
                raise ArgumentTypeError(f"prompt_length must be an int, got {type(n).__name__}")
            if "tokens" not in self.sequences or not 0 <= n <= len(self.sequences["tokens"]):
                raise ArgumentError(
                    f"prompt_length must lie in [0, len(sequences['tokens'])] (a language "
                    f"model's tokens), got {n} with sequences {list(self.sequences)}"
                )
        if self.token_scores is not None:
            self._check_token_scores(self.token_scores)
        for name, positions in (self.special or {}).items():
            n = len(self.sequences.get(name, ()))
            if name not in self.sequences or any(not 0 <= int(i) < n for i in positions):
                raise ArgumentError(
                    f"special must give positions of the sequences {list(self.sequences)}, got "
                    f"{name!r}: {list(positions)[:8]}"
                )
        if self.start is not None:
            self._check_start(self.start)
        if self.lenses is not None:
            check_lenses(self.lenses)
        for g in self.groups:
            sides = (
                (g.query, g.key) if g.projected_from is None else (g.query, g.key, g.projected_from)
            )
            for side in sides:
                if side not in self.sequences:
                    raise ArgumentError(
                        f"group {g.name!r} names sequence {side!r}, not in sequences {list(self.sequences)}"
                    )
            t_q, t_k = len(self.sequences[g.query]), len(self.sequences[g.key])
            for layer in g.layers:
                self._check_weights(f"weights of {layer.name!r}", layer.weights, t_q, t_k)
                if layer.mask is not None and layer.mask.shape != (t_q, t_k):
                    raise ArgumentError(
                        f"mask of {layer.name!r} must be ({t_q}, {t_k}), got {shape_str(layer.mask.shape)}"
                    )
                if layer.effective is None:
                    continue
                if g.projected_from is None:
                    raise ArgumentError(
                        f"layer {layer.name!r} has effective weights but its group {g.name!r} has "
                        "no projected keys (set projected_from)"
                    )
                t_tok = len(self.sequences[g.projected_from])
                self._check_weights(
                    f"effective weights of {layer.name!r}", layer.effective, t_q, t_tok
                )
                if layer.effective.shape[-3] != layer.weights.shape[-3]:
                    raise ArgumentError(
                        f"effective weights of {layer.name!r} have {layer.effective.shape[-3]} heads, "
                        f"the weights {layer.weights.shape[-3]}"
                    )
        check_mixing(self)

    def _check_token_scores(self, scores: object) -> None:
        if not isinstance(scores, list) or not all(isinstance(d, dict) for d in scores):
            raise ArgumentTypeError(
                f"token_scores must be a list of dicts, got {type(scores).__name__}"
            )
        if self.prompt_length is None:
            raise ArgumentError("token_scores needs prompt_length (the generated tokens' start)")
        n = len(self.sequences["tokens"]) - self.prompt_length
        if len(scores) != n:
            raise ArgumentError(
                f"token_scores must hold one entry per generated token ({n} after "
                f"prompt_length {self.prompt_length}), got {len(scores)}"
            )

    def _check_start(self, start: object) -> None:
        if not isinstance(start, ViewerStart):
            raise ArgumentTypeError(f"start must be a ViewerStart, got {type(start).__name__}")
        if not 0 <= start.group < len(self.groups):
            raise ArgumentError(
                f"start.group must be in [0, {len(self.groups)}), got {start.group}"
            )
        layers = self.groups[start.group].layers
        if not 0 <= start.layer < len(layers):
            raise ArgumentError(f"start.layer must be in [0, {len(layers)}), got {start.layer}")
        heads = layers[start.layer].weights.shape[-3]
        if not 0 <= start.head < heads:
            raise ArgumentError(f"start.head must be in [0, {heads}), got {start.head}")

    def _check_weights(self, what: str, w: np.ndarray, t_q: int, t_k: int) -> None:
        if self.steps is not None:
            n = len(self.steps)
            if w.ndim != 4 or w.shape[0] != n or w.shape[2:] != (t_q, t_k):
                raise ArgumentError(
                    f"{what} must be (S, H, T_q, T_k) = ({n}, H, {t_q}, {t_k}) with steps, got "
                    f"{shape_str(w.shape)}"
                )
        elif w.ndim != 3 or w.shape[1:] != (t_q, t_k):
            raise ArgumentError(
                f"{what} must be (H, T_q, T_k) = (H, {t_q}, {t_k}), got {shape_str(w.shape)}"
            )

    def to_json(self) -> dict:
        """The page's JSON (weights as base64 little-endian float32, masks as base64 uint8; with
        ``steps`` each layer's weights are all steps in order, ``(S, H, T_q, T_k)``).

        Returns:
            A JSON-ready dict: ``title``, ``sequences``, ``groups`` (each with its layers' names,
            shapes, weights, masks and effective weights, and the group's ``projected_from`` and
            ``note``), ``steps``, ``prompt_length``, ``start`` (the initial group, layer,
            head and why: :attr:`start`, or :func:`~attnlab.viz.viewer_start.most_informative_head`)
            and ``methods`` (the method switch: each layer's ``mixing`` holds, per method, its
            ``heads`` (``H`` or 1) and base64 float32 ``values``), ``lenses`` (the lens panel:
            :meth:`~attnlab.viz.viewer_lens.LensView.to_json` of each).
        """

        def b64(a: np.ndarray) -> str:
            return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")

        return {
            "title": self.title,
            "steps": None if self.steps is None else [int(s) for s in self.steps],
            "prompt_length": None if self.prompt_length is None else int(self.prompt_length),
            "token_scores": self.token_scores,
            "special": {k: [int(i) for i in v] for k, v in (self.special or {}).items()},
            "start": (self.start or most_informative_head(self)).to_json(),
            "sequences": self.sequences,
            "methods": [v.to_json() for v in self.methods or []],
            "lenses": [v.to_json() for v in self.lenses or []],
            "groups": [
                {
                    "name": g.name,
                    "query": g.query,
                    "key": g.key,
                    "projected_from": g.projected_from,
                    "note": g.note,
                    "layers": [
                        {
                            "name": layer.name,
                            "heads": int(layer.weights.shape[-3]),
                            "weights": b64(layer.weights.astype("<f4")),
                            "mask": None
                            if layer.mask is None
                            else b64(layer.mask.astype(np.uint8)),
                            "effective": None
                            if layer.effective is None
                            else b64(layer.effective.astype("<f4")),
                            "mixing": {
                                m: {"heads": int(a.shape[0]), "values": b64(a.astype("<f4"))}
                                for m, a in (layer.mixing or {}).items()
                            },
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


_METHODS = {"linformer": "Linformer"}


def viewer_data(
    attentions: Mapping[str, torch.Tensor | np.ndarray],
    *,
    tokens: Sequence[str] | None = None,
    source: Sequence[str] | None = None,
    target: Sequence[str] | None = None,
    kinds: Mapping[str, str] | None = None,
    projected: Mapping[str, ProjectedKeys] | None = None,
    batch_index: int = 0,
    title: str = "attnlab attention viewer",
    prompt_length: int | None = None,
    token_scores: list[dict[str, Any]] | None = None,
    bidirectional: bool = False,
    special: dict[str, list[int]] | None = None,
) -> ViewerData:
    """Build :class:`ViewerData` from captured weights (``cache.attentions``).

    A GPT passes ``tokens``; an encoder-decoder passes ``source`` and ``target``. Layers are
    grouped by kind: for the encoder-decoder, paths starting with ``encoder`` are encoder
    self-attention (padding mask only), ``kinds[path] == "cross"`` (or ``cross``/``src_attn`` in the
    path) decoder cross-attention, the rest decoder self-attention (look-ahead mask).

    Layers named in ``projected`` (Linformer: ``cache.projected``) attend over ``k`` projected
    rows of ``E K``, not over tokens: they go to a group of their own, e.g. ``"encoder
    self-attention (Linformer, k = 16)"``, whose key labels are the rows (``"E·K row j"``), with a
    note saying what the columns are and the effective weights ``A · F`` over the key tokens
    (:meth:`~attnlab.inspect.capture.ProjectedKeys.effective_weights`; possibly negative).

    Args:
        attentions: module path → ``(B, H, T_q, T_k)`` or ``(H, T_q, T_k)``.
        tokens: a GPT's tokens.
        source: an encoder-decoder's source tokens.
        target: an encoder-decoder's target tokens (what the decoder read).
        kinds: module path → ``"self"``/``"cross"`` (``cache.kinds``).
        projected: module path → :class:`~attnlab.inspect.capture.ProjectedKeys` for the layers
            whose keys are projected (``cache.projected``); default none.
        batch_index: which sequence of the batch.
        title: page title.
        prompt_length: a GPT's prompt length when ``tokens`` continue with generated ones (see
            :attr:`ViewerData.prompt_length`); default ``None``.
        token_scores: the generated tokens' probabilities (see
            :attr:`ViewerData.token_scores`); default ``None``.
        bidirectional: ``tokens`` are an encoder's (BERT): its layers form the group "encoder
            self-attention", with no look-ahead mask; default ``False`` (a GPT's, causal).
        special: the positions of special tokens by sequence (:attr:`ViewerData.special`).

    Returns:
        :class:`ViewerData`.

    Raises:
        ValueError: neither ``tokens`` nor ``source`` and ``target``; a weight of another shape
            than its tokens (a layer with projected keys not named in ``projected`` says so);
            ``batch_index`` out of range.

    Shape:
        - each weight: ``(B, H, T_q, T_k)`` (``batch_index`` picks the sequence) or
          ``(H, T_q, T_k)``; ``T_q``/``T_k`` are the lengths of ``tokens`` for a GPT, of
          ``target``/``source`` (or ``target``/``target``, ``source``/``source``) for an
          encoder-decoder; ``T_k = k`` for a layer in ``projected``.
    """
    if tokens is None and (source is None or target is None):
        raise ArgumentError(
            "pass tokens (GPT) or both source and target (encoder-decoder), got neither"
        )
    kinds = dict(kinds or {})
    projected = dict(projected or {})
    parents: dict[str, str] = {}  # projected group → the group it was split from
    seqs: dict[str, list[str]]
    if tokens is not None:
        seqs = {"tokens": [str(t) for t in tokens]}
        own = "encoder self-attention" if bidirectional else "self-attention"
        groups = {own: AttentionGroup(own, "tokens", "tokens")}
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
        full = arr
        if arr.ndim == 4:
            if not 0 <= batch_index < arr.shape[0]:
                raise ArgumentError(
                    f"batch_index must be in [0, {arr.shape[0]}), got {batch_index}"
                )
            arr = arr[batch_index]
        if arr.ndim != 3:
            raise ArgumentError(
                f"attentions[{name!r}] must be (B, H, T_q, T_k) or (H, T_q, T_k), got {shape_str(arr.shape)}"
            )
        cross = kinds.get(name) == "cross" or bool(re.search(r"cross|src_attn|enc_dec", name))
        if tokens is not None:
            group = groups[own]
        elif cross:
            group = groups["decoder cross-attention"]
        elif name.startswith("encoder") or ".encoder." in name:
            group = groups["encoder self-attention"]
        else:
            group = groups["decoder self-attention"]
        t_q, t_k = arr.shape[1:]
        info = projected.get(name)
        if info is not None:
            base = group
            group = _projected_group(groups, seqs, base, info)
            parents[group.name] = base.name
            a = w if isinstance(w, torch.Tensor) else torch.as_tensor(full)
            effective = _np(info.effective_weights(a))  # A · F over the key tokens
            if effective.ndim == 4:
                effective = effective[batch_index]
            group.layers.append(
                AttentionLayer(name, arr.astype(np.float32), effective=effective.astype(np.float32))
            )
            continue
        if t_k != len(seqs[group.key]) and t_q == len(seqs[group.query]):
            raise ArgumentError(
                f"attentions[{name!r}] must be (H, T_q, T_k) = (H, {t_q}, {len(seqs[group.key])}) "
                f"over the {group.key} tokens of {group.name}, got {shape_str(arr.shape)}; if the "
                f"layer's keys are projected (Linformer: T_q × k weights) pass "
                f"projected=cache.projected"
            )
        mask = None
        if group.query == group.key and group.name != "encoder self-attention":
            # the look-ahead mask, bottom-right aligned
            mask = np.arange(t_k)[None, :] <= np.arange(t_q)[:, None] + (t_k - t_q)
        group.layers.append(AttentionLayer(name, arr.astype(np.float32), mask))
    # a projected group follows the group it was split from
    base_order = [n for n in groups if n not in parents]
    kept = sorted(
        (g for g in groups.values() if g.layers),
        key=lambda g: base_order.index(parents.get(g.name, g.name)),
    )
    return ViewerData(
        title=title, sequences=seqs, groups=kept, prompt_length=prompt_length,
        token_scores=token_scores, special=special,
    )  # fmt: skip


def _projected_group(
    groups: dict[str, AttentionGroup],
    seqs: dict[str, list[str]],
    base: AttentionGroup,
    info: ProjectedKeys,
) -> AttentionGroup:
    """The group of ``base``'s layers whose keys ``info`` projects: its own key labels (the
    ``k`` rows) and a note that the columns are not tokens (created on first use)."""
    method = _METHODS.get(info.method, info.method)
    name = f"{base.name} ({method}, k = {info.k})"
    if name in groups:
        return groups[name]
    rows = f"E·K rows (k = {info.k})"
    seqs[rows] = list(info.labels)
    n = len(seqs[base.key])
    note = (
        f"keys projected to k = {info.k} rows ({method}): column j is row j of E·K, a learned "
        f"mix of all {n} {base.key} positions, not a token, so no token-to-token lines are drawn. "
        f"'effective weight through F' (A·F) shows what each query took from each {base.key} "
        f"token through the value projection F (output = (A·F)·V); it may be negative."
    )
    groups[name] = AttentionGroup(name, base.query, rows, projected_from=base.key, note=note)
    return groups[name]


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
        raise ArgumentTypeError(f"data must be a ViewerData, got {type(data).__name__}")
    payload = _script_json(data.to_json())
    parts = {
        "/*@CSS@*/": _template("viewer.css"),
        "@TITLE@": _escape(data.title),
        "/*@JS@*/": (_template("viewer.js") + _template("viewer_lens.js")).replace("</", "<\\/"),
        "/*@DATA@*/": payload,
    }
    # one pass: an inserted text (a title, a token) is never searched for placeholders again
    pattern = re.compile("|".join(re.escape(k) for k in parts))
    return pattern.sub(lambda m: parts[m.group(0)], _template("viewer.html"))


def _script_json(obj: object) -> str:
    """JSON safe inside ``<script>``: ``<``, ``>`` and ``&`` become ``\\u003c``, ``\\u003e``,
    ``\\u0026`` (outside strings JSON has none of them, so the text parses to the same value)."""
    text = json.dumps(obj, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_viewer(data: ViewerData, path: str | Path) -> Path:
    """Render the viewer and write it to ``path`` (parent folders created).

    The file is replaced only once it is complete: a full disk or a read-only folder raises an
    ``OSError`` naming ``path`` and leaves any file already there unchanged.

    Args:
        data: what to show.
        path: the ``.html`` file to write.

    Returns:
        The path written.

    Raises:
        ValueError: a parent of ``path`` is a file.
        OSError: the file could not be written.
    """
    html = render_viewer(data).encode("utf-8")
    return write_file(path, lambda f: f.write(html))


@dataclass(frozen=True)
class Viewer:
    """The viewer page of some attention weights: saved to a file, or shown inside a notebook.

    In Jupyter the object displays itself (``_repr_html_``): the same self-contained page, inside
    an ``<iframe srcdoc=…>`` of its own, so that several viewers in one notebook never share
    element ids, styles or scripts, and the page runs sandboxed (scripts only; no access to the
    notebook).

    Attributes:
        data: what the page shows.
        height: the height of the inline frame, in CSS pixels.
    """

    data: ViewerData
    height: int = 720

    @property
    def html(self) -> str:
        """The page as one HTML string (:func:`render_viewer`)."""
        return render_viewer(self.data)

    def save(self, path: str | Path) -> Path:
        """Write the page to ``path`` (:func:`write_viewer`).

        Args:
            path: the ``.html`` file to write; parent folders are created.

        Returns:
            The path written.
        """
        return write_viewer(self.data, path)

    def _repr_html_(self) -> str:
        page = html.escape(self.html, quote=True)
        title = html.escape(self.data.title, quote=True)
        return (
            f'<iframe class="attnlab-viewer" title="{title}" sandbox="allow-scripts" '
            f'style="width: 100%; height: {self.height}px; border: 1px solid #ccc" '
            f'srcdoc="{page}"></iframe>'
        )


def view(
    attentions: object,
    *,
    tokens: Sequence[str] | None = None,
    source: Sequence[str] | None = None,
    target: Sequence[str] | None = None,
    kinds: Mapping[str, str] | None = None,
    projected: Mapping[str, ProjectedKeys] | None = None,
    batch_index: int = 0,
    title: str = "attnlab attention viewer",
    height: int = 720,
) -> Viewer:
    """The attention viewer for captured weights; in a notebook, the page shows inline.

    Example::

        with attnlab.inspect.capture(model) as cache:
            model(tokens)
        attnlab.viz.view(cache, tokens=[tok.decode([t]) for t in tokens[0].tolist()])

    Args:
        attentions: an :class:`~attnlab.inspect.ActivationCache` (its ``attentions`` and
            ``kinds`` are used), a :class:`ViewerData` (shown as it is; no other argument but
            ``height`` may be given), or a mapping of module path → weights.
        tokens: a GPT's tokens (one label per position).
        source: an encoder-decoder's source tokens.
        target: an encoder-decoder's target tokens.
        kinds: module path → ``"self"``/``"cross"``; taken from the cache when it is one.
        projected: module path → :class:`~attnlab.inspect.capture.ProjectedKeys` for layers
            with projected keys (Linformer); taken from the cache when it is one.
        batch_index: which sequence of the batch to show.
        title: the page title.
        height: the height of the inline frame in a notebook, in CSS pixels (> 0).

    Returns:
        A :class:`Viewer`: ``.html`` is the page, ``.save(path)`` writes it.

    Shape:
        - each weight: ``(B, H, T_q, T_k)`` or ``(H, T_q, T_k)``, with ``T_q``/``T_k`` the lengths
          of ``tokens`` (or ``target``/``source``).

    Raises:
        TypeError: ``attentions`` is none of the accepted types, or ``height`` is not an int.
        ValueError: see :func:`viewer_data`; ``height`` is not positive; a :class:`ViewerData` was
            given with token arguments.
    """
    if isinstance(height, bool) or not isinstance(height, int):
        raise ArgumentTypeError(f"height must be an int, got {type(height).__name__}")
    if height <= 0:
        raise ArgumentError(f"height must be > 0, got {height}")
    if isinstance(attentions, ViewerData):
        extra = [n for n, v in (("tokens", tokens), ("source", source), ("target", target),
                                ("kinds", kinds), ("projected", projected)) if v is not None]  # fmt: skip
        if extra:
            raise ArgumentError(
                f"a ViewerData already holds its tokens; got {', '.join(extra)} as well"
            )
        return Viewer(attentions, height)
    weights = getattr(attentions, "attentions", attentions)
    if not isinstance(weights, Mapping):
        raise ArgumentTypeError(
            "attentions must be an ActivationCache, a ViewerData or a mapping of module path → "
            f"weights, got {type(attentions).__name__}"
        )
    if kinds is None:
        kinds = getattr(attentions, "kinds", None)
    if projected is None:
        projected = getattr(attentions, "projected", None)
    data = viewer_data(
        weights,
        tokens=tokens,
        source=source,
        target=target,
        kinds=kinds,
        projected=projected,
        batch_index=batch_index,
        title=title,
    )
    return Viewer(data, height)
