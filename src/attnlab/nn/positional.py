"""Positional encodings: sinusoidal, learned, rotary (RoPE) and ALiBi.

Attention itself is permutation-equivariant; these tell it where tokens are.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from attnlab._checks import check_positive_int, check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.nn.rope import PAIRINGS, RopeScaling, rope_frequencies

__all__ = [
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "alibi_bias",
    "alibi_slopes",
    "sinusoidal_table",
]


def sinusoidal_table(max_len: int, d_model: int, *, base: float = 10000.0) -> torch.Tensor:
    """Vaswani et al. (2017), §3.5:

        PE(pos, 2i)   = sin(pos / base^{2i / d_model})
        PE(pos, 2i+1) = cos(pos / base^{2i / d_model})

    Args:
        max_len: number of positions (rows).
        d_model: embedding width (columns).
        base: the wavelength base; default 10000 (the paper's).

    Returns:
        The float32 table, computed in float64.

    Shape:
        ``(max_len, d_model)``; an odd ``d_model`` drops the last cosine column.
    """
    check_positive_int("max_len", max_len)
    check_positive_int("d_model", d_model)
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (ceil(d/2),)
    angle = pos * inv_freq  # (max_len, ceil(d/2))
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal table to embeddings (no parameters).

    Args:
        d_model: embedding width.
        max_len: longest sequence. Default 5000.

    Shape:
        x ``(B, T, d_model)`` → ``(B, T, d_model)``; ``positions`` ``(T,)`` or ``(B, T)`` (default
        ``offset + arange(T)``).
    """

    table: torch.Tensor  # (max_len, d_model), a buffer

    def __init__(self, d_model: int, max_len: int = 5000) -> None:
        super().__init__()
        self.d_model = d_model
        self.max_len = max_len
        self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, offset: int = 0
    ) -> torch.Tensor:
        """Add the encoding of each position to ``x``.

        Args:
            x: the embeddings.
            positions: position ids; default ``offset + arange(T)``.
            offset: the first position when ``positions`` is not given (the length of a KV cache).
                Default 0.

        Returns:
            ``x + PE[positions]``, in ``x``'s dtype.

        Raises:
            ValueError: a position is negative or not below ``max_len``.

        Shape:
            x ``(B, T, d_model)``; positions ``(T,)`` or ``(B, T)``; output ``(B, T, d_model)``.
        """
        pos = _positions(x.shape[1], offset, positions, self.max_len, x.device)
        return x + self.table[pos].to(x.dtype)


