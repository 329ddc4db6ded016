"""The viewer's method switch: context-mixing scores on the same layers × heads grid and matrix.

Raw attention weights say where a head looks, not what it moves (see
:mod:`attnlab.inspect.mixing`). :func:`add_mixing` runs :func:`attnlab.inspect.mixing` once per
method and puts its tensors on the page as they are (float32, base64, like the weights): the
page computes nothing of its own, it only draws. What each layer shows, by what the method
defines (:class:`~attnlab.inspect.mixing.Mixing`):

=================  ==========  ==================================================================
method             scope       the matrix of layer ``l``
=================  ==========  ==================================================================
``weights``        head        the attention weights (the page's own data, always there)
``rollout``        through     ``Mixing.cumulative[l]``: ``Ã_l ⋯ Ã_0`` (Abnar & Zuidema 2020)
``norm``           head        ``Mixing.per_head[l]``: ``α^h_ij ‖W_O^h v^h_j‖`` (Kobayashi 2020)
``norm_residual``  layer       ``Mixing.per_layer[l]``: ``‖T_i(x_j)‖`` (Kobayashi et al. 2021)
``alti``           through     ``Mixing.cumulative[l]``: ALTI rolled out to layer ``l``
                               (Ferrando et al. 2022)
``value_zeroing``  layer       ``Mixing.per_layer[l]`` (Mohebbi et al. 2023)
``grad_weights``   through     ``Mixing.cumulative[l]``: Chefer et al.'s ``R`` after layer ``l``
=================  ==========  ==================================================================

A *layer* or *through* method has one matrix per layer, which the page shows whichever head is
chosen (and says so); its layers × heads grid has one column. A method whose numbers can be
negative is drawn on the diverging scale (blue < 0 < red) of Linformer's effective weights;
every method above is ≥ 0. ``flow`` and ``integrated_gradients`` have no matrix per layer (only a
total through every layer; ``attnlab plot mixing`` shows it) and are refused.

**Page size.** Each *head* method adds as many numbers as the weights (``L · H · T²``), each
*layer* or *through* method ``L · T²``: for SmolLM2 (30 layers × 9 heads) every method together
makes the page about 2.6 times as large as the weights alone (:func:`page_factor`).

**Encoder-decoder.** The methods read one stack of layers over the same tokens: the encoder's
self-attention (``layers="encoder."``). The decoder's self- and cross-attention groups keep
their weights, and the page says the method was computed for the encoder only; ``grad_weights``
explains output positions over the same tokens and is refused there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from attnlab.errors import ArgumentError, ArgumentTypeError

if TYPE_CHECKING:
    from attnlab.viz.viewer import ViewerData

__all__ = ["METHODS", "MixingView", "add_mixing", "check_mixing", "mixing_views", "page_factor"]

#: the methods the switch shows, in its order (``weights`` is the page's own data)
METHODS: tuple[str, ...] = (
    "weights",
    "rollout",
    "norm",
    "norm_residual",
    "alti",
    "value_zeroing",
    "grad_weights",
)
#: label, colour-bar meaning and scope of each method
_SHOWN: dict[str, tuple[str, str, str]] = {
    "weights": ("weights", "attention weight α_ij", "head"),
    "rollout": ("rollout", "rolled-out attention (Abnar & Zuidema 2020)", "through"),
    "norm": ("norm", "‖α_ij f(x_j)‖ (Kobayashi et al. 2020)", "head"),
    "norm_residual": (
        "norm + residual",
        "‖T_i(x_j)‖ with the residual (Kobayashi et al. 2021)",
        "layer",
    ),
    "alti": ("ALTI", "ALTI contribution (Ferrando et al. 2022)", "through"),
    "value_zeroing": ("value zeroing", "value-zeroing change (Mohebbi et al. 2023)", "layer"),
    "grad_weights": ("grad", "gradient-weighted attention (Chefer et al. 2021)", "through"),
}
_NOTES = {
    "head": "per head",
    "layer": "one matrix per layer (the method has no per-head version): the same whichever "
    "head is chosen",
    "through": "layer l shows the product through layers 0 … l (the last layer's "
    "is the total); one matrix per layer, the same whichever head is chosen",
}
#: the methods :func:`attnlab.inspect.mixing` has that the switch refuses, and why
_NO_LAYERS = (
    "gives only a total through every layer, no matrix per layer (attnlab plot mixing shows it)"
)


@dataclass(frozen=True)
class MixingView:
    """One context-mixing method as the page shows it.

    Attributes:
        name: the method (one of :data:`METHODS`).
        label: the switch's button.
        meaning: what one number means (the colour bar's label).
        scope: ``"head"`` (a matrix per head), ``"layer"`` (one per layer) or ``"through"``
            (one per layer, rolled out through the layers up to it).
        signed: the numbers can be negative (drawn on a diverging scale).
        note: a line the page shows while the method is on.
    """

    name: str
    label: str
    meaning: str
    scope: str
    signed: bool = False
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """The method as the page reads it.

        Returns:
            ``{"name", "label", "meaning", "scope", "signed", "note"}``.
        """
        return dataclasses.asdict(self)


def _methods(methods: Sequence[str] | str) -> list[str]:
    """The methods asked for, checked, without ``weights`` (the page's own)."""
    if isinstance(methods, str):
        methods = [methods]
    if not isinstance(methods, Sequence):
        raise ArgumentTypeError(f"methods must be a list of str, got {type(methods).__name__}")
    chosen = []
    for m in methods:
        if m in ("flow", "integrated_gradients"):
            raise ArgumentError(f"method {m!r} {_NO_LAYERS}; the viewer shows {', '.join(METHODS)}")
        if m not in METHODS:
            raise ArgumentError(f"method must be one of {', '.join(METHODS)}, got {m!r}")
        if m != "weights" and m not in chosen:
            chosen.append(m)
    return chosen


def page_factor(methods: Sequence[str], heads: int) -> float:
    """How many times the weights' numbers the page holds with ``methods`` switched in.

    Args:
        methods: the methods (``weights`` counts once, always).
        heads: the layers' heads ``H``.

    Returns:
        ``1 + (number of per-head methods) + (number of per-layer methods) / H``.
    """
    return 1.0 + sum(1.0 if _SHOWN[m][2] == "head" else 1.0 / heads for m in _methods(methods))


def mixing_views(
    model: nn.Module,
    input_ids: torch.Tensor,
    methods: Sequence[str] | str,
    *,
    layers: str | None = None,
    batch_index: int = 0,
    **forward_kwargs: Any,
) -> tuple[list[MixingView], dict[str, dict[str, np.ndarray]]]:
    """Each method's matrices, layer by layer, as the page shows them (see the module docstring).

    Args:
        model: the model (eval mode: value zeroing and the gradients run it again).
        input_ids: what it read.
        methods: names of :data:`METHODS`.
        layers: the attention layers, by path prefix (``"encoder."`` for an encoder-decoder).
        batch_index: which sequence of the batch.
        **forward_kwargs: further arguments of the model's forward (``tgt_in``).

    Returns:
        ``(the methods shown, layer path → method → matrices)``, each ``(H, T_q, T_k)`` for a
        per-head method, else ``(1, T_q, T_k)``, float32.

    Raises:
        ValueError: an unknown method, or one the model cannot give
            (:func:`attnlab.inspect.mixing`'s error).

    Shape:
        input_ids ``(B, T)``.
    """
    from attnlab.inspect.mixing import mixing

    views: list[MixingView] = []
    values: dict[str, dict[str, np.ndarray]] = {}
    for name in _methods(methods):
        label, meaning, scope = _SHOWN[name]
        mix = mixing(model, input_ids, name, layers=layers, heads=scope == "head", **forward_kwargs)
        if scope == "head":
            stacked = mix.per_head
        elif scope == "layer":
            stacked = None if mix.per_layer is None else mix.per_layer[:, :, None]
        else:
            stacked = None if mix.cumulative is None else mix.cumulative[:, :, None]
        if stacked is None:  # e.g. ALTI+ of both stacks at once: no matrix per layer
            raise ArgumentError(f"{name} gave no matrix per layer for {', '.join(mix.layers[:3])}")
        if not 0 <= batch_index < stacked.shape[1]:
            raise ArgumentError(
                f"batch_index must be in [0, {stacked.shape[1]}), got {batch_index}"
            )
        arrays = stacked[:, batch_index].detach().cpu().float().numpy()  # (L, H or 1, T_q, T_k)
        note = _NOTES[scope]
        if name == "norm":
            note += ": α^h_ij ‖W_O^h v^h_j‖ (the layer's ‖Σ_h α^h_ij f_h(x_j)‖ is not their sum)"
        views.append(MixingView(name, label, meaning, scope, bool((arrays < 0).any()), note))
        for layer, a in zip(mix.layers, arrays):
            values.setdefault(layer, {})[name] = a
    return views, values


def add_mixing(
    data: ViewerData,
    model: nn.Module,
    input_ids: torch.Tensor,
    methods: Sequence[str] | str,
    *,
    layers: str | None = None,
    batch_index: int = 0,
    **forward_kwargs: Any,
) -> ViewerData:
    """``data`` with the method switch: each method's matrices on the layers of the same name.

    Example::

        data = viewer_data(cache.attentions, tokens=words)
        write_viewer(add_mixing(data, model, ids, ["norm", "alti"]), "view.html")
        attnlab.viz.view(add_mixing(data, model, ids, "alti"))  # inline, in a notebook

    Args:
        data: the page's data, for the same input (its layers are named by module path).
        model: the model that read ``input_ids``.
        input_ids: the tokens.
        methods: names of :data:`METHODS`.
        layers: the attention layers to read, by path prefix (``"encoder."`` for an
            encoder-decoder: the methods read one stack over the same tokens).
        batch_index: which sequence of the batch (the one ``data`` shows).
        **forward_kwargs: further arguments of the model's forward (``tgt_in``).

    Returns:
        A new :class:`~attnlab.viz.viewer.ViewerData`.

    Raises:
        ValueError: see :func:`mixing_views`; the page shows none of the layers the methods
            read (a layer it leaves out is skipped: the rolled-out methods still run through
            it); ``data`` has training steps.

    Shape:
        input_ids ``(B, T)``.
    """
    if data.steps is not None:
        raise ArgumentError("the method switch shows one input; data has training steps")
    views, values = mixing_views(
        model, input_ids, methods, layers=layers, batch_index=batch_index, **forward_kwargs
    )
    shown = {layer.name for g in data.groups for layer in g.layers}
    if not shown & set(values):  # some may be left out (attnlab view --layer), not all
        raise ArgumentError(
            f"the page shows none of the layers the methods read ({', '.join(list(values)[:3])}); "
            "capture the same model on the same input"
        )
    groups = [
        dataclasses.replace(
            g,
            layers=[
                dataclasses.replace(layer, mixing={**(layer.mixing or {}), **values[layer.name]})
                if layer.name in values
                else layer
                for layer in g.layers
            ],
        )
        for g in data.groups
    ]
    known = {v.name: v for v in data.methods or []}
    known.update({v.name: v for v in views})
    return dataclasses.replace(data, groups=groups, methods=list(known.values()))


def check_mixing(data: ViewerData) -> None:
    """Check the method switch's matrices against the page (called by ``ViewerData``).

    Args:
        data: the page's data.

    Raises:
        ValueError: a layer's method not in ``data.methods``, or of another shape than
            ``(H or 1, T_q, T_k)``; training steps with methods.
    """
    names = {v.name for v in data.methods or []}
    for g in data.groups:
        t_q, t_k = len(data.sequences[g.query]), len(data.sequences[g.key])
        for layer in g.layers:
            for name, a in (layer.mixing or {}).items():
                if name not in names:
                    raise ArgumentError(
                        f"layer {layer.name!r} has {name!r} matrices, not in methods {sorted(names)}"
                    )
                if data.steps is not None:
                    raise ArgumentError("the method switch shows one input: no training steps")
                heads = layer.weights.shape[-3]
                if a.ndim != 3 or a.shape[0] not in (1, heads) or a.shape[1:] != (t_q, t_k):
                    raise ArgumentError(
                        f"{name} of {layer.name!r} must be (H or 1, T_q, T_k) = ({heads} or 1, "
                        f"{t_q}, {t_k}), got {tuple(a.shape)}"
                    )
