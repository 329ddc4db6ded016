"""Block-sparse attention masks: which ``(query block, key block)`` tiles are visible.

A :class:`BlockLayout` keeps the visible blocks of a sequence cut into blocks (not a dense
``T × T`` mask), so that the blockwise backend visits only the visible tiles;
:func:`expand_blocks` turns block rows and columns into a dense mask, and :func:`bigbird_layout`
and :func:`bigbird_mask` build BigBird's pattern (Zaheer et al. 2020): global, sliding-window and
random blocks. :mod:`attnlab.nn.masks` re-exports them beside the dense mask builders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

from attnlab._checks import check_positive_int, check_seed, check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError

__all__ = ["BlockLayout", "bigbird_layout", "bigbird_mask", "expand_blocks"]


@dataclass(frozen=True, eq=False)
class BlockLayout:
    """Block-sparse attention: which ``(query block, key block)`` tiles are visible.

    The sequence of ``seq_len`` positions is cut into blocks of ``block_size`` (the last one
    partial when ``block_size`` does not divide ``seq_len``); ``blocks[r, c]`` lets the positions
    of block ``r`` attend to the positions of block ``c``. As a dense mask (aligned bottom-right
    like the causal rule: query ``i`` is position ``p_i = i + T_k - T_q``)::

        mask[i, j] = blocks[p_i // b, j // b]   (and j <= p_i when causal)

    Pass it as ``block_mask=`` to :func:`attnlab.scaled_dot_product_attention`: every backend
    applies it (``"math"`` and ``"sdpa"`` through the dense mask), and ``"blockwise"`` visits only
    the visible tiles, so its time and memory grow with the number of visible blocks, not ``T²``.
    Build one with :func:`bigbird_layout`, or from any boolean block matrix.

    Attributes:
        blocks: the visible blocks, ``True = may attend``; kept on the CPU (it is small and the
            blockwise backend plans its tiles from it).
        block_size: positions per block ``b``, a positive int.
        seq_len: the number of positions ``T`` the layout covers; the keys must have
            ``T_k = seq_len`` and the queries ``T_q <= seq_len`` (the last ``T_q`` positions).
        causal: also apply the causal rule inside the visible blocks (``j <= p_i``).

    Raises:
        TypeError: ``blocks`` is not a boolean tensor, or an argument is not an int / bool.
        ValueError: ``blocks`` is not ``(⌈T / b⌉, ⌈T / b⌉)``, or ``block_size`` or ``seq_len`` is
            not positive.

    Shape:
        blocks ``(⌈T / b⌉, ⌈T / b⌉)``; :meth:`to_dense` gives ``(T_q, T)``.

    Examples:
        >>> layout = BlockLayout(torch.tensor([[True, False], [True, True]]), 2, 3)
        >>> layout.to_dense().int()
        tensor([[1, 1, 0],
                [1, 1, 0],
                [1, 1, 1]], dtype=torch.int32)
    """

    blocks: torch.Tensor
    block_size: int
    seq_len: int
    causal: bool = False
    # seq_len -> the layout's crop to that length (see crop): a decoding loop builds each once
    _crops: dict[int, BlockLayout] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        check_tensor("blocks", self.blocks)
        if self.blocks.dtype != torch.bool:
            raise ArgumentTypeError(
                f"blocks must be a bool tensor (True = may attend), got dtype {self.blocks.dtype}"
            )
        check_positive_int("block_size", self.block_size)
        check_positive_int("seq_len", self.seq_len)
        if not isinstance(self.causal, bool):
            raise ArgumentTypeError(f"causal must be a bool, got {type(self.causal).__name__}")
        n = -(-self.seq_len // self.block_size)
        if tuple(self.blocks.shape) != (n, n):
            raise ArgumentError(
                f"blocks has shape {shape_str(self.blocks.shape)} but must be "
                f"(ceil(seq_len / block_size),) * 2 = ({n}, {n}) for seq_len = {self.seq_len}, "
                f"block_size = {self.block_size}"
            )
        # small: kept on the host, where the tile plans read it
        object.__setattr__(self, "blocks", self.blocks.detach().to("cpu").clone())

    @property
    def num_blocks(self) -> int:
        """Blocks along each side, ``⌈T / b⌉``."""
        return int(self.blocks.shape[0])

    @property
    def num_visible(self) -> int:
        """How many ``(query block, key block)`` tiles are visible."""
        return int(self.blocks.sum())

    @cached_property
    def runs(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """The visible key blocks of each query block as runs ``(c0, c1)``: blocks ``c0 … c1 − 1``.

        Returns:
            One tuple of runs per query block, in order of the key blocks.
        """
        return _runs(self.blocks)

    @cached_property
    def query_runs(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """The query blocks that see each key block, as runs ``(r0, r1)``: blocks ``r0 … r1 − 1``.

        Returns:
            One tuple of runs per key block, in order of the query blocks.
        """
        return _runs(self.blocks.T)

    def row_spans(self, q_len: int) -> list[tuple[int, int, int]]:
        """The query blocks met by ``q_len`` queries, the last positions of the sequence.

        Args:
            q_len: number of queries ``T_q`` (query ``i`` is position ``i + T - T_q``).

        Returns:
            ``(r, r0, r1)`` for each block ``r`` holding some query: its query rows are
            ``r0 … r1 − 1``.
        """
        b, off = self.block_size, self.seq_len - q_len
        out = []
        for r in range(off // b, self.num_blocks):
            r0, r1 = max(0, r * b - off), min(q_len, (r + 1) * b - off)
            if r0 < r1:
                out.append((r, r0, r1))
        return out

    def crop(self, seq_len: int) -> BlockLayout:
        """The layout of the first ``seq_len`` positions: the top-left corner of this one.

        Position ``j`` keeps its block ``j // b`` and the blocks it sees, so that the pattern a
        position sees does not depend on the length of the sequence it is in: a model's layout
        built for its longest sequence serves every shorter one, and a decoding step with a KV
        cache (the last query of ``T_k`` keys) sees exactly what that row sees in the full
        forward::

            layout.crop(t).to_dense() == layout.to_dense()[:t, :t]

        Crops are kept (one per length asked for), so that a decoding loop pays for each length
        once; their ``runs`` are this layout's runs cut at ``seq_len``.

        Args:
            seq_len: positions to keep ``T'``, in ``1 … seq_len``.

        Returns:
            A :class:`BlockLayout` over ``seq_len`` positions (``self`` for ``seq_len`` itself),
            with the same ``block_size`` and ``causal``.

        Raises:
            ValueError: ``seq_len`` is not a positive int or is longer than the layout's.

        Examples:
            >>> layout = bigbird_layout(12, block_size=2, num_random_blocks=0)
            >>> layout.crop(7).blocks.int()     # 4 of the 6 blocks, the last one partial
            tensor([[1, 1, 1, 1],
                    [1, 1, 1, 0],
                    [1, 1, 1, 1],
                    [1, 0, 1, 1]], dtype=torch.int32)
        """
        check_positive_int("seq_len", seq_len)
        if seq_len > self.seq_len:
            raise ArgumentError(
                f"seq_len must be at most the layout's seq_len = {self.seq_len} (a layout can be "
                f"cropped, not grown), got {seq_len}"
            )
        if seq_len == self.seq_len:
            return self
        crops = self._crops
        if seq_len not in crops:
            m = -(-seq_len // self.block_size)
            crop = BlockLayout(self.blocks[:m, :m], self.block_size, seq_len, self.causal)
            # the runs of the first m blocks, cut at block m: no pass over the m × m blocks
            crop.__dict__["runs"] = _cut_runs(self.runs[:m], m)
            crop.__dict__["query_runs"] = _cut_runs(self.query_runs[:m], m)
            crops[seq_len] = crop
        return crops[seq_len]

    def mask_at(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """The layout's mask between given positions, e.g. per row of a left-padded batch.

        ``mask[..., i, j] = blocks[q_i // b, k_j // b]`` (and ``k_j <= q_i`` when causal), the
        dense mask read at the positions instead of the slots: a row whose tokens start at slot
        ``s`` (left padding) passes ``slot − s`` and sees the pattern of an unpadded row.

        Args:
            q_positions: the queries' positions, integers in ``0 … seq_len − 1``.
            k_positions: the keys' positions, likewise, with the same leading dims.

        Returns:
            A boolean mask, ``True = may attend``, on the positions' device.

        Shape:
            q_positions ``(..., T_q)``, k_positions ``(..., T_k)`` → ``(..., T_q, T_k)``.

        Examples:
            >>> layout = BlockLayout(torch.tensor([[True, False], [False, True]]), 2, 4)
            >>> layout.mask_at(torch.tensor([0, 3]), torch.tensor([1, 2])).int()
            tensor([[1, 0],
                    [0, 1]], dtype=torch.int32)
        """
        q = check_tensor("q_positions", q_positions).unsqueeze(-1)  # (..., T_q, 1)
        k = check_tensor("k_positions", k_positions).unsqueeze(-2)  # (..., 1, T_k)
        b = self.block_size
        mask = self.blocks.to(q.device)[q // b, k // b]
        if self.causal:
            mask = mask & (k <= q)
        return mask

    def to_dense(
        self, q_len: int | None = None, device: torch.device | str | None = None
    ) -> torch.Tensor:
        """The layout as a dense boolean mask, the causal rule included when ``causal``.

        Args:
            q_len: number of queries ``T_q``, the last positions of the sequence (default
                ``seq_len``).
            device: where to build it (default: the current default device).

        Returns:
            A boolean mask, ``True = may attend``.

        Raises:
            ValueError: ``q_len`` is not in ``1 … seq_len``.

        Shape:
            ``(T_q, T)``.
        """
        t = self.seq_len
        q_len = t if q_len is None else check_positive_int("q_len", q_len)
        if q_len > t:
            raise ArgumentError(f"q_len must be at most seq_len = {t}, got {q_len}")
        mask = expand_blocks(self.blocks, self.block_size, q_len, t, device)
        if self.causal:
            # a deferred import: masks re-exports this module's names
            from attnlab.nn.masks import causal_mask

            mask &= causal_mask(q_len, t, device=device)
        return mask


def _cut_runs(
    runs: tuple[tuple[tuple[int, int], ...], ...], m: int
) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Runs ``(c0, c1)`` of blocks cut to the first ``m`` blocks (runs past them dropped)."""
    return tuple(tuple((c0, min(c1, m)) for c0, c1 in row if c0 < m) for row in runs)


def _runs(blocks: torch.Tensor) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Each row's ``True`` entries of a boolean matrix as runs ``(c0, c1)`` of columns."""
    out = []
    for row in blocks.tolist():
        runs, c0 = [], None
        for c, seen in enumerate([*row, False]):
            if seen and c0 is None:
                c0 = c
            elif not seen and c0 is not None:
                runs.append((c0, c))
                c0 = None
        out.append(tuple(runs))
    return tuple(out)


def expand_blocks(
    blocks: torch.Tensor,
    block_size: int,
    q_len: int,
    seq_len: int,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """A block matrix as a dense mask over positions, queries aligned bottom-right.

    ``mask[i, j] = blocks[(i + T - T_q) // b, j // b]`` (no causal rule).

    Args:
        blocks: the block matrix.
        block_size: positions per block ``b``.
        q_len: number of queries ``T_q`` (the last positions).
        seq_len: number of positions ``T``.
        device: where to build it.

    Returns:
        The dense boolean mask.

    Shape:
        blocks ``(⌈T / b⌉, ⌈T / b⌉)`` → ``(T_q, T)``.
    """
    grid = blocks.to(device).repeat_interleave(block_size, 0)[seq_len - q_len : seq_len]
    return grid.repeat_interleave(block_size, 1)[:, :seq_len]


def bigbird_layout(
    seq_len: int,
    *,
    block_size: int,
    global_blocks: int | Sequence[int] = 1,
    window_blocks: int = 3,
    num_random_blocks: int = 2,
    seed: int = 0,
    generator: torch.Generator | None = None,
    causal: bool = False,
) -> BlockLayout:
    """The block layout of BigBird (Zaheer et al. 2020, §2 and App. D; Longformer's global tokens).

    Three kinds of visible blocks, over ``n = ⌈T / b⌉`` blocks (the last one partial):

    * **global** blocks ``g`` (BigBird-ITC): ``blocks[g, :]`` and ``blocks[:, g]`` — global
      positions see every key and every query sees them;
    * a **sliding band** of ``window_blocks`` blocks: ``|r − c| <= window_blocks // 2`` (BigBird's 3
      is a block and its two neighbours);
    * ``num_random_blocks`` **random** key blocks for each non-global query block, drawn without
      replacement among the blocks the first two leave hidden (fewer where fewer are left);
      reproducible from ``seed`` (or ``generator``).

    ``causal=True`` keeps only the blocks on or below the diagonal (the random blocks are drawn
    among those), and the layout applies the causal rule inside them (``j <= i``): a global block
    then sees the past only, and is seen by the queries after it.

    Args:
        seq_len: number of positions ``T``, a positive int.
        block_size: positions per block ``b``, a positive int.
        global_blocks: an int ``g``: the first ``g`` blocks are global (default 1, e.g. a
            ``[CLS]`` block; more than ``n`` means all); or a sequence of block indices (negative
            ones count from the end, BigBird-ITC's ``(0, -1)``).
        window_blocks: the band's width in blocks: ``0`` (no band) or an odd int.
        num_random_blocks: random key blocks per query block, ``>= 0``.
        seed: seeds the draw of the random blocks when ``generator`` is ``None``: an int in
            ``[0, 2**32)``.
        generator: a CPU ``torch.Generator`` to draw the random blocks from instead of ``seed``.
        causal: keep the blocks on or below the diagonal and the causal rule inside them.

    Returns:
        The :class:`BlockLayout`.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: ``seq_len`` or ``block_size`` is not positive, ``window_blocks`` is negative
            or even, ``num_random_blocks`` is negative, or a global block index is out of range.

    Examples:
        >>> layout = bigbird_layout(8, block_size=2, num_random_blocks=0)
        >>> layout.blocks.int()
        tensor([[1, 1, 1, 1],
                [1, 1, 1, 0],
                [1, 1, 1, 1],
                [1, 0, 1, 1]], dtype=torch.int32)
    """
    t = check_positive_int("seq_len", seq_len)
    b = check_positive_int("block_size", block_size)
    n = -(-t // b)
    glob = _global_blocks(global_blocks, n)
    w = _non_negative_int("window_blocks", window_blocks)
    if w % 2 == 0 and w != 0:
        raise ArgumentError(
            f"window_blocks must be 0 or odd (a block and (w - 1) / 2 neighbours each side), got {w}"
        )
    k = _non_negative_int("num_random_blocks", num_random_blocks)
    if generator is None:
        generator = torch.Generator().manual_seed(check_seed("seed", seed))
    elif not isinstance(generator, torch.Generator):
        raise ArgumentTypeError(f"generator must be a torch.Generator or None, got {generator!r}")
    if not isinstance(causal, bool):
        raise ArgumentTypeError(f"causal must be a bool, got {type(causal).__name__}")

    r = torch.arange(n)[:, None]
    c = torch.arange(n)[None, :]
    blocks = (r - c).abs() <= w // 2 if w else torch.zeros(n, n, dtype=torch.bool)
    is_global = torch.zeros(n, dtype=torch.bool)
    is_global[list(glob)] = True
    blocks |= is_global[:, None] | is_global[None, :]
    if causal:
        blocks &= c <= r
    if k:
        # k random picks per row among the hidden candidates: the k largest of uniform scores
        candidates = ~blocks & ~is_global[:, None]
        if causal:
            candidates &= c <= r
        scores = torch.rand(n, n, generator=generator, device=generator.device).cpu()
        scores = scores.masked_fill(~candidates, -1.0)
        picked = torch.zeros_like(blocks).scatter_(1, scores.topk(min(k, n), dim=1).indices, True)
        blocks |= picked & candidates
    return BlockLayout(blocks, b, t, causal)


def bigbird_mask(
    seq_len: int,
    *,
    block_size: int,
    global_blocks: int | Sequence[int] = 1,
    window_blocks: int = 3,
    num_random_blocks: int = 2,
    seed: int = 0,
    generator: torch.Generator | None = None,
    causal: bool = False,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """BigBird's attention mask, dense: ``bigbird_layout(...).to_dense()``.

    See :func:`bigbird_layout` for the layout; prefer passing the layout itself as
    ``block_mask=`` to :func:`attnlab.scaled_dot_product_attention`, which the blockwise
    backend turns into visiting the visible tiles only.

    Args:
        seq_len: number of positions ``T``.
        block_size: positions per block ``b``.
        global_blocks: an int ``g`` (the first ``g`` blocks) or a sequence of block indices.
        window_blocks: the band's width in blocks: ``0`` or an odd int.
        num_random_blocks: random key blocks per query block.
        seed: seeds the random blocks when ``generator`` is ``None``.
        generator: a CPU ``torch.Generator`` for the random blocks.
        causal: blocks on or below the diagonal only, and the causal rule inside them.
        device: where to build the mask.

    Returns:
        A boolean mask, ``True = may attend``.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: an argument is out of range (see :func:`bigbird_layout`).

    Shape:
        ``(T, T)``.
    """
    layout = bigbird_layout(
        seq_len,
        block_size=block_size,
        global_blocks=global_blocks,
        window_blocks=window_blocks,
        num_random_blocks=num_random_blocks,
        seed=seed,
        generator=generator,
        causal=causal,
    )
    return layout.to_dense(device=device)


def _non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ArgumentError(f"{name} must be >= 0, got {value}")
    return value


def _global_blocks(global_blocks: object, n: int) -> tuple[int, ...]:
    if isinstance(global_blocks, int) and not isinstance(global_blocks, bool):
        g = _non_negative_int("global_blocks", global_blocks)
        return tuple(range(min(g, n)))
    if not isinstance(global_blocks, (tuple, list, range)):
        raise ArgumentTypeError(
            f"global_blocks must be an int (the first g blocks) or a sequence of block indices, "
            f"got {global_blocks!r}"
        )
    out = []
    for idx in global_blocks:
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise ArgumentTypeError(f"global_blocks must hold ints, got {idx!r}")
        if not -n <= idx < n:
            raise ArgumentError(
                f"global_blocks holds block {idx}, out of range for {n} blocks (-{n} … {n - 1})"
            )
        out.append(idx % n)
    return tuple(sorted(set(out)))
