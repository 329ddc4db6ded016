"""Masks: the one place where attention masks are built.

The convention everywhere in attnlab (and in ``torch.nn.functional.scaled_dot_product_attention``):

* a **boolean** mask means ``True = may attend``;
* a **floating** mask is an additive bias on the scores (``-inf`` or the dtype's minimum hides a key);
* masks broadcast to ``(B, H, T_q, T_k)``.

Causal masks are aligned **bottom-right**: with ``T_q != T_k`` query ``i`` sees keys
``j <= i + (T_k - T_q)``, so the queries are the *last* ``T_q`` positions of the key sequence —
exactly the situation of a decoding step with a KV cache.

A sliding window (Beltagy et al. 2020, Longformer; Mistral 7B; FlashAttention's ``window_size``)
is aligned the same way: with ``window = (left, right)`` query ``i``, at position
``p_i = i + (T_k - T_q)``, sees keys ``p_i - left <= j <= p_i + right``.

Block-sparse layouts (:class:`BlockLayout`, BigBird's :func:`bigbird_layout`) live in
:mod:`attnlab.nn.block_layout`; this module re-exports them, so that every mask is here.
"""

from __future__ import annotations

from typing import overload

import torch

from attnlab._checks import check_positive_int, check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.nn.block_layout import BlockLayout, bigbird_layout, bigbird_mask, expand_blocks

#: a ``window=`` argument: ``None`` (no window), an int ``w`` (= ``(w, 0)``), or a pair
#: ``(left, right)`` of non-negative ints where ``None`` leaves that side unbounded
Window = int | tuple[int | None, int | None] | None

