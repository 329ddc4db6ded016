"""Multi-head attention (Vaswani et al. 2017, §3.2.2), with grouped- and multi-query heads.

    MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O,   head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

With ``num_kv_heads < num_heads`` (Ainslie et al. 2023, GQA) groups of query heads share one
key/value head; ``num_kv_heads = 1`` is multi-query attention (Shazeer 2019).

Heads can be switched off with a head mask ``ξ`` (Michel et al. 2019, "Are Sixteen Heads Really
Better than One?", §2.2), as Hugging Face names it ``head_mask``:

    MultiHead(Q, K, V) = Concat(ξ_1 head_1, …, ξ_h head_h) W^O

``ξ_i = 1`` keeps head ``i``, ``ξ_i = 0`` removes what it adds to the output.

A layer may carry a block-sparse layout (``block_mask``, e.g. BigBird's, Zaheer et al. 2020) built
for the longest sequence it will see; a call over ``T_k`` keys uses its top-left crop,
``block_mask.crop(T_k)``, so that what a position sees does not depend on the length of the
sequence, and a decoding step (the last query of ``T_k`` keys, aligned bottom-right) sees exactly
the keys of that row in the full forward.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from attnlab._checks import check_positive_int, check_probability
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.nn.attention import Backend, attend
from attnlab.nn.backends import check_backend, choose_backend
from attnlab.nn.cache_policies import CrossKVCache, RollingKVCache
from attnlab.nn.cache_view import CacheView
from attnlab.nn.head_mask import check_head_mask, with_ablations
from attnlab.nn.hooks import HookPoint
from attnlab.nn.kv_cache import KVCache, KVCachePolicy, LayerCache
from attnlab.nn.mask_spec import Masking, normalize_mask
from attnlab.nn.masks import BlockLayout, Window, normalize_window
from attnlab.nn.multihead_call import AttentionCall, check_inputs

if TYPE_CHECKING:
    from attnlab.nn.positional import RotaryEmbedding

__all__ = ["AttentionCall", "MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head self- or cross-attention.

    Args:
        d_model: model width; must be divisible by ``num_heads``.
        num_heads: query heads ``H``.
        num_kv_heads: key/value heads ``H_kv`` (default ``num_heads``); ``num_heads`` must be a
            multiple of it.
        dropout: dropout on the attention weights while training. Default ``0.0``.
        bias: whether the projections have biases. Default ``True``.
        backend: attention backend, see :func:`attnlab.scaled_dot_product_attention`. Default ``"auto"``.
        rotary: a :class:`~attnlab.nn.positional.RotaryEmbedding` applied to queries and keys, or
            ``None`` (the default).
        window: sliding-window attention for every call (Mistral's ``sliding_window``): ``None``
            (default), an int ``w`` (= ``(w, 0)``: each query sees itself and the ``w`` keys
            before it) or ``(left, right)``, see :func:`attnlab.scaled_dot_product_attention`.
            Stored as :attr:`window`, in the form ``(left, right)``; ``forward(window=...)``
            overrides it for one call. With a KV cache, a cache made with
            ``RollingKVCache(..., window=left)`` keeps only the keys the window can still reach.
        block_mask: block-sparse attention for every call: ``None`` (default) or a
            :class:`~attnlab.nn.masks.BlockLayout` (e.g. :func:`attnlab.masks.bigbird_layout`)
            over the longest sequence the layer will see (a model's ``n_positions``). A call over
            ``T_k`` keys applies ``block_mask.crop(T_k)`` (queries aligned bottom-right, as the
            causal rule); a causal layout also hides future keys. Stored as :attr:`block_mask`;
            ``forward(block_mask=...)`` overrides it for one call. ``"auto"`` then runs the
            blockwise backend, which visits only the visible blocks. Not with a rolling KV cache
            (``RollingKVCache``): the layout counts every position.
        device: where to create the parameters; default the current default device.
        dtype: dtype of the parameters; default the current default dtype.

    The query, key and value projections live in one matrix ``in_proj_weight`` (as in
    ``torch.nn.MultiheadAttention``), so self-attention projects with one matmul.

    Shape:
        - query ``(B, T_q, d_model)``; key/value ``(B, T_k, d_model)`` (default: the query)
        - mask broadcastable to ``(B, H, T_q, T_k)``, ``True = may attend``, or additive float
        - head_mask broadcastable to ``(B, H)``: ``(H,)`` or ``(B, H)``, 1 keeps a head, 0 removes it
        - output ``(B, T_q, d_model)``; weights ``(B, H, T_q, T_k)`` (per head, not averaged)

    Examples:
        >>> mha = MultiHeadAttention(64, num_heads=8, num_kv_heads=2)
        >>> x = torch.randn(2, 10, 64)
        >>> mha(x, is_causal=True).shape
        torch.Size([2, 10, 64])
    """

    #: whether ``forward`` hides future keys when ``is_causal`` is not given
    causal: bool = False
    #: the sliding window ``(left, right)`` ``forward`` applies when ``window`` is not given
    window: tuple[int | None, int | None] | None = None
    #: the block-sparse layout ``forward`` applies (cropped to ``T_k``) when ``block_mask`` is
    #: not given
    block_mask: BlockLayout | None = None
    head_ablations: tuple[torch.Tensor, ...] = ()  #: ξ ``(H,)`` of ``inspect.masked_heads``
    softcap: float | None = None  #: ``c`` of ``c · tanh(s / c)`` on the scores (``Masking``)

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        backend: Backend = "auto",
        rotary: RotaryEmbedding | None = None,
        window: Window = None,
        block_mask: BlockLayout | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        num_kv_heads = (
            num_heads if num_kv_heads is None else check_positive_int("num_kv_heads", num_kv_heads)
        )
        if d_model % num_heads != 0:
            raise ArgumentError(f"d_model = {d_model} must be divisible by num_heads = {num_heads}")
        if num_heads % num_kv_heads != 0:
            raise ArgumentError(
                f"num_heads = {num_heads} must be a multiple of num_kv_heads = {num_kv_heads}"
            )
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.d_head = d_model // num_heads
        self.score_scale = self.d_head**-0.5  # the scores' scale (Gemma 2 sets its own)
        self.dropout = check_probability("dropout", dropout)
        self.backend: Backend = check_backend(backend)
        self.rotary = rotary
        self.window = normalize_window(window)
        if block_mask is not None and not isinstance(block_mask, BlockLayout):
            raise ArgumentTypeError(
                f"block_mask must be an attnlab.masks.BlockLayout (e.g. from "
                f"attnlab.masks.bigbird_layout) or None, got {type(block_mask).__name__}"
            )
        self.block_mask = block_mask
        self._build_projections(bias, device, dtype)
        self.hook_q = HookPoint()
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        self.hook_weights = HookPoint()  # (B, H, T_q, T_k), computed only when something listens
        self.hook_z = HookPoint()  # per-head outputs, (B, H, T_q, d_head)
        self.hook_call = HookPoint()  # the resolved call (ResolvedCall), built only when observed
        if rotary is not None:  # the queries and keys after the rotation, as the scores see them
            self.hook_rot_q = HookPoint()  # (B, H, T_q, d_head)
            self.hook_rot_k = HookPoint()  # (B, H_kv, T_new, d_head), before the cache

    # -- projections (subclasses may store them under other names, e.g. GPT-2's c_attn/c_proj) --

    def _build_projections(
        self, bias: bool, device: torch.device | str | None, dtype: torch.dtype | None
    ) -> None:
        kv = self.num_kv_heads * self.d_head
        self.in_proj_weight = nn.Parameter(
            torch.empty(self.d_model + 2 * kv, self.d_model, device=device, dtype=dtype)
        )
        self.in_proj_bias = (
            nn.Parameter(torch.zeros(self.d_model + 2 * kv, device=device, dtype=dtype))
            if bias
            else None
        )
        self.out_proj = nn.Linear(self.d_model, self.d_model, bias=bias, device=device, dtype=dtype)
        nn.init.xavier_uniform_(self.in_proj_weight)
        if bias:
            nn.init.zeros_(self.out_proj.bias)

    def qkv_parameters(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The fused projection ``[W^Q; W^K; W^V]`` and its bias; a subclass that stores them
        elsewhere returns its own.

        Returns:
            ``(weight, bias)``, ``bias`` being ``None`` for a layer built with ``bias=False``.

        Shape:
            weight ``(d_model + 2 · H_kv · d_head, d_model)``; bias
            ``(d_model + 2 · H_kv · d_head,)``.
        """
        return self.in_proj_weight, self.in_proj_bias

    def fused_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """``x [W^Q; W^K; W^V]ᵀ + b``: self-attention's three projections in one matmul.

        Args:
            x: the activations that are projected to queries, keys and values alike.

        Returns:
            ``[Q, K, V]`` concatenated in the last dimension, heads still merged.

        Shape:
            ``(B, T, d_model)`` → ``(B, T, d_model + 2 · H_kv · d_head)``.
        """
        w, b = self.qkv_parameters()
        return F.linear(x, w, b)

    def project_qkv(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        project_kv: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``Q = x W^Qᵀ + b^Q``, ``K = y W^Kᵀ + b^K``, ``V = y' W^Vᵀ + b^V``.

        Self-attention (``key is None``): ``x = y = y'`` and one matmul with the fused weight.
        Cross-attention: the query rows of the weight for ``query``, the key and value rows for
        ``key`` and ``value`` (default ``key``); with ``project_kv=False`` (the keys and values
        are already in a cache) only ``Q`` is computed and ``K``, ``V`` are ``None``.

        Args:
            query: the activations the queries come from.
            key: the activations the keys come from, or ``None`` (default) for self-attention.
            value: the activations the values come from; default ``key``.
            project_kv: compute ``K`` and ``V`` (default ``True``); ignored for self-attention.

        Returns:
            ``(q, k, v)``; ``k`` and ``v`` are ``None`` when ``project_kv`` is false.

        Shape:
            query ``(B, T_q, d_model)``, key/value ``(B, T_k, d_model)`` → ``q`` ``(B, T_q, d_model)``,
            ``k``, ``v`` ``(B, T_k, H_kv · d_head)`` (heads still merged in the last dim).
        """
        d, kv = self.num_heads * self.d_head, self.num_kv_heads * self.d_head  # d_model unsharded
        if key is None:
            q, k, v = self.fused_qkv(query).split([d, kv, kv], dim=-1)
            return q, k, v
        w, b = self.qkv_parameters()

        def rows(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
            return F.linear(x, w[lo:hi], None if b is None else b[lo:hi])

        q = rows(query, 0, d)
        if not project_kv:
            return q, None, None
        return q, rows(key, d, d + kv), rows(key if value is None else value, d + kv, d + 2 * kv)

    def project_out(self, x: torch.Tensor) -> torch.Tensor:
        """``Concat(heads) W^O``: the output projection.

        Args:
            x: the heads' outputs, concatenated in the last dimension.

        Returns:
            The layer's output.

        Shape:
            ``(B, T_q, d_model)`` → ``(B, T_q, d_model)``.
        """
        return self.out_proj(x)

    # -- forward --

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        is_causal: bool | None = None,
        need_weights: bool = False,
        cache: LayerCache | None = None,
        positions: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
        check_positions: bool = True,
        window: Window = None,
        block_mask: BlockLayout | Literal[False] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``query`` to ``key``/``value`` (self-attention when ``key`` is ``None``).

        Args:
            query: ``(B, T_q, d_model)``.
            key: ``(B, T_k, d_model)`` or ``None`` for self-attention.
            value: ``(B, T_k, d_model)``; default ``key``.
            mask: boolean (``True = may attend``) or additive float, broadcastable to
                ``(B, H, T_q, T_k)``; ``T_k`` includes cached positions.
            is_causal: bottom-right causal masking (works across a KV cache); ``None`` (default)
                takes the layer's own default, :attr:`causal` (``False`` here, ``True`` for GPT's
                self-attention).
            need_weights: also return the per-head weights ``(B, H, T_q, T_k)``.
            cache: a KV cache policy (:class:`~attnlab.nn.kv_cache.KVCache`, a rolling or sink
                cache, :mod:`attnlab.nn.cache_policies`): self-attention hands it the new
                keys/values (``update``); a cross-attention call needs a
                :class:`~attnlab.nn.cache_policies.CrossKVCache`, filled on first use and reused
                afterwards.
            positions: position ids ``(B, T_q)`` or ``(T_q,)`` for rotary embeddings; default
                ``cache.length + arange(T_q)``.
            head_mask: ``ξ`` broadcastable to ``(B, H)`` (``(H,)`` or ``(B, H)``), floating or
                bool: each head's output is multiplied by its entry before the output
                projection, so 1 keeps a head and 0 removes it (Hugging Face's ``head_mask``).
                The returned and hooked weights (``hook_weights``) and per-head outputs
                (``hook_z``) are the masked ones. Differentiable with respect to a floating mask
                (Michel et al. 2019 score heads by ``|∂L/∂ξ_h|``). ``None`` (default) and an
                all-ones mask give bit-identical results.
            check_positions: check that ``positions`` lie in the rotary table. ``False`` is for
                callers that have checked them already (the models do, once per forward): the
                check reads the largest position back to the host, a synchronisation a decoding
                step should not pay.
            window: the sliding window for this call, as in
                :func:`attnlab.scaled_dot_product_attention` (aligned bottom-right, so it works
                across a KV cache); ``None`` (default) takes the layer's own :attr:`window`, and
                ``(None, None)`` turns it off for this call.
            block_mask: the block-sparse layout for this call: ``None`` (default) takes the
                layer's own :attr:`block_mask`, a :class:`~attnlab.nn.masks.BlockLayout`
                replaces it, and ``False`` turns it off for this call (e.g. when ``mask``
                already holds the pattern per row, as :class:`attnlab.GPT` does for left
                padding). A layout longer than ``T_k`` is cropped to the first ``T_k``
                positions (:meth:`~attnlab.nn.masks.BlockLayout.crop`).

        Returns:
            ``output`` ``(B, T_q, d_model)``, or ``(output, weights)`` with ``need_weights``.

        Shape:
            - query ``(B, T_q, d_model)``; key/value ``(B, T_k, d_model)``
            - mask broadcastable to ``(B, H, T_q, T_k)``; positions ``(B, T_q)`` or ``(T_q,)``;
              head_mask ``(H,)`` or ``(B, H)``
            - output ``(B, T_q, d_model)``; weights ``(B, H, T_q, T_k)``
        """
        cross = check_inputs(self, query, key, value)
        call = AttentionCall(
            mask=mask,
            is_causal=self.causal if is_causal is None else bool(is_causal),
            need_weights=need_weights,
            cache=cache,
            positions=positions,
            check_positions=check_positions,
            window=self.window if window is None else normalize_window(window),
            block_mask=block_mask,
            cross=cross,
            query=query,
            memory=key if cross else None,
        )
        self.check_call(call)
        head_mask = self._ablated(head_mask)  # masked_heads' ξ (head_ablations), in order
        xi = None if head_mask is None else check_head_mask(head_mask, len(query), self.num_heads)
        q, k, v = self.heads(query, key, value, call)
        result = self.attend_heads(q, k, v, call)
        z, weights = result if isinstance(result, tuple) else (result, None)
        return self._merge_heads(z, weights, xi, need_weights)

    def _ablated(self, head_mask: torch.Tensor | None) -> torch.Tensor | None:
        return with_ablations(head_mask, self.head_ablations)

    # -- the seam: what a variant of attention overrides --

    def check_call(self, call: AttentionCall) -> None:
        """Refuse the options of one call this layer cannot honour, before any work is done;
        a subclass that does not implement an option refuses it here.

        Args:
            call: the call's options (:class:`AttentionCall`).

        Raises:
            ValueError: a cache this layer cannot use (see :meth:`check_cache`), a
                cross-attention cache on self-attention or the reverse, or a block layout with
                a cache that evicts.
        """
        if call.cache is not None:
            self.check_cache(call.cache)
            if call.cross != isinstance(call.cache, CrossKVCache):
                kind, need = ("cross", "a CrossKVCache") if call.cross else ("self", "a KVCache")
                raise ArgumentError(
                    f"cache: a {kind}-attention call needs {need} (or another {kind}-attention "
                    f"cache policy), got {type(call.cache).__name__}"
                )
        self._layout(call.block_mask, call.cache)

    def heads(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        call: AttentionCall,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``Q``, ``K``, ``V`` with the heads split, rotated (rotary embeddings, self-attention
        only), ``Q`` through ``hook_q``; ``K``, ``V`` are ``None`` when a filled
        :class:`~attnlab.nn.cache_policies.CrossKVCache` already holds them. The queries turn by
        the places the cache gives (``query_places``: a sink cache's, its keys turned after it),
        else by ``positions`` or the next ``cache.length …``.

        Args:
            query: ``(B, T_q, d_model)``.
            key: ``(B, T_k, d_model)`` or ``None`` (self-attention).
            value: ``(B, T_k, d_model)`` or ``None`` (``key``).
            call: the call's options.

        Returns:
            ``(q, k, v)``.

        Shape:
            q ``(B, H, T_q, d_head)``; k, v ``(B, H_kv, T_k, d_head)``.
        """
        cache, cross = call.cache, call.cross
        # a filled cross-attention cache holds the memory's K, V: computed once
        cached_kv = cross and isinstance(cache, CrossKVCache) and cache.filled
        q, k, v = self.project_qkv(
            query, key if cross else None, value if cross else None, project_kv=not cached_kv
        )
        q = self.hook_q(self._split_heads(q, self.num_heads))
        if k is not None and v is not None:
            k, v = self._split_heads(k, self.num_kv_heads), self._split_heads(v, self.num_kv_heads)
        if not cross and k is not None:
            q, k = self._rotate(q, k, call)
        return q, k, v

    def attend_heads(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        call: AttentionCall,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Every head's ``softmax(Q Kᵀ / √d_head + M) V``, the cache included: **the one method a
        variant of attention overrides** (Linformer's projected keys, Performer's random
        features, ring attention across processes in
        :mod:`attnlab.distributed.context_parallel`); projections, rotary embeddings, the head
        mask and the hook points around it stay the layer's.

        Here: the new keys and values enter the KV cache (a static cross-attention cache is
        filled once, then read), pass ``hook_k``/``hook_v``, the masks are normalised
        (:func:`~attnlab.nn.mask_spec.normalize_mask`) and the backend ``"auto"`` would pick runs
        them (an observer on ``hook_weights`` does not change the kernel; it gets exact weights).

        Args:
            q: queries, heads split (rotated).
            k: the new keys, or ``None`` when a static cache holds them.
            v: the new values, likewise.
            call: the call's options (mask, causality, window, layout, cache, need_weights).

        Returns:
            ``z`` ``(B, H, T_q, d_head)``, or ``(z, weights)`` with weights ``(B, H, T_q, T_k)``
            when ``call.need_weights`` or ``hook_weights`` listens.

        Shape:
            q ``(B, H, T_q, d_head)``; k, v ``(B, H_kv, T_new, d_head)``.
        """
        view = self._with_cache(k, v, call)
        k, v = view.keys, view.values
        if k.dtype != q.dtype:  # e.g. an fp32 cache read under bf16 autocast
            k, v = k.to(q.dtype), v.to(q.dtype)
        k, v = self.hook_k(k), self.hook_v(v)
        layout = self._crop(self._layout(call.block_mask, call.cache), k.shape[-2])
        # per head: softmax(Q Kᵀ / √d_head + M) V                      (B, H, T_q, d_head)
        want_weights = call.need_weights or self.hook_weights.active
        # q, k, v are built here, consistent by construction: only the mask needs checking
        window = None if view.window_in_mask else call.window  # a static cache's own mask
        masking = normalize_mask(q, k, view.mask, view.is_causal, window, layout)
        masking = dataclasses.replace(masking, softcap=self.softcap)  # applied or refused
        # an observer (a hook on hook_weights) must not change what forward computes: the kernel
        # is the one "auto" picks when no weights are wanted; it returns exact weights as well
        backend = choose_backend(
            self.backend, call.need_weights, masking, q.shape[-2], k.shape[-2], q.device
        )
        dropout_p = self.dropout if self.training else 0.0
        result = attend(q, k, v, masking, self.score_scale, dropout_p, backend, want_weights)
        if self.hook_call.active:
            self.emit_call(call, q, k, v, masking, result)
        return result

    def emit_call(
        self,
        call: AttentionCall,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        masking: Masking,
        result: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        **fields: object,
    ) -> None:
        """Hand the call as it ran to ``hook_call`` (:meth:`ResolvedCall.of
        <attnlab.nn.resolved_call.ResolvedCall.of>`); :meth:`attend_heads` and a variant's own
        call it only when something listens, a variant with its ``method`` and ``fields``.

        Args:
            call: the call's options.
            q: the queries as scored.
            k: the keys as scored.
            v: the values.
            masking: the normalised mask.
            result: ``z`` or ``(z, weights)``.
            **fields: further :class:`~attnlab.nn.resolved_call.ResolvedCall` fields.

        Shape:
            q ``(B, H, T_q, d_head)``; k, v ``(B, H_kv, T_k, d_head)``.
        """
        from attnlab.nn.resolved_call import ResolvedCall

        self.hook_call(ResolvedCall.of(self, call, q, k, v, masking, result, **fields))

    def _with_cache(
        self, k: torch.Tensor | None, v: torch.Tensor | None, call: AttentionCall
    ) -> CacheView:
        """The keys and values the queries see, and the mask over them: the cache's
        ``update`` (its policy decides what it keeps and hands on), the keys turned by the
        places it gives (a sink cache stores them unrotated); without a cache, the call's own."""
        cache = call.cache
        if cache is None:
            if k is None or v is None:  # unreachable: only a filled cache skips the projection
                raise RuntimeError("keys and values were neither projected nor cached")
            return CacheView(k, v, call.mask, call.is_causal)
        view = cast(KVCachePolicy, cache).update(
            k, v, call.mask, window=call.window, is_causal=call.is_causal
        )
        if view.key_places is not None and self.rotary is not None:
            keys = self.hook_rot_k(self.rotary(view.keys, view.key_places, check=False))
            view = dataclasses.replace(view, keys=keys)
        return view

    # -- decoding: each layer makes and checks its own cache --

    def new_cache(
        self,
        batch: int,
        capacity: int,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> LayerCache:
        """An empty decoding cache for this layer: a :class:`~attnlab.nn.kv_cache.KVCache` of
        ``capacity`` positions, a :class:`~attnlab.nn.cache_policies.RollingKVCache` of ``w``
        positions under a causal window ``(w, 0)`` (older keys are never read again), every
        position under a block layout.

        Args:
            batch: ``B``.
            capacity: the most positions decoded (prompt + new tokens).
            dtype: default the parameters' dtype.
            device: default the parameters' device.

        Returns:
            The cache.
        """
        weight = self.qkv_parameters()[0]
        dtype, device = dtype or weight.dtype, device or weight.device
        shape = (batch, self.num_kv_heads, capacity, self.d_head)
        left, right = (None, None) if self.window is None else self.window
        if left is not None and right == 0 and self.block_mask is None:
            return RollingKVCache(*shape, window=left, dtype=dtype, device=device)
        return KVCache(*shape, dtype=dtype, device=device)

    def new_cross_cache(
        self,
        batch: int,
        src_len: int,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> CrossKVCache:
        """An empty cache for this layer used as cross-attention: a
        :class:`~attnlab.nn.cache_policies.CrossKVCache` of ``src_len`` source positions,
        filled by the first call from the memory.

        Args:
            batch: ``B``.
            src_len: the most source positions ``T_src``.
            dtype: default the parameters' dtype.
            device: default the parameters' device.

        Returns:
            The cache.
        """
        weight = self.qkv_parameters()[0]
        dtype, device = dtype or weight.dtype, device or weight.device
        return CrossKVCache(
            batch, self.num_kv_heads, src_len, self.d_head, dtype=dtype, device=device
        )

    def check_cache(self, cache: object) -> None:
        """Refuse a cache this layer cannot decode from (before any work is done).

        Args:
            cache: what a caller passed as ``cache``.

        Raises:
            ValueError: not a KV cache policy (:class:`~attnlab.nn.kv_cache.KVCachePolicy`:
                a :class:`~attnlab.nn.kv_cache.KVCache` or another policy with ``update``; e.g.
                another kind's cache).
        """
        # a KVCachePolicy (not isinstance: a runtime Protocol's costs ~90 µs a layer a step)
        if not callable(getattr(cache, "update", None)):
            raise ArgumentError(
                f"cache must be a KV cache (KVCache, or a policy with update: RollingKVCache, "
                f"SinkKVCache, CrossKVCache) for {type(self).__name__} (made by its new_cache, "
                f"or a model's new_cache), got {type(cache).__name__}"
            )

    def _layout(self, block_mask: object, cache: LayerCache | None) -> BlockLayout | None:
        """The call's block layout, checked before the cache changes: ``block_mask``
        (``None``: the layer's own, ``False``: none), not yet cropped."""
        if block_mask is None:
            block_mask = self.block_mask
        if block_mask is None or block_mask is False:
            return None
        if not isinstance(block_mask, BlockLayout):
            raise ArgumentTypeError(
                f"block_mask must be an attnlab.masks.BlockLayout, None (the layer's own) or "
                f"False (none for this call), got {block_mask!r}"
            )
        if cache is not None and not getattr(cache, "keeps_all", True):  # a cache that evicts
            raise ArgumentError(
                f"a block_mask counts every position, but the cache keeps only the last ones "
                f"({cache!r}); use a KVCache"
            )
        return block_mask

    @staticmethod
    def _crop(layout: BlockLayout | None, t_k: int) -> BlockLayout | None:
        """The layout of the first ``T_k`` positions (:meth:`BlockLayout.crop`)."""
        if layout is None:
            return None
        if t_k > layout.seq_len:
            raise ArgumentError(
                f"block_mask covers {layout.seq_len} positions but the call has T_k = {t_k} "
                f"keys; build the layout for the longest sequence (e.g. the model's positions)"
            )
        return layout.crop(t_k)

    def _merge_heads(
        self,
        z: torch.Tensor,
        weights: torch.Tensor | None,
        xi: torch.Tensor | None,
        need_weights: bool,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The head mask, the ``hook_weights``/``hook_z`` hook points, then
        ``Concat(ξ_1 head_1, …, ξ_H head_H) W^O``: z ``(B, H, T_q, d_head)`` → ``(B, T_q, d_model)``;
        subclasses that replace the attention share it (their weights may be ``(B, H, T_q, k)``)."""
        if xi is not None:
            # head_i ← ξ_i · head_i  (Michel et al. 2019): the weights too, as Hugging Face did
            xi = xi.to(device=z.device, dtype=z.dtype)
            z = z * xi  # (B, H, T_q, d_head)
            if weights is not None:
                weights = weights * xi.to(weights.dtype)  # (B, H, T_q, T_k)
        if weights is not None:
            weights = self.hook_weights(weights)
        z = self.hook_z(z)
        b, _, t_q, _ = z.shape
        # Concat(head_1, …, head_H) W^O                                  (B, T_q, d_model)
        out = self.project_out(z.transpose(1, 2).reshape(b, t_q, self.num_heads * self.d_head))
        if need_weights:
            if weights is None:
                raise RuntimeError("the attention backend returned no weights")
            return out, weights
        return out

    def _split_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """``(B, T, heads · d_head)`` → ``(B, heads, T, d_head)``."""
        return x.unflatten(-1, (heads, self.d_head)).transpose(1, 2)

    def _rotate(
        self, q: torch.Tensor, k: torch.Tensor, call: AttentionCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary embedding of the new queries and keys (before the keys enter the cache): at
        the places the cache gives (a sink cache's; its keys are turned after it, by the view's
        ``key_places``), else at ``call.positions``, else the next ``cache.length …``."""
        rotary, cache, t_q = self.rotary, call.cache, q.shape[-2]
        if rotary is None:
            return q, k
        places = None if cache is None else cache.query_places(t_q)
        if places is not None:  # the largest first place of any row is known on the host
            if (start := cache.next_position) + t_q > rotary.max_len:
                raise ArgumentError(
                    f"a sink cache gives the new tokens places up to {start + t_q - 1}, past the "
                    f"rotary table's {rotary.max_len}: make sinks + window + new tokens fit it"
                )
            return self.hook_rot_q(rotary(q, places.to(q.device), check=False)), k
        positions, check = call.positions, call.check_positions
        if positions is None:  # the next T_q positions: their range is known on the host
            past = 0 if cache is None else cache.length
            if past + t_q > rotary.max_len:
                raise ArgumentError(
                    f"positions must lie in [0, {rotary.max_len}) (the rotary table's length, "
                    f"max_len = {rotary.max_len}), got values up to {past + t_q - 1}"
                )
            positions, check = torch.arange(past, past + t_q, device=q.device), False
        with rotary.shared_angles():  # the queries' angles serve the keys
            q = self.hook_rot_q(rotary(q, positions, check=check))
            k = self.hook_rot_k(rotary(k, positions, check=False))
        return q, k

    @classmethod
    def from_torch(
        cls, module: nn.MultiheadAttention, *, backend: Backend = "auto"
    ) -> MultiHeadAttention:
        """The same layer with the weights of a ``torch.nn.MultiheadAttention``.

        The PyTorch module must be ``batch_first=True`` with equal query/key/value widths and
        without ``add_bias_kv``/``add_zero_attn``. Its masks convert with
        :func:`attnlab.masks.from_key_padding_mask` (``True = ignore`` becomes ``True = attend``)
        and ``~attn_mask`` for a boolean ``attn_mask``.

        Args:
            module: the PyTorch layer to copy (its device and dtype are kept).
            backend: the attention backend of the new layer; default ``"auto"``.

        Returns:
            A new :class:`MultiHeadAttention` with copies of the weights.

        Raises:
            TypeError: ``module`` is not a ``torch.nn.MultiheadAttention``.
            ValueError: it is not ``batch_first``, has distinct key/value widths, or uses
                ``add_bias_kv``/``add_zero_attn``.

        Examples:
            >>> ref = nn.MultiheadAttention(32, 4, batch_first=True)
            >>> mha = MultiHeadAttention.from_torch(ref)
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise ArgumentTypeError(
                f"module must be a torch.nn.MultiheadAttention, got {type(module).__name__}"
            )
        if not module.batch_first:
            raise ArgumentError(
                "module must have batch_first=True (attnlab is batch first), got batch_first=False"
            )
        if not module._qkv_same_embed_dim:
            raise ArgumentError(
                "module must have kdim == vdim == embed_dim to map onto one in_proj_weight"
            )
        if module.bias_k is not None or module.add_zero_attn:
            raise ArgumentError("module must not use add_bias_kv or add_zero_attn")
        p = module.in_proj_weight
        new = cls(
            module.embed_dim,
            module.num_heads,
            dropout=module.dropout,
            bias=module.in_proj_bias is not None,
            backend=backend,
            device=p.device,
            dtype=p.dtype,
        )
        with torch.no_grad():
            new.in_proj_weight.copy_(module.in_proj_weight)
            if new.in_proj_bias is not None:
                new.in_proj_bias.copy_(module.in_proj_bias)
            new.out_proj.weight.copy_(module.out_proj.weight)
            if new.out_proj.bias is not None:
                new.out_proj.bias.copy_(module.out_proj.bias)
        return new
