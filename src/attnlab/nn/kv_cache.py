"""The KV cache: keys and values of past positions, preallocated per layer.

During autoregressive decoding each new token's query attends to the keys and values of every
earlier position. Recomputing them is ``O(T²)`` work per token; keeping them is ``O(T)`` memory:
``2 · layers · B · H_kv · capacity · d_head`` numbers. Grouped-query and multi-query attention
shrink the cache by ``H / H_kv``.
"""

from __future__ import annotations

import torch

from attnlab._checks import check_positive_int, shape_str

__all__ = ["KVCache", "ModelCache"]


class KVCache:
    """Keys and values of one attention layer, in buffers of a fixed ``capacity``.

    A self-attention cache grows by :meth:`append`; a cross-attention cache is filled once by
    :meth:`set_static` (the encoder memory does not change while decoding).

    Args:
        batch: batch size ``B``.
        num_kv_heads: ``H_kv``.
        capacity: the most positions it can hold.
        d_head: head dimension of keys (and of values unless ``d_head_v`` is given).

    Shape:
        ``keys``/``values``: ``(B, H_kv, length, d_head)``.
    """

    def __init__(
        self,
        batch: int,
        num_kv_heads: int,
        capacity: int,
        d_head: int,
        d_head_v: int | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        check_positive_int("batch", batch)
        check_positive_int("num_kv_heads", num_kv_heads)
        check_positive_int("capacity", capacity)
        check_positive_int("d_head", d_head)
        d_v = d_head if d_head_v is None else check_positive_int("d_head_v", d_head_v)
        self.k = torch.zeros(batch, num_kv_heads, capacity, d_head, dtype=dtype, device=device)
        self.v = torch.zeros(batch, num_kv_heads, capacity, d_v, dtype=dtype, device=device)
        self.length = 0
        self.static = False

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def keys(self) -> torch.Tensor:
        return self.k[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor:
        return self.v[:, :, : self.length]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions' keys/values and return all keys/values so far.

        Raises:
            ValueError: when the cache would go past its capacity, or shapes disagree.
        """
        if self.static:
            raise ValueError("this is a cross-attention (static) cache; it cannot grow")
        self._check(k, v)
        n = k.shape[2]
        if self.length + n > self.capacity:
            raise ValueError(
                f"KV cache capacity exceeded: it holds {self.length} of {self.capacity} positions "
                f"and {n} more were added; make the cache larger (max_length)"
            )
        self.k[:, :, self.length : self.length + n] = k
        self.v[:, :, self.length : self.length + n] = v
        self.length += n
        return self.keys, self.values

    def set_static(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill the cache once with keys/values that will not change (cross-attention)."""
        self._check(k, v)
        n = k.shape[2]
        if n > self.capacity:
            raise ValueError(f"KV cache capacity is {self.capacity}, got {n} positions")
        self.k[:, :, :n] = k
        self.v[:, :, :n] = v
        self.length = n
        self.static = True
        return self.keys, self.values

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search): row ``b`` becomes old row ``index[b]``."""
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)

    def _check(self, k: torch.Tensor, v: torch.Tensor) -> None:
        b, h, _, d = self.k.shape
        if k.dim() != 4 or k.shape[0] != b or k.shape[1] != h or k.shape[3] != d:
            raise ValueError(
                f"keys have shape {shape_str(k.shape)} but the cache holds (B, H_kv, T, d_head) = "
                f"({b}, {h}, T, {d})"
            )
        if v.shape[:3] != k.shape[:3] or v.shape[3] != self.v.shape[3]:
            raise ValueError(f"values have shape {shape_str(v.shape)}, keys {shape_str(k.shape)}")


class ModelCache:
    """The caches of a whole model: one :class:`KVCache` per self-attention layer, and per
    cross-attention layer for an encoder-decoder.

    ``length`` is the number of positions processed so far (the next token's position).
    """

    def __init__(self, layers: list[KVCache], cross: list[KVCache] | None = None) -> None:
        self.layers = layers
        self.cross = cross

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0

    @property
    def capacity(self) -> int:
        return self.layers[0].capacity if self.layers else 0

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows in every layer (beam search)."""
        for c in self.layers + (self.cross or []):
            c.reorder(index)

    def nbytes(self) -> int:
        return sum(c.k.nbytes + c.v.nbytes for c in self.layers + (self.cross or []))
