"""Scaled dot-product attention — the functional core, with interchangeable backends.

Vaswani et al. (2017), §3.2.1:

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V

``M`` is the mask: a boolean mask hides keys (``True = may attend``), a floating mask is added to
the scores. Causal masking is aligned bottom-right (see :mod:`attnlab.nn.masks`).

Backends (all give the same numbers within the float tolerance of their dtype):

* ``"math"`` — the explicit equation, materialises the ``T_q × T_k`` weights; the readable reference.
* ``"sdpa"`` — PyTorch's fused ``scaled_dot_product_attention`` (flash / memory-efficient kernels).
* ``"blockwise"`` — online softmax over key blocks (Milakov & Gimelshein 2018; Dao et al. 2022):
  memory ``O(T · block)``, key blocks hidden by the causal mask, a window or a block layout are
  skipped, and the backward pass recomputes the weights block by block instead of storing them;
  its tiles run in PyTorch's fused CPU kernel, merged by log-sum-exp, or written out in PyTorch.
* ``"flex"`` — PyTorch's compiled FlexAttention (:mod:`attnlab.nn.backends.flex`): the causal
  rule, the window and a block layout as a cached ``BlockMask`` whose empty tiles are skipped, a
  boolean mask as a ``mask_mod``, a floating mask as a ``score_mod``; dropout, float64 and, on the
  CPU (forward only there), calls that need a gradient run the exact ``"blockwise"`` path.
* ``"auto"`` — ``"math"`` when the weights are asked for (it computes them anyway), else
  ``"flex"`` on CUDA under a block layout or a window (for ``T_q >= 128``), else ``"blockwise"`` under a ``block_mask`` that hides some block or a narrow sliding window (it
  skips the hidden tiles), else ``"sdpa"`` (:func:`~attnlab.nn.backends.choose_backend`).

Conventions every backend keeps:

* a query row that may attend to no key gives an output row of zeros, a weight row of zeros and
  zero gradients — never NaN;
* NaN or inf stored in keys/values that *no* query may see (padding) never reaches the output;
  a non-finite query row, key or value reaches exactly the rows that may see it (they are NaN)
  and nothing else; backward, those rows' queries and the keys and values they may see get NaN
  gradients, every other gradient is exact (:mod:`attnlab.nn.nonfinite`);
* ``is_causal=True`` together with an explicit ``mask``: both apply — a key is visible only where
  the mask allows it **and** it is not in the future (PyTorch's own function refuses the pair);
* ``need_weights=True`` returns the exact softmax weights (before dropout) from any backend;
* ``window=(left, right)`` (sliding-window attention) works on every backend, with every mask and
  with ``is_causal``, aligned bottom-right as the causal rule;
* ``block_mask=`` (a :class:`~attnlab.nn.masks.BlockLayout`, block-sparse attention such as
  BigBird's) works on every backend, with every mask, ``is_causal`` and ``window``; the
  ``"blockwise"`` backend visits only the visible tiles.
"""

from __future__ import annotations

import math
from typing import Literal, overload

import torch

from attnlab._checks import check_floating, check_probability, check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.nn.backends import (
    ATTENTION_BACKENDS,
    check_backend,
    check_softcap,
    choose_backend,
    get_backend,
)
from attnlab.nn.mask_spec import Masking, empty_rows, hide_unseen_keys, normalize_mask
from attnlab.nn.masks import BlockLayout, Window
from attnlab.nn.nonfinite import guard_nonfinite, poison_rows

__all__ = ["BACKENDS", "Backend", "attend", "scaled_dot_product_attention"]

# a backend's name: "auto" or a registered one (attnlab.nn.backends.register_backend)
Backend = str
#: the names ``backend=`` accepts when attnlab is imported (registering adds to them)
BACKENDS: tuple[str, ...] = ("auto", *ATTENTION_BACKENDS)


@overload
def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = ...,
    *,
    is_causal: bool = ...,
    dropout_p: float = ...,
    scale: float | None = ...,
    backend: Backend = ...,
    need_weights: Literal[False] = ...,
    window: Window = ...,
    block_mask: BlockLayout | None = ...,
) -> torch.Tensor: ...


