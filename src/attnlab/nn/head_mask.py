"""Head masks (Michel et al. 2019, "Are Sixteen Heads Really Better than One?", §2.2), as
Hugging Face names them ``head_mask``: ``ξ_h`` multiplies head ``h``'s output before the output
projection, so 1 keeps a head and 0 removes what it adds.

    MultiHead(Q, K, V) = Concat(ξ_1 head_1, …, ξ_h head_h) W^O
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnlab._checks import broadcast_or_raise, check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError

__all__ = ["check_head_mask", "layer_head_masks", "with_ablations"]


def check_head_mask(head_mask: object, batch: int, num_heads: int) -> torch.Tensor:
    """Validate a head mask ``ξ`` and shape it ``(B or 1, H, 1, 1)`` to multiply per-head tensors.

    Args:
        head_mask: a floating or boolean tensor broadcastable to ``(B, H)`` (usually ``(H,)`` or
            ``(B, H)``); 1/True keeps a head, 0/False removes it. Floating values are used as they
            are (any finite scale), so a mask that requires grad stays differentiable.
        batch: ``B``.
        num_heads: ``H``.

    Returns:
        The mask viewed as ``(B or 1, H or 1, 1, 1)``, not yet converted to the activations' dtype.

    Raises:
        TypeError: not a tensor, or an integer/complex dtype.
        ValueError: a shape that does not broadcast to ``(B, H)``, or a NaN/inf entry.

    Shape:
        head_mask broadcastable to ``(B, H)`` → ``(B or 1, H or 1, 1, 1)``.
    """
    m = check_tensor("head_mask", head_mask)
    if m.dtype != torch.bool and not m.is_floating_point():
        raise ArgumentTypeError(
            f"head_mask must be floating (1.0 keeps a head, 0.0 removes it) or bool, got dtype "
            f"{m.dtype}; convert it with .float()"
        )
    broadcast_or_raise("head_mask", m.shape, (batch, num_heads), "(B, H)")
    if m.is_floating_point() and not bool(torch.isfinite(m.detach()).all()):
        raise ArgumentError("head_mask must be finite, got NaN or inf entries")
    while m.dim() < 2:
        m = m.unsqueeze(0)
    return m[:, :, None, None]  # (B or 1, H or 1, 1, 1)


def layer_head_masks(
    name: str, head_mask: object, num_layers: int, num_heads: int
) -> list[torch.Tensor | None]:
    """Split a model-level head mask into one ``(H,)`` mask per layer (Hugging Face semantics).

    Args:
        name: the argument's name, for errors (``"head_mask"``, ``"decoder_head_mask"``, …).
        head_mask: ``None``, or a floating/boolean tensor of shape ``(num_layers, num_heads)``, or
            ``(num_heads,)`` for the same heads in every layer.
        num_layers: layers ``L``.
        num_heads: heads ``H`` per layer.

    Returns:
        ``L`` entries: ``None`` everywhere when ``head_mask`` is ``None``, else ``(H,)`` views.

    Raises:
        TypeError: not a tensor, or an integer/complex dtype.
        ValueError: a shape other than ``(L, H)`` or ``(H,)``.

    Shape:
        head_mask ``(L, H)`` or ``(H,)`` → ``L`` tensors ``(H,)``.
    """
    if head_mask is None:
        return [None] * num_layers
    m = check_tensor(name, head_mask)
    if m.dtype != torch.bool and not m.is_floating_point():
        raise ArgumentTypeError(
            f"{name} must be floating (1.0 keeps a head, 0.0 removes it) or bool, got dtype "
            f"{m.dtype}; convert it with .float()"
        )
    if m.shape == (num_heads,):
        return [m] * num_layers
    if m.shape == (num_layers, num_heads):
        return list(m.unbind(0))
    raise ArgumentError(
        f"{name} must have shape (num_layers, num_heads) = ({num_layers}, {num_heads}) or "
        f"(num_heads,) = ({num_heads},), got {shape_str(m.shape)}"
    )


def with_ablations(
    head_mask: torch.Tensor | None, ablations: Sequence[torch.Tensor]
) -> torch.Tensor | None:
    """``head_mask · ξ_1 · ξ_2 …``: a call's head mask times the ablations in force on its layer
    (``MultiHeadAttention.head_ablations``, set by :func:`attnlab.inspect.masked_heads`), in
    order; ``ξ_1 · ξ_2 …`` without a call's mask, the mask itself without ablations.

    Args:
        head_mask: the call's ``ξ``, or ``None``.
        ablations: the ablation masks, in the order they were set.

    Returns:
        The product, or ``None`` when there is neither.

    Shape:
        head_mask ``(H,)`` or ``(B, H)``; each ablation ``(H,)``.
    """
    for xi in ablations:
        head_mask = xi if head_mask is None else head_mask * xi
    return head_mask