__all__ = [
    "BlockLayout",
    "Window",
    "bigbird_layout",
    "bigbird_mask",
    "causal_mask",
    "combine",
    "expand_blocks",
    "from_key_padding_mask",
    "is_masked_bias",
    "normalize_window",
    "padding_mask",
    "sliding_window_mask",
    "to_additive",
]


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Keys that are real tokens (not padding).

    Args:
        tokens: integer token ids.
        pad_id: the padding id.

    Returns:
        A boolean mask, ``True`` where ``tokens != pad_id``.

    Shape:
        tokens ``(B, T)`` → mask ``(B, 1, 1, T)`` (broadcasts over heads and queries).

    Examples:
        >>> padding_mask(torch.tensor([[5, 6, 0]]), pad_id=0).squeeze()
        tensor([ True,  True, False])
    """
    check_tensor("tokens", tokens)
    if tokens.dim() != 2:
        raise ArgumentError(f"tokens must have shape (B, T), got {shape_str(tokens.shape)}")
    if tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise ArgumentTypeError(f"tokens must be integer token ids, got dtype {tokens.dtype}")
    if isinstance(pad_id, bool) or not isinstance(pad_id, int):
        raise ArgumentTypeError(f"pad_id must be an int (the padding token id), got {pad_id!r}")
    return (tokens != pad_id)[:, None, None, :]


def causal_mask(
    q_len: int, k_len: int | None = None, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """The look-ahead mask, aligned bottom-right.

    ``mask[i, j] = j <= i + (k_len - q_len)``.

    Args:
        q_len: number of queries ``T_q``.
        k_len: number of keys ``T_k`` (default ``q_len``).
        device: where to build it (default: the current default device).

    Returns:
        A boolean mask, ``True = may attend``.

    Raises:
        ValueError: ``q_len`` or ``k_len`` is not a positive int.

    Shape:
        ``(T_q, T_k)`` boolean.

    Examples:
        >>> causal_mask(2, 4).int()
        tensor([[1, 1, 1, 0],
                [1, 1, 1, 1]], dtype=torch.int32)
    """
    check_positive_int("q_len", q_len)
    k_len = q_len if k_len is None else check_positive_int("k_len", k_len)
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    return j <= i + (k_len - q_len)


def normalize_window(window: object) -> tuple[int | None, int | None] | None:
    """Check a ``window=`` argument and bring it to the form ``(left, right)``.

    FlashAttention's ``window_size`` semantics, aligned bottom-right like the causal mask: query
    ``i`` at position ``p_i = i + (T_k - T_q)`` sees keys ``p_i - left <= j <= p_i + right``.
    An int ``w`` means ``(w, 0)``: the key of the query's own position and the ``w`` before it
    (Mistral's sliding window of ``w + 1`` keys). A side given as ``None`` is unbounded (what
    FlashAttention writes ``-1``); negative sides are refused.

    Args:
        window: ``None``, an int ``w >= 0``, or a pair ``(left, right)`` of ints ``>= 0`` or
            ``None``.

    Returns:
        ``(left, right)`` (either side ``None`` when unbounded), or ``None`` when there is no
        window at all (``None`` or ``(None, None)``).

    Raises:
        TypeError: ``window`` is not an int, a pair of ints/``None``, or ``None``.
        ValueError: a side is negative.

    Examples:
        >>> normalize_window(3), normalize_window((2, None)), normalize_window(None)
        ((3, 0), (2, None), None)
    """
    if window is None:
        return None
    if isinstance(window, int) and not isinstance(window, bool):
        sides: tuple[object, ...] = (window, 0)
    elif isinstance(window, (tuple, list)) and len(window) == 2:
        sides = tuple(window)
    else:
        raise ArgumentTypeError(
            f"window must be None, an int w (= (w, 0)) or a pair (left, right) of ints or None, "
            f"got {window!r}"
        )
    for name, side in zip(("left", "right"), sides):
        if side is None:
            continue
        if isinstance(side, bool) or not isinstance(side, int):
            raise ArgumentTypeError(
                f"window = (left, right) must hold ints or None (unbounded), got {name} = "
                f"{side!r} ({type(side).__name__})"
            )
        if side < 0:
            raise ArgumentError(
                f"window = (left, right) must be >= 0, got {name} = {side}; write None for an "
                f"unbounded side (FlashAttention's -1)"
            )
    left, right = sides
    if left is None and right is None:
        return None
    return left, right  # type: ignore[return-value]


def sliding_window_mask(
    t_q: int, t_k: int, window: Window, device: torch.device | str | None = None
) -> torch.Tensor:
    """The sliding-window (local attention) mask, aligned bottom-right.

    ``mask[i, j] = p_i - left <= j <= p_i + right`` with ``p_i = i + (t_k - t_q)``, the dense
    equivalent of ``window=`` in :func:`attnlab.scaled_dot_product_attention` (which never
    builds it where it can skip the hidden tiles instead). ``sliding_window_mask(t, t, (w, 0))``
    is the causal mask restricted to the last ``w + 1`` keys; combine it with
    :func:`causal_mask` for a window with ``right > 0`` under a causal rule.

    Args:
        t_q: number of queries ``T_q``.
        t_k: number of keys ``T_k``.
        window: an int ``w`` (= ``(w, 0)``), a pair ``(left, right)`` of ints ``>= 0`` or
            ``None`` (unbounded side), or ``None`` (every key visible), see
            :func:`normalize_window`.
        device: where to build it (default: the current default device).

    Returns:
        A boolean mask, ``True = may attend``.

    Raises:
        ValueError: ``t_q`` or ``t_k`` is not a positive int, or a side of ``window`` is negative.
        TypeError: ``window`` is not an int, a pair or ``None``.

    Shape:
        ``(T_q, T_k)`` boolean.

    Examples:
        >>> sliding_window_mask(4, 4, 1).int()
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 1, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
    """
    check_positive_int("t_q", t_q)
    check_positive_int("t_k", t_k)
    sides = normalize_window(window)
    i = torch.arange(t_q, device=device)[:, None] + (t_k - t_q)  # the queries' positions
    j = torch.arange(t_k, device=device)[None, :]
    mask = torch.ones(t_q, t_k, dtype=torch.bool, device=device)
    if sides is not None:
        left, right = sides
        if left is not None:
            mask &= j >= i - left
        if right is not None:
            mask &= j <= i + right
    return mask


def is_masked_bias(bias: torch.Tensor) -> torch.Tensor:
    """Where an additive bias hides a key: ``-inf``, or at most the dtype's (finite) minimum.

    Args:
        bias: a floating additive mask.

    Returns:
        A boolean tensor, ``True`` where the key is hidden.

    Shape:
        any; the result has the shape of ``bias``.
    """
    return bias <= torch.finfo(bias.dtype).min


def to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A boolean mask as an additive bias: ``0`` where allowed, ``finfo(dtype).min`` where hidden.

    The minimum is finite and representable in ``dtype`` (never ``-1e9``, which overflows fp16), and
    attnlab's attention treats it exactly like ``-inf``: a row hidden everywhere gives zeros.
    A floating mask is returned cast to ``dtype``; an already hidden entry stays hidden.

    Args:
        mask: a boolean mask (``True = may attend``) or a floating additive bias.
        dtype: a floating dtype for the bias; default ``torch.float32``.

    Returns:
        The additive bias, in ``dtype``.

    Raises:
        TypeError: ``mask`` is neither bool nor floating, or ``dtype`` is not a floating dtype.

    Shape:
        any; the result has the shape of ``mask``.
    """
    check_tensor("mask", mask)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ArgumentTypeError(f"dtype must be a floating torch.dtype, got {dtype}")
    low = torch.finfo(dtype).min
    if mask.dtype == torch.bool:
        zeros = torch.zeros((), dtype=dtype, device=mask.device)
        return zeros.masked_fill(~mask, low).expand(mask.shape).clone()
    if mask.is_floating_point():
        hidden = is_masked_bias(mask)
        return mask.to(dtype).clamp(min=low).masked_fill(hidden, low)
    raise ArgumentTypeError(f"mask must be bool or floating, got dtype {mask.dtype}")


