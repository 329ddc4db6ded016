"""Masks after validation: the one form every attention backend reads.

:func:`normalize_mask` checks a user's mask against the query and key shapes and turns it, with
``is_causal``, into a :class:`Masking`: a boolean ``allowed`` tensor (``True = may attend``), a
finite additive ``bias``, and the causal rule and the sliding window kept as *structure*
(``causal_offset``, ``window``) rather than as a dense ``T_q × T_k`` tensor, so that a backend can
skip the tiles they hide; so is a block-sparse layout (``blocks``, a
:class:`~attnlab.nn.block_layout.BlockLayout`).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass

import torch

from attnlab._checks import broadcast_or_raise, check_tensor
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.nn.block_layout import BlockLayout, expand_blocks
from attnlab.nn.masks import is_masked_bias, normalize_window

__all__ = ["Masking", "empty_rows", "hide_unseen_keys", "normalize_mask"]

# the keys row ``i`` sees as offsets from ``i``: ``i + lo <= j <= i + hi`` (``None``: unbounded)
Bounds = tuple[int | None, int | None]


@dataclass(frozen=True)
class Masking:
    """Masks after validation, in the one form every backend reads.

    Attributes:
        allowed: boolean, ``True = may attend``, broadcastable to ``(..., H, T_q, T_k)``; ``None``
            when every key is allowed (apart from the causal rule).
        bias: a finite additive bias in the query's dtype, or ``None``. Hidden entries of a
            floating mask have moved into ``allowed``.
        causal_offset: ``T_k - T_q`` when causal (query ``i`` sees ``j <= i + offset``), else ``None``.
        shift: what was subtracted from each row of a floating mask (its largest visible entry,
            see :func:`normalize_mask`), or ``None``; a row's log-sum-exp of the user's
            ``scores + mask`` is that of ``scores + bias`` plus ``shift``.
        window: the sliding window ``(left, right)`` aligned bottom-right (query ``i`` sees keys
            ``i + T_k - T_q - left <= j <= i + T_k - T_q + right``), a side ``None`` when it
            hides nothing; ``None`` when there is no window. It applies on top of ``allowed``
            and the causal rule.
        blocks: a block-sparse layout (its causal rule, if any, already in ``causal_offset``):
            query ``i`` at position ``p_i = i + T_k - T_q`` sees key ``j`` only where
            ``blocks.blocks[p_i // b, j // b]``; ``None`` when there is none. It applies on top
            of ``allowed``, the causal rule and the window.
        softcap: soft-capping of the scores (Gemma 2's ``attn_logit_softcapping``): the scaled
            scores become ``c · tanh(s / c)`` before the bias is added, or ``None``. A score
            modification, not a mask: only the backends that apply it exactly take it
            (:data:`~attnlab.nn.backends.SOFTCAP_BACKENDS`); the others refuse the call.

    Shape:
        ``allowed`` and ``bias`` broadcastable to ``(..., H, T_q, T_k)``, e.g. ``(B, 1, 1, T_k)``
        for a padding mask; ``shift`` broadcastable to ``(..., H, T_q, 1)``.
    """

    allowed: torch.Tensor | None
    bias: torch.Tensor | None
    causal_offset: int | None
    shift: torch.Tensor | None = None
    window: tuple[int | None, int | None] | None = None
    blocks: BlockLayout | None = None
    softcap: float | None = None

    def bounds(self, t_q: int, t_k: int) -> tuple[int | None, int | None]:
        """The causal rule and the window as the keys each row may see: ``i + lo <= j <= i + hi``.

        Args:
            t_q: number of queries ``T_q``.
            t_k: number of keys ``T_k``.

        Returns:
            ``(lo, hi)``, either ``None`` when that side is unbounded (``(None, None)`` when there
            is neither a causal rule nor a window).
        """
        hi = self.causal_offset
        if self.window is None:
            return None, hi
        left, right = self.window
        offset = t_k - t_q
        lo = None if left is None else offset - left
        if right is not None:
            hi = offset + right if hi is None else min(hi, offset + right)
        return lo, hi

    def visible(self, t_q: int, t_k: int, device: torch.device) -> torch.Tensor | None:
        """``allowed``, the causal rule and the window together, as one boolean mask.

        Args:
            t_q: number of queries ``T_q``.
            t_k: number of keys ``T_k``.
            device: where to build the causal part.

        Returns:
            The boolean mask (``True = may attend``), or ``None`` when nothing is hidden.

        Shape:
            broadcastable to ``(..., H, T_q, T_k)``; ``(T_q, T_k)`` for the causal rule alone.
        """
        vis = self.allowed
        if self.blocks is not None:
            grid = expand_blocks(self.blocks.blocks, self.blocks.block_size, t_q, t_k, device)
            vis = grid if vis is None else vis & grid
        if self.window is not None:
            band = _band(self.bounds(t_q, t_k), t_q, t_k, device)
            return band if vis is None else vis & band
        if self.causal_offset is not None:
            i = torch.arange(t_q, device=device)[:, None]
            j = torch.arange(t_k, device=device)[None, :]
            causal = j <= i + self.causal_offset
            vis = causal if vis is None else vis & causal
        return vis

    def open_rows(self, rows: torch.Tensor, t_q: int, t_k: int, device: torch.device) -> Masking:
        """The same masking, except that the given query rows may see every key.

        Args:
            rows: ``True`` for the query rows to open (as :func:`empty_rows` returns them).
            t_q: number of queries ``T_q``.
            t_k: number of keys ``T_k``.
            device: where to build the causal part.

        Returns:
            A new :class:`Masking` with the causal rule folded into ``allowed`` (or ``self`` when
            nothing is hidden). A window stays structure when it leaves every row some key (the
            opened rows see the keys of their window), so that a backend still skips the tiles
            outside the band; else it is folded into ``allowed`` too. So does a block layout
            (the opened rows see the keys of their visible blocks).

        Shape:
            rows ``(..., T_q, 1)`` boolean, broadcastable against the mask.
        """
        if self.blocks is not None:
            # the structure stays when it leaves every row some key (the opened rows see the keys
            # of their blocks), so that a backend still visits the visible tiles only
            if self.allowed is not None and _layout_leaves_every_row_a_key(
                self.blocks, self.bounds(t_q, t_k), t_q, t_k
            ):
                return dataclasses.replace(self, allowed=self.allowed | rows)
        elif self.window is not None and self.allowed is not None:
            if _band_leaves_every_row_a_key(self.bounds(t_q, t_k), t_q, t_k):
                return dataclasses.replace(self, allowed=self.allowed | rows, blocks=None)
        vis = self.visible(t_q, t_k, device)
        if vis is None:  # nothing is hidden, so no row needs opening
            return self
        return Masking(vis | rows, self.bias, None, self.shift, softcap=self.softcap)


def normalize_mask(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: object,
    is_causal: bool,
    window: object = None,
    block_mask: object = None,
) -> Masking:
    """Check a user's ``mask`` against the queries and keys and turn it, with ``is_causal``,
    ``window`` and ``block_mask``, into a :class:`Masking`.

    Args:
        query: the queries (their shape and device are what the mask is checked against).
        key: the keys (their length is ``T_k``).
        mask: ``None``, a boolean mask (``True = may attend``) or a floating additive bias in which
            ``-inf`` or the dtype's minimum hides a key.
        is_causal: add the bottom-right causal rule (kept as ``causal_offset``, not as a tensor).
        window: ``None``, an int ``w`` (= ``(w, 0)``) or ``(left, right)``, see
            :func:`attnlab.masks.normalize_window`; kept as ``Masking.window``, not as a tensor,
            with the sides that hide nothing at these lengths dropped (a window that hides
            nothing is no window; ``(left >= T_k - 1, 0)`` without ``is_causal`` is the causal
            rule).
        block_mask: ``None`` or a :class:`~attnlab.nn.block_layout.BlockLayout` over ``T_k``
            positions (the queries being the last ``T_q``); kept as ``Masking.blocks``, its
            causal rule as ``causal_offset``; a layout in which every block is visible is dropped.

    Returns:
        The normalised masking; a floating mask's hidden entries move into ``allowed`` and the rest
        becomes a finite ``bias`` in the query's dtype, shifted so that each row's largest visible
        entry is 0 (softmax does not change; the log-sum-exp of a row moves by that shift).

    Raises:
        TypeError: ``mask`` is not a tensor, or neither bool nor floating; ``window`` is not an
            int, a pair or ``None``; ``block_mask`` is not a ``BlockLayout``.
        ValueError: ``mask`` does not broadcast to ``(..., H, T_q, T_k)``, is on another device, or
            holds NaN or ``+inf``; a side of ``window`` is negative; ``block_mask`` covers
            another length than ``T_k`` or fewer positions than ``T_q``.

    Shape:
        query ``(..., H, T_q, D)``, key ``(..., H_kv, T_k, D)``, mask broadcastable to
        ``(..., H, T_q, T_k)``.
    """
    t_q, t_k = query.shape[-2], key.shape[-2]
    # the causal rule hides nothing from a single query aligned bottom-right (a decoding step)
    blocks = None if block_mask is None else _check_block_mask(block_mask, t_q, t_k)
    if blocks is not None and blocks.causal:
        is_causal = True
        if blocks.blocks.all():  # nothing but the causal rule
            blocks = None
    causal_offset = t_k - t_q if is_causal and t_q != 1 else None
    sides = None
    if window is not None:
        sides, causal_offset = _window_sides(normalize_window(window), t_q, t_k, causal_offset)
    if mask is None:
        return Masking(None, None, causal_offset, None, sides, blocks)
    mask = check_tensor("mask", mask)
    if not (mask.dtype == torch.bool or mask.is_floating_point()):
        raise ArgumentTypeError(
            f"mask must be bool (True = may attend) or floating (additive), got dtype {mask.dtype}"
        )
    if mask.device != query.device:
        raise ArgumentError(f"mask must be on the query's device {query.device}, got {mask.device}")
    target = (*query.shape[:-1], t_k)
    broadcast_or_raise("mask", mask.shape, target, "(..., H, T_q, T_k)")
    if mask.dim() < len(target):  # any rank that broadcasts: the missing leading dims are 1
        mask = mask.reshape((1,) * (len(target) - mask.dim()) + tuple(mask.shape))
    if mask.dtype == torch.bool:
        return Masking(mask, None, causal_offset, None, sides, blocks)
    if not _no_readback(mask):
        _check_bias_values(mask)
    hidden = is_masked_bias(mask)
    # a bias that hides nothing (ALiBi, relative positions) gives no boolean mask: the backends
    # then skip every per-row step (empty rows, unseen keys, a dense mask per layer)
    hides = _no_readback(mask) or bool(hidden.any())
    # softmax(s + b) = softmax(s + b − c) for any c constant along a row: each row's largest
    # visible bias moves to 0, so biases such as −1e9 everywhere neither swallow the scores in
    # rounding nor overflow to −∞ in a half-precision query dtype
    row_max = (mask.masked_fill(hidden, float("-inf")) if hides else mask).amax(-1, keepdim=True)
    shift = row_max.masked_fill(row_max == float("-inf"), 0.0) if hides else row_max
    bias = (mask - shift).to(query.dtype)
    # what the query's dtype cannot hold (below its minimum) hides the key: its weight is 0 anyway
    low = is_masked_bias(bias)
    if not hides and not bool(low.any()):
        return Masking(None, bias, causal_offset, shift, sides, blocks)
    hidden = hidden | low
    return Masking(~hidden, bias.masked_fill(hidden, 0.0), causal_offset, shift, sides, blocks)


def _check_block_mask(block_mask: object, t_q: int, t_k: int) -> BlockLayout | None:
    """A ``block_mask=`` argument checked against the lengths; ``None`` when it hides nothing."""
    if not isinstance(block_mask, BlockLayout):
        raise ArgumentTypeError(
            f"block_mask must be an attnlab.masks.BlockLayout (e.g. from "
            f"attnlab.masks.bigbird_layout) or None, got {type(block_mask).__name__}"
        )
    if block_mask.seq_len != t_k or t_q > t_k:
        raise ArgumentError(
            f"block_mask covers seq_len = {block_mask.seq_len} positions but must cover the keys, "
            f"T_k = {t_k}, with T_q <= T_k (the queries are the last positions), got "
            f"(T_q, T_k) = ({t_q}, {t_k})"
        )
    if not block_mask.causal and bool(block_mask.blocks.all()):
        return None
    return block_mask


def _window_sides(
    sides: tuple[int | None, int | None] | None, t_q: int, t_k: int, causal_offset: int | None
) -> tuple[tuple[int | None, int | None] | None, int | None]:
    """The window's sides that hide something at these lengths, and the causal offset.

    The left side hides a key iff the last query's window starts after key 0
    (``left < T_k - 1``); the right side iff the first query's window ends before the last key
    (``right < T_q - 1``) and no causal rule hides more. ``(None, 0)`` alone is the causal rule.
    """
    if sides is None:
        return None, causal_offset
    left, right = sides
    if left is not None and left >= t_k - 1:
        left = None
    if right is not None and (right >= t_q - 1 or causal_offset is not None):
        right = None  # hides nothing, or the causal rule hides at least as much
    if left is None and right == 0 and t_q != 1:
        return None, t_k - t_q  # the causal rule: kept as such, backends have fast paths for it
    if left is None and right is None:
        return None, causal_offset
    return (left, right), causal_offset


def _band(bounds: Bounds, t_q: int, t_k: int, device: torch.device | str) -> torch.Tensor:
    """``i + lo <= j <= i + hi`` as a dense boolean ``(T_q, T_k)`` tensor."""
    lo, hi = bounds
    i = torch.arange(t_q, device=device)[:, None]
    j = torch.arange(t_k, device=device)[None, :]
    band = torch.ones(t_q, t_k, dtype=torch.bool, device=device)
    if lo is not None:
        band &= j >= i + lo
    if hi is not None:
        band &= j <= i + hi
    return band


def _check_bias_values(mask: torch.Tensor) -> None:
    """A floating mask is an additive bias: ``−inf`` (or the dtype's minimum) hides a key, any other
    value must be finite. Only 0s and 1s is a boolean mask passed as floats by mistake (adding 1
    to a score does not hide anything): a warning, once."""
    not_finite, zero_one, has_one = torch.stack(
        [
            (torch.isnan(mask) | (mask == float("inf"))).any(),
            ((mask == 0) | (mask == 1)).all(),
            (mask == 1).any(),
        ]
    ).tolist()
    if not_finite:
        raise ArgumentError(
            "mask must not hold NaN or +inf: a floating mask is added to the scores (-inf or the "
            "dtype's minimum hides a key, other values must be finite)"
        )
    if zero_one and has_one:
        warnings.warn(
            "mask is floating and holds only 0 and 1, so it is added to the scores and hides "
            "nothing; for 'True/1 = may attend' pass a bool mask (mask.bool())",
            UserWarning,
            stacklevel=4,
        )


def empty_rows(masking: Masking, t_q: int, t_k: int, device: torch.device) -> torch.Tensor | None:
    """The query rows that may attend to no key.

    Computed without a ``T_q × T_k`` tensor beyond the mask itself: a row has a key iff its first
    allowed key is not in the future. Whether any row is empty is read back to the host (to keep
    the fast path when none is) except while ``torch.compile`` traces: a captured graph takes the
    path that handles empty rows, which gives the same numbers when there are none.

    Args:
        masking: the normalised mask.
        t_q: number of queries ``T_q``.
        t_k: number of keys ``T_k``.
        device: where to build the result when the mask alone does not say.

    Returns:
        A boolean tensor, ``True`` for a row that sees no key, or ``None`` if there are none.

    Shape:
        ``(..., T_q, 1)``, broadcastable against ``(..., H, T_q, T_k)``.
    """
    offset = masking.causal_offset
    allowed = masking.allowed
    if t_k == 0:  # no key at all: every row is empty
        return torch.ones(t_q, 1, dtype=torch.bool, device=device) if t_q else None
    if masking.blocks is not None:
        bounds = masking.bounds(t_q, t_k)
        if allowed is None and _layout_leaves_every_row_a_key(masking.blocks, bounds, t_q, t_k):
            return None  # the layout alone decides: no tensor, no read-back
        return _empty_rows_in_blocks(allowed, masking.blocks, bounds, t_q, t_k, device)
    if masking.window is not None:
        return _empty_rows_in_band(allowed, masking.bounds(t_q, t_k), t_q, t_k, device)
    if allowed is None:
        if offset is None or offset >= 0:
            return None
        return torch.arange(t_q, device=device)[:, None] + offset < 0  # T_q > T_k: top rows
    if offset is None:
        empty = ~allowed.any(dim=-1, keepdim=True)
    else:
        # the first allowed key of each row (argmax returns the first maximum); t_k when none
        first = allowed.to(torch.uint8).argmax(dim=-1, keepdim=True)
        first = first.masked_fill(~allowed.any(dim=-1, keepdim=True), t_k)
        rows = torch.arange(
            allowed.shape[-2] if allowed.shape[-2] > 1 else t_q, device=allowed.device
        )
        empty = first > rows[:, None] + offset
    if not _no_readback(empty) and not bool(empty.any()):
        return None
    return empty


def _band_leaves_every_row_a_key(bounds: Bounds, t_q: int, t_k: int) -> bool:
    """Whether every row ``i < T_q`` keeps a key in ``[i + lo, i + hi] ∩ [0, T_k)``.

    The band moves with ``i``: it holds a key for all rows iff ``lo <= hi``, the first row's
    reaches ``j = 0`` (``hi >= 0``) and the last row's starts before ``T_k`` (``T_q − 1 + lo <
    T_k``); an unbounded side always does.
    """
    lo, hi = bounds
    return (
        t_k > 0
        and (lo is None or hi is None or lo <= hi)
        and (hi is None or hi >= 0)
        and (lo is None or t_q - 1 + lo < t_k)
    )


def _empty_rows_in_band(
    allowed: torch.Tensor | None, bounds: Bounds, t_q: int, t_k: int, device: torch.device
) -> torch.Tensor | None:
    """:func:`empty_rows` under a window: row ``i`` is empty iff ``allowed`` has no key in
    ``[i + lo, i + hi]``, counted with a cumulative sum along the keys (no ``T_q × T_k`` tensor
    beyond the mask itself)."""
    lo, hi = bounds
    if allowed is None and _band_leaves_every_row_a_key(bounds, t_q, t_k):
        return None  # decided from the bounds alone: no read-back, no tensor, on every device
    rows = torch.arange(t_q, device=device)
    start = torch.zeros_like(rows) if lo is None else (rows + lo).clamp(0, t_k)
    stop = torch.full_like(rows, t_k) if hi is None else (rows + hi + 1).clamp(0, t_k)
    if allowed is None:
        empty = (stop <= start)[:, None]  # (T_q, 1)
    elif allowed.shape[-1] == 1:  # the mask is the same for every key of a row
        empty = ~allowed | (stop <= start)[:, None]
    else:
        # seen[i] = #allowed keys in [start_i, stop_i) = c[stop_i] − c[start_i], c = [0, cumsum]
        c = torch.nn.functional.pad(allowed.to(torch.int32).cumsum(-1), (1, 0))
        c = c.expand(*c.shape[:-2], t_q, t_k + 1)  # (..., T_q, T_k + 1), a view
        idx = torch.stack([start, stop], -1).expand(*c.shape[:-1], 2)
        bounds_count = c.gather(-1, idx)
        empty = (bounds_count[..., 1:] - bounds_count[..., :1] <= 0) | (stop <= start)[:, None]
    if not _no_readback(empty) and not bool(empty.any()):
        return None
    return empty


def hide_unseen_keys(
    allowed: torch.Tensor | None,
    key: torch.Tensor,
    value: torch.Tensor,
    bounds: Bounds | None = None,
    t_q: int = 0,
    blocks: BlockLayout | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero keys/values that no query may see, so NaN/inf stored there cannot leak (0 · NaN = NaN).

    As in :func:`empty_rows`, the check that every key is seen runs on the host except while
    ``torch.compile`` traces.

    Args:
        allowed: the boolean mask, ``True = may attend``, or ``None`` (every key allowed).
        key: the keys.
        value: the values.
        bounds: ``(lo, hi)`` from :meth:`Masking.bounds` (row ``i`` sees
            keys ``i + lo <= j <= i + hi``), else ``None``; without a window the causal rule
            hides no key from every row unless the mask differs per row.
        t_q: number of queries ``T_q``, read with ``bounds`` only.
        blocks: the block-sparse layout, or ``None``; with it ``bounds`` must be given
            (``(None, None)`` when there is neither a causal rule nor a window).

    Returns:
        ``(key, value)``, unchanged when every key is seen by some query, else with the unseen
        positions set to zero (new tensors; the inputs are not modified).

    Shape:
        allowed broadcastable to ``(..., H, T_q, T_k)``; key ``(..., H_kv, T_k, D)``, value
        ``(..., H_kv, T_k, D_v)``; the outputs have the inputs' shapes.
    """
    t_k = key.shape[-2]
    if allowed is None and _structure_sees_every_key(bounds, blocks, t_q, t_k):
        return key, value  # decided on the host from the structure alone: no read-back
    if blocks is not None:
        seen = _seen_in_blocks(allowed, blocks, bounds or (None, None), t_q, t_k, key.device)
    elif bounds is not None:
        seen = _seen_in_band(allowed, bounds, t_q, t_k, key.device)
    elif allowed is None:
        return key, value
    else:
        seen = allowed.any(dim=-2)  # (..., H or 1, T_k)
    if not _no_readback(seen) and bool(seen.all()):
        return key, value
    if allowed is None:
        allowed = seen.unsqueeze(-2)  # only its number of dims and heads are read below
    h, h_kv = allowed.shape[-3] if allowed.dim() >= 3 else 1, key.shape[-3]
    if h != 1 and h != h_kv:  # query heads → their key/value head: seen by any head of the group
        seen = seen.unflatten(-2, (h_kv, h // h_kv)).any(dim=-2)
    seen = seen.unsqueeze(-1)
    zero = torch.zeros((), dtype=key.dtype, device=key.device)
    return torch.where(seen, key, zero), torch.where(seen, value, zero)


def _seen_in_band(
    allowed: torch.Tensor | None, bounds: Bounds, t_q: int, t_k: int, device: torch.device
) -> torch.Tensor:
    """The keys some query sees under a window: key ``j`` is in the window of the rows
    ``j − hi <= i <= j − lo`` (of ``0 … T_q − 1``), counted with a cumulative sum along the
    queries where the mask has rows."""
    lo, hi = bounds
    cols = torch.arange(t_k, device=device)
    first = torch.zeros_like(cols) if hi is None else (cols - hi).clamp(0, t_q)
    stop = torch.full_like(cols, t_q) if lo is None else (cols - lo + 1).clamp(0, t_q)
    in_band = stop > first  # (T_k,)
    if allowed is None:
        return in_band
    if allowed.shape[-2] == 1:
        return in_band & allowed.any(dim=-2)
    c = torch.nn.functional.pad(allowed.to(torch.int32).cumsum(-2), (0, 0, 1, 0))
    c = c.expand(*c.shape[:-1], t_k)  # (..., T_q + 1, T_k), a view
    idx = torch.stack([first, stop], 0).expand(*c.shape[:-2], 2, t_k)
    counts = c.gather(-2, idx)
    return (counts[..., 1, :] - counts[..., 0, :] > 0) & in_band


def _padded_runs(
    runs: tuple[tuple[tuple[int, int], ...], ...], block_size: int, shift: int, limit: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs of blocks as ``(start, stop)`` positions minus ``shift``, clipped to ``0 … limit``,
    one row per block padded with empty runs.   (n, R) each."""
    width = max(1, max(len(r) for r in runs))
    spans = [[*r, *[(0, 0)] * (width - len(r))] for r in runs]
    t = torch.tensor(spans, dtype=torch.long).reshape(len(runs), width, 2) * block_size - shift
    t = t.clamp(0, limit)
    return t[..., 0], t[..., 1]


def _empty_rows_in_blocks(
    allowed: torch.Tensor | None,
    layout: BlockLayout,
    bounds: Bounds,
    t_q: int,
    t_k: int,
    device: torch.device | str,
) -> torch.Tensor | None:
    """:func:`empty_rows` under a block layout: row ``i`` sees the keys of the runs of visible
    blocks of its query block within ``[i + lo, i + hi]``; ``allowed`` counted with a cumulative
    sum along the keys. ``O(T · runs)`` (no ``T_q × T_k`` tensor beyond the mask itself)."""
    if allowed is not None and allowed.shape[-2] > 1:  # a mask per row: dense already
        vis = allowed & expand_blocks(layout.blocks, layout.block_size, t_q, t_k, allowed.device)
        return _empty_rows_in_band(vis, bounds, t_q, t_k, torch.device(device))
    lo, hi = bounds
    rows = torch.arange(t_q, device=device)
    start = torch.zeros_like(rows) if lo is None else (rows + lo).clamp(0, t_k)
    stop = torch.full_like(rows, t_k) if hi is None else (rows + hi + 1).clamp(0, t_k)
    run_start, run_stop = _padded_runs(layout.runs, layout.block_size, 0, t_k)
    block = (rows + (t_k - t_q)) // layout.block_size
    # each run of the row's block, cut to the row's bounds: keys a … z − 1   (T_q, R)
    z = torch.minimum(run_stop.to(device)[block], stop[:, None])
    a = torch.minimum(torch.maximum(run_start.to(device)[block], start[:, None]), z)
    if allowed is None:
        empty = ((z - a).sum(-1) <= 0)[:, None]
    elif allowed.shape[-1] == 1:  # the same for every key
        empty = ~allowed | ((z - a).sum(-1) <= 0)[:, None]
    else:  # seen[i] = Σ_runs c[z] − c[a], c = [0, cumsum(allowed)]
        c = torch.nn.functional.pad(allowed[..., 0, :].to(torch.int32).cumsum(-1), (1, 0))
        empty = ((c[..., z] - c[..., a]).sum(-1) <= 0).unsqueeze(-1)  # (..., T_q, 1)
    if not _no_readback(empty) and not bool(empty.any()):
        return None
    return empty


@functools.lru_cache(maxsize=16)
def _layout_coverage(layout: BlockLayout, bounds: Bounds, t_q: int, t_k: int) -> tuple[bool, bool]:
    """``(no row is empty, every key is seen)`` under a layout and bounds, without a mask:
    computed on the CPU, where the layout lives, once per layout (immutable, compared by
    identity, as its cached ``runs``) and shape; ``O(T · runs)``, 5 ms at ``T = 32768``, too slow
    for every layer of every call."""
    cpu = torch.device("cpu")
    rows = _empty_rows_in_blocks(None, layout, bounds, t_q, t_k, cpu) is None
    keys = bool(_seen_in_blocks(None, layout, bounds, t_q, t_k, cpu).all())
    return rows, keys


def _layout_leaves_every_row_a_key(layout: BlockLayout, bounds: Bounds, t_q: int, t_k: int) -> bool:
    """Whether the layout and bounds leave every row a key (``False`` while ``torch.compile``
    traces: a graph takes the long way, no host-side cache inside it)."""
    return not torch.compiler.is_compiling() and _layout_coverage(layout, bounds, t_q, t_k)[0]


def _structure_sees_every_key(
    bounds: Bounds | None, blocks: BlockLayout | None, t_q: int, t_k: int
) -> bool:
    """Whether the causal rule, the window and the layout alone let some query see every key,
    decided without reading a device tensor (``False``: not known here, take the long way).

    Key ``j`` is seen by the rows ``j − hi <= i <= j − lo``: the band of the transposed problem,
    ``(−hi, −lo)`` over ``T_k`` rows and ``T_q`` columns.
    """
    if bounds is None and blocks is None:
        return True
    lo, hi = bounds or (None, None)
    if blocks is None:
        flipped = (None if hi is None else -hi, None if lo is None else -lo)
        return _band_leaves_every_row_a_key(flipped, t_k, t_q)
    if torch.compiler.is_compiling():
        return False  # a traced graph takes the long way (no host-side cache inside a graph)
    return _layout_coverage(blocks, (lo, hi), t_q, t_k)[1]


def _seen_in_blocks(
    allowed: torch.Tensor | None,
    layout: BlockLayout,
    bounds: Bounds,
    t_q: int,
    t_k: int,
    device: torch.device,
) -> torch.Tensor:
    """The keys some query sees under a block layout: key ``j`` is seen iff a query row of a
    block that sees its block lies in ``[j − hi, j − lo]`` (and ``allowed`` keeps it).
    ``O(T · runs)``."""
    if allowed is not None and allowed.shape[-2] > 1:  # a mask per row: dense already
        vis = allowed & expand_blocks(layout.blocks, layout.block_size, t_q, t_k, allowed.device)
        return _seen_in_band(vis, bounds, t_q, t_k, device)
    lo, hi = bounds
    cols = torch.arange(t_k, device=device)
    first = torch.zeros_like(cols) if hi is None else (cols - hi).clamp(0, t_q)
    stop = torch.full_like(cols, t_q) if lo is None else (cols - lo + 1).clamp(0, t_q)
    # the query rows of the runs of blocks that see each key's block   (T_k, R)
    run_start, run_stop = _padded_runs(layout.query_runs, layout.block_size, t_k - t_q, t_q)
    block = cols // layout.block_size
    z = torch.minimum(run_stop.to(device)[block], stop[:, None])
    a = torch.maximum(run_start.to(device)[block], first[:, None])
    seen = (z > a).any(dim=-1)  # (T_k,)
    if allowed is None:
        return seen
    return allowed.any(dim=-2) & seen


def _no_readback(t: torch.Tensor) -> bool:
    """Whether no tensor value may be read back to the host: while ``torch.compile`` traces, and
    on an accelerator (a read-back is a host synchronisation on the hot path; the shortcuts it
    decides, such as "no row is empty", are optimisations, and the long way is exact too)."""
    return torch.compiler.is_compiling() or t.device.type != "cpu"
