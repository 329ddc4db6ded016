"""The options of one attention call, as one object (:class:`AttentionCall`).

:meth:`attnlab.nn.multihead.MultiHeadAttention.forward` takes its options as keyword arguments
(the public, ``torch.nn.MultiheadAttention``-like signature), resolves them against the layer's
defaults and hands them on as one :class:`AttentionCall`; a variant of attention overrides
:meth:`~attnlab.nn.multihead.MultiHeadAttention.attend_heads`, which receives it, and never
re-declares the keyword arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from attnlab._checks import check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError

if TYPE_CHECKING:
    from attnlab.nn.block_layout import BlockLayout
    from attnlab.nn.multihead import MultiHeadAttention

__all__ = ["AttentionCall", "check_inputs"]


@dataclass(frozen=True)
class AttentionCall:
    """One call's options, resolved against the layer's defaults.

    Attributes:
        mask: boolean (``True = may attend``) or additive float, broadcastable to
            ``(B, H, T_q, T_k)``, or ``None``.
        is_causal: bottom-right causal masking (the layer's default applied).
        need_weights: the caller wants the weights back.
        cache: the layer's decoding cache, or ``None``.
        positions: rotary position ids, or ``None``.
        check_positions: check the positions against the rotary table.
        window: the sliding window ``(left, right)`` in force (the layer's, or the call's), or
            ``None``.
        block_mask: the call's block layout: ``None`` (the layer's own), a layout, or ``False``.
        cross: cross-attention (``key`` given and not ``query`` itself).
        query: the layer's query input ``x``, for the resolved call the layer emits
            (:class:`~attnlab.nn.resolved_call.ResolvedCall`); ``None`` when not given.
        memory: the key/value input of a cross-attention call, likewise.

    Shape:
        mask broadcastable to ``(B, H, T_q, T_k)``; positions ``(B, T_q)`` or ``(T_q,)``;
        query ``(B, T_q, d_model)``; memory ``(B, T_k, d_model)``.
    """

    mask: torch.Tensor | None = None
    is_causal: bool = False
    need_weights: bool = False
    cache: Any = None
    positions: torch.Tensor | None = None
    check_positions: bool = True
    window: tuple[int | None, int | None] | None = None
    block_mask: BlockLayout | Literal[False] | None = None
    cross: bool = False
    query: torch.Tensor | None = None
    memory: torch.Tensor | None = None

    def refuse(self, layer: str, *names: str) -> None:
        """Refuse the named options when set (not ``None``): a layer that does not implement
        them calls this from its ``check_call``.

        Args:
            layer: the layer's name, for the message.
            *names: options among ``positions``, ``window``, ``block_mask``, ``cache``.

        Raises:
            ValueError: one of them is set.
        """
        for name in names:
            value = getattr(self, name)
            if value is not None:
                raise ArgumentError(
                    f"{name} must be None: {layer} does not support it, got {value!r}"
                )


def check_inputs(
    layer: MultiHeadAttention,
    query: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
) -> bool:
    """Check the inputs of :meth:`MultiHeadAttention.forward
    <attnlab.nn.multihead.MultiHeadAttention.forward>` before any work.

    Args:
        layer: the layer called (its ``d_model`` and weights' dtype).
        query: the query input.
        key: the key input, or ``None`` (self-attention).
        value: the value input, or ``None`` (``key``).

    Returns:
        ``True`` for cross-attention (``key`` given and not ``query`` itself).

    Raises:
        ValueError: a shape that is not ``(B, T, d_model)``, or batch sizes that differ.
        TypeError: not a floating tensor, or a dtype other than the weights' (no autocast).

    Shape:
        query ``(B, T_q, d_model)``; key, value ``(B, T_k, d_model)``.
    """
    _check_input(layer, "query", query)
    cross = key is not None and key is not query
    if key is not None and cross:
        _check_input(layer, "key", key)
        if value is not None:
            _check_input(layer, "value", value)
            if value.shape[:2] != key.shape[:2]:
                raise ArgumentError(
                    f"key and value must have the same (B, T_k), got "
                    f"{shape_str(key.shape[:2])} and {shape_str(value.shape[:2])}"
                )
        if key.shape[0] != query.shape[0]:
            raise ArgumentError(
                f"query and key batch sizes differ: {query.shape[0]} vs {key.shape[0]}"
            )
    return cross


def _check_input(layer: MultiHeadAttention, name: str, x: object) -> None:
    x = check_tensor(name, x)
    if x.dim() != 3 or x.shape[-1] != layer.d_model:
        raise ArgumentError(
            f"{name} must have shape (B, T, d_model={layer.d_model}), got {shape_str(x.shape)}"
        )
    weight = layer.qkv_parameters()[0]
    if not x.is_floating_point():
        raise ArgumentTypeError(
            f"{name} must be a floating tensor of activations, got dtype {x.dtype}"
        )
    autocast = torch.is_autocast_enabled(x.device.type)
    if x.dtype != weight.dtype and not autocast:
        raise ArgumentTypeError(
            f"{name} has dtype {x.dtype} but the layer's weights are {weight.dtype}; convert "
            f"one of them (e.g. layer.to({x.dtype}) or {name}.to({weight.dtype}))"
        )
