"""The KV cache policies besides the growing :class:`~attnlab.nn.kv_cache.KVCache`: a rolling
window, a StreamingLLM sink cache, and the cross-attention cache filled once.

Under sliding-window attention with ``window = (left, 0)`` (Mistral 7B, Jiang et al. 2023) a new
query never reads a key more than ``left`` positions back, so a :class:`RollingKVCache` with
``window=left`` keeps only the last ``left`` positions (a rolling buffer): ``O(left)`` memory
whatever the length decoded.

A :class:`SinkKVCache` (``window=w, sinks=s``; StreamingLLM, Xiao et al. 2023) streams a
full-attention model past any length: it keeps the first ``s`` positions (the "attention sinks"
that softmax attention leans on) and the last ``w``, so a new query sees ``s + w`` earlier keys
and itself. Its positions are those *within the cache*, as StreamingLLM assigns them: the keys
are stored before the rotary embedding and turned at every step by their place in the cache
(``0 … s + w − 1``), the new token by the next place, so the positions never pass ``s + w``.
Each batch row may keep its own number of sinks (``sinks=(0, 4)``: a window cache and a sink
cache streamed as one batch, the weights read once for both): the buffers keep the most sinks of
any row, and a row does not see the sink slots it does not keep, its places counting only the
keys it sees (rotary models). The places depend only on the step (and the rows' sinks), not on
the layer: the sink caches of one model share a :class:`SinkPlaces`, so the first layer of a step
computes them and the others read the same tensors (and the rotary angles of those places, once
per step inside the model's ``shared_angles``).

A :class:`CrossKVCache` holds the keys and values of an encoder's memory: the first call fills
it, every later one reads it (the layer projects no keys or values then).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, ClassVar, TypeVar

import torch

from attnlab._checks import check_positive_int, check_sink_rows
from attnlab.errors import ArgumentError
from attnlab.nn.cache_view import CacheView
from attnlab.nn.kv_cache import KVBuffers
from attnlab.nn.masks import combine

__all__ = ["CrossKVCache", "RollingKVCache", "SinkKVCache", "SinkPlaces", "last_keys"]

Window = tuple[int | None, int | None] | None
_T = TypeVar("_T")


class SinkPlaces:
    """The places of a decoding step, shared by the sink caches of a model's layers: each
    layer's cache asks for the same queries' places, keys' places and mask in a step, so the
    first computes them and the others get the same tensors (the same numbers: a place is a
    function of the cache's length, the tokens appended, its sizes and the rows' sinks, all in
    the key). Nothing is shared while ``torch.compile`` traces.
    """

    # the entries of a few steps at most: a step's are looked up by every layer before the next
    _KEEP: ClassVar[int] = 16

    def __init__(self) -> None:
        # key → (the tensors the key names by id, kept alive so no id is reused; the value)
        self._memo: dict[Hashable, tuple[tuple[Any, ...], Any]] = {}

    def get(self, key: tuple[Hashable, ...], alive: tuple[Any, ...], make: Callable[[], _T]) -> _T:
        """The value of ``key``, made by ``make()`` the first time.

        Args:
            key: everything the value depends on (tensors by ``id``, and given in ``alive``).
            alive: the tensors named in ``key`` by ``id``.
            make: computes the value.

        Returns:
            The value made for an equal key, or ``make()``.
        """
        if torch.compiler.is_compiling():
            return make()
        seen = self._memo.get(key)
        if seen is not None and all(a is b for a, b in zip(seen[0], alive, strict=True)):
            return seen[1]  # type: ignore[no-any-return]
        if len(self._memo) >= self._KEEP:
            self._memo.clear()
        value = make()
        self._memo[key] = (alive, value)
        return value


class _EvictingBuffers(KVBuffers):
    """The buffers of a cache that evicts (a rolling or sink cache): it hands on the positions it
    held and the new ones, then keeps some of them."""

    keeps_all: ClassVar[bool] = False

    def _after_held(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The held positions' keys and values, then the new ones (new tensors, the buffers'
        dtype)."""
        held = self.held
        k, v = k.to(self.k.dtype), v.to(self.v.dtype)
        if held:
            k = torch.cat([self.k[:, :, :held], k], dim=2)
            v = torch.cat([self.v[:, :, :held], v], dim=2)
        return k, v


