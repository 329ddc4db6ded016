"""A KV cache of fixed capacity whose write position is a tensor: the cache compiled decoding
traces (gpt-fast's ``KVCache.update(input_pos, k, v)``, PyTorch Labs 2023).

A growing cache changes shape every step (its keys grow by one), and its length is a Python int
that changes every step: ``torch.compile`` would specialise on both and trace a new graph per
token. Here the shapes never change:

* each layer's keys and values are buffers ``(B, H_kv, C, d_head)`` allocated at the capacity
  ``C``, and never move (``torch._dynamo.mark_static_address``: a CUDA graph reads them in
  place);
* the slots a call writes are a **tensor** ``s`` (``T_q`` long: ``arange(T)`` for the prompt, one
  slot per step), shared by every layer (:class:`StaticSlots`); the new keys and values go in
  with ``index_copy_``;
* every call attends over all ``C`` slots, under the mask built from the same tensor: slot ``j``
  is visible to the query in slot ``s_i`` iff

      j ≤ s_i                (causal: written, and not in the future)
      s_i − j ≤ w            (a causal window (w, 0))

  and-ed with the caller's mask over the ``C`` slots (padding; ALiBi's bias). The view says
  ``is_causal=False`` and ``window_in_mask=True``: the mask holds the rule.

The host keeps the count of written slots (:attr:`StaticSlots.length`) for checks and for the
next call's slots; a traced step reads only the tensor (:meth:`StaticSlots.begin` runs before it,
outside the compiled region).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

from attnlab._checks import shape_str
from attnlab.errors import ArgumentError
from attnlab.nn.cache_view import CacheView
from attnlab.nn.kv_cache import LayerCache, ModelCache
from attnlab.nn.masks import combine

__all__ = ["StaticKVCache", "StaticModelCache", "StaticSlots"]


def _pin(t: torch.Tensor) -> torch.Tensor:
    """Mark ``t`` as living at a fixed address (a CUDA graph reads it in place, no copy); no
    guard on its identity, so a new cache of the same shapes reuses the compiled graph."""
    torch._dynamo.mark_static_address(t, guard=False)
    return t


class StaticSlots:
    """The slots the current call writes, shared by every layer of a :class:`StaticModelCache`.

    Args:
        capacity: the slots ``C`` each layer holds.
        device: where the slot tensor lives.

    Attributes:
        slots: the current call's slots ``(T_q,)`` (long), set by :meth:`begin`.
        length: slots written so far, on the host (the next call's first slot).
    """

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.capacity = capacity
        self.length = 0
        self._one = _pin(torch.zeros(1, dtype=torch.long, device=device))
        self.slots = self._one

    def begin(self, count: int) -> torch.Tensor:
        """Take the next ``count`` slots for the coming call (host side, before any trace): one
        slot is written into the same tensor every step (no new input, no host→device copy
        that waits), a prompt gets ``arange``.

        Args:
            count: the call's new tokens ``T_q``.

        Returns:
            The slots ``(count,)``.

        Raises:
            ValueError: the cache has no room for them.

        Shape:
            ``(count,)``.
        """
        if self.length + count > self.capacity:
            raise ArgumentError(
                f"a static cache of capacity {self.capacity} holds {self.length} positions and "
                f"has no room for {count} more"
            )
        if count == 1:
            self._one.fill_(self.length)
            self.slots = self._one
        else:
            self.slots = torch.arange(self.length, self.length + count, device=self._one.device)
        self.length += count
        return self.slots


class StaticKVCache:
    """One layer's keys and values at a fixed capacity, written at the slots of a shared
    :class:`StaticSlots` (see the module docstring for the mask).

    Args:
        batch: rows ``B``.
        num_kv_heads: ``H_kv``.
        capacity: slots ``C``.
        d_head: per-head size.
        dtype: the buffers' dtype.
        device: their device.
        slots: the write position shared with the model's other layers.

    Shape:
        k, v ``(B, H_kv, C, d_head)``.
    """

    #: a self-attention cache (not a cross-attention one filled once)
    static = False
    #: no rolling window: the window is a rule of the mask
    window = None

    def __init__(
        self,
        batch: int,
        num_kv_heads: int,
        capacity: int,
        d_head: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        slots: StaticSlots,
    ) -> None:
        shape = (batch, num_kv_heads, capacity, d_head)
        self.k = _pin(torch.zeros(shape, dtype=dtype, device=device))
        self.v = _pin(torch.zeros(shape, dtype=dtype, device=device))
        self.position = slots

    @property
    def length(self) -> int:
        """Slots written so far (host)."""
        return self.position.length

    @property
    def next_position(self) -> int:
        """The next call's first slot (host)."""
        return self.position.length

    @property
    def batch(self) -> int:
        """Rows ``B``."""
        return self.k.shape[0]

    @property
    def capacity(self) -> int:
        """Slots ``C``."""
        return self.k.shape[2]

    def update(
        self,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        mask: torch.Tensor | None,
        *,
        window: tuple[int | None, int | None] | None,
        is_causal: bool,
    ) -> CacheView:
        """Write the new keys and values at the current slots; every slot and its mask back.

        Args:
            k: the new keys ``(B, H_kv, T_q, d_head)`` (rotated).
            v: the new values.
            mask: the caller's mask over the ``C`` slots (bool, or an additive bias), or ``None``.
            window: the call's window ``(w, 0)`` or ``None``.
            is_causal: must be ``True`` (a static cache serves causal self-attention).

        Returns:
            The :class:`~attnlab.nn.cache_view.CacheView` over all ``C`` slots,
            ``is_causal=False``.

        Raises:
            ValueError: a non-causal call, a window reaching future keys, or a mask not over
                the ``C`` slots.

        Shape:
            k, v ``(B, H_kv, T_q, d_head)``; mask broadcastable to ``(B, H, T_q, C)``; the
            view's mask ``(B?, H?, T_q, C)``.
        """
        if k is None or v is None or not is_causal:
            raise ArgumentError("a static cache serves causal self-attention only")
        left, right = (None, None) if window is None else window
        if right not in (0, None):
            raise ArgumentError(f"a static cache takes a causal window (w, 0), got {window}")
        cap = self.capacity
        if mask is not None and mask.shape[-1] not in (1, cap):
            raise ArgumentError(
                f"mask must cover the static cache's {cap} slots, got {shape_str(mask.shape)}"
            )
        s = self.position.slots  # (T_q,)
        self.k.index_copy_(2, s, k.to(self.k.dtype))
        self.v.index_copy_(2, s, v.to(self.v.dtype))
        # slot j is visible to the query in slot s_i iff j <= s_i (and s_i − j <= w)
        distance = s[:, None] - torch.arange(cap, device=s.device)  # (T_q, C)
        visible = distance >= 0
        if left is not None:
            visible = visible & (distance <= left)
        return CacheView(self.k, self.v, combine(mask, visible), False, window_in_mask=True)

    def query_places(self, count: int) -> None:
        """No places of its own: the queries turn at the positions the model reads from the
        slot tensor.

        Args:
            count: the new queries.
        """
        return None

    def reorder(self, index: torch.Tensor) -> None:
        """Select rows in place (the buffers keep their address; beam search).

        Args:
            index: row indices, one per row (``B`` of them).

        Raises:
            ValueError: ``index`` does not have ``B`` entries.

        Shape:
            index ``(B,)``.
        """
        if index.shape != (self.batch,):
            raise ArgumentError(
                f"index must select {self.batch} rows of a static cache, got "
                f"{shape_str(index.shape)}"
            )
        self.k.copy_(self.k.index_select(0, index))
        self.v.copy_(self.v.index_select(0, index))

    def nbytes(self) -> int:
        """Bytes held by the two buffers (at full capacity).

        Returns:
            The size.
        """
        return self.k.nbytes + self.v.nbytes


class StaticModelCache(ModelCache):
    """A model's :class:`StaticKVCache` layers and the :class:`StaticSlots` they share.

    Args:
        layers: one per block, all over the same ``slots``.
        slots: the shared write position.

    Raises:
        ValueError: a layer over other slots.
    """

    def __init__(self, layers: Sequence[StaticKVCache], slots: StaticSlots) -> None:
        if any(layer.position is not slots for layer in layers):
            raise ArgumentError("every layer of a StaticModelCache must share its slots")
        super().__init__(cast(Sequence[LayerCache], layers))  # length: read-only here
        self.position = slots

    @property
    def slots(self) -> torch.Tensor:
        """The current call's slots.

        Shape:
            ``(T_q,)``.
        """
        return self.position.slots

    def begin(self, count: int) -> torch.Tensor:
        """:meth:`StaticSlots.begin`: take the next ``count`` slots (before the call).

        Args:
            count: the call's new tokens.

        Returns:
            The slots.

        Shape:
            ``(count,)``.
        """
        return self.position.begin(count)
