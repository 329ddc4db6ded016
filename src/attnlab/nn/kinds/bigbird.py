"""BigBird: block-sparse attention with global, band and random blocks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, ClassVar

import torch

from attnlab._checks import check_positive_int, check_seed
from attnlab.errors import ArgumentError
from attnlab.nn.block_layout import BlockLayout, bigbird_layout
from attnlab.nn.kinds.base import (
    AttentionSite,
    AttentionSpec,
    CliOption,
    check_int_field,
    register_attention,
)

if TYPE_CHECKING:
    from attnlab.nn.multihead import MultiHeadAttention

__all__ = ["BigBirdSpec", "block_pairs"]


def block_pairs(layout: BlockLayout, q_len: int | None = None) -> int:
    """Query-key scores of a block layout's visible tiles, as the blockwise backend forms them.

    The ``T_q`` queries are the last positions of the ``T = layout.seq_len`` keys (bottom-right
    alignment). Each query block ``r`` (its ``rows(r)`` queries) meets each visible key block
    ``c`` (its ``cols(c)`` keys, fewer in the last, partial block)::

        pairs = Σ_{(r, c) visible} rows(r) · cols(c)

    Under a causal layout the keys past a block's last query are never visited (a tile that
    crosses the diagonal is formed whole up to there, then masked); a single query (a decoding
    step) reads the whole of its visible blocks up to itself.

    Args:
        layout: the :class:`~attnlab.nn.masks.BlockLayout` over the ``T`` keys.
        q_len: queries ``T_q``, in ``1 … T``; default ``T``.

    Returns:
        The number of scores computed.

    Examples:
        >>> from attnlab.nn.block_layout import bigbird_layout
        >>> block_pairs(bigbird_layout(10, block_size=4, num_random_blocks=0))  # 3 blocks, all
        100
    """
    t_k = layout.seq_len
    t_q = t_k if q_len is None else check_positive_int("q_len", q_len)
    if t_q > t_k:
        raise ArgumentError(f"q_len must be at most the layout's seq_len = {t_k}, got {t_q}")
    b = layout.block_size
    total = 0
    for r, r0, r1 in layout.row_spans(t_q):
        # causal: keys past the block's last query are hidden from all of its rows
        end = min(t_k, r1 + t_k - t_q) if layout.causal else t_k
        for c0, c1 in layout.runs[r]:
            total += (r1 - r0) * max(0, min(c1 * b, end) - c0 * b)
    return total


@register_attention
@dataclass(frozen=True)
class BigBirdSpec(AttentionSpec):
    """BigBird's block-sparse attention (Zaheer et al. 2020).

    Blocks of ``block_size`` positions: the first ``global_blocks`` are global (they see and are
    seen by every block), each block sees a band of ``window_blocks`` blocks and
    ``num_random_blocks`` random key blocks drawn from ``seed``
    (:func:`attnlab.masks.bigbird_layout` over the model's positions, :meth:`layout`). A causal
    site uses the causal layout (blocks on or below the diagonal, future keys hidden), with a
    full KV cache while decoding. A sequence of ``T`` positions uses the layout's first ``T``
    (its top-left crop), so a position sees the same blocks whatever the length.
    ``backend="auto"`` runs the blockwise backend, which visits only the visible blocks.

    Args:
        block_size: the block ``b`` in positions (not a context length).
        global_blocks: global blocks, ``>= 0``. Default 1.
        window_blocks: the band's width in blocks, 0 or odd. Default 3 (a block and its two
            neighbours).
        num_random_blocks: random key blocks per query block, ``>= 0``. Default 2.
        seed: the seed the random blocks are drawn from, ``>= 0`` (kept in the config, so a
            saved model rebuilds the same layout). Default 0.

    Examples:
        >>> BigBirdSpec(block_size=64).to_dict()
        {'kind': 'bigbird', 'block_size': 64, 'global_blocks': 1, 'window_blocks': 3, 'num_random_blocks': 2, 'seed': 0}
    """

    name = "bigbird"
    shards_by_heads = True
    cli_options = (
        CliOption(
            "--bigbird-block", "block_size", metavar="B", required=True,
            help="BigBird's block of B tokens (with --attention bigbird; not --block-size, the context)",
        ),
        CliOption(
            "--global-blocks", "global_blocks", "non_negative_int", metavar="G",
            help="BigBird's global blocks, the first G (with --attention bigbird; default 1)",
        ),
        CliOption(
            "--window-blocks", "window_blocks", "non_negative_int", metavar="W",
            help="BigBird's band of W blocks, 0 or odd (with --attention bigbird; default 3)",
        ),
        CliOption(
            "--random-blocks", "num_random_blocks", "non_negative_int", metavar="R",
            help="BigBird's random key blocks per block (with --attention bigbird; default 2)",
        ),
        CliOption(
            "--bigbird-seed", "seed", "non_negative_int", metavar="S",
            help="the seed of BigBird's random blocks (with --attention bigbird; default 0)",
        ),
    )  # fmt: skip
    legacy_fields: ClassVar[Mapping[str, str]] = {
        "block_size": "block_size",
        "global_blocks": "global_blocks",
        "window_blocks": "window_blocks",
        "num_random_blocks": "num_random_blocks",
        "bigbird_seed": "seed",
    }

    block_size: int
    global_blocks: int = 1
    window_blocks: int = 3
    num_random_blocks: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        check_int_field(self, "block_size")
        check_seed("seed", self.seed)  # 32-bit, as every seed of the project
        for name in ("global_blocks", "window_blocks", "num_random_blocks"):
            check_int_field(self, name, minimum=0)
        if self.window_blocks != 0 and self.window_blocks % 2 == 0:
            raise ArgumentError(
                f"window_blocks must be 0 or odd (a block and (w - 1) / 2 neighbours each side), "
                f"got {self.window_blocks}"
            )
        if self.global_blocks == self.window_blocks == self.num_random_blocks == 0:
            raise ArgumentError(
                "attention='bigbird' needs some visible blocks: global_blocks, window_blocks and "
                "num_random_blocks are all 0, so every key would be hidden"
            )

    def label(self) -> str:
        """``bigbird block B global G window W random R seed S``.

        Returns:
            The label.
        """
        return (
            f"bigbird block {self.block_size} global {self.global_blocks} window "
            f"{self.window_blocks} random {self.num_random_blocks} seed {self.seed}"
        )

    def layout(self, seq_len: int, *, causal: bool) -> BlockLayout:
        """The layout over ``seq_len`` positions (one per spec, length and causality: it is
        immutable and shared by a model's layers).

        Args:
            seq_len: the model's positions.
            causal: the causal layout (a GPT, a decoder) or the bidirectional one (an encoder).

        Returns:
            The :class:`~attnlab.nn.masks.BlockLayout`.
        """
        return _layout(self, seq_len, causal)

    def build(self, site: AttentionSite) -> MultiHeadAttention:
        """A :class:`~attnlab.nn.multihead.MultiHeadAttention` with the site's layout.

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
            block_mask=self.layout(site.max_len, causal=site.causal),
        )

    def padded_mask(
        self, site: AttentionSite, keep: torch.Tensor, past: int
    ) -> torch.Tensor | None:
        """The layout read at each row's token positions
        (:meth:`~attnlab.nn.masks.BlockLayout.mask_at`): a left-padded row sees the blocks an
        unpadded one would.

        Args:
            site: the layer's site.
            keep: ``True`` for the real tokens of every position so far.
            past: positions before this call's queries.

        Returns:
            The pattern, ``True`` = may attend.

        Shape:
            keep ``(B, T_past + T)`` → ``(B, T, T_past + T)``.
        """
        where = (keep.long().cumsum(-1) - 1).clamp(min=0)  # each token's position, (B, T_past + T)
        return self.layout(site.max_len, causal=site.causal).mask_at(where[:, past:], where)

    def core_flops(
        self, t_q: int, t_k: int, *, d_head: int, heads: int, kv_heads: int, site: AttentionSite
    ) -> dict[str, int]:
        """``QKᵀ`` and ``PV`` over the visible blocks of the layout's first ``T_k`` positions
        (:func:`block_pairs`), ``2 · H · scores · d_h`` each.

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
        pairs = self.matrix_elements(t_q, t_k, d_head=d_head, site=site)
        return {"scores": 2 * heads * pairs * d_head, "reduce": 2 * heads * pairs * d_head}

    def matrix_elements(self, t_q: int, t_k: int, *, d_head: int, site: AttentionSite) -> int:
        """The visible blocks' scores per head.

        Args:
            t_q: queries.
            t_k: keys.
            d_head: head width.
            site: the layer's site.

        Returns:
            The count.
        """
        return block_pairs(self.layout(site.max_len, causal=site.causal).crop(t_k), t_q)


@lru_cache(maxsize=64)
def _layout(spec: BigBirdSpec, seq_len: int, causal: bool) -> BlockLayout:
    # a layout is host data, drawn on the CPU whatever the default device (a run loader builds
    # its placeholder model on the meta device; a GPU model moves the blocks where they are used)
    with torch.device("cpu"):
        return _draw(spec, seq_len, causal)


def _draw(spec: BigBirdSpec, seq_len: int, causal: bool) -> BlockLayout:
    return bigbird_layout(
        seq_len,
        block_size=spec.block_size,
        global_blocks=spec.global_blocks,
        window_blocks=spec.window_blocks,
        num_random_blocks=spec.num_random_blocks,
        seed=spec.seed,
        causal=causal,
    )