@overload
def combine(mask: torch.Tensor, /, *masks: torch.Tensor | None) -> torch.Tensor: ...


@overload
def combine(*masks: torch.Tensor | None) -> torch.Tensor | None: ...


def combine(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Combine masks so that a key is visible only where **every** mask allows it.

    Booleans are and-ed; if any mask is floating the result is an additive bias (booleans are
    converted with :func:`to_additive`, biases are added). ``None`` entries are skipped; with no mask
    at all the result is ``None``.

    Args:
        *masks: boolean masks, floating biases or ``None``, broadcastable together.

    Returns:
        The combined mask (boolean if every mask is boolean, else an additive bias in the widest
        floating dtype), or ``None`` when no mask was given.

    Raises:
        TypeError: a mask is neither bool nor floating.
        ValueError: the masks do not broadcast together.

    Shape:
        the broadcast of the inputs' shapes.

    Examples:
        >>> tokens = torch.tensor([[7, 8, 0]])
        >>> m = combine(padding_mask(tokens, 0), causal_mask(3))  # (1, 1, 3, 3)
    """
    present = [m for m in masks if m is not None]
    for k, m in enumerate(present):
        check_tensor(f"masks[{k}]", m)
        if not (m.dtype == torch.bool or m.is_floating_point()):
            raise ArgumentTypeError(f"masks[{k}] must be bool or floating, got dtype {m.dtype}")
    if not present:
        return None
    try:
        shape = torch.broadcast_shapes(*(m.shape for m in present))
    except RuntimeError:
        shapes = ", ".join(shape_str(m.shape) for m in present)
        raise ArgumentError(f"masks do not broadcast together: {shapes}") from None
    floats = [m for m in present if m.is_floating_point()]
    if not floats:
        out = present[0]
        for m in present[1:]:
            out = out & m
        return out.expand(shape)
    dtype = torch.promote_types(*(m.dtype for m in floats)) if len(floats) > 1 else floats[0].dtype
    out = torch.zeros(shape, dtype=dtype, device=present[0].device)
    hidden = torch.zeros(shape, dtype=torch.bool, device=out.device)
    for m in present:
        if m.dtype == torch.bool:
            hidden = hidden | ~m
        else:
            hidden = hidden | is_masked_bias(m)
            out = out + m.to(dtype)
    return out.masked_fill(hidden, torch.finfo(dtype).min)


def from_key_padding_mask(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """Convert PyTorch ``nn.MultiheadAttention``'s ``key_padding_mask`` (``True = ignore``).

    A boolean mask is inverted to attnlab's polarity (``True = may attend``); a floating one is
    already an additive bias and is only reshaped.

    Args:
        key_padding_mask: ``True`` (or ``-inf``) for keys to ignore, PyTorch's polarity.

    Returns:
        The mask in attnlab's form: boolean ``True = may attend``, or the same additive bias.

    Raises:
        ValueError: ``key_padding_mask`` is not 2-D.
        TypeError: it is neither bool nor floating.

    Shape:
        ``(B, T_k)`` → ``(B, 1, 1, T_k)``.
    """
    check_tensor("key_padding_mask", key_padding_mask)
    if key_padding_mask.dim() != 2:
        raise ArgumentError(
            f"key_padding_mask must have shape (B, T_k), got {shape_str(key_padding_mask.shape)}"
        )
    if key_padding_mask.dtype == torch.bool:
        return ~key_padding_mask[:, None, None, :]
    if key_padding_mask.is_floating_point():
        return key_padding_mask[:, None, None, :]
    raise ArgumentTypeError(
        f"key_padding_mask must be bool or floating, got dtype {key_padding_mask.dtype}"
    )
