"""Masks after validation: the one form every attention backend reads.

:func:`normalize_mask` checks a user's mask against the query and key shapes and turns it, with
``is_causal``, into a :class:`Masking`: a boolean ``allowed`` tensor (``True = may attend``), a
finite additive ``bias``, and the causal rule kept as *structure* (``causal_offset``) rather than
as a dense ``T_q × T_k`` tensor, so that a backend can skip the tiles the rule hides.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from attnlab._checks import broadcast_or_raise, check_tensor
from attnlab.nn.masks import is_masked_bias

__all__ = ["Masking", "empty_rows", "hide_unseen_keys", "normalize_mask"]


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

    Shape:
        ``allowed`` and ``bias`` broadcastable to ``(..., H, T_q, T_k)``, e.g. ``(B, 1, 1, T_k)``
        for a padding mask; ``shift`` broadcastable to ``(..., H, T_q, 1)``.
    """

    allowed: torch.Tensor | None
    bias: torch.Tensor | None
    causal_offset: int | None
    shift: torch.Tensor | None = None

    def visible(self, t_q: int, t_k: int, device: torch.device) -> torch.Tensor | None:
        """``allowed`` and the causal rule together, as one boolean mask.

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
            nothing is hidden).

        Shape:
            rows ``(..., T_q, 1)`` boolean, broadcastable against the mask.
        """
        vis = self.visible(t_q, t_k, device)
        if vis is None:  # nothing is hidden, so no row needs opening
            return self
        return Masking(vis | rows, self.bias, None, self.shift)


def normalize_mask(
    query: torch.Tensor, key: torch.Tensor, mask: object, is_causal: bool
) -> Masking:
    """Check a user's ``mask`` against the queries and keys and turn it, with ``is_causal``, into
    a :class:`Masking`.

    Args:
        query: the queries (their shape and device are what the mask is checked against).
        key: the keys (their length is ``T_k``).
        mask: ``None``, a boolean mask (``True = may attend``) or a floating additive bias in which
            ``-inf`` or the dtype's minimum hides a key.
        is_causal: add the bottom-right causal rule (kept as ``causal_offset``, not as a tensor).

    Returns:
        The normalised masking; a floating mask's hidden entries move into ``allowed`` and the rest
        becomes a finite ``bias`` in the query's dtype, shifted so that each row's largest visible
        entry is 0 (softmax does not change; the log-sum-exp of a row moves by that shift).

    Raises:
        TypeError: ``mask`` is not a tensor, or neither bool nor floating.
        ValueError: ``mask`` does not broadcast to ``(..., H, T_q, T_k)``, is on another device, or
            holds NaN or ``+inf``.

    Shape:
        query ``(..., H, T_q, D)``, key ``(..., H_kv, T_k, D)``, mask broadcastable to
        ``(..., H, T_q, T_k)``.
    """
    t_q, t_k = query.shape[-2], key.shape[-2]
    # the causal rule hides nothing from a single query aligned bottom-right (a decoding step)
    causal_offset = t_k - t_q if is_causal and t_q != 1 else None
    if mask is None:
        return Masking(None, None, causal_offset)
    mask = check_tensor("mask", mask)
    if not (mask.dtype == torch.bool or mask.is_floating_point()):
        raise TypeError(
            f"mask must be bool (True = may attend) or floating (additive), got dtype {mask.dtype}"
        )
    if mask.device != query.device:
        raise ValueError(f"mask must be on the query's device {query.device}, got {mask.device}")
    target = (*query.shape[:-1], t_k)
    broadcast_or_raise("mask", mask.shape, target, "(..., H, T_q, T_k)")
    if mask.dim() < len(target):  # any rank that broadcasts: the missing leading dims are 1
        mask = mask.reshape((1,) * (len(target) - mask.dim()) + tuple(mask.shape))
    if mask.dtype == torch.bool:
        return Masking(mask, None, causal_offset)
    if not _tracing():
        _check_bias_values(mask)
    hidden = is_masked_bias(mask)
    # softmax(s + b) = softmax(s + b − c) for any c constant along a row: each row's largest
    # visible bias moves to 0, so biases such as −1e9 everywhere neither swallow the scores in
    # rounding nor overflow to −∞ in a half-precision query dtype
    row_max = mask.masked_fill(hidden, float("-inf")).amax(dim=-1, keepdim=True)
    shift = row_max.masked_fill(row_max == float("-inf"), 0.0)
    bias = (mask - shift).to(query.dtype)
    # what the query's dtype cannot hold (below its minimum) hides the key: its weight is 0 anyway
    hidden = hidden | is_masked_bias(bias)
    return Masking(~hidden, bias.masked_fill(hidden, 0.0), causal_offset, shift)


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
        raise ValueError(
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
    if not _tracing() and not bool(empty.any()):
        return None
    return empty


def hide_unseen_keys(
    allowed: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero keys/values that no query may see, so NaN/inf stored there cannot leak (0 · NaN = NaN).

    As in :func:`empty_rows`, the check that every key is seen runs on the host except while
    ``torch.compile`` traces.

    Args:
        allowed: the boolean mask, ``True = may attend``.
        key: the keys.
        value: the values.

    Returns:
        ``(key, value)``, unchanged when every key is seen by some query, else with the unseen
        positions set to zero (new tensors; the inputs are not modified).

    Shape:
        allowed broadcastable to ``(..., H, T_q, T_k)``; key ``(..., H_kv, T_k, D)``, value
        ``(..., H_kv, T_k, D_v)``; the outputs have the inputs' shapes.
    """
    seen = allowed.any(dim=-2)  # (..., H or 1, T_k)
    if not _tracing() and bool(seen.all()):
        return key, value
    h, h_kv = allowed.shape[-3] if allowed.dim() >= 3 else 1, key.shape[-3]
    if h != 1 and h != h_kv:  # query heads → their key/value head: seen by any head of the group
        seen = seen.unflatten(-2, (h_kv, h // h_kv)).any(dim=-2)
    seen = seen.unsqueeze(-1)
    zero = torch.zeros((), dtype=key.dtype, device=key.device)
    return torch.where(seen, key, zero), torch.where(seen, value, zero)


def _tracing() -> bool:
    """Whether ``torch.compile`` is tracing: no tensor value may be read back to the host then."""
    return torch.compiler.is_compiling()
