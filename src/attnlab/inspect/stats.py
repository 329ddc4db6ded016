"""Attention statistics for long sequences, without the ``T_q × T_k`` weight matrix.

For one query row with scores ``s_j = q·k_j · scale + b_j`` and weights ``p_j = softmax(s)_j``:

    LSE         = log Σ_j e^{s_j}
    max weight  = max_j p_j = e^{max_j s_j − LSE}
    entropy     = −Σ_j p_j log p_j = LSE − Σ_j p_j s_j
                = LSE − scale · q·(Σ_j p_j k_j) − Σ_j p_j b_j

The last line is why no score needs to be kept: ``Σ_j p_j k_j`` is an attention output with the
keys as values. Everything is accumulated over key blocks with the online-softmax recurrence
(Milakov & Gimelshein 2018; the forward of FlashAttention), keeping per row the running maximum
``m``, the normaliser ``l = Σ e^{s_j − m}`` and ``u = Σ e^{s_j − m} k_j``:

    m' = max(m, rowmax(S_b)),   α = e^{m − m'}
    l' = α · l + Σ_b e^{s_j − m'}
    u' = α · u + Σ_b e^{s_j − m'} k_j        (one matmul with [K_b, 1] also yields Σ_b e^{s_j − m'})

and at the end ``LSE = m + log l``, ``max weight = e^{m − LSE} = 1 / l``,
``entropy = log l − (scale · q·u / l + Σ p_j b_j − m)`` (taken relative to ``m``, which keeps
the cancellation small; ``b_j`` is the bias plus what a soft-cap ``c · tanh(s / c)`` changes,
the parts of the score not linear in ``k_j``) and the weight on the first key ``p_0 = e^{s_0 − LSE}`` (``s_0`` is kept
from the first key block; the attention sink of Xiao et al. 2024).

The causal rule, a sliding window and a block-sparse layout are applied per tile from their
structure (as the model's attention applies them), and key blocks they hide entirely are skipped,
so a window of ``w`` keys costs ``O(T · w)`` time.

Only a ``query chunk × key block`` tile of scores exists at any time, so memory grows as
``O(T)``, not ``O(T²)``: at ``T = 16384`` with 12 heads the tiles take a few tens of MiB.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

import torch

from attnlab._checks import check_floating, check_positive_int, check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.nn.backends.common import compute_dtype
from attnlab.nn.block_layout import BlockLayout
from attnlab.nn.mask_spec import Masking, normalize_mask

if TYPE_CHECKING:
    from attnlab.nn.resolved_call import ResolvedCall

__all__ = [
    "TILE_ELEMENTS",
    "AttentionStats",
    "attention_stats",
    "call_stats",
    "call_weights",
    "structure_at",
]

# elements of one score tile (all batch dims and heads together): 2^22 fp32 values = 16 MiB
TILE_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class AttentionStats:
    """Per query row statistics of the attention weights ``softmax(Q Kᵀ · scale + M)``.

    Attributes:
        entropy: ``−Σ_j p_j log p_j`` in nats; ``0`` for a row that may see no key.
        max_weight: ``max_j p_j``; ``0`` for a row that may see no key.
        logsumexp: ``log Σ_j e^{s_j}`` over the visible keys; ``−inf`` for a row that may see no key.
        first_weight: ``p_0``, the weight on key 0 (the first token); ``0`` when the row may not
            see it (or sees no key).

    Shape:
        each ``(..., H, T_q)``, in fp32 for half-precision inputs (fp64 stays fp64).
    """

    entropy: torch.Tensor
    max_weight: torch.Tensor
    logsumexp: torch.Tensor
    first_weight: torch.Tensor

    @property
    def effective_keys(self) -> torch.Tensor:
        """``e^{entropy}``: how many keys a row spreads its weight over (1 = one key)."""
        return torch.exp(self.entropy)


@torch.no_grad()
def attention_stats(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_size: int = 512,
    window: object = None,
    block_mask: object = None,
) -> AttentionStats:
    """Entropy, maximum weight, log-sum-exp and first-key weight of every attention row,
    computed blockwise.

    Equivalent to computing ``P = softmax(Q Kᵀ · scale + M)`` as
    :func:`attnlab.scaled_dot_product_attention` does (same masks, same bottom-right causal rule, sliding window
    and block layout, grouped-query heads) and reducing each row — but ``P`` is never formed: keys are visited in
    blocks of ``block_size`` and queries in chunks that keep one score tile near
    :data:`TILE_ELEMENTS` values. Key blocks hidden by the causal rule or the window are
    skipped; under the causal rule a chunk holds at most ``block_size / 4`` queries, so that
    the keys past its last query (hidden from all its rows) are not scored. Not
    differentiable (runs under ``torch.no_grad``).

    Memory beyond the inputs: a scaled copy of the queries, the keys with a ones column, the
    ``(..., H, T_q, D + 1)`` accumulators and a few score tiles — ``O(T · H · D)``, about 310 MiB
    measured at ``T = 16384``, 12 heads, ``D = 64``. (A floating ``mask`` of full
    ``(T_q, T_k)`` size is itself a ``T × T`` input and is normalised once, like the attention
    core does; pass ``is_causal`` and key-padding masks ``(B, 1, 1, T_k)`` for long sequences.)

    Args:
        query: the queries.
        key: the keys; ``H`` must be a multiple of ``H_kv``.
        mask: ``None``, boolean (``True = may attend``) or an additive float bias, broadcastable
            to ``(..., H, T_q, T_k)``.
        is_causal: hide future keys, aligned bottom-right (query ``i`` sees ``j <= i + T_k − T_q``).
        scale: the score scale; default ``1 / √D``.
        block_size: keys per block. Default ``512``.
        window: a sliding window, as in :func:`attnlab.scaled_dot_product_attention` (an int
            ``w`` = ``(w, 0)``, or ``(left, right)``, aligned bottom-right); default none.
        block_mask: a :class:`~attnlab.masks.BlockLayout` over the ``T_k`` keys; default none.

    Returns:
        An :class:`AttentionStats`.

    Shape:
        - query ``(..., H, T_q, D)``, key ``(..., H_kv, T_k, D)``
        - mask broadcastable to ``(..., H, T_q, T_k)``
        - every statistic ``(..., H, T_q)``

    Examples:
        >>> q, k = torch.randn(1, 12, 4096, 64), torch.randn(1, 12, 4096, 64)
        >>> stats = attention_stats(q, k, is_causal=True)
        >>> stats.entropy.shape
        torch.Size([1, 12, 4096])
    """
    _check_inputs(query, key)
    block_size = check_positive_int("block_size", block_size)
    if not isinstance(is_causal, bool):
        raise ArgumentTypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if scale is None:
        scale = query.shape[-1] ** -0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise ArgumentTypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if block_mask is not None and not isinstance(block_mask, BlockLayout):
        raise ArgumentTypeError(
            f"block_mask must be an attnlab.masks.BlockLayout or None, got {type(block_mask).__name__}"
        )
    if block_mask is not None:
        block_mask = block_mask.crop(key.shape[-2])
    masking = normalize_mask(query, key, mask, is_causal, window, block_mask)
    return _blockwise(query, key, masking, float(scale), block_size)


@torch.no_grad()
def call_stats(call: ResolvedCall, *, block_size: int = 512) -> AttentionStats:
    """The statistics of one attention call as the layer resolved it (its ``hook_call``): the
    queries and keys as scored and the normalised mask (causal rule, window and block layout as
    structure), so nothing is re-derived from the forward's arguments.

    Softmax and Linformer calls (over the projected rows ``E K``) go blockwise like
    :func:`attention_stats` — ``O(T)`` memory; a FAVOR+ call's weights ``D⁻¹ φ(q) φ(k)ᵀ`` are
    reduced by chunks of queries from its features (``S = log φ(q) φ(k)ᵀ``), one score tile
    at a time.

    Args:
        call: a :class:`~attnlab.nn.resolved_call.ResolvedCall`.
        block_size: keys per block. Default ``512``.

    Returns:
        An :class:`AttentionStats` of the weights the call computed.

    Shape:
        every statistic ``(B, H, T_q)``.
    """
    block_size = check_positive_int("block_size", block_size)
    if call.method == "favor":
        return _favor_stats(call)
    return _blockwise(call.q, call.k, call.masking, call.scale, block_size)


def _favor_stats(call: ResolvedCall) -> AttentionStats:
    """The statistics of FAVOR+'s implied weights, by chunks of queries: ``S = log φ(q) φ(k)ᵀ``
    on one ``chunk × T_k`` tile at a time (:meth:`ResolvedCall.scores` per chunk)."""
    q = call.q
    t_q, t_k = q.shape[-2], call.k.shape[-2]
    chunk = max(1, min(t_q, TILE_ELEMENTS // max(1, q[..., 0, 0].numel() * t_k)))
    acc = compute_dtype(q.dtype)
    parts: list[tuple[torch.Tensor, ...]] = []
    for i0 in range(0, t_q, chunk):
        i1 = min(t_q, i0 + chunk)
        part = replace(
            call,
            q=q[..., i0:i1, :],
            q_features=None if call.q_features is None else call.q_features[..., i0:i1, :],
            masking=_rows(call.masking, i0, i1),
        )
        s = part.scores(acc)  # (B, H, rows, T_k), hidden −∞
        lse = torch.logsumexp(s, dim=-1)
        empty = lse == float("-inf")
        p = torch.exp(s - lse.masked_fill(empty, 0.0)[..., None])
        ent = -(p * s.masked_fill(p == 0, 0.0)).sum(-1) + lse.masked_fill(empty, 0.0)
        parts.append((
            ent.masked_fill(empty, 0.0).clamp_min(0.0), p.amax(-1).masked_fill(empty, 0.0),
            lse, p[..., 0].masked_fill(empty, 0.0),
        ))  # fmt: skip
    return AttentionStats(*(torch.cat(t, dim=-1) for t in zip(*parts)))


def _rows(masking: Masking, i0: int, i1: int) -> Masking:
    """The mask of query rows ``i0 … i1 − 1`` (FAVOR+: a key mask and the causal rule): row
    ``r`` is query ``i0 + r``, which sees ``j <= i0 + r + offset``."""
    allowed = masking.allowed
    if allowed is not None and allowed.shape[-2] != 1:
        allowed = allowed[..., i0:i1, :]
    offset = masking.causal_offset
    return Masking(allowed, None, None if offset is None else offset + i0)


def _blockwise(
    query: torch.Tensor, key: torch.Tensor, masking: Masking, scale: float, block_size: int
) -> AttentionStats:
    """The statistics of ``softmax(Q Kᵀ · scale + M)`` over key blocks (the module docstring)."""
    lead, h, t_q, d = query.shape[:-3], query.shape[-3], query.shape[-2], query.shape[-1]
    h_kv, t_k = key.shape[-3], key.shape[-2]
    groups = h // h_kv
    acc = compute_dtype(query.dtype)
    # grouped heads without copying keys: (..., H_kv, G, T_q, D) against (..., H_kv, 1, T_k, D)
    q = query.unflatten(-3, (h_kv, groups))
    k = key.unsqueeze(-3)
    allowed = _grouped(masking.allowed, query.shape, t_k, h_kv, groups)
    bias = _grouped(masking.bias, query.shape, t_k, h_kv, groups)

    lo, hi = masking.bounds(t_q, t_k)  # row i sees keys i + lo <= j <= i + hi
    rows_per_tile = TILE_ELEMENTS // max(1, query[..., 0, 0].numel() * min(block_size, t_k))
    if hi is not None:  # a chunk's keys end at its last row's: narrow chunks skip more of them
        rows_per_tile = min(rows_per_tile, max(1, block_size // 4))
    q_chunk = max(1, min(t_q, rows_per_tile))
    q = q.to(acc) * scale  # the scale folded into the queries            (..., H_kv, G, T_q, D)
    # [K, 1]: one matmul gives Σ e^{s−m'} k_j and Σ e^{s−m'}       (..., H_kv, 1, T_k, D + 1)
    k_acc = k.to(acc)
    k_aug = torch.cat([k_acc, k.new_ones((*k.shape[:-1], 1), dtype=acc)], dim=-1)
    shape = (*lead, h_kv, groups, t_q)
    m = torch.full(shape, float("-inf"), dtype=acc, device=query.device)
    u = torch.zeros((*shape, d + 1), dtype=acc, device=query.device)  # [Σ e k_j, l]
    s0 = torch.full(shape, float("-inf"), dtype=acc, device=query.device)  # s_0 − (its shift)
    # Σ e^{s−m'} b_j of what is not linear in k: the bias, and what a soft-cap changes
    extra = bias is not None or masking.softcap is not None
    eb = torch.zeros(shape, dtype=acc, device=query.device) if extra else None
    for i0 in range(0, t_q, q_chunk):
        i1 = min(t_q, i0 + q_chunk)
        q_c = q[..., i0:i1, :]
        # the keys some row of this chunk may see under the causal rule and the window
        k_start = 0 if lo is None else max(0, i0 + lo)
        k_end = t_k if hi is None else min(t_k, i1 + hi)
        for j0 in range(k_start, k_end, block_size):
            j1 = min(k_end, j0 + block_size)
            # S_b = (scale · Q_c) K_bᵀ + B_b, hidden entries at −∞     (..., H_kv, G, rows, keys)
            s = torch.matmul(q_c, k_acc[..., j0:j1, :].transpose(-2, -1))
            capped = None
            if masking.softcap is not None:  # c · tanh(s / c), before the bias (Gemma 2)
                capped = torch.tanh(s / masking.softcap) * masking.softcap
                s, capped = capped, capped - s  # the scores, and what the cap changed
            if bias is not None:
                s = s + bias[..., i0:i1, j0:j1]
            vis = None if allowed is None else allowed[..., i0:i1, j0:j1]
            struct = _structure(masking, (lo, hi), (i0, i1), (j0, j1), t_q, t_k, query.device)
            if struct is not None:
                vis = struct if vis is None else vis & struct
            if vis is not None:
                s = s.masked_fill_(~vis, float("-inf"))
            if j0 == 0:
                s0[..., i0:i1] = s[..., 0]
            m_old = m[..., i0:i1]
            m_new = torch.maximum(m_old, s.amax(dim=-1))
            m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)  # rows with no key yet
            alpha = torch.exp(m_old - m_safe).unsqueeze(-1)  # e^{m − m'}
            e = s.sub_(m_safe.unsqueeze(-1)).exp_()  # e^{s_j − m'}, 0 where hidden
            u[..., i0:i1, :] = alpha * u[..., i0:i1, :] + torch.matmul(e, k_aug[..., j0:j1, :])
            if eb is not None:
                parts = [bias[..., i0:i1, j0:j1].to(acc) if bias is not None else None, capped]
                b = sum(t for t in parts if t is not None)  # the bias, what the cap changed
                b = cast(torch.Tensor, b).masked_fill(e == 0, 0.0)  # no 0 · (−big)
                eb[..., i0:i1] = alpha[..., 0] * eb[..., i0:i1] + (e * b).sum(dim=-1)
            m[..., i0:i1] = m_new

    norm = u[..., d]  # l
    # E[s] − m = scale · q·u / l + Σ p_j b_j − m
    moment = (q.unsqueeze(-2) @ u[..., :d].unsqueeze(-1))[..., 0, 0]
    if eb is not None:
        moment = moment + eb
    empty = norm == 0
    l_safe = norm.masked_fill(empty, 1.0)
    lse = m + torch.log(l_safe)
    shift = _grouped(masking.shift, query.shape, 1, h_kv, groups)
    if shift is not None:  # the mask's rows were shifted to a largest entry of 0: shift back
        lse = lse + shift[..., 0].to(acc)
    lse = lse.masked_fill(empty, float("-inf"))
    max_weight = (1.0 / l_safe).masked_fill(empty, 0.0)
    entropy = torch.log(l_safe) - (moment / l_safe - m.masked_fill(empty, 0.0))
    entropy = entropy.masked_fill(empty, 0.0).clamp_min_(0.0)
    # p_0 = e^{s_0 − m − log l}, both in the frame of the shifted mask (0 when key 0 is hidden)
    first = torch.exp(s0 - m.masked_fill(empty, 0.0) - torch.log(l_safe)).masked_fill(empty, 0.0)
    return AttentionStats(
        entropy=entropy.flatten(-3, -2),
        max_weight=max_weight.flatten(-3, -2),
        logsumexp=lse.flatten(-3, -2),
        first_weight=first.flatten(-3, -2),
    )


def _structure(
    masking: Masking,
    bounds: tuple[int | None, int | None],
    rows: tuple[int, int],
    cols: tuple[int, int],
    t_q: int,
    t_k: int,
    device: torch.device,
) -> torch.Tensor | None:
    """The causal rule, the window and the block layout on one tile, or ``None`` when they
    hide nothing there.

    Shape:
        ``(rows, cols)`` boolean, ``True = may attend``.
    """
    (lo, hi), (i0, i1), (j0, j1) = bounds, rows, cols
    hides_lo = lo is not None and j0 < i1 - 1 + lo
    hides_hi = hi is not None and j1 - 1 > i0 + hi
    if not (hides_lo or hides_hi or masking.blocks is not None):
        return None
    i = torch.arange(i0, i1, device=device)
    j = torch.arange(j0, j1, device=device)
    return structure_at(
        masking, (lo if hides_lo else None, hi if hides_hi else None), i, j, t_q, t_k
    )


def structure_at(
    masking: Masking,
    bounds: tuple[int | None, int | None],
    rows: torch.Tensor,
    cols: torch.Tensor,
    t_q: int,
    t_k: int,
) -> torch.Tensor:
    """The causal rule, the window (row ``i`` sees ``i + lo <= j <= i + hi``) and the block
    layout (query ``i`` at position ``i + T_k − T_q``) at the given query rows and key columns.

    Args:
        masking: the normalised mask (its ``blocks`` read here).
        bounds: ``(lo, hi)``, :meth:`Masking.bounds <attnlab.nn.mask_spec.Masking.bounds>` (a
            side ``None`` hides nothing).
        rows: query indices.
        cols: key indices.
        t_q: ``T_q`` of the whole call.
        t_k: ``T_k`` of the whole call.

    Returns:
        ``True = may attend``.

    Shape:
        rows ``(R,)``, cols ``(C,)`` → ``(R, C)``.
    """
    lo, hi = bounds
    i, j = rows[:, None], cols[None, :]
    vis = torch.ones(i.shape[0], j.shape[1], dtype=torch.bool, device=rows.device)
    if lo is not None:
        vis &= j >= i + lo
    if hi is not None:
        vis &= j <= i + hi
    if masking.blocks is not None:
        b = masking.blocks.block_size
        grid = masking.blocks.blocks.to(rows.device)
        vis &= grid[(i + t_k - t_q) // b, j // b]
    return vis


def call_weights(
    call: ResolvedCall, rows: torch.Tensor, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """The weights some query rows of one call computed, from its queries, keys and normalised
    mask (the tile rule of :func:`call_stats`): ``softmax`` over the visible keys of
    :meth:`ResolvedCall.scores <attnlab.nn.resolved_call.ResolvedCall.scores>` at those rows —
    a Linformer call's over its projected rows ``E K``, a FAVOR+ call's ``D⁻¹ φ(q) φ(k)ᵀ``.
    Only ``R × T_k`` scores per head exist, so a few rows of a long call are cheap.

    Args:
        call: a :class:`~attnlab.nn.resolved_call.ResolvedCall`.
        rows: the query rows, indices in ``[0, T_q)``.
        dtype: computed in this dtype (default float64).

    Returns:
        The weights; a row that may see no key is zeros (as the layers return it).

    Shape:
        rows ``(R,)`` → ``(B, H, R, T_k)``.
    """
    t_q, t_k = call.q.shape[-2], call.k.shape[-2]
    masking = call.masking

    def at_rows(t: torch.Tensor | None) -> torch.Tensor | None:
        return t if t is None or t.shape[-2] == 1 else t[..., rows, :]

    qf = call.q_features
    part = replace(
        call,
        q=call.q[..., rows, :],
        q_features=None if qf is None else qf[..., rows, :],
        masking=Masking(None, at_rows(masking.bias), None, softcap=masking.softcap),
    )
    s = part.scores(dtype)  # (B, H, R, T_k), the structure not yet applied
    allowed = at_rows(masking.allowed)
    vis = structure_at(
        masking, masking.bounds(t_q, t_k), rows.to(s.device), torch.arange(t_k, device=s.device),
        t_q, t_k,
    )  # fmt: skip
    if allowed is not None:
        vis = vis & allowed.to(s.device)
    s = s.masked_fill(~vis, float("-inf"))
    empty = s.amax(-1, keepdim=True) == float("-inf")
    return torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)


def _grouped(
    t: torch.Tensor | None, q_shape: torch.Size, t_k: int, h_kv: int, groups: int
) -> torch.Tensor | None:
    """A mask broadcastable to ``(..., H, T_q, T_k)`` as a view ``(..., H_kv, G, T_q, T_k)``."""
    if t is None:
        return None
    full = t.expand(*q_shape[:-1], t_k)  # a view: no copy
    return full.unflatten(-3, (h_kv, groups))


def _check_inputs(query: object, key: object) -> None:
    q = check_tensor("query", query)
    k = check_tensor("key", key)
    for name, t in (("query", q), ("key", k)):
        check_floating(name, t)
        if t.dim() < 3 or 0 in t.shape[-3:]:
            raise ArgumentError(
                f"{name} must have shape (..., H, T, D) with H, T, D > 0, got {shape_str(t.shape)}"
            )
    if q.dtype != k.dtype:
        raise ArgumentTypeError(f"query and key must share a dtype, got {q.dtype} and {k.dtype}")
    if q.device != k.device:
        raise ArgumentError(f"query and key must be on one device, got {q.device} and {k.device}")
    if q.dim() != k.dim() or q.shape[:-3] != k.shape[:-3]:
        raise ArgumentError(
            f"query and key must share leading (batch) dims, got shapes {shape_str(q.shape)} "
            f"and {shape_str(k.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ArgumentError(
            f"query and key head dims must match, got D = {q.shape[-1]} and {k.shape[-1]}"
        )
    if q.shape[-3] % k.shape[-3] != 0:
        raise ArgumentError(
            f"query heads H = {q.shape[-3]} must be a multiple of key heads H_kv = {k.shape[-3]}"
        )