class LearnedPositionalEmbedding(nn.Embedding):
    """A learned vector per position (GPT-2's ``wpe``).

    Args:
        max_len: number of positions; ids must be below it.
        d_model: embedding width.
        **kwargs: passed to ``torch.nn.Embedding`` (``device``, ``dtype``, ...).

    Shape:
        ``positions`` ``(T,)`` or ``(B, T)`` → ``(..., T, d_model)``.
    """

    def __init__(self, max_len: int, d_model: int, **kwargs: Any) -> None:
        super().__init__(max_len, d_model, **kwargs)
        self.max_len = max_len

    def forward(self, positions: torch.Tensor, *, check: bool = True) -> torch.Tensor:
        """The position vectors.

        Args:
            positions: integer position ids.
            check: check that every id is in ``[0, max_len)`` (default). ``False`` skips the check,
                which reads the largest position back to the host (for a caller that has proven
                the range, e.g. :class:`attnlab.GPT`).

        Returns:
            One learned vector per position id.

        Raises:
            ValueError: with ``check``, a position outside ``[0, max_len)``.

        Shape:
            positions ``(T,)`` or ``(B, T)`` → ``(T, d_model)`` or ``(B, T, d_model)``.
        """
        if check:
            _check_range(positions, self.max_len)
        return super().forward(positions)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021, RoFormer §3.4).

    Pairs of dimensions of each query and key are rotated by the angle ``pos · θ_i``:

        (x'_a, x'_b) = (x_a cos pos·θ_i − x_b sin pos·θ_i,  x_a sin pos·θ_i + x_b cos pos·θ_i)

    so ``q_m · k_n`` depends on positions only through ``m − n``. Two pairings are in use:

    * ``"interleaved"`` (RoFormer, GPT-J, llama.cpp): pair ``i`` is ``(x_{2i}, x_{2i+1})``;
    * ``"halves"`` (GPT-NeoX, Llama, Mistral, Qwen2 in Hugging Face): pair ``i`` is
      ``(x_i, x_{i + r/2})``, Hugging Face's ``x · cos + rotate_half(x) · sin``.

    Only the first ``rotary_dim = r`` dimensions of a head turn (GPT-NeoX's partial rotary,
    ``rotary_pct``); the others pass unchanged. The frequencies are ``θ_i = base^{-2i/r}``
    (:func:`~attnlab.nn.rope.rope_frequencies`, which also applies a ``linear`` or ``llama3``
    scaling): computed in float64 for the interleaved pairing (attnlab's own models), and as
    Hugging Face computes them for the halves pairing (float32 frequencies, float32 angles
    ``pos · θ_i``), so that a converted model's tables are the same numbers.

    Args:
        d_head: head dimension.
        max_len: longest sequence; positions must be below it. Default 4096.
        base: ``θ`` base. Default 10000.
        rotary_dim: the rotated dimensions ``r`` (even, at most ``d_head``); default ``d_head``.
        pairing: ``"interleaved"`` (default) or ``"halves"``.
        scaling: a :class:`~attnlab.nn.rope.RopeScaling` of the frequencies, or ``None``.

    Shape:
        x ``(B, H, T, d_head)``; positions ``(T,)`` or ``(B, T)`` → ``(B, H, T, d_head)``.
    """

    cos: torch.Tensor  # (max_len, rotary_dim / 2), a buffer
    sin: torch.Tensor

    def __init__(
        self,
        d_head: int,
        max_len: int = 4096,
        base: float = 10000.0,
        *,
        rotary_dim: int | None = None,
        pairing: str = "interleaved",
        scaling: RopeScaling | None = None,
    ) -> None:
        super().__init__()
        check_positive_int("d_head", d_head)
        if rotary_dim is None and d_head % 2:
            raise ArgumentError(f"d_head must be even for rotary embeddings, got {d_head}")
        r = d_head if rotary_dim is None else check_positive_int("rotary_dim", rotary_dim)
        if r % 2 or r > d_head:
            raise ArgumentError(
                f"rotary_dim must be even and at most d_head = {d_head} for rotary embeddings, "
                f"got {r}"
            )
        if pairing not in PAIRINGS:
            raise ArgumentError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
        self.d_head, self.rotary_dim, self.pairing = d_head, r, pairing
        self.max_len = check_positive_int("max_len", max_len)
        self.base, self.scaling = base, scaling
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        # (positions, dtype, (cos, sin)) computed inside shared_angles(), else None
        self._memo: (
            list[tuple[torch.Tensor, torch.dtype, tuple[torch.Tensor, torch.Tensor]]] | None
        ) = None
        self.reset_tables()

    def reset_tables(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the ``cos``/``sin`` tables, on ``device`` (default: where they are; a
        model built on the ``meta`` device and then given its weights calls this with its
        weights' device, as the tables are no weights).

        Args:
            device: where to put the tables.
        """
        where = self.cos.device if device is None else torch.device(device)
        r, n = self.rotary_dim, self.max_len
        with torch.device("cpu"):  # the same numbers wherever the model runs
            if self.pairing == "interleaved" and self.scaling is None:
                # attnlab's own rotary models: θ_i and the angles in float64, tables in float32
                inv_freq = self.base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
                angle = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq  # (max_len, r/2)
            else:
                # as Hugging Face computes them: float32 θ_i, float32 pos · θ_i
                inv_freq = rope_frequencies(r, self.base, self.scaling)  # (r/2,) float32
                angle = torch.arange(n, dtype=torch.float32)[:, None] * inv_freq
            self.cos = angle.cos().float().to(where)
            self.sin = angle.sin().float().to(where)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, *, check: bool = True
    ) -> torch.Tensor:
        """Rotate ``x`` by its positions.

        Args:
            x: queries or keys, split in heads.
            positions: integer position ids, per batch row or shared.
            check: check that every id is in ``[0, max_len)`` (default). ``False`` skips the check,
                which reads their largest value back to the host (for callers that have proven it).

        Returns:
            The rotated tensor, in ``x``'s dtype (computed in float32, or in float64 for a
            float64 ``x``).

        Raises:
            ValueError: ``x``'s last dimension is not ``d_head``, or (with ``check``) a position
                outside ``[0, max_len)``.

        Shape:
            x ``(B, H, T, d_head)``; positions ``(T,)`` or ``(B, T)``; output ``(B, H, T, d_head)``.
        """
        check_tensor("x", x)
        if x.shape[-1] != self.d_head:
            raise ArgumentError(f"x has head dim {x.shape[-1]}, expected d_head = {self.d_head}")
        if check:
            _check_range(positions, self.max_len)
        work = _work_dtype(x.dtype)
        cos, sin = self._angles(positions, work)  # (.., T, r), each angle once per pair
        r = self.rotary_dim
        turned = x if r == x.shape[-1] else x[..., :r]
        if turned.dtype != work:
            turned = turned.to(work)
        # (x_a, x_b) → (x_a cos − x_b sin, x_b cos + x_a sin) for each pair, written as
        # x · cos + turn(x) · sin with turn(x_a, x_b) = (−x_b, x_a): the same numbers (a − b and
        # a + (−b) round alike), fewer operations
        if self.pairing == "interleaved":
            x1, x2 = turned[..., 0::2], turned[..., 1::2]
            swapped = torch.stack((-x2, x1), dim=-1).flatten(-2)
        else:  # halves: rotate_half(x) = (−x_2, x_1)
            x1, x2 = turned[..., : r // 2], turned[..., r // 2 :]
            swapped = torch.cat((-x2, x1), dim=-1)
        out = turned * cos + swapped * sin
        if out.dtype != x.dtype:
            out = out.to(x.dtype)
        return out if r == x.shape[-1] else torch.cat((out, x[..., r:]), dim=-1)

    def _angles(
        self, positions: torch.Tensor, work: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``, ``sin`` of the positions' angles, one per rotated dimension (each pair's
        angle twice, in the pairing's order), in ``work``; computed once per positions tensor
        and dtype inside :meth:`shared_angles`.   positions ``(T,)`` or ``(B, T)`` →
        ``(T, r)`` or ``(B, 1, T, r)``."""
        memo = None if torch.compiler.is_compiling() else getattr(self, "_memo", None)
        if memo is not None:
            for seen, dtype, angles in memo:
                if seen is positions and dtype == work:
                    return angles
        cos, sin = self.cos[positions], self.sin[positions]  # (.., T, r/2)
        if self.pairing == "interleaved":
            cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        else:
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        if cos.dtype != work:
            cos, sin = cos.to(work), sin.to(work)
        if positions.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, r): broadcast over heads
        if memo is not None:
            memo.append((positions, work, (cos, sin)))
        return cos, sin

    @contextlib.contextmanager
    def shared_angles(self) -> Iterator[None]:
        """Compute the angles of a positions tensor once for every call inside the block: a
        model's layers share one rotary embedding and one positions tensor per forward (the
        caller must not change the positions in place inside it). Nothing is shared while
        ``torch.compile`` traces; a nested block shares the outer one's angles.

        Yields:
            Nothing; the shared angles are dropped on exit.
        """
        if getattr(self, "_memo", None) is not None or torch.compiler.is_compiling():
            yield
            return
        self._memo = []
        try:
            yield
        finally:
            self._memo = None


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype rotary embeddings compute in: float32, or float64 for float64 inputs."""
    return _WORK.get(dtype) or torch.promote_types(dtype, torch.float32)


# the usual dtypes' work dtype without a call into PyTorch (one per rotation of a decoding step)
_WORK = {
    torch.float32: torch.float32,
    torch.float64: torch.float64,
    torch.bfloat16: torch.float32,
    torch.float16: torch.float32,
}


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi head slopes (Press et al. 2022, §3): a geometric sequence starting at
    ``2^{-8/n}`` with ratio ``2^{-8/n}``; for a head count that is not a power of two, the slopes of
    the next lower power of two followed by every other slope of the next higher one.

    Args:
        num_heads: number of heads ``H``.

    Returns:
        The slopes ``m_h``, float32, largest first.

    Shape:
        ``(num_heads,)``.
    """
    check_positive_int("num_heads", num_heads)

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    low = 1  # the largest power of two <= num_heads, in integer steps (no math.log2: torch 2.4's
    while 2 * low <= num_heads:  # dynamo can't trace it when num_heads is a SymInt)
        low *= 2
    slopes = power_of_two(low) + power_of_two(2 * low)[0::2][: num_heads - low]
    return torch.tensor(slopes, dtype=torch.float32)


@functools.lru_cache(maxsize=32)
def _device_slopes(num_heads: int, device: torch.device | None) -> torch.Tensor:
    """:func:`alibi_slopes` on ``device``, copied there once (a copy per call from the host would
    synchronise every forward on an accelerator)."""
    return alibi_slopes(num_heads).to(device=device, dtype=torch.float32)


def alibi_bias(
    num_heads: int,
    q_len: int,
    k_len: int | None = None,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """ALiBi additive bias ``−m_h · (i' − j)``, where ``i' = i + T_k − T_q`` is the query's absolute
    position (bottom-right aligned, like the causal mask), or ``i' = slots[i]`` (the query's key
    slot in a static cache). Future keys get a positive bias; combine with ``is_causal=True`` (or
    a static cache's mask) to hide them.

    Args:
        num_heads: number of heads ``H``.
        q_len: number of queries ``T_q``.
        k_len: number of keys ``T_k`` (default ``q_len``).
        device: where to build it; default the current default device.
        dtype: dtype of the bias; default ``torch.float32``.
        slots: ``(T_q,)`` the queries' key indices (a tensor: nothing read back); default
            bottom-right, ``i + T_k − T_q``.

    Returns:
        The additive bias, to pass as ``mask`` (or to add to another floating mask).

    Shape:
        ``(num_heads, T_q, T_k)`` — broadcasts over the batch as ``(B, H, T_q, T_k)`` masks do.
    """
    check_positive_int("q_len", q_len)
    k_len = q_len if k_len is None else check_positive_int("k_len", k_len)
    if torch.compiler.is_compiling():  # traced: a constant of the graph, no cache
        slopes = alibi_slopes(num_heads).to(device=device, dtype=torch.float32)
    else:
        slopes = _device_slopes(num_heads, None if device is None else torch.device(device))
    i = (
        torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
        if slots is None
        else slots[:, None]
    )
    j = torch.arange(k_len, device=device)[None, :]
    distance = (i - j).to(torch.float32)  # (T_q, T_k)
    return (-slopes[:, None, None] * distance).to(dtype)


def _positions(
    t: int, offset: int, positions: torch.Tensor | None, max_len: int, device: torch.device
) -> torch.Tensor:
    if positions is None:
        positions = torch.arange(offset, offset + t, device=device)
    _check_range(positions, max_len)
    return positions


def _check_range(positions: torch.Tensor, max_len: int) -> None:
    check_tensor("positions", positions)
    if positions.is_floating_point():
        raise ArgumentTypeError(f"positions must be integer ids, got dtype {positions.dtype}")
    if positions.dim() not in (1, 2):
        raise ArgumentError(
            f"positions must have shape (T,) or (B, T), got {shape_str(positions.shape)}"
        )
    if positions.numel() and (int(positions.max()) >= max_len or int(positions.min()) < 0):
        raise ArgumentError(
            f"positions must lie in [0, {max_len}) (the position table's length, max_len = {max_len}), "
            f"got values up to {int(positions.max())}"
        )
