"""Decoding caches: keys and values of past positions, preallocated per layer, one class per
policy of what is kept.

During autoregressive decoding each new token's query attends to the keys and values of every
earlier position. Recomputing them is ``O(T²)`` work per token; keeping them is ``O(T)`` memory:
``2 · layers · B · H_kv · capacity · d_head`` numbers. Grouped-query and multi-query attention
shrink the cache by ``H / H_kv``.

Each policy is its own class with one method the attention layer calls,
``view = cache.update(k, v, mask, window=..., is_causal=...)`` (a
:class:`~attnlab.nn.cache_view.CacheView`: the keys, values and mask the queries attend over):

* :class:`KVCache` keeps every position, up to its capacity;
* :class:`~attnlab.nn.cache_policies.RollingKVCache` keeps the last ``window`` positions, all
  that sliding-window attention ``(window, 0)`` (Mistral 7B) reads again: ``O(window)`` memory;
* :class:`~attnlab.nn.cache_policies.SinkKVCache` keeps the first ``sinks`` positions and the
  last ``window`` (StreamingLLM), its keys unrotated, to stream a full-attention model past any
  length;
* :class:`~attnlab.nn.cache_policies.CrossKVCache` is filled once with the encoder memory's keys
  and values (cross-attention) and read at every later step.

Causal linear attention needs no keys at all: it is a recurrent network (Katharopoulos et al.
2020, "Transformers are RNNs", §3.4) whose state is two running sums over the keys seen so far,

    S_t = S_{t−1} + φ(k_t) v_tᵀ        z_t = z_{t−1} + φ(k_t)        o_t = φ(q_t)ᵀ S_t / φ(q_t)ᵀ z_t

so a causal Performer (FAVOR+) layer decodes from a :class:`PerformerState` of
``B · H_kv · (m · (d_head + 1) + 1)`` numbers (``m`` random features): ``O(1)`` memory and time per
token, whatever the length decoded. It has no ``update``: the Performer layer reads it itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar, Protocol, runtime_checkable

import torch

from attnlab._budget import check_fits
from attnlab._checks import check_device, check_positive_int, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.nn.cache_view import CacheView

__all__ = [
    "KVBuffers",
    "KVCache",
    "KVCachePolicy",
    "LayerCache",
    "ModelCache",
    "PerformerState",
]


class KVBuffers:
    """What every KV cache policy shares: key and value buffers of a fixed ``capacity``, the
    checks of what enters them, beam-search reordering and their size. A policy (a subclass)
    adds how positions enter and leave (its ``update``).

    Args:
        batch: batch size ``B``.
        num_kv_heads: ``H_kv``.
        capacity: the most positions the buffers hold.
        d_head: head dimension of keys (and of values unless ``d_head_v`` is given).
        d_head_v: head dimension of values; default ``d_head``.
        dtype: dtype of the buffers; default ``torch.float32``.
        device: device of the buffers; default the current default device.

    Raises:
        ValueError: a size that is not a positive int, or buffers larger than the memory of
            ``device`` (checked before they are allocated, :func:`attnlab._budget.check_fits`).
        TypeError: ``dtype`` is not a ``torch.dtype``.

    Shape:
        ``keys``: ``(B, H_kv, held, d_head)``; ``values``: ``(B, H_kv, held, d_head_v)``.
    """

    #: whether the cache hands the attention every position it was given (a block layout,
    #: which counts every position, needs it); a rolling or sink cache evicts
    keeps_all: ClassVar[bool] = True

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
        if not isinstance(dtype, torch.dtype):
            raise ArgumentTypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
        device = torch.get_default_device() if device is None else check_device("device", device)
        if device.type != "meta":  # meta: shapes only, nothing held
            check_fits(
                f"{type(self).__name__}(batch={batch}, num_kv_heads={num_kv_heads}, "
                f"capacity={capacity}, d_head={d_head})",
                batch * num_kv_heads * capacity * (d_head + d_v) * dtype.itemsize,
                what="the cache's keys and values",
                device=device,
            )
        self.k = torch.zeros(batch, num_kv_heads, capacity, d_head, dtype=dtype, device=device)
        self.v = torch.zeros(batch, num_kv_heads, capacity, d_v, dtype=dtype, device=device)
        self.length = 0

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
        """The positions the buffers hold (``length`` until a policy evicts)."""
        return min(self.length, self.k.shape[2])

    @property
    def next_position(self) -> int:
        """The position the next token gets: ``length`` (a sink cache: its place in the cache)."""
        return self.length

    def query_places(self, count: int) -> torch.Tensor | None:
        """The places to rotate the next ``count`` queries at, when the cache decides them (a
        sink cache); ``None``: the tokens' own positions, and the keys are stored rotated.

        Args:
            count: the new tokens ``T_new``.

        Returns:
            ``None`` here.

        Shape:
            a cache that gives places: ``(T_new,)`` or ``(B, T_new)``.
        """
        return None

    @property
    def keys(self) -> torch.Tensor:
        """The keys stored so far, a view ``(B, H_kv, held, d_head)`` of the buffer."""
        return self.k[:, :, : self.held]

    @property
    def values(self) -> torch.Tensor:
        """The values stored so far, a view ``(B, H_kv, held, d_head_v)`` of the buffer."""
        return self.v[:, :, : self.held]

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search): row ``b`` becomes old row ``index[b]``.

        Args:
            index: integer indices of the rows to keep, on the cache's device; may repeat rows.

        Shape:
            index ``(B_new,)``; the buffers become ``(B_new, H_kv, capacity, d_head)``.
        """
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)

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

    def _new_keys(
        self, k: torch.Tensor | None, v: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``k``, ``v``, which every update but a filled cross-attention cache's needs."""
        if k is None or v is None:
            raise ArgumentError(
                f"{type(self).__name__}.update needs the new keys and values (only a filled "
                "CrossKVCache is read without them)"
            )
        return k, v


class KVCache(KVBuffers):
    """The keys and values of every position of one self-attention layer, up to ``capacity``:
    it grows by :meth:`append` (:meth:`update` for the layer).

    A rolling cache for sliding-window attention is a
    :class:`~attnlab.nn.cache_policies.RollingKVCache`, a StreamingLLM sink cache a
    :class:`~attnlab.nn.cache_policies.SinkKVCache`, a cross-attention cache a
    :class:`~attnlab.nn.cache_policies.CrossKVCache`: the ``window``/``sinks`` keywords of
    earlier versions are refused with the class to use.

    Args:
        batch: batch size ``B``.
        num_kv_heads: ``H_kv``.
        capacity: the most positions it can hold.
        d_head: head dimension of keys (and of values unless ``d_head_v`` is given).
        d_head_v: head dimension of values; default ``d_head``.
        dtype: dtype of the buffers; default ``torch.float32``.
        device: device of the buffers; default the current default device.
        window: refused (a :class:`~attnlab.nn.cache_policies.RollingKVCache`).
        sinks: refused (a :class:`~attnlab.nn.cache_policies.SinkKVCache`).

    Raises:
        ValueError: a size that is not a positive int, or buffers larger than the memory of
            ``device`` (checked before they are allocated, :func:`attnlab._budget.check_fits`).
        TypeError: ``window`` or ``sinks`` given.

    Shape:
        ``keys``: ``(B, H_kv, length, d_head)``; ``values``: ``(B, H_kv, length, d_head_v)``.
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
        window: None = None,
        sinks: None = None,
    ) -> None:
        if window is not None or sinks is not None:
            new = (
                f"RollingKVCache(..., window={window})"
                if sinks is None
                else f"SinkKVCache(..., window={window}, sinks={sinks})"
            )
            raise ArgumentTypeError(
                f"KVCache takes no window or sinks (it keeps every position), got "
                f"window={window!r}, sinks={sinks!r}: use attnlab.{new}"
            )
        super().__init__(
            batch, num_kv_heads, capacity, d_head, d_head_v, dtype=dtype, device=device
        )

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions' keys/values and return all keys/values so far.

        Args:
            k: keys of the ``T_new`` new positions.
            v: values of the same positions.

        Returns:
            ``(keys, values)``: every position stored so far, the new ones last (views).

        Raises:
            ValueError: when the cache would go past its capacity, or when shapes disagree
                with the buffers.

        Shape:
            - k ``(B, H_kv, T_new, d_head)``, v ``(B, H_kv, T_new, d_head_v)``
            - keys ``(B, H_kv, length, d_head)``, values ``(B, H_kv, length, d_head_v)``, with
              ``length`` the previous length plus ``T_new``
        """
        self._check(k, v)
        n = k.shape[2]
        if self.length + n > self.capacity:
            raise ArgumentError(
                f"KV cache capacity exceeded: it holds {self.length} of {self.capacity} positions "
                f"and {n} more were added; make the cache larger (max_length)"
            )
        self.k[:, :, self.length : self.length + n] = k
        self.v[:, :, self.length : self.length + n] = v
        self.length += n
        return self.keys, self.values

    def update(
        self,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        mask: torch.Tensor | None,
        *,
        window: tuple[int | None, int | None] | None = None,
        is_causal: bool = False,
    ) -> CacheView:
        """Append the call's keys and values (:meth:`append`); the queries see every position.

        Args:
            k: the new keys.
            v: the new values.
            mask: the call's mask over every position so far, or ``None``; handed on as it is.
            window: the call's window (any: every key is kept).
            is_causal: the call's causality, handed on.

        Returns:
            The view: every key and value so far, ``mask``, ``is_causal``.

        Raises:
            ValueError: no keys given, shapes that disagree, or the capacity exceeded.

        Shape:
            k ``(B, H_kv, T_new, d_head)``; the view's keys ``(B, H_kv, length, d_head)``.
        """
        keys, values = self.append(*self._new_keys(k, v))
        return CacheView(keys, values, mask, is_causal)


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
    def next_position(self) -> int:
        """The position the next token gets: ``length``."""
        return self.length

    def query_places(self, count: int) -> None:
        """The tokens' own positions rotate the queries (``None``), as for a :class:`KVCache`.

        Args:
            count: the new tokens.

        Returns:
            ``None``.
        """
        return None

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
    """What a model needs of one layer's decoding cache, whatever the layer keeps (a KV cache
    policy, a :class:`PerformerState`, or a new kind's own): the layer that made it (its
    ``new_cache``) is the only one that reads it.

    Attributes:
        length: positions absorbed so far.
    """

    length: int

    @property
    def batch(self) -> int:
        """The rows ``B`` it holds."""
        ...

    @property
    def capacity(self) -> int:
        """The most positions it takes."""
        ...

    @property
    def next_position(self) -> int:
        """The position the next token gets (a sink cache: its place in the cache)."""
        ...

    def query_places(self, count: int) -> torch.Tensor | None:
        """The places to rotate the next ``count`` queries at, or ``None`` for the tokens' own
        positions (the keys are then rotated before they enter the cache).

        Args:
            count: the new tokens ``T_new``.

        Returns:
            The places, or ``None``.

        Shape:
            ``(T_new,)`` or ``(B, T_new)``.
        """
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


@runtime_checkable
class KVCachePolicy(LayerCache, Protocol):
    """A KV cache policy: a :class:`LayerCache` that a
    :class:`~attnlab.nn.multihead.MultiHeadAttention` reads through :meth:`update` alone
    (:class:`KVCache`, :class:`~attnlab.nn.cache_policies.CrossKVCache`,
    :class:`~attnlab.nn.cache_policies.RollingKVCache`,
    :class:`~attnlab.nn.cache_policies.SinkKVCache`, the static cache of compiled decoding).
    """

    def update(
        self,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        mask: torch.Tensor | None,
        *,
        window: tuple[int | None, int | None] | None = None,
        is_causal: bool = False,
    ) -> CacheView:
        """Take the call's new keys and values, keep what the policy keeps, and return what the
        queries attend over (:class:`~attnlab.nn.cache_view.CacheView`).

        Args:
            k: the new keys, ``None`` when a filled cross-attention cache holds them.
            v: the new values, likewise.
            mask: the call's mask over every position so far, or ``None``.
            window: the call's ``(left, right)`` window, or ``None``.
            is_causal: whether the call is causal.

        Returns:
            The view.

        Raises:
            ValueError: a call the policy cannot serve (shapes, capacity, window, causality).

        Shape:
            k ``(B, H_kv, T_new, d_head)``; v ``(B, H_kv, T_new, d_head_v)``; mask
            broadcastable to ``(B, H, T_q, T_past + T_new)``.
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
        return self.layers[0].next_position if self.layers else 0

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
