"""The KV cache: keys and values of past positions, preallocated per layer.

During autoregressive decoding each new token's query attends to the keys and values of every
earlier position. Recomputing them is ``O(T²)`` work per token; keeping them is ``O(T)`` memory:
``2 · layers · B · H_kv · capacity · d_head`` numbers. Grouped-query and multi-query attention
shrink the cache by ``H / H_kv``.

Under sliding-window attention with ``window = (left, 0)`` (Mistral 7B, Jiang et al. 2023) a new
query never reads a key more than ``left`` positions back, so a cache made with ``window=left``
keeps only the last ``left`` positions (a rolling buffer): ``O(left)`` memory whatever the length
decoded.

A **sink cache** (``window=w, sinks=s``; StreamingLLM, Xiao et al. 2023) streams a full-attention
model past any length: it keeps the first ``s`` positions (the "attention sinks" that softmax
attention leans on) and the last ``w``, so a new query sees ``s + w`` earlier keys and itself.
Its positions are those *within the cache*, as StreamingLLM assigns them: the keys are stored
before the rotary embedding and turned at every step by their place in the cache
(``0 … s + w − 1``), the new token by the next place, so the positions never pass ``s + w``.
Each batch row may keep its own number of sinks (``sinks=(0, 4)``: a window cache and a sink cache
streamed as one batch, the weights read once for both): the buffers keep the most sinks of any
row, and a row does not see the sink slots it does not keep, its places counting only the keys it
sees (rotary models).

Causal linear attention needs no keys at all: it is a recurrent network (Katharopoulos et al.
2020, "Transformers are RNNs", §3.4) whose state is two running sums over the keys seen so far,

    S_t = S_{t−1} + φ(k_t) v_tᵀ        z_t = z_{t−1} + φ(k_t)        o_t = φ(q_t)ᵀ S_t / φ(q_t)ᵀ z_t

so a causal Performer (FAVOR+) layer decodes from a :class:`PerformerState` of
``B · H_kv · (m · (d_head + 1) + 1)`` numbers (``m`` random features): ``O(1)`` memory and time per
token, whatever the length decoded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from attnlab._budget import check_fits
from attnlab._checks import check_device, check_positive_int, check_sink_rows, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError

__all__ = ["KVCache", "LayerCache", "ModelCache", "PerformerState", "last_keys"]


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
        sinks: with ``window``, a sink cache (StreamingLLM): keep the first ``sinks`` positions
            too (``0`` keeps none: a window that evicts the first tokens), store the keys
            unrotated and give positions within the cache (see the module docstring). The
            buffers hold ``min(capacity, sinks + window)`` positions. A sequence gives each batch
            row its own (:meth:`key_places` then hides the others' sinks from it). Default
            ``None``: the positions are the tokens' own.

    Raises:
        ValueError: a size that is not a positive int, or buffers larger than the memory of
            ``device`` (checked before they are allocated, :func:`attnlab._budget.check_fits`).

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
        sinks: int | Sequence[int] | None = None,
    ) -> None:
        check_positive_int("batch", batch)
        check_positive_int("num_kv_heads", num_kv_heads)
        check_positive_int("capacity", capacity)
        check_positive_int("d_head", d_head)
        d_v = d_head if d_head_v is None else check_positive_int("d_head_v", d_head_v)
        self.window = None if window is None else check_positive_int("window", window)
        self.sinks: int | None = None
        self.row_sinks: torch.Tensor | None = None  # (B,) when the rows keep different sinks
        if sinks is not None:
            rows = check_sink_rows(sinks, batch)
            if len(set(rows)) > 1:
                self.row_sinks = torch.tensor(rows, device=device)
            sinks = max(rows)
            if self.window is None:
                raise ArgumentError(
                    "sinks needs a window: KVCache(window=w, sinks=s) keeps the first s "
                    "positions and the last w"
                )
            self.sinks = sinks
            capacity = min(capacity, sinks + self.window)
            self._recent = capacity - sinks  # the window's slots (fewer if capacity is smaller)
        elif self.window is not None:
            capacity = min(capacity, self.window)
        if not isinstance(dtype, torch.dtype):
            raise ArgumentTypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
        device = torch.get_default_device() if device is None else check_device("device", device)
        if device.type != "meta":  # meta: shapes only, nothing held
            check_fits(
                f"KVCache(batch={batch}, num_kv_heads={num_kv_heads}, capacity={capacity}, "
                f"d_head={d_head})",
                batch * num_kv_heads * capacity * (d_head + d_v) * dtype.itemsize,
                what="the cache's keys and values",
                device=device,
            )
        self.k = torch.zeros(batch, num_kv_heads, capacity, d_head, dtype=dtype, device=device)
        self.v = torch.zeros(batch, num_kv_heads, capacity, d_v, dtype=dtype, device=device)
        self.length = 0
        self.static = False

    @property
    def batch(self) -> int:
        """The rows ``B`` the buffers hold."""
        return self.k.shape[0]

    @property
    def capacity(self) -> int:
        """The most positions the buffers can hold."""
        return self.k.shape[2]

    @property
    def held(self) -> int:
        """The positions the buffers hold: ``length``, or at most ``window`` for a rolling cache
        (``sinks + window`` for a sink cache)."""
        return self.length if self.window is None else min(self.length, self.k.shape[2])

    @property
    def streaming(self) -> bool:
        """Whether this is a sink cache: keys stored unrotated, positions within the cache."""
        return self.sinks is not None

    @property
    def next_position(self) -> int:
        """The position the next token gets: ``length``, or for a sink cache its place in the
        cache, ``held`` (never more than ``sinks + window``)."""
        return self.held if self.sinks is not None else self.length

    def query_places(self, count: int) -> torch.Tensor:
        """A sink cache's places for the next ``count`` tokens: ``next_position …``, or per row
        when the rows keep different sinks (a row's place counts only the keys it sees).

        Args:
            count: the new tokens ``T_new``.

        Returns:
            The places.

        Shape:
            ``(T_new,)``, or ``(B, T_new)`` with sinks per row.
        """
        new = torch.arange(count, device=self.k.device)
        if self.row_sinks is None or self.sinks is None:
            return self.next_position + new
        seen = (self.row_sinks + self._recent).clamp(max=self.length)  # the keys each row sees
        return seen[:, None] + new

    def key_places(self, count: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """After :meth:`append` of ``count`` tokens to a sink cache: the places of the keys it
        returned (``0 … K − 1``), and with sinks per row which keys each row sees — its own
        sinks, the last ``window`` and the new tokens — and their places among those.

        Args:
            count: the tokens the last :meth:`append` took.

        Returns:
            ``(places, visible)``: ``visible`` is ``None`` unless the rows keep different sinks.

        Shape:
            places ``(K,)``, or ``(B, K)`` with sinks per row; visible ``(B, K)`` bool.
        """
        dev, before = self.k.device, self.length - count
        held = min(before, self.k.shape[2])
        if self.row_sinks is None or self.sinks is None:
            return torch.arange(held + count, device=dev), None
        start = before - self._recent  # the first earlier token still in the window
        token = torch.arange(before + count, device=dev)  # the token in each returned slot
        if before > held:  # the first sinks and the last window of the earlier tokens, the new
            token = torch.cat([token[: self.sinks], token[start:]])
        visible = (token < self.row_sinks[:, None]) | (token >= start)  # (B, K)
        return (visible.long().cumsum(-1) - 1).clamp(min=0), visible

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
            raise ArgumentError("this is a cross-attention (static) cache; it cannot grow")
        self._check(k, v)
        n = k.shape[2]
        if self.sinks is not None:
            return self._stream(k, v)
        if self.window is not None:
            return self._roll(k, v)
        if self.length + n > self.capacity:
            raise ArgumentError(
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

    def _stream(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`append` for a sink cache: the held positions and the new ones; then the first
        ``sinks`` and the last ``window`` of them stay."""
        held, s = self.held, int(self.sinks or 0)
        k, v = k.to(self.k.dtype), v.to(self.v.dtype)
        if held:
            k = torch.cat([self.k[:, :, :held], k], dim=2)
            v = torch.cat([self.v[:, :, :held], v], dim=2)
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

    def check_attention(
        self, window: tuple[int | None, int | None] | None, is_causal: bool
    ) -> None:
        """Refuse a layer's attention this cache would get wrong: a rolling cache drops old
        keys, right only for a causal window that never reaches them; a sink cache's eviction
        is the window, so the layer must attend causally to all it holds.

        Args:
            window: the layer's ``(left, right)`` window for the call, or ``None``.
            is_causal: whether the call is causal.

        Raises:
            ValueError: the attention does not fit the cache.
        """
        if self.sinks is not None:
            if window is not None or not is_causal:
                raise ArgumentError(
                    f"a sink cache (KVCache(window={self.window}, sinks={self.sinks})) is for "
                    f"causal full attention, got window = {window} and is_causal = {is_causal}"
                )
            return
        left, right = (None, None) if window is None else window
        limit = self.window
        if left is None or limit is None or left > limit or not (is_causal or right == 0):
            raise ArgumentError(
                f"cache keeps only the last {self.window} positions (KVCache(window="
                f"{self.window})), so the layer's attention must be causal with a window of at "
                f"most (left, right) = ({self.window}, 0), got window = {window} and "
                f"is_causal = {is_causal}"
            )

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
            raise ArgumentError(f"KV cache capacity is {self.capacity}, got {n} positions")
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
        if self.row_sinks is not None:
            self.row_sinks = self.row_sinks.index_select(0, index)

    def nbytes(self) -> int:
        """Bytes held by the key and value buffers (at full capacity).

        Returns:
            The size of ``k`` and ``v`` in bytes.
        """
        return self.k.nbytes + self.v.nbytes

    def _check(self, k: torch.Tensor, v: torch.Tensor) -> None:
        b, h, _, d = self.k.shape
        if k.dim() != 4 or k.shape[0] != b or k.shape[1] != h or k.shape[3] != d:
            raise ArgumentError(
                f"keys have shape {shape_str(k.shape)} but the cache holds (B, H_kv, T, d_head) = "
                f"({b}, {h}, T, {d})"
            )
        if v.shape[:3] != k.shape[:3] or v.shape[3] != self.v.shape[3]:
            raise ArgumentError(
                f"values have shape {shape_str(v.shape)}, keys {shape_str(k.shape)}"
            )


class PerformerState:
    """The running state of one causal Performer (FAVOR+) layer: ``O(1)`` memory per layer and
    ``O(1)`` work per decoded token, however long the sequence (Katharopoulos et al. 2020, §3.4;
    Choromanski et al. 2021, §2.6).

    Causal linear attention with the feature map ``φ`` is a recurrent network over the keys:

        S_t = S_{t−1} + φ(k_t) v_tᵀ       (m × D_v)
        z_t = z_{t−1} + φ(k_t)             (m)
        o_t = φ(q_t)ᵀ S_t / φ(q_t)ᵀ z_t

    FAVOR+'s features ``φ(k) = exp(l − c) / √m``, with exponents ``l = W k' − ‖k'‖²/2``, carry a
    stabiliser ``c`` that cancels between the numerator and the normaliser; the prefix-sum form
    (:func:`~attnlab.nn.performer.favor_attention`) takes the largest exponent of every key of
    the sequence, unknown while decoding. The state keeps the running maximum ``c_t`` instead and
    the sums scaled by it, ``S̃_t = e^{−c_t} S_t``, ``z̃_t = e^{−c_t} z_t``; a block of new keys
    moves it and rescales the sums (:meth:`append`). The outputs are those of the prefix-sum form
    up to rounding.

    The sums are tied to the random features they were built with: the first :meth:`append`
    through a layer records its ``features`` (:meth:`bind_features`), and a later call after a
    redraw (``redraw_features``, or new weights loaded) is refused — start a new state.

    Args:
        batch: batch size ``B``.
        num_kv_heads: key/value heads ``H_kv`` (the sums depend on keys and values only, so
            grouped-query heads share them).
        capacity: the most positions it takes (prompt + new tokens); its memory does not depend
            on it, only the check does, as for a :class:`KVCache`.
        num_features: random features ``m``.
        d_head_v: head dimension of the values ``D_v``.
        dtype: dtype of the sums; default ``torch.float32``. A running sum of many terms needs
            the mantissa: prefer float32 (or float64) to half types.
        device: device of the sums; default the current default device.

    Attributes:
        s: ``S̃ = e^{−c} Σ_j φ(k_j) v_jᵀ`` ``(B, H_kv, m, D_v)``.
        z: ``z̃ = e^{−c} Σ_j φ(k_j)`` ``(B, H_kv, m)``.
        c: the stabiliser ``c``, the largest key exponent absorbed so far, ``−∞`` before the
            first visible key ``(B, H_kv)``.
        length: positions absorbed so far (the next token's position), masked ones included.

    Shape:
        s ``(B, H_kv, m, D_v)``; z ``(B, H_kv, m)``; c ``(B, H_kv)``; none grows with ``length``.

    Examples:
        >>> state = PerformerState(2, 4, capacity=100, num_features=32, d_head_v=16)
        >>> state.s.shape, state.nbytes()
        (torch.Size([2, 4, 32, 16]), 17440)
    """

    #: a state grows with every step: never the static cache of cross-attention
    static = False

    def __init__(
        self,
        batch: int,
        num_kv_heads: int,
        capacity: int,
        num_features: int,
        d_head_v: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        check_positive_int("batch", batch)
        check_positive_int("num_kv_heads", num_kv_heads)
        self._capacity = check_positive_int("capacity", capacity)
        check_positive_int("num_features", num_features)
        check_positive_int("d_head_v", d_head_v)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ArgumentTypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        shape = (batch, num_kv_heads, num_features)
        self.s = torch.zeros(*shape, d_head_v, dtype=dtype, device=device)
        self.z = torch.zeros(*shape, dtype=dtype, device=device)
        self.c = torch.full(shape[:2], -math.inf, dtype=dtype, device=device)
        self.length = 0
        self._features: tuple[int, int] | None = None

    @property
    def batch(self) -> int:
        """The rows ``B`` it holds."""
        return self.s.shape[0]

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads ``H_kv``."""
        return self.s.shape[1]

    @property
    def num_features(self) -> int:
        """Random features ``m``."""
        return self.s.shape[2]

    @property
    def capacity(self) -> int:
        """The most positions it takes."""
        return self._capacity

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the sums."""
        return self.s.dtype

    @property
    def device(self) -> torch.device:
        """The device of the sums."""
        return self.s.device

    def bind_features(self, features: torch.Tensor) -> None:
        """Tie the state to the random features its sums are built with, or check that they are
        still those: the first call records ``features`` (which tensor, and its version counter,
        which every in-place write bumps), later calls compare.

        Args:
            features: the layer's ``W`` (``PerformerAttention.features``).

        Raises:
            ValueError: the features were written since the state was tied to them (a redraw,
                or weights loaded), or they are another tensor.

        Shape:
            features ``(m, d_head)``.
        """
        tag = (features.data_ptr(), features._version)
        if self._features is None:
            self._features = tag
        elif tag != self._features:
            raise ArgumentError(
                "the Performer's random features changed (redraw_features, or weights loaded) "
                "since this PerformerState was filled: its sums are built from the old features; "
                "make a new cache (new_cache) and run the prompt again"
            )

    def append(
        self, logits: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Absorb ``T_new`` keys and values, moving the stabiliser and rescaling the sums.

        With ``l_j`` the new keys' exponents (``−∞`` for a masked key) and ``c`` the stabiliser,

            c' = max(c, max_{j, r} l_{j,r})
            φ̃(k_j) = exp(l_j − c') / √m
            S̃' = e^{c − c'} S̃ + Σ_j φ̃(k_j) v_jᵀ
            z̃' = e^{c − c'} z̃ + Σ_j φ̃(k_j)

        (``e^{c − c'} <= 1``: nothing overflows; ``c' = −∞`` while every key so far is masked,
        and then the exponents use 0, so that the sums stay exactly zero).

        Args:
            logits: the new keys' exponents ``l = W k' − ‖k'‖²/2``, ``−∞`` at masked keys.
            v: the new values, zero at masked keys.

        Returns:
            ``(phi_k, s, z)``: the new keys' features ``φ̃(k_j)``, and the sums *before* them
            rescaled to the new stabiliser (``e^{c − c'} S̃``, ``e^{c − c'} z̃``: what a new
            query sees besides the new keys), in the dtype of ``logits``.

        Raises:
            ValueError: shapes that disagree with the state, or the capacity exceeded.

        Shape:
            - logits ``(B, H_kv, T_new, m)``; v ``(B, H_kv, T_new, D_v)``
            - phi_k ``(B, H_kv, T_new, m)``; s ``(B, H_kv, m, D_v)``; z ``(B, H_kv, m)``
        """
        b, h, m, d_v = self.s.shape
        if logits.dim() != 4 or (logits.shape[0], logits.shape[1], logits.shape[3]) != (b, h, m):
            raise ArgumentError(
                f"logits have shape {shape_str(logits.shape)} but the state holds "
                f"(B, H_kv, T_new, m) = ({b}, {h}, T_new, {m})"
            )
        if v.shape != (*logits.shape[:3], d_v):
            raise ArgumentError(
                f"v has shape {shape_str(v.shape)}, expected (B, H_kv, T_new, D_v) = "
                f"{shape_str((*logits.shape[:3], d_v))}"
            )
        n = logits.shape[2]
        if self.length + n > self.capacity:
            raise ArgumentError(
                f"PerformerState capacity exceeded: it took {self.length} of {self.capacity} "
                f"positions and {n} more were added; make the cache larger (max_length)"
            )
        dt = logits.dtype
        s, z, c = self.s.to(dt), self.z.to(dt), self.c.to(dt)
        if n:
            # c' = max(c, max_{j,r} l_{j,r}), the exponents read with 0 while it is −∞
            c_new = torch.maximum(c, logits.detach().amax(dim=(-2, -1)))  # (B, H_kv)
            c_use = torch.where(torch.isfinite(c_new), c_new, torch.zeros_like(c_new))
            # e^{c − c'} S̃, e^{c − c'} z̃: the old sums under the new stabiliser
            alpha = torch.exp(c - c_use)  # (B, H_kv), 0 before the first visible key
            s, z, c = s * alpha[..., None, None], z * alpha[..., None], c_new
            # φ̃(k_j) = exp(l_j − c') / √m
            phi_k = torch.exp(logits - c_use[..., None, None]) * m**-0.5  # (B, H_kv, T_new, m)
        else:
            phi_k = logits.new_zeros(logits.shape)
        # S̃' = e^{c − c'} S̃ + Σ_j φ̃(k_j) v_jᵀ,  z̃' = e^{c − c'} z̃ + Σ_j φ̃(k_j)
        self.s = (s + phi_k.transpose(-2, -1) @ v.to(dt)).to(self.s.dtype)
        self.z = (z + phi_k.sum(-2)).to(self.z.dtype)
        self.c = c.to(self.c.dtype)
        self.length += n
        return phi_k, s, z

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search): row ``b`` becomes old row ``index[b]``.

        Args:
            index: integer indices of the rows to keep, on the state's device; may repeat rows.

        Shape:
            index ``(B_new,)``; the sums become ``(B_new, H_kv, m, D_v)`` and ``(B_new, H_kv, m)``.
        """
        self.s = self.s.index_select(0, index)
        self.z = self.z.index_select(0, index)
        self.c = self.c.index_select(0, index)

    def nbytes(self) -> int:
        """Bytes held by the sums and the stabiliser (the same after any number of tokens).

        Returns:
            The size of ``s``, ``z`` and ``c`` in bytes.
        """
        return self.s.nbytes + self.z.nbytes + self.c.nbytes


@runtime_checkable
class LayerCache(Protocol):
    """What a model needs of one layer's decoding cache, whatever the layer keeps (a
    :class:`KVCache`, a :class:`PerformerState`, or a new kind's own): the layer that made it
    (its ``new_cache``) is the only one that reads it.

    Attributes:
        length: positions absorbed so far (the next token's position).
        static: a cross-attention cache, filled once.
    """

    length: int
    static: bool

    @property
    def batch(self) -> int:
        """The rows ``B`` it holds."""
        ...

    @property
    def capacity(self) -> int:
        """The most positions it takes."""
        ...

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search).

        Args:
            index: the rows to keep.

        Shape:
            index ``(B_new,)``.
        """
        ...

    def nbytes(self) -> int:
        """Bytes held.

        Returns:
            The size.
        """
        ...


class ModelCache:
    """The caches of a whole model: one :class:`KVCache` per self-attention layer (a
    :class:`PerformerState` for a causal Performer layer), and per cross-attention layer for an
    encoder-decoder.

    ``length`` is the number of positions processed so far (the next token's position).

    Args:
        layers: the self-attention caches, one per layer, first layer first.
        cross: the cross-attention caches of an encoder-decoder, one per decoder layer;
            ``None`` (the default) for a decoder-only model.
    """

    #: the model runs the whole prefix again at each step instead of reading the layers'
    #: caches (a reference for cached decoding, e.g. :class:`attnlab.models.gpt.RecomputeCache`)
    recomputes = False

    def __init__(
        self,
        layers: Sequence[LayerCache],
        cross: list[LayerCache] | None = None,
    ) -> None:
        self.layers: list[LayerCache] = list(layers)
        self.cross = cross

    @property
    def length(self) -> int:
        """Positions processed so far (the next token's position); 0 without layers."""
        return self.layers[0].length if self.layers else 0

    @property
    def next_position(self) -> int:
        """The position the next token gets: ``length``, or its place in a sink cache."""
        if not self.layers:
            return 0
        first = self.layers[0]
        return int(getattr(first, "next_position", first.length))

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
        """Bytes held by the key and value buffers of every layer (at full capacity), or by
        the running sums of Performer layers.

        Returns:
            The total size of the buffers in bytes, cross-attention caches included.
        """
        return sum(c.nbytes() for c in self.layers + (self.cross or []))


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
