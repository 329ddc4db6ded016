"""Which tiles of the score matrix an attention pass visits: the blockwise backend's plan.

A :class:`TilePlan` lists, per block of query rows, the key ranges (:class:`Tile`) that some row of
the block may see, and which of them a rule cuts (so that only those pay for a mask):

* :meth:`TilePlan.make` — every key, or under a causal mask only the keys up to the block's last
  row's diagonal (the keys every row sees come unmasked; only the tile crossing the diagonal is
  masked): ``O(T_q · T_k / 2)`` scores under a causal mask;
* :meth:`TilePlan.make_band` — a sliding window: only the keys between the first row's window
  start and the last row's window end, ``O(T_q · (w + query_block))`` scores;
* :meth:`TilePlan.make_blocks` — a block layout (BigBird's): only the runs of visible key blocks,
  ``O(#visible blocks · b²)`` scores.

Both ways of computing a tile — the online softmax written out in PyTorch
(:mod:`attnlab.nn.backends.blockwise`) and PyTorch's fused CPU kernel per tile
(:mod:`attnlab.nn.backends.fused_tiles`) — follow the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.nn.block_layout import BlockLayout

__all__ = ["Tile", "TilePlan"]


@dataclass(frozen=True)
class Tile:
    """Query rows ``r0:r1`` against keys ``j0:j1`` of one attention pass.

    Args:
        r0: first query row.
        r1: one past the last query row.
        j0: first key.
        j1: one past the last key.
        mask_from: keys from here on are cut by the causal rule for some rows
            (``mask_from >= j1``: the tile needs no causal mask).
        band: some of its keys lie outside some row's sliding window (the plan's ``band``).
    """

    r0: int
    r1: int
    j0: int
    j1: int
    mask_from: int
    band: bool = False

    @property
    def diagonal(self) -> bool:
        """The causal rule cuts this tile (it crosses the diagonal).

        Returns:
            ``mask_from < j1``.
        """
        return self.mask_from < self.j1


@dataclass(frozen=True)
class TilePlan:
    """The tiles a pass visits, grouped by query block.

    Args:
        blocks: one tuple of tiles per query block (all with that block's ``r0:r1``).
        causal_offset: the causal rule, row ``i`` sees keys ``j <= i + causal_offset``, or
            ``None`` (a band holds it instead).
        band: under a sliding window ``(lo, hi)``: row ``i`` sees keys ``i + lo <= j <= i + hi``
            (``None`` for an open side); ``None`` without a window.
    """

    blocks: tuple[tuple[Tile, ...], ...]
    causal_offset: int | None
    band: tuple[int | None, int | None] | None = None

    @staticmethod
    def make_band(
        t_q: int, t_k: int, q_block: int, k_block: int, bounds: tuple[int | None, int | None]
    ) -> TilePlan:
        """Only the tiles that meet the band: ``O(T_q · (w + q_block))`` scores in all.

        Args:
            t_q: query rows.
            t_k: keys.
            q_block: query rows per block.
            k_block: the most keys per tile.
            bounds: ``(lo, hi)``, row ``i`` sees keys ``i + lo <= j <= i + hi`` (``None``: open);
                the causal rule, if any, is already part of ``hi``.

        Returns:
            The plan; a tile is marked ``band`` when the window cuts some of its rows.
        """
        lo, hi = bounds
        blocks = []
        for r0 in range(0, t_q, q_block):
            r1 = min(r0 + q_block, t_q)
            start = 0 if lo is None else max(0, r0 + lo)  # keys seen by some row of the block
            end = t_k if hi is None else min(t_k, r1 + hi)
            tiles = []
            for j0 in range(start, end, k_block):
                j1 = min(j0 + k_block, end)
                # keys [r1 - 1 + lo, r0 + hi] are in the window of every row of the block
                cut = (lo is not None and j0 < r1 - 1 + lo) or (hi is not None and j1 - 1 > r0 + hi)
                tiles.append(Tile(r0, r1, j0, j1, j1, cut))
            blocks.append(tuple(tiles))
        return TilePlan(tuple(blocks), None, bounds)

    @staticmethod
    def make_blocks(
        t_q: int,
        t_k: int,
        k_block: int,
        layout: BlockLayout,
        causal_offset: int | None,
        bounds: tuple[int | None, int | None] | None,
    ) -> TilePlan:
        """Only the visible tiles of a block layout: a query block of the layout (its ``b`` rows)
        against each run of consecutive visible key blocks (split at ``k_block`` keys), clipped
        to the keys the causal rule or the window leave to some row; ``O(#visible blocks · b²)``
        scores in all. With a window the plan masks as :meth:`make_band` does (``bounds`` holds
        the causal rule), else the causal rule masks as in :meth:`make`.

        Args:
            t_q: query rows (the last ``t_q`` positions of the layout when ``t_q < t_k``).
            t_k: keys.
            k_block: the most keys per tile.
            layout: the block layout.
            causal_offset: row ``i`` sees keys ``j <= i + causal_offset``, or ``None``.
            bounds: a sliding window's ``(lo, hi)`` with the causal rule in it, or ``None``.

        Returns:
            The plan.

        Raises:
            RuntimeError: some query block sees no tile (the caller opens such rows first).
        """
        lo, hi = (None, causal_offset) if bounds is None else bounds
        b = layout.block_size
        blocks = []
        for r, r0, r1 in layout.row_spans(t_q):
            start = 0 if lo is None else max(0, r0 + lo)  # keys seen by some row of the block
            end = t_k if hi is None else min(t_k, r1 + hi)
            # causal (no window): keys < full are seen by every row of the block
            full = t_k if causal_offset is None else max(0, min(t_k, r0 + causal_offset + 1))
            tiles = []
            for c0, c1 in layout.runs[r]:
                for j0 in range(max(c0 * b, start), min(c1 * b, end), k_block):
                    j1 = min(j0 + k_block, c1 * b, end)
                    if bounds is None:
                        tiles.append(Tile(r0, r1, j0, j1, full))
                    else:
                        cut = (lo is not None and j0 < r1 - 1 + lo) or (
                            hi is not None and j1 - 1 > r0 + hi
                        )
                        tiles.append(Tile(r0, r1, j0, j1, j1, cut))
            if not tiles:  # attend() opens rows that see nothing, so this cannot happen
                raise RuntimeError(f"query rows {r0}…{r1 - 1} see no tile of the block layout")
            blocks.append(tuple(tiles))
        if bounds is None:
            return TilePlan(tuple(blocks), causal_offset)
        return TilePlan(tuple(blocks), None, bounds)

    @staticmethod
    def make(t_q: int, t_k: int, q_block: int, k_block: int, causal_offset: int | None) -> TilePlan:
        """Every key, or under a causal rule the keys up to each query block's last diagonal.

        The keys every row of a block sees come in unmasked tiles; only the last tile, which
        crosses the diagonal, is masked (its ``mask_from``).

        Args:
            t_q: query rows.
            t_k: keys.
            q_block: query rows per block.
            k_block: the most keys per tile.
            causal_offset: row ``i`` sees keys ``j <= i + causal_offset``, or ``None``.

        Returns:
            The plan.
        """
        blocks = []
        for r0 in range(0, t_q, q_block):
            r1 = min(r0 + q_block, t_q)
            if causal_offset is None:
                end, full = t_k, t_k
            else:
                end = min(t_k, r1 + causal_offset)  # keys < end: seen by some row of the block
                full = max(0, min(t_k, r0 + causal_offset + 1))  # keys < full: seen by every row
            # the last tile also holds the keys that cross the diagonal; only they get masked
            tiles = [
                Tile(r0, r1, j0, min(j0 + k_block, end), full) for j0 in range(0, end, k_block)
            ]
            blocks.append(tuple(tiles))
        return TilePlan(tuple(blocks), causal_offset)