@overload
def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = ...,
    *,
    is_causal: bool = ...,
    dropout_p: float = ...,
    scale: float | None = ...,
    backend: Backend = ...,
    need_weights: Literal[True],
    window: Window = ...,
    block_mask: BlockLayout | None = ...,
) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = ...,
    *,
    is_causal: bool = ...,
    dropout_p: float = ...,
    scale: float | None = ...,
    backend: Backend = ...,
    need_weights: bool,
    window: Window = ...,
    block_mask: BlockLayout | None = ...,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    backend: Backend = "auto",
    need_weights: bool = False,
    window: Window = None,
    block_mask: BlockLayout | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, ``softmax(Q Kᵀ · scale + M) V``.

    Args:
        query: the queries.
        key: the keys; ``H`` must be a multiple of ``H_kv`` (grouped-query attention; ``H_kv = 1``
            is multi-query attention). Query head ``h`` reads key/value head ``h // (H // H_kv)``.
        value: the values.
        mask: ``None``, a boolean mask (``True = may attend``) or a floating additive bias, either
            broadcastable to ``(..., H, T_q, T_k)``. Integer and uint8 masks are refused.
        is_causal: hide future keys, aligned bottom-right (query ``i`` sees ``j <= i + T_k - T_q``).
            Combines with ``mask``: a key must pass both.
        dropout_p: dropout probability on the attention weights, in ``[0, 1)``. Applied whenever it
            is non-zero (pass ``0.0`` in evaluation, as ``nn.Module`` callers do with ``self.training``).
        scale: the score scale; default ``1 / √D``.
        backend: ``"auto"``, ``"math"``, ``"sdpa"``, ``"blockwise"`` or ``"flex"`` (see the
            module docstring).
        need_weights: also return the attention weights (softmax probabilities, before dropout).
        window: sliding-window (local) attention, FlashAttention's ``window_size``: ``None``
            (default, no window), an int ``w`` meaning ``(w, 0)``, or ``(left, right)``. Query
            ``i``, at position ``p_i = i + T_k - T_q`` (bottom-right, as ``is_causal``), sees keys
            ``p_i - left <= j <= p_i + right``; a side ``None`` is unbounded (FlashAttention's
            ``-1``; negative sides are refused). Combines with ``mask`` and ``is_causal``: a key
            must pass all of them. The ``"blockwise"`` backend visits only the tiles that meet
            the band (time and memory ``O(T · w)``); equivalent to the dense
            :func:`attnlab.masks.sliding_window_mask`.
        block_mask: block-sparse attention (BigBird, Longformer's global tokens): ``None``
            (default) or a :class:`attnlab.masks.BlockLayout` over the ``T_k`` key positions,
            e.g. :func:`attnlab.masks.bigbird_layout`; query ``i`` (position
            ``p_i = i + T_k - T_q``) sees key ``j`` only where the layout's block
            ``(p_i // b, j // b)`` is visible (and ``j <= p_i`` for a causal layout). Combines
            with ``mask``, ``is_causal`` and ``window``: a key must pass all of them. Every
            backend applies it; ``"blockwise"`` visits only the visible tiles (time and memory
            grow with the number of visible blocks, not ``T²``); equivalent to the dense
            ``block_mask.to_dense(T_q)``.

    Returns:
        ``output``, or ``(output, weights)`` when ``need_weights`` is true.

    Shape:
        - query ``(..., H, T_q, D)``, key ``(..., H_kv, T_k, D)``, value ``(..., H_kv, T_k, D_v)``
          with the same leading dims ``...`` (e.g. a batch ``B``)
        - mask broadcastable to ``(..., H, T_q, T_k)``
        - output ``(..., H, T_q, D_v)``; weights ``(..., H, T_q, T_k)``

        ``H``: query heads, ``H_kv``: key/value heads, ``T_q``/``T_k``: query/key lengths,
        ``D``: head dimension of queries and keys, ``D_v``: head dimension of values.

    Examples:
        >>> q = torch.randn(2, 8, 5, 64); k = v = torch.randn(2, 2, 7, 64)   # GQA: 8 heads over 2
        >>> out, w = scaled_dot_product_attention(q, k, v, is_causal=True, need_weights=True)
        >>> out.shape, w.shape
        (torch.Size([2, 8, 5, 64]), torch.Size([2, 8, 5, 7]))
    """
    if not (isinstance(backend, str) and (backend == "auto" or backend in ATTENTION_BACKENDS)):
        check_backend(backend)  # raises, naming the backends
    if type(dropout_p) is not float or dropout_p != 0.0:
        dropout_p = check_probability("dropout_p", dropout_p)
    _check_qkv(query, key, value)
    if not isinstance(is_causal, bool):
        raise ArgumentTypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if scale is None:
        # with D = 0 every score is 0 whatever the scale: uniform weights, the mean of the values
        scale = query.shape[-1] ** -0.5 if query.shape[-1] else 1.0
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise ArgumentTypeError(f"scale must be a float or None, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ArgumentError(f"scale must be finite, got {scale}")

    masking = normalize_mask(query, key, mask, is_causal, window, block_mask)
    return attend(query, key, value, masking, scale, dropout_p, backend, need_weights)


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    masking: Masking,
    scale: float,
    dropout_p: float,
    backend: Backend,
    need_weights: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The core of :func:`scaled_dot_product_attention` on checked arguments and a normalised
    mask: rows that may see no key, keys that no query sees, the backend. For callers that build
    ``query``, ``key`` and ``value`` themselves (:class:`~attnlab.nn.multihead.MultiHeadAttention`),
    so that a decoding step does not pay for checks its inputs pass by construction.

    Args:
        query: the queries, checked as :func:`scaled_dot_product_attention` checks them.
        key: the keys (``H_kv`` heads, ``H`` a multiple of ``H_kv``).
        value: the values.
        masking: the mask after :func:`~attnlab.nn.mask_spec.normalize_mask` (``is_causal``,
            ``window`` and ``block_mask`` folded in).
        scale: the score scale, e.g. ``1 / √D``.
        dropout_p: dropout probability on the attention weights, in ``[0, 1)``.
        backend: a registered backend's name or ``"auto"`` (``"math"`` when the weights are
            asked for, else ``"blockwise"`` under a block layout or a narrow window, else
            ``"sdpa"``: see :func:`~attnlab.nn.backends.choose_backend`).
        need_weights: also return the attention weights (before dropout).

    Returns:
        ``output``, or ``(output, weights)`` when ``need_weights`` is true; rows that may see no
        key are zero in both.

    Shape:
        as :func:`scaled_dot_product_attention`: query ``(..., H, T_q, D)``, key
        ``(..., H_kv, T_k, D)``, value ``(..., H_kv, T_k, D_v)``; output ``(..., H, T_q, D_v)``,
        weights ``(..., H, T_q, T_k)``.
    """
    device = query.device.type
    if torch.is_autocast_enabled(device):
        # autocast would run the fp32 scores, softmax and P·V of math and blockwise in its low
        # precision: under autocast, attention computes as it does for inputs of their own dtype
        with torch.autocast(device, enabled=False):
            return attend(query, key, value, masking, scale, dropout_p, backend, need_weights)
    backend = choose_backend(
        backend, need_weights, masking, query.shape[-2], key.shape[-2], query.device
    )
    check_softcap(backend, masking)
    if _empty(query, key, value):
        # empty in, empty out (PyTorch's rule); the explicit equation handles every empty case
        # (no key at all: every row fully masked, zeros; D = 0: the mean of the values)
        backend = "math"

    t_q, t_k = query.shape[-2], key.shape[-2]
    # keys that no query may see are zeroed before empty rows are opened (an opened row "sees"
    # them, but its output is zeroed below): NaN/inf stored there cannot reach the other rows
    if masking.blocks is not None:
        key, value = hide_unseen_keys(
            masking.allowed, key, value, masking.bounds(t_q, t_k), t_q, masking.blocks
        )
    elif masking.window is not None:
        key, value = hide_unseen_keys(masking.allowed, key, value, masking.bounds(t_q, t_k), t_q)
    elif masking.allowed is not None:
        # a mask that differs per row, under the causal rule, can leave keys seen only by rows
        # the rule keeps them from: the rule's bounds count then
        causal = masking.causal_offset is not None and masking.allowed.shape[-2] > 1
        bounds = (None, masking.causal_offset) if causal else None
        key, value = hide_unseen_keys(masking.allowed, key, value, bounds, t_q)
    # NaN/inf reach exactly the rows that may see them: the backend gets finite inputs and the
    # rows a non-finite entry may reach are set to NaN afterwards (attnlab.nn.nonfinite)
    query, key, value, reach = guard_nonfinite(query, key, value, masking)
    empty = empty_rows(masking, t_q, t_k, query.device)
    if empty is not None:
        # Rows that may see no key: let them see every key, so that no backend meets an all -inf
        # row (NaN forward *and* backward), then zero them below. Their upstream gradient is zero,
        # so they add nothing to the gradients of keys and values.
        masking = masking.open_rows(empty, t_q, t_k, query.device)

    out, weights = get_backend(backend)(query, key, value, masking, scale, dropout_p, need_weights)
    out = poison_rows(out, reach)
    if weights is not None:
        weights = poison_rows(weights, reach)
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
        if weights is not None:
            weights = weights.masked_fill(empty, 0.0)
    if not need_weights:
        return out
    if weights is None:
        raise RuntimeError(
            f"the {backend!r} backend returned no weights although they were asked for"
        )
    return out, weights


def _empty(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether some dimension of the problem is zero (batch, heads, lengths or head dims)."""
    return query.numel() == 0 or key.numel() == 0 or value.numel() == 0


def _check_qkv(query: object, key: object, value: object) -> None:
    if (
        isinstance(query, torch.Tensor)
        and isinstance(key, torch.Tensor)
        and isinstance(value, torch.Tensor)
    ):
        # the usual case in one pass (a call's checks are a third of its host time at T = 16);
        # anything it does not accept takes the checks below, which say what is wrong
        qs, ks, vs = query.shape, key.shape, value.shape
        if (
            len(qs) >= 3
            and len(ks) == len(qs)
            and len(vs) == len(qs)
            and query.dtype == key.dtype == value.dtype
            and query.dtype.is_floating_point
            and qs[:-3] == ks[:-3] == vs[:-3]
            and qs[-1] == ks[-1]
            and ks[-3:-1] == vs[-3:-1]
            and ks[-3] > 0
            and qs[-3] % ks[-3] == 0
            and (
                (query.is_cpu and key.is_cpu and value.is_cpu)  # a flag, not three devices built
                or query.device == key.device == value.device
            )
        ):
            return
    q = check_tensor("query", query)
    k = check_tensor("key", key)
    v = check_tensor("value", value)
    for name, t in (("query", q), ("key", k), ("value", v)):
        check_floating(name, t)
        if t.dim() < 3:
            raise ArgumentError(
                f"{name} must have shape (..., H, T, D) with at least 3 dims, got {shape_str(t.shape)}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise ArgumentTypeError(
            f"query, key and value must share a dtype, got {q.dtype}, {k.dtype} and {v.dtype}"
        )
    if not (q.device == k.device == v.device):
        raise ArgumentError(
            f"query, key and value must be on one device, got {q.device}, {k.device} and {v.device}"
        )
    if not (q.dim() == k.dim() == v.dim()):
        raise ArgumentError(
            f"query, key and value must have the same rank, got shapes {shape_str(q.shape)}, "
            f"{shape_str(k.shape)} and {shape_str(v.shape)}"
        )
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-3] != v.shape[:-3]:
        raise ArgumentError(
            f"query, key and value must share leading (batch) dims, got {shape_str(q.shape[:-3])}, "
            f"{shape_str(k.shape[:-3])} and {shape_str(v.shape[:-3])}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ArgumentError(
            f"query and key head dims must match, got D = {q.shape[-1]} and {k.shape[-1]}"
        )
    if k.shape[-3] != v.shape[-3] or k.shape[-2] != v.shape[-2]:
        raise ArgumentError(
            f"key and value must have the same heads and length (H_kv, T_k), got "
            f"{shape_str(k.shape[-3:-1])} and {shape_str(v.shape[-3:-1])}"
        )
    h, h_kv = q.shape[-3], k.shape[-3]
    if h_kv == 0:
        if h != 0:
            raise ArgumentError(f"query heads H = {h} need key/value heads, got H_kv = 0")
    elif h % h_kv != 0:
        raise ArgumentError(
            f"query heads H = {h} must be a multiple of key/value heads H_kv = {h_kv}"
        )
