"""The ``"flex"`` backend: PyTorch's FlexAttention, attnlab's mask structure as a ``BlockMask``.

FlexAttention (``torch.nn.attention.flex_attention``) computes

    O = softmax(score_mod(Q Kᵀ · scale) with mask_mod's hidden entries → −∞) V

in one compiled kernel that skips every ``128 × 128`` tile the ``BlockMask`` marks empty. A
:class:`~attnlab.nn.mask_spec.Masking` maps onto it directly:

* the causal rule, the sliding window and a block layout (BigBird's) — *structure* — become one
  ``mask_mod``: query ``i`` (position ``p_i = i + T_k − T_q``) sees key ``j`` when
  ``i + lo <= j <= i + hi`` (:meth:`~attnlab.nn.mask_spec.Masking.bounds`) and
  ``blocks[p_i // b, j // b]``; a layout whose blocks are whole tiles gives its tiles to the
  ``BlockMask`` directly (the ``mask_mod`` then runs on the partial tiles only, those the
  bounds cut), others by evaluating the ``mask_mod`` (``create_block_mask``);
* a boolean ``allowed`` mask (padding, a per-row mask) is read inside the ``mask_mod``;
* a finite additive ``bias`` is a ``score_mod``: ``s + bias[b, h, i, j]``.

The ``BlockMask`` of the structure is built once per shape and kept in a small LRU cache keyed by
the structure, the lengths and the device (:func:`structure_block_mask`), so a training loop and
every layer of a model share it. A call with an ``allowed`` mask does not evaluate a mask over
``T_q × T_k`` entries either: it keeps the structure's tiles in which ``allowed`` lets some entry
through — ``allowed`` reduced over each tile, ``O(B · T_k)`` for padding — each marked *partial*
so that the kernel evaluates the ``mask_mod`` (which reads ``allowed``) on every entry of them,
and ``BlockMask.from_kv_blocks`` lists them on the device. Tiles hidden by padding are skipped;
nothing is read back to the host.
FlexAttention is compiled with static shapes, a kernel per shape, mask form and dtype (the
bounds ``lo``, ``hi`` are a tensor the kernel reads: the causal rule and every window share one
kernel, and under an ``allowed`` mask so does no window); past
``torch._dynamo.config.recompile_limit`` of them (8 by default) in one process PyTorch runs it
eagerly (exact, but it forms the ``T_q × T_k`` scores): raise the limit for many shapes
(:func:`allow_recompiles`).

Where FlexAttention cannot compute a call exactly the backend computes it on the exact
``"blockwise"`` path instead (:func:`flex_available` says which): dropout, float64, and on the
CPU (where PyTorch's FlexAttention has no backward pass) any call that needs a gradient, and a
call inside code that ``torch.compile`` traces (the CPU template does not fuse into a graph).
``need_weights`` returns the exact weights of the ``"math"`` backend next to FlexAttention's
output, as ``"sdpa"`` does.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attnlab.nn.backends.blockwise import blockwise_attention
from attnlab.nn.backends.common import head_groups, repeat_kv
from attnlab.nn.backends.math import math_attention
from attnlab.nn.mask_spec import Masking

__all__ = [
    "FLEX_BLOCK",
    "allow_recompiles",
    "flex_attention",
    "flex_available",
    "structure_block_mask",
]

#: FlexAttention's tile (rows and columns of a ``BlockMask`` block)
FLEX_BLOCK = 128
# how many structure-only block masks are kept (a model uses one or two shapes at a time)
_CACHE_SIZE = 16
_FLEX_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# mask_mod(b, h, q_idx, kv_idx) -> bool tensor; score_mod(score, b, h, q_idx, kv_idx) -> score
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class _Structure:
    """What the causal rule, the window and the block layout give FlexAttention at one shape.

    Attributes:
        mod: their ``mask_mod`` (the layout's block matrix already on the device), or ``None``
            when they hide nothing.
        block_mask: their ``BlockMask`` (tiles empty, partial or full), or ``None`` likewise.
        visited: ``True`` for each tile the structure does not hide entirely (partial or full):
            what a call that also reads an ``allowed`` mask may visit.
        rule: what a call that also reads an ``allowed`` mask evaluates next to it: ``mod``, or
            when that is ``None`` the bounds mod with both sides open (the kernel of any window).

    Shape:
        ``visited`` ``(1, 1, n_q, n_k)`` boolean, with ``n = ⌈T / 128⌉`` tiles.
    """

    mod: MaskMod | None
    block_mask: Any | None
    visited: torch.Tensor
    rule: MaskMod


_STRUCTURES: OrderedDict[tuple[Any, ...], _Structure] = OrderedDict()


def allow_recompiles(limit: int) -> None:
    """Let ``torch.compile`` keep ``limit`` kernels per function (FlexAttention: one per shape,
    mask and dtype) before it runs the function eagerly.

    Args:
        limit: the recompiles allowed; dynamo's option is ``recompile_limit`` since torch 2.7,
            ``cache_size_limit`` before, and setting an option a version lacks raises.
    """
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, limit)


def flex_available(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    masking: Masking,
    dropout_p: float,
) -> bool:
    """Whether FlexAttention computes this call exactly (else the backend takes ``"blockwise"``).

    Args:
        query: the queries.
        key: the keys.
        value: the values.
        masking: the normalised mask.
        dropout_p: dropout probability (FlexAttention has no dropout).

    Returns:
        ``True`` for fp32/fp16/bf16 inputs on a CUDA or CPU device without dropout, and on the
        CPU only when nothing needs a gradient (PyTorch's CPU FlexAttention is forward only) and
        outside code that ``torch.compile`` traces.

    Shape:
        as :func:`flex_attention`.
    """
    if dropout_p > 0 or query.dtype not in _FLEX_DTYPES:
        return False
    if query.device.type == "cuda":
        return True
    if query.device.type != "cpu" or torch.compiler.is_compiling():
        # torch 2.13's CPU flex template cannot fuse the caller's graph around it
        return False
    bias = masking.bias
    tensors = (query, key, value) if bias is None else (query, key, value, bias)
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def flex_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    masking: Masking,
    scale: float,
    dropout_p: float,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention through PyTorch's compiled FlexAttention, the mask as a ``BlockMask``.

    Args:
        query: the queries, validated by :func:`attnlab.scaled_dot_product_attention`.
        key: the keys; ``H`` is a multiple of ``H_kv`` (grouped-query attention).
        value: the values.
        masking: the normalised mask; every query row sees at least one key.
        scale: the score scale (``1 / √D`` by default upstream).
        dropout_p: dropout probability on the weights; non-zero runs the ``"blockwise"`` path.
        need_weights: also compute the attention weights (before dropout), by the ``"math"``
            backend.

    Returns:
        ``(output, weights)``, ``weights`` being ``None`` unless ``need_weights``.

    Shape:
        as :func:`attnlab.nn.backends.math.math_attention`: query ``(..., H, T_q, D)``, key
        ``(..., H_kv, T_k, D)``, value ``(..., H_kv, T_k, D_v)`` → output ``(..., H, T_q, D_v)``,
        weights ``(..., H, T_q, T_k)``.
    """
    if not flex_available(query, key, value, masking, dropout_p):
        return blockwise_attention(query, key, value, masking, scale, dropout_p, need_weights)
    if not torch.is_grad_enabled():  # torch's CPU FlexAttention refuses any requires_grad input
        query, key, value = query.detach(), key.detach(), value.detach()
    lead = query.shape[:-3]
    t_q, t_k = query.shape[-2], key.shape[-2]
    q4, k4, v4 = (_as_4d(t) for t in (query, key, value))
    groups = head_groups(query, key)
    gqa = groups > 1
    half_grad = query.dtype != torch.float32 and (key.requires_grad or value.requires_grad)
    if gqa and half_grad:
        # as in "sdpa": a fused GQA backward sums the grouped heads' gradients after rounding
        # each to the half type; repeating the heads first keeps fp32 sums
        k4, v4, gqa = repeat_kv(k4, groups), repeat_kv(v4, groups), False
    block_mask = _block_mask(masking, lead, t_q, t_k, query.device)
    bias = masking.bias
    if bias is not None and not torch.is_grad_enabled():
        bias = bias.detach()
    score_mod = None if bias is None else _bias_mod(bias, lead)
    out = _compiled()(
        q4, k4, v4, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa
    )
    out = out.reshape(*lead, *out.shape[-3:])
    weights = None
    if need_weights:
        _, weights = math_attention(query, key, value, masking, scale, 0.0, True)
    return out, weights


def structure_block_mask(masking: Masking, t_q: int, t_k: int, device: torch.device) -> Any | None:
    """The ``BlockMask`` of the causal rule, the window and the block layout, cached.

    Args:
        masking: the normalised mask (its ``allowed`` and ``bias`` are not read here).
        t_q: number of queries ``T_q``.
        t_k: number of keys ``T_k``.
        device: where the block mask lives.

    Returns:
        A ``torch.nn.attention.flex_attention.BlockMask`` over ``(1, 1, T_q, T_k)``, or ``None``
        when the structure hides nothing. The last ``16`` are cached by (bounds, layout, lengths,
        device).
    """
    return _structure(masking, t_q, t_k, device).block_mask


def _structure(masking: Masking, t_q: int, t_k: int, device: torch.device) -> _Structure:
    """The structure's ``mask_mod``, ``BlockMask`` and tiles, from the cache or built."""
    if torch.compiler.is_compiling():  # traced into the caller's graph: built there, no cache
        return _build_structure(masking, t_q, t_k, device)
    layout = masking.blocks
    layout_key = None if layout is None else (layout.block_size, layout.blocks.numpy().tobytes())
    key = (masking.bounds(t_q, t_k), layout_key, t_q, t_k, str(device))
    cached = _STRUCTURES.get(key)
    if cached is not None:
        _STRUCTURES.move_to_end(key)
        return cached
    built = _STRUCTURES[key] = _build_structure(masking, t_q, t_k, device)
    while len(_STRUCTURES) > _CACHE_SIZE:
        _STRUCTURES.popitem(last=False)
    return built


def _build_structure(masking: Masking, t_q: int, t_k: int, device: torch.device) -> _Structure:
    """Build :class:`_Structure`: the ``mask_mod``, its ``BlockMask`` and the non-empty tiles."""
    mod = _structure_mod(masking, t_q, t_k, device)
    if mod is None:
        n_q, n_k = -(-t_q // FLEX_BLOCK), -(-t_k // FLEX_BLOCK)
        visited = torch.ones(1, 1, n_q, n_k, dtype=torch.bool, device=device)
        return _Structure(None, None, visited, _bounds_mod(None, None, None, t_q, t_k, device))
    block_mask = _from_layout(masking, mod, t_q, t_k, device)
    if block_mask is None:
        block_mask = _create(mod, None, None, t_q, t_k, device)
    return _Structure(mod, block_mask, block_mask.to_dense() > 0, mod)  # partial or full


def _from_layout(
    masking: Masking, mod: MaskMod, t_q: int, t_k: int, device: torch.device
) -> Any | None:
    """The ``BlockMask`` of a block layout read from its blocks, tile by tile (``O(n_q · n_k)``
    tiles), where each ``128 × 128`` tile lies inside one layout block (``b`` a multiple of 128,
    ``T_k − T_q`` too); ``None`` otherwise (then ``create_block_mask`` evaluates the
    ``mask_mod`` over every entry: ``T_q · T_k`` of them, 20 s on two CPU cores at 4096).

    A tile is visited iff its layout block is visible and the bounds ``i + lo <= j <= i + hi``
    keep some entry of it; *full* (no ``mask_mod`` inside) iff they keep every entry and the
    tile is whole; *partial* otherwise. The same tiles, partial and full, as
    ``create_block_mask`` finds.
    """
    from torch.nn.attention.flex_attention import BlockMask

    layout = masking.blocks
    offset = t_k - t_q
    if layout is None or layout.block_size % FLEX_BLOCK or offset % FLEX_BLOCK:
        return None
    lo, hi = masking.bounds(t_q, t_k)
    n_q, n_k = -(-t_q // FLEX_BLOCK), -(-t_k // FLEX_BLOCK)
    i0 = torch.arange(n_q)[:, None] * FLEX_BLOCK  # first and last row and column of each tile
    j0 = torch.arange(n_k)[None, :] * FLEX_BLOCK
    i1, j1 = (i0 + FLEX_BLOCK).clamp(max=t_q) - 1, (j0 + FLEX_BLOCK).clamp(max=t_k) - 1
    ratio = layout.block_size // FLEX_BLOCK
    # the tile's layout block: rows at positions i + offset (a whole number of tiles)
    seen = layout.blocks[(torch.arange(n_q) + offset // FLEX_BLOCK) // ratio][
        :, torch.arange(n_k) // ratio
    ]
    # j − i over a tile runs through [j0 − i1, j1 − i0]: some entry in [lo, hi], or all of them
    some, every = seen.clone(), seen & (i1 - i0 == FLEX_BLOCK - 1) & (j1 - j0 == FLEX_BLOCK - 1)
    if lo is not None:
        some &= j1 - i0 >= lo
        every &= j0 - i1 >= lo
    if hi is not None:
        some &= j0 - i1 <= hi
        every &= j1 - i0 <= hi
    partial = some & ~every

    def listed(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # each row's tiles first, in column order (a stable sort of the flags)
        order = torch.argsort(tiles.to(torch.int8), dim=-1, descending=True, stable=True)
        counts = tiles.sum(-1, dtype=torch.int32)
        return counts[None, None].to(device), order.to(torch.int32)[None, None].to(device)

    kv_num, kv_idx = listed(partial)
    full_num, full_idx = listed(every)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=FLEX_BLOCK, mask_mod=mod,
        seq_lengths=(t_q, t_k),
    )  # fmt: skip


@functools.cache
def _compiled() -> Callable[..., torch.Tensor]:
    """FlexAttention compiled once per process (it is only fast, and on the CPU only runs, so).

    Static shapes: a kernel per shape (torch 2.13's CPU kernel for dynamic shapes does not compile
    when ``T_q != T_k``).
    """
    from torch.nn.attention.flex_attention import flex_attention as flex

    return torch.compile(flex, dynamic=False)  # type: ignore[no-any-return]


def _create(mod: MaskMod, b: int | None, h: int | None, t_q: int, t_k: int, device: Any) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(mod, b, h, t_q, t_k, device=device)


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    """``(..., H, T, D)`` → ``(B, H, T, D)``, the leading dims flattened (one batch of 1 if none)."""
    return t.reshape(-1, *t.shape[-3:])


def _as_mask_4d(m: torch.Tensor, lead: torch.Size) -> torch.Tensor:
    """A mask broadcastable to ``(..., H, T_q, T_k)`` as ``(B | 1, H | 1, T_q | 1, T_k | 1)``."""
    m = m.reshape((1,) * (len(lead) + 3 - m.dim()) + tuple(m.shape))
    if all(s == 1 for s in m.shape[: len(lead)]):
        return m.reshape(1, *m.shape[-3:])
    return m.expand(*lead, *m.shape[-3:]).reshape(-1, *m.shape[-3:])


def _index(m: torch.Tensor, b: Any, h: Any, i: Any, j: Any) -> torch.Tensor:
    """``m[b, h, i, j]`` of a 4-d mask whose size-1 dims broadcast."""
    idx = tuple(x if size > 1 else 0 for x, size in zip((b, h, i, j), m.shape, strict=True))
    return m[idx]


def _structure_mod(masking: Masking, t_q: int, t_k: int, device: torch.device) -> MaskMod | None:
    """The causal rule, the window and the layout as one ``mask_mod`` (``None``: none of them).

    ``i + lo <= j <= i + hi`` (the rule and the window) and ``blocks[(i + T_k − T_q) // b, j // b]``.
    """
    lo, hi = masking.bounds(t_q, t_k)
    layout = masking.blocks
    if lo is None and hi is None and layout is None:
        return None
    return _bounds_mod(lo, hi, layout, t_q, t_k, device)


def _bounds_mod(
    lo: int | None, hi: int | None, layout: Any | None, t_q: int, t_k: int, device: torch.device
) -> MaskMod:
    """``i + lo <= j <= i + hi`` and ``blocks[(i + T_k − T_q) // b, j // b]`` as a ``mask_mod``.

    The bounds are a tensor the kernel reads, not constants compiled into it, and an open side is
    a bound that keeps every key (``lo = −T_q``, ``hi = T_k``): one compiled kernel per shape
    serves the causal rule, every window and neither (the layers of a model with windows of other
    widths, a padded call with or without a window), where constants would compile one each.
    """
    # the layout's block matrix is small and kept on the CPU: one copy per call that builds a mask
    blocks = None if layout is None else layout.blocks.to(device)
    size = 0 if layout is None else layout.block_size
    offset = t_k - t_q
    bounds = torch.tensor(
        [-t_q if lo is None else lo, t_k if hi is None else hi], dtype=torch.int32, device=device
    )

    def mod(b: Any, h: Any, i: Any, j: Any) -> torch.Tensor:
        ok = (j >= i + bounds[0]) & (j <= i + bounds[1])
        if blocks is not None:
            ok = ok & blocks[(i + offset) // size, j // size]
        return ok

    return mod


def _block_mask(
    masking: Masking, lead: torch.Size, t_q: int, t_k: int, device: torch.device
) -> Any | None:
    """The call's ``BlockMask``: the structure's, or with ``allowed`` its tiles in which
    ``allowed`` lets something through, all partial.

    ``allowed`` is read in the ``mask_mod``, ``allowed[b, h, i, j] and structure(i, j)``, on
    every tile kept; which tiles is decided per tile on the device (:func:`_tiles_allowed`),
    without evaluating anything over ``T_q × T_k`` beyond the mask itself.
    """
    from torch.nn.attention.flex_attention import BlockMask

    structure = _structure(masking, t_q, t_k, device)
    if masking.allowed is None:
        return structure.block_mask
    allowed = _as_mask_4d(masking.allowed, lead)
    rule = structure.rule  # never None: with or without a window, one kernel per shape

    def mod(b: Any, h: Any, i: Any, j: Any) -> torch.Tensor:
        return _index(allowed, b, h, i, j) & rule(b, h, i, j)

    # the kept tiles of each row first, in column order (a stable sort of the flags)
    visited = structure.visited & _tiles_allowed(allowed, t_q, t_k)  # (B | 1, H | 1, n_q, n_k)
    counts = visited.sum(-1, dtype=torch.int32)
    order = torch.argsort(visited.to(torch.int8), dim=-1, descending=True, stable=True)
    return BlockMask.from_kv_blocks(
        counts, order.to(torch.int32), BLOCK_SIZE=FLEX_BLOCK, mask_mod=mod, seq_lengths=(t_q, t_k)
    )


def _tiles_allowed(allowed: torch.Tensor, t_q: int, t_k: int) -> torch.Tensor:
    """``True`` for each ``128 × 128`` tile in which ``allowed`` lets some entry through: the
    mask reduced over the tile (a size-1 dimension stays one, broadcasting over the tiles).

    Shape:
        allowed ``(B | 1, H | 1, T_q | 1, T_k | 1)`` → ``(B | 1, H | 1, n_q | 1, n_k | 1)``.
    """
    for dim, t in ((-1, t_k), (-2, t_q)):
        if allowed.shape[dim] == 1:
            continue
        n = -(-t // FLEX_BLOCK)
        pad = [0, 0] * (-dim - 1) + [0, n * FLEX_BLOCK - t]  # pad the end of `dim` with False
        allowed = torch.nn.functional.pad(allowed, pad)
        shape = (*allowed.shape[:dim], n, FLEX_BLOCK) + ((allowed.shape[-1],) if dim == -2 else ())
        allowed = allowed.reshape(shape).any(dim=dim)
    return allowed


def _bias_mod(bias: torch.Tensor, lead: torch.Size) -> Callable[..., torch.Tensor]:
    """``score_mod``: ``s + bias[b, h, i, j]`` (the bias broadcast as the scores)."""
    bias4 = _as_mask_4d(bias, lead)

    def mod(score: torch.Tensor, b: Any, h: Any, i: Any, j: Any) -> torch.Tensor:
        return score + _index(bias4, b, h, i, j).to(score.dtype)

    return mod
