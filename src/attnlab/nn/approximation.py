"""What the approximations of softmax attention (Linformer, Performer) share: the key mask
they can honour, their input checks and the relative error they are measured by."""

from __future__ import annotations

import torch

from attnlab._checks import broadcast_or_raise, check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError

__all__ = ["check_qkv", "key_mask", "relative_error"]


def key_mask(mask: object, batch: int, heads: int, t_k: int, method: str) -> torch.Tensor | None:
    """Validate a mask that hides keys only (the same for every query) and shape it
    ``(B or 1, H or 1, T_k)``.

    The approximations of this package mix or factorise the keys before any score exists, so
    they can honour a mask only when it is a property of the keys: a padding mask
    (:func:`attnlab.masks.padding_mask` gives ``(B, 1, 1, T_k)``), not a causal or per-query one.

    Args:
        mask: ``None`` or a boolean tensor, ``True = may attend``, broadcastable to
            ``(B, H, 1, T_k)``.
        batch: ``B``.
        heads: ``H``.
        t_k: ``T_k``.
        method: the method's name, for errors.

    Returns:
        ``None`` or the boolean mask viewed as ``(B or 1, H or 1, T_k)``.

    Raises:
        TypeError: not a tensor, or not boolean.
        ValueError: a shape that does not broadcast to ``(B, H, 1, T_k)`` (e.g. a causal mask).

    Shape:
        mask broadcastable to ``(B, H, 1, T_k)`` → ``(B or 1, H or 1, T_k)``.
    """
    if mask is None:
        return None
    m = check_tensor("mask", mask)
    if m.dtype != torch.bool:
        raise ArgumentTypeError(
            f"mask must be boolean (True = may attend) for {method}, got dtype {m.dtype}; an "
            f"additive mask cannot be applied before the scores exist"
        )
    if m.dim() >= 2 and m.shape[-2] != 1:
        raise ArgumentError(
            f"mask has shape {shape_str(m.shape)} but {method} can only hide keys for every query "
            f"alike: it must broadcast to (B, H, 1, T_k) = {shape_str((batch, heads, 1, t_k))} "
            f"(a padding mask); causal and per-query masks are not supported"
        )
    broadcast_or_raise("mask", m.shape, (batch, heads, 1, t_k), "(B, H, 1, T_k)")
    while m.dim() < 4:
        m = m.unsqueeze(0)
    return m[:, :, 0, :]  # (B or 1, H or 1, T_k)


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """``‖Ã − A‖_F / ‖A‖_F``, computed in float64.

    Args:
        approx: the approximation.
        exact: the exact value (not all zeros).

    Returns:
        The relative Frobenius error.

    Shape:
        approx and exact: the same shape.
    """
    if approx.shape != exact.shape:
        raise ArgumentError(
            f"approx and exact must have the same shape, got {shape_str(approx.shape)} and "
            f"{shape_str(exact.shape)}"
        )
    a, e = approx.detach().double(), exact.detach().double()
    return float(torch.linalg.vector_norm(a - e) / torch.linalg.vector_norm(e))


def check_qkv(query: object, key: object, value: object) -> None:
    """Check ``query``, ``key`` and ``value``: floating tensors of shape ``(..., T, D)``.

    Args:
        query: the queries.
        key: the keys.
        value: the values.

    Raises:
        TypeError: not a tensor, or not floating.
        ValueError: fewer than two dimensions.
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        t = check_tensor(name, x)
        if t.dim() < 2:
            raise ArgumentError(f"{name} must have shape (..., T, D), got {shape_str(t.shape)}")
        if not t.is_floating_point():
            raise ArgumentTypeError(f"{name} must have a floating dtype, got {t.dtype}")