class RollingKVCache(_EvictingBuffers):
    """A rolling buffer for sliding-window attention: after each :meth:`append` it keeps only
    the last ``window`` positions (what a causal window ``(window, 0)`` can still reach), so it
    holds at most ``window`` keys between steps and hands ``window + T_new`` to the attention
    of a step. ``length`` still counts every position appended (the next token's position), and
    the capacity no longer limits it.

    Args:
        batch: batch size ``B``.
        num_kv_heads: ``H_kv``.
        capacity: the most positions decoded; the buffers hold ``min(capacity, window)``.
        d_head: head dimension of keys (and of values unless ``d_head_v`` is given).
        d_head_v: head dimension of values; default ``d_head``.
        window: the positions kept, a positive int.
        dtype: dtype of the buffers; default ``torch.float32``.
        device: device of the buffers; default the current default device.

    Raises:
        ValueError: a size that is not a positive int, or buffers too large for ``device``.

    Shape:
        ``keys``: ``(B, H_kv, min(length, window), d_head)``; ``values`` likewise.
    """

    def __init__(
        self,
        batch: int,
        num_kv_heads: int,
        capacity: int,
        d_head: int,
        d_head_v: int | None = None,
        *,
        window: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        check_positive_int("capacity", capacity)
        self.window = check_positive_int("window", window)
        capacity = min(capacity, self.window)
        super().__init__(
            batch, num_kv_heads, capacity, d_head, d_head_v, dtype=dtype, device=device
        )

    def __repr__(self) -> str:
        return f"RollingKVCache(window={self.window})"

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions and return the ones held before and the new ones; then keep
        the last ``window`` of them.

        Args:
            k: keys of the ``T_new`` new positions.
            v: values of the same positions.

        Returns:
            ``(keys, values)``: the positions held before the call and the new ones (new
            tensors).

        Raises:
            ValueError: shapes that disagree with the buffers.

        Shape:
            - k ``(B, H_kv, T_new, d_head)``, v ``(B, H_kv, T_new, d_head_v)``
            - keys ``(B, H_kv, held + T_new, d_head)``, values likewise (``held`` before)
        """
        self._check(k, v)
        held = self.held
        k, v = self._after_held(k, v)
        keep = min(self.k.shape[2], k.shape[2])
        self.k[:, :, :keep] = k[:, :, k.shape[2] - keep :]
        self.v[:, :, :keep] = v[:, :, v.shape[2] - keep :]
        self.length += k.shape[2] - held
        return k, v

    def check_attention(self, window: Window, is_causal: bool) -> None:
        """Refuse an attention this cache would get wrong: it drops old keys, right only for a
        causal window that never reaches them.

        Args:
            window: the call's ``(left, right)`` window, or ``None``.
            is_causal: whether the call is causal.

        Raises:
            ValueError: the attention does not fit the cache.
        """
        left, right = (None, None) if window is None else window
        if left is None or left > self.window or not (is_causal or right == 0):
            raise ArgumentError(
                f"cache keeps only the last {self.window} positions ({self!r}), so the layer's "
                f"attention must be causal with a window of at most (left, right) = "
                f"({self.window}, 0), got window = {window} and is_causal = {is_causal}"
            )

    def update(
        self,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        mask: torch.Tensor | None,
        *,
        window: Window = None,
        is_causal: bool = False,
    ) -> CacheView:
        """Check the call's attention (:meth:`check_attention`), :meth:`append` its keys and
        values, and cut the mask to the keys handed on.

        Args:
            k: the new keys.
            v: the new values.
            mask: the call's mask over every position so far (its last ``held + T_new`` key
                columns are kept), or ``None``.
            window: the call's window: causal, at most ``(window, 0)``.
            is_causal: the call's causality, handed on.

        Returns:
            The view: the held and the new keys and values, the mask over them.

        Raises:
            ValueError: the attention does not fit the cache, or shapes disagree.

        Shape:
            k ``(B, H_kv, T_new, d_head)``; mask ``(..., T_past + T_new)``; the view's keys
            ``(B, H_kv, held + T_new, d_head)``, its mask ``(..., held + T_new)``.
        """
        self.check_attention(window, is_causal)
        keys, values = self.append(*self._new_keys(k, v))
        if mask is not None and keys.shape[-2] < self.length:
            # the cache holds the last positions only: so does the mask, whose last dim counts
            # every position (T_past + T_q)
            mask = last_keys(mask, keys.shape[-2], self.length)
        return CacheView(keys, values, mask, is_causal)


class SinkKVCache(_EvictingBuffers):
    """A StreamingLLM sink cache: keeps the first ``sinks`` positions and the last ``window``,
    its keys stored unrotated and turned by their places within the cache (see the module
    docstring); the layer's attention must be causal and full (the eviction is the window).

    Args:
        batch: batch size ``B``.
        num_kv_heads: ``H_kv``.
        capacity: the most positions decoded; the buffers hold ``min(capacity, sinks + window)``.
        d_head: head dimension of keys (and of values unless ``d_head_v`` is given).
        d_head_v: head dimension of values; default ``d_head``.
        window: the last positions kept, a positive int.
        sinks: the first positions kept (``0`` keeps none: a window that evicts the first
            tokens), or one per batch row (:meth:`key_places` then hides the others' sinks from
            a row).
        dtype: dtype of the buffers; default ``torch.float32``.
        device: device of the buffers; default the current default device.
        shared: a :class:`SinkPlaces` shared with the other layers' sink caches of the same
            sizes (a model's), or ``None`` (the default): the places computed at every call.

    Raises:
        ValueError: a size that is not a positive int, sinks that are not non-negative ints
            (one, or one per row), or buffers too large for ``device``.

    Shape:
        ``keys``: ``(B, H_kv, min(length, sinks + window), d_head)``; ``values`` likewise.
    """

    def __init__(
        self,
        batch: int,
        num_kv_heads: int,
        capacity: int,
        d_head: int,
        d_head_v: int | None = None,
        *,
        window: int,
        sinks: int | Sequence[int],
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        shared: SinkPlaces | None = None,
    ) -> None:
        check_positive_int("batch", batch)
        check_positive_int("capacity", capacity)
        self.window = check_positive_int("window", window)
        rows = check_sink_rows(sinks, batch)
        self.sinks = max(rows)
        capacity = min(capacity, self.sinks + self.window)
        self._recent = capacity - self.sinks  # the window's slots (fewer if capacity is smaller)
        super().__init__(
            batch, num_kv_heads, capacity, d_head, d_head_v, dtype=dtype, device=device
        )
        self.shared = shared
        # (B,) when the rows keep different sinks: one tensor for the layers sharing ``shared``
        self.row_sinks: torch.Tensor | None = None
        if len(set(rows)) > 1:
            dev = self.k.device
            make = lambda: torch.tensor(rows, device=dev)  # noqa: E731
            self.row_sinks = self._step("rows", 0, make, values=tuple(rows))

    def _step(
        self,
        kind: str,
        count: int,
        make: Callable[[], _T],
        *alive: Any,
        values: tuple[Hashable, ...] = (),
    ) -> _T:
        """``make()``, or the value another layer's cache made for the same step (``shared``):
        ``kind`` of the step of ``count`` tokens at this length, sizes and rows' sinks, of the
        tensors ``alive`` (by identity) and of ``values``."""
        if self.shared is None:
            return make()
        rows = self.row_sinks
        key = (kind, self.length, count, self.sinks, self._recent, self.k.shape[2],
               self.k.device, id(rows), *map(id, alive), *values)  # fmt: skip
        return self.shared.get(key, (rows, *alive), make)

    def __repr__(self) -> str:
        sinks = self.sinks if self.row_sinks is None else tuple(self.row_sinks.tolist())
        return f"SinkKVCache(window={self.window}, sinks={sinks})"

    @property
    def next_position(self) -> int:
        """The place the next token gets in the cache, ``held`` (never more than
        ``sinks + window``; with sinks per row, the largest of any row)."""
        return self.held

    def query_places(self, count: int) -> torch.Tensor:
        """The places of the next ``count`` tokens: ``next_position …``, or per row when the
        rows keep different sinks (a row's place counts only the keys it sees).

        Args:
            count: the new tokens ``T_new``.

        Returns:
            The places.

        Shape:
            ``(T_new,)``, or ``(B, T_new)`` with sinks per row.
        """
        return self._step("query", count, lambda: self._query_places(count))

    def _query_places(self, count: int) -> torch.Tensor:
        new = torch.arange(count, device=self.k.device)
        if self.row_sinks is None:
            return self.next_position + new
        seen = (self.row_sinks + self._recent).clamp(max=self.length)  # the keys each row sees
        return seen[:, None] + new

    def key_places(self, count: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """After :meth:`append` of ``count`` tokens: the places of the keys it returned
        (``0 … K − 1``), and with sinks per row which keys each row sees — its own sinks, the
        last ``window`` and the new tokens — and their places among those.

        Args:
            count: the tokens the last :meth:`append` took.

        Returns:
            ``(places, visible)``: ``visible`` is ``None`` unless the rows keep different sinks.

        Shape:
            places ``(K,)``, or ``(B, K)`` with sinks per row; visible ``(B, K)`` bool.
        """
        return self._step("keys", count, lambda: self._key_places(count))

    def _key_places(self, count: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        dev, before = self.k.device, self.length - count
        held = min(before, self.k.shape[2])
        if self.row_sinks is None:
            return torch.arange(held + count, device=dev), None
        start = before - self._recent  # the first earlier token still in the window
        token = torch.arange(before + count, device=dev)  # the token in each returned slot
        if before > held:  # the first sinks and the last window of the earlier tokens, the new
            token = torch.cat([token[: self.sinks], token[start:]])
        visible = (token < self.row_sinks[:, None]) | (token >= start)  # (B, K)
        return (visible.long().cumsum(-1) - 1).clamp(min=0), visible

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions (unrotated) and return the ones held before and the new
        ones; then the first ``sinks`` and the last ``window`` of them stay.

        Args:
            k: keys of the ``T_new`` new positions, before the rotary embedding.
            v: values of the same positions.

        Returns:
            ``(keys, values)``: ``[sinks | last window | new]`` (new tensors).

        Raises:
            ValueError: shapes that disagree with the buffers.

        Shape:
            - k ``(B, H_kv, T_new, d_head)``, v ``(B, H_kv, T_new, d_head_v)``
            - keys ``(B, H_kv, held + T_new, d_head)``, values likewise (``held`` before)
        """
        self._check(k, v)
        held, s = self.held, self.sinks
        k, v = self._after_held(k, v)
        total, room = k.shape[2], self.k.shape[2]
        if total <= room:
            self.k[:, :, :total], self.v[:, :, :total] = k, v
        else:  # keep [0, s) and the last room − s
            dev = k.device  # built there: a copy from the host would synchronise
            keep = torch.cat(
                [torch.arange(s, device=dev), torch.arange(total - (room - s), total, device=dev)]
            )
            self.k.copy_(k.index_select(2, keep))
            self.v.copy_(v.index_select(2, keep))
        self.length += total - held
        return k, v

    def check_attention(self, window: Window, is_causal: bool) -> None:
        """Refuse an attention this cache would get wrong: its eviction is the window, so the
        layer must attend causally to all it holds.

        Args:
            window: the call's ``(left, right)`` window, or ``None``.
            is_causal: whether the call is causal.

        Raises:
            ValueError: a window, or a call that is not causal.
        """
        if window is not None or not is_causal:
            raise ArgumentError(
                f"a sink cache ({self!r}) is for causal full attention, got window = {window} "
                f"and is_causal = {is_causal}"
            )

    def update(
        self,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        mask: torch.Tensor | None,
        *,
        window: Window = None,
        is_causal: bool = False,
    ) -> CacheView:
        """Check the call's attention (:meth:`check_attention`), :meth:`append` its unrotated
        keys and values, and give their places in the cache (the layer turns them by these).

        Args:
            k: the new keys, before the rotary embedding.
            v: the new values.
            mask: the call's mask over the keys handed on, or ``None``; with sinks per row,
                combined with each row's visible keys.
            window: the call's window: ``None``.
            is_causal: the call's causality: ``True``.

        Returns:
            The view: ``[sinks | last window | new]``, the mask, the keys' places.

        Raises:
            ValueError: the attention does not fit the cache, or shapes disagree.

        Shape:
            k ``(B, H_kv, T_new, d_head)``; the view's keys ``(B, H_kv, K, d_head)``, key_places
            ``(K,)`` or ``(B, K)``.
        """
        self.check_attention(window, is_causal)
        k, v = self._new_keys(k, v)
        n = k.shape[-2]
        keys, values = self.append(k, v)  # unrotated: [sinks | last window | new]
        places, visible = self.key_places(n)  # 0 … K − 1 (sinks per row: its own)
        if visible is not None:  # each row sees its own sinks only (every layer: the same mask)
            seen = visible
            mask = self._step("mask", n, lambda: combine(mask, seen[:, None, None]), mask)
        return CacheView(keys, values, mask, is_causal, key_places=places)

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search): row ``b`` becomes old row ``index[b]``, its sinks
        too.

        Args:
            index: integer indices of the rows to keep, on the cache's device; may repeat rows.

        Shape:
            index ``(B_new,)``; the buffers become ``(B_new, H_kv, capacity, d_head)``.
        """
        super().reorder(index)
        if (rows := self.row_sinks) is not None:  # the layers sharing places: one new tensor
            self.row_sinks = self._step("reorder", 0, lambda: rows.index_select(0, index), index)


class CrossKVCache(KVBuffers):
    """The keys and values of a cross-attention layer's encoder memory: filled by the first
    :meth:`update` (the memory does not change while decoding) and read by every later one,
    whose layer then projects no keys or values.

    Args:
        batch: batch size ``B``.
        num_kv_heads: ``H_kv``.
        capacity: the most source positions ``T_src`` it can hold.
        d_head: head dimension of keys (and of values unless ``d_head_v`` is given).
        d_head_v: head dimension of values; default ``d_head``.
        dtype: dtype of the buffers; default ``torch.float32``.
        device: device of the buffers; default the current default device.

    Raises:
        ValueError: a size that is not a positive int, or buffers too large for ``device``.

    Shape:
        ``keys``: ``(B, H_kv, T_src, d_head)``; ``values``: ``(B, H_kv, T_src, d_head_v)``.
    """

    @property
    def filled(self) -> bool:
        """Whether it holds the memory's keys and values (after the first :meth:`update`)."""
        return self.length > 0

    def update(
        self,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        mask: torch.Tensor | None,
        *,
        window: Window = None,
        is_causal: bool = False,
    ) -> CacheView:
        """Fill the cache with the memory's keys and values, or read them once filled.

        Args:
            k: the memory's keys, or ``None`` once :attr:`filled`.
            v: the memory's values, likewise.
            mask: the call's mask over the memory (e.g. the source padding), handed on.
            window: the call's window, handed on to the layer's masking.
            is_causal: the call's causality, handed on.

        Returns:
            The view: the memory's keys and values (views of the buffers), ``mask``,
            ``is_causal``.

        Raises:
            ValueError: no keys given to an empty cache, ``T_src`` larger than the capacity,
                or shapes that disagree with the buffers.

        Shape:
            k ``(B, H_kv, T_src, d_head)``; the view's keys the same.
        """
        if k is not None or v is not None or not self.filled:
            self._fill(*self._new_keys(k, v))
        return CacheView(self.keys, self.values, mask, is_causal)

    def _fill(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self._check(k, v)
        n = k.shape[2]
        if n > self.capacity:
            raise ArgumentError(f"KV cache capacity is {self.capacity}, got {n} positions")
        self.k[:, :, :n] = k
        self.v[:, :, :n] = v
        self.length = n


def last_keys(mask: torch.Tensor, held: int, total: int) -> torch.Tensor:
    """The columns of a mask over every position so far that a rolling cache still holds: the
    last ``held`` of ``total`` (a mask that broadcasts over the keys is returned as it is).

    Args:
        mask: the call's mask, its last dimension the keys.
        held: the keys the cache hands to the attention.
        total: every position so far, ``T_past + T_q``.

    Returns:
        The mask's last ``held`` key columns.

    Raises:
        ValueError: the mask's key dimension is neither 1 nor ``total``.

    Shape:
        ``(..., total)`` → ``(..., held)``.
    """
    if mask.dim() == 0 or mask.shape[-1] == 1:
        return mask
    if mask.shape[-1] != total:
        raise ArgumentError(
            f"mask has {mask.shape[-1]} key positions but must have T_past + T_q = {total} "
            f"(every position so far, the rolling cache keeps the last {held})"
        )
    return mask[..., total - held :]
