"""Sliding-window attention: each query sees the ``w`` keys before it (and, in an encoder, the
``w`` after it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from attnlab.nn.kinds.base import (
    AttentionSite,
    AttentionSpec,
    CliOption,
    check_int_field,
    register_attention,
)

if TYPE_CHECKING:
    from attnlab.nn.multihead import MultiHeadAttention

__all__ = ["SlidingSpec", "window_pairs"]


def window_pairs(t_q: int, t_k: int, left: int | None, right: int | None) -> int:
    """Query-key pairs a sliding window lets through (causal alignment bottom-right).

    Query ``i`` sits at position ``p = i + T_k − T_q`` and sees keys
    ``max(0, p − left) ≤ j ≤ min(T_k − 1, p + right)`` (``None`` is unbounded).

    Args:
        t_q: queries ``T_q``.
        t_k: keys ``T_k``.
        left: keys before the query's position it sees (``None``: all).
        right: keys after it (``None``: all; 0 is causal).

    Returns:
        The number of visible pairs.

    Examples:
        >>> window_pairs(5, 5, 1, 0)    # 1 + 2 + 2 + 2 + 2
        9
    """
    total = 0
    for i in range(t_q):
        p = i + t_k - t_q
        lo = 0 if left is None else max(0, p - left)
        hi = t_k - 1 if right is None else min(t_k - 1, p + right)
        total += max(0, hi - lo + 1)
    return total


@register_attention
@dataclass(frozen=True)
class SlidingSpec(AttentionSpec):
    """Local attention in a window of ``window`` positions (Longformer's local attention,
    Mistral's ``sliding_window``).

    At a causal site (a GPT, a decoder) each token sees itself and the ``window`` tokens before
    it, the window ``(window, 0)``, and decoding keeps a rolling KV cache of ``window``
    positions; at a bidirectional site (an encoder) the symmetric window ``(window, window)``.

    Args:
        window: the window ``w``, a positive int.

    Examples:
        >>> SlidingSpec(window=256).to_dict()
        {'kind': 'sliding', 'window': 256}
    """

    name = "sliding"
    shards_by_heads = True
    decodes_statically = True
    cli_options = (
        CliOption(
            "--window", "window", required=True,
            help="sliding window w: a token sees the w tokens before it (with --attention sliding)",
        ),
    )  # fmt: skip
    legacy_fields: ClassVar[Mapping[str, str]] = {"window": "window"}

    window: int

    def __post_init__(self) -> None:
        check_int_field(self, "window")

    def label(self) -> str:
        """``sliding window w``.

        Returns:
            The label.
        """
        return f"sliding window {self.window}"

    def sides(self, *, causal: bool) -> tuple[int, int]:
        """The window ``(left, right)`` at a causal or bidirectional site.

        Args:
            causal: the site is causal.

        Returns:
            ``(w, 0)`` or ``(w, w)``.
        """
        return (self.window, 0) if causal else (self.window, self.window)

    def build(self, site: AttentionSite) -> MultiHeadAttention:
        """A :class:`~attnlab.nn.multihead.MultiHeadAttention` with the site's window.

        Args:
            site: the model's sizes and the layer's role.

        Returns:
            The layer.
        """
        from attnlab.nn.multihead import MultiHeadAttention

        return site.layer(
            MultiHeadAttention,
            backend=site.backend,
            rotary=site.rotary,
            window=self.sides(causal=site.causal),
        )

    def core_flops(
        self, t_q: int, t_k: int, *, d_head: int, heads: int, kv_heads: int, site: AttentionSite
    ) -> dict[str, int]:
        """``QKᵀ`` and ``PV`` over the visible pairs only (:func:`window_pairs`): the
        pattern's ideal count, ``2 · H · pairs · d_h`` each.

        Args:
            t_q: queries.
            t_k: keys.
            d_head: head width.
            heads: query heads.
            kv_heads: key/value heads.
            site: the layer's site.

        Returns:
            ``{"scores": …, "reduce": …}``.
        """
        pairs = window_pairs(t_q, t_k, *self.sides(causal=site.causal))
        return {"scores": 2 * heads * pairs * d_head, "reduce": 2 * heads * pairs * d_head}

    def matrix_elements(self, t_q: int, t_k: int, *, d_head: int, site: AttentionSite) -> int:
        """``T_q · min(T_k, span)`` weights per head (the window's span).

        Args:
            t_q: queries.
            t_k: keys.
            d_head: head width.
            site: the layer's site.

        Returns:
            The count.
        """
        left, right = self.sides(causal=site.causal)
        return t_q * min(t_k, left + 1 + right)

    def cache_bytes(
        self, seq_len: int, *, batch: int, kv_heads: int, d_head: int, dtype: torch.dtype
    ) -> int:
        """A rolling cache of ``min(T, w)`` positions.

        Args:
            seq_len: tokens decoded.
            batch: sequences.
            kv_heads: ``H_kv``.
            d_head: ``d_h``.
            dtype: the cache's dtype.

        Returns:
            The size in bytes.
        """
        return super().cache_bytes(
            min(seq_len, self.window), batch=batch, kv_heads=kv_heads, d_head=d_head, dtype=dtype
        )
