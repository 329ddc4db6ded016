"""The KV cache: keys and values of past positions, preallocated per layer.

During autoregressive decoding each new token's query attends to the keys and values of every
earlier position. Recomputing them is ``O(T²)`` work per token; keeping them is ``O(T)`` memory:
``2 · layers · B · H_kv · capacity · d_head`` numbers. Grouped-query and multi-query attention
shrink the cache by ``H / H_kv``.

Under sliding-window attention with ``window = (left, 0)`` (Mistral 7B, Jiang et al. 2023) a new
query never reads a key more than ``left`` positions back, so a cache made with ``window=left``
keeps only the last ``left`` positions (a rolling buffer): ``O(left)`` memory whatever the length
decoded.
"""

from __future__ import annotations

import torch

from attnlab._checks import check_positive_int, shape_str

__all__ = ["KVCache", "ModelCache"]


class KVCache:
    """Keys and values of one attention layer, in buffers of a fixed ``capacity``.

    A self-attention cache grows by :meth:`append`; a cross-attention cache is filled once by
    :meth:`set_static` (the encoder memory does not change while decoding).

    With ``window=w`` it is a rolling buffer for sliding-window attention: after each
    :meth:`append` it keeps only the last ``w`` positions (what a causal window ``(w, 0)`` can
    still reach), so it holds at most ``w`` keys between steps and hands ``w + T_new`` to the
    attention of a step. ``length`` still counts every position appended (the next token's
    position), and the capacity no longer limits it.

    Args:
        batch: batch size ``B``.
        num_kv_heads: ``H_kv``.
        capacity: the most positions it can hold.
        d_head: head dimension of keys (and of values unless ``d_head_v`` is given).
        d_head_v: head dimension of values; default ``d_head``.
        dtype: dtype of the buffers; default ``torch.float32``.
        device: device of the buffers; default the current default device.
        window: keep only the last ``window`` positions (a positive int), or ``None`` (default)
            to keep every position up to ``capacity``. The buffers then hold
            ``min(capacity, window)`` positions.

    Shape:
        ``keys``: ``(B, H_kv, held, d_head)``; ``values``: ``(B, H_kv, held, d_head_v)``, where
        ``held`` is ``length``, or ``min(length, window)`` for a rolling cache.
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
        window: int | None = None,
    ) -> None:
        check_positive_int("batch", batch)
        check_positive_int("num_kv_heads", num_kv_heads)
        check_positive_int("capacity", capacity)
        check_positive_int("d_head", d_head)
        d_v = d_head if d_head_v is None else check_positive_int("d_head_v", d_head_v)
        self.window = None if window is None else check_positive_int("window", window)
        if self.window is not None:
            capacity = min(capacity, self.window)
        self.k = torch.zeros(batch, num_kv_heads, capacity, d_head, dtype=dtype, device=device)
        self.v = torch.zeros(batch, num_kv_heads, capacity, d_v, dtype=dtype, device=device)
        self.length = 0
        self.static = False

    @property
    def capacity(self) -> int:
        """The most positions the buffers can hold."""
        return self.k.shape[2]

    @property
    def held(self) -> int:
        """The positions the buffers hold: ``length``, or at most ``window`` for a rolling cache."""
        return self.length if self.window is None else min(self.length, self.k.shape[2])

    @property
    def keys(self) -> torch.Tensor:
        """The keys stored so far, a view ``(B, H_kv, held, d_head)`` of the buffer."""
        return self.k[:, :, : self.held]

    @property
    def values(self) -> torch.Tensor:
        """The values stored so far, a view ``(B, H_kv, held, d_head_v)`` of the buffer."""
        return self.v[:, :, : self.held]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions' keys/values and return all keys/values so far.

        Args:
            k: keys of the ``T_new`` new positions.
            v: values of the same positions.

        Returns:
            ``(keys, values)``: every position stored so far, the new ones last (views). A
            rolling cache (``window``) returns the positions it held before the call and the new
            ones (new tensors), then keeps the last ``window`` of them.

        Raises:
            ValueError: when the cache would go past its capacity, when it is a static
                (cross-attention) cache, or when shapes disagree with the buffers.

        Shape:
            - k ``(B, H_kv, T_new, d_head)``, v ``(B, H_kv, T_new, d_head_v)``
            - keys ``(B, H_kv, length, d_head)``, values ``(B, H_kv, length, d_head_v)``, with
              ``length`` the previous length plus ``T_new`` (a rolling cache: the previous
              ``held`` plus ``T_new``)
        """
        if self.static:
            raise ValueError("this is a cross-attention (static) cache; it cannot grow")
        self._check(k, v)
        n = k.shape[2]
        if self.window is not None:
            return self._roll(k, v)
        if self.length + n > self.capacity:
            raise ValueError(
                f"KV cache capacity exceeded: it holds {self.length} of {self.capacity} positions "
                f"and {n} more were added; make the cache larger (max_length)"
            )
        self.k[:, :, self.length : self.length + n] = k
        self.v[:, :, self.length : self.length + n] = v
        self.length += n
        return self.keys, self.values

    def _roll(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`append` for a rolling cache: the held positions and the new ones, of which the
        last ``window`` stay."""
        held = self.held
        k, v = k.to(self.k.dtype), v.to(self.v.dtype)
        if held:
            k = torch.cat([self.k[:, :, :held], k], dim=2)
            v = torch.cat([self.v[:, :, :held], v], dim=2)
        keep = min(self.k.shape[2], k.shape[2])
        self.k[:, :, :keep] = k[:, :, k.shape[2] - keep :]
        self.v[:, :, :keep] = v[:, :, v.shape[2] - keep :]
        self.length += k.shape[2] - held
        return k, v

    def set_static(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill the cache once with keys/values that will not change (cross-attention).

        Args:
            k: the keys of the encoder memory.
            v: the values of the encoder memory.

        Returns:
            ``(keys, values)`` as stored (views); :meth:`append` is refused from now on.

        Raises:
            ValueError: ``T_src`` is larger than the capacity, or shapes disagree with the buffers.

        Shape:
            - k ``(B, H_kv, T_src, d_head)``, v ``(B, H_kv, T_src, d_head_v)``
            - keys and values: the same shapes
        """
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
        """Select batch rows (beam search): row ``b`` becomes old row ``index[b]``.

        Args:
            index: integer indices of the rows to keep, on the cache's device; may repeat rows.

        Shape:
            index ``(B_new,)``; the buffers become ``(B_new, H_kv, capacity, d_head)``.
        """
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

    Args:
        layers: the self-attention caches, one per layer, first layer first.
        cross: the cross-attention caches of an encoder-decoder, one per decoder layer;
            ``None`` (the default) for a decoder-only model.
    """

    def __init__(self, layers: list[KVCache], cross: list[KVCache] | None = None) -> None:
        self.layers = layers
        self.cross = cross

    @property
    def length(self) -> int:
        """Positions processed so far (the next token's position); 0 without layers."""
        return self.layers[0].length if self.layers else 0

    @property
    def capacity(self) -> int:
        """The most positions each self-attention cache can hold; 0 without layers."""
        return self.layers[0].capacity if self.layers else 0

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows in every layer (beam search): row ``b`` becomes old row ``index[b]``.

        Args:
            index: integer indices of the rows to keep, on the caches' device; may repeat rows.

        Shape:
            index ``(B_new,)``; every cache then holds ``B_new`` rows.
        """
        for c in self.layers + (self.cross or []):
            c.reorder(index)

    def nbytes(self) -> int:
        """Bytes held by the key and value buffers of every layer (at full capacity).

        Returns:
            The total size of the buffers in bytes, cross-attention caches included.
        """
        return sum(c.k.nbytes + c.v.nbytes for c in self.layers + (self.cross or []))
