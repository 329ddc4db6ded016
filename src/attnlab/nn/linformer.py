"""Linformer: self-attention with linear complexity (Wang et al. 2020).

The ``T × T`` context-mapping matrix ``P = softmax(Q Kᵀ / √d_k)`` is close to low rank (§3), so
the keys and values are projected along the *sequence* axis to ``k`` rows with learned matrices
``E_i, F_i ∈ R^{k × n}`` (§4, eq. 7):

    head_i = softmax(Q W_i^Q (E_i K W_i^K)ᵀ / √d_k) · F_i V W_i^V        (T × k weights, not T × T)

Time and memory fall from ``O(T²)`` to ``O(T · k)``. ``n`` is the longest sequence the layer
takes (``max_len``); a shorter sequence of ``T`` positions uses the first ``T`` columns of ``E``
and ``F`` (as the authors' reference implementation does). §4 "Parameter sharing" shares the
projections: ``"none"`` (one ``E_i``, ``F_i`` per head), ``"headwise"`` (one ``E``, ``F`` for
every head) and ``"key-value"`` (one ``E = F`` for keys, values and every head).

Two consequences of mixing positions before the softmax:

* **No causal masking.** A projected key row mixes every position, future ones included, so the
  method cannot be causal: ``is_causal=True`` and masks that differ from query to query are
  refused with a ``ValueError``.
* **Padding is zeroed, not masked.** The softmax runs over the ``k`` projected rows, which are
  never padding, so a key mask cannot hide a score. Instead masked keys and values are set to
  zero *before* the sequence projection: ``E K = E_{:, S} K_S`` over the visible positions ``S``,
  and a masked position contributes nothing, whatever it holds (NaN included). With right padding
  this equals running the shorter, unpadded sequence (it uses the first ``T`` columns of ``E``).
  A query whose keys are all masked sees ``k`` zero keys and zero values: a zero output row.

:func:`linformer_attention` is the functional core; :class:`LinformerAttention` the layer, a
:class:`~attnlab.nn.multihead.MultiHeadAttention` with the same projections (``in_proj_weight``,
``out_proj``) and hook points; :func:`random_projection` draws the Gaussian Johnson–Lindenstrauss
matrix of the paper's Theorem 1 and :func:`~attnlab.nn.approximation_errors.linformer_errors` measures the error against exact
attention as ``k`` grows.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from attnlab._checks import (
    check_choice,
    check_positive_int,
    check_tensor,
    shape_str,
)
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.nn.approximation import check_qkv, key_mask, relative_error
from attnlab.nn.attention import Backend, scaled_dot_product_attention
from attnlab.nn.backends import choose_backend
from attnlab.nn.kv_cache import LayerCache
from attnlab.nn.mask_spec import Masking
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.multihead_call import AttentionCall

__all__ = [
    "SHARING",
    "LinformerAttention",
    "Sharing",
    "linformer_attention",
    "project_keys_values",
    "random_projection",
    "relative_error",
]

Sharing = Literal["none", "headwise", "key-value"]
#: the parameter-sharing variants of Wang et al. (2020), §4
SHARING: tuple[str, ...] = ("none", "headwise", "key-value")


# ------------------------------------------------------------------------------------ functional


def random_projection(
    k: int,
    n: int,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """A Gaussian Johnson–Lindenstrauss matrix ``R ∈ R^{k × n}``, entries ``N(0, 1/k)``.

    Wang et al. (2020), Theorem 1: for the context mapping ``P``, ``P Rᵀ R V`` approximates
    ``P V`` with error ``O(1/√k)`` (``E[Rᵀ R] = I``); it is also the usual initialisation of
    ``E`` and ``F``.

    Args:
        k: rows (the projected length).
        n: columns (the sequence length it projects).
        generator: the random generator; default the global one.
        dtype: element type; default the current default dtype.
        device: where to create it; default the current default device.

    Returns:
        ``R``.

    Shape:
        ``(k, n)``.
    """
    check_positive_int("k", k)
    check_positive_int("n", n)
    r = torch.randn(k, n, generator=generator, dtype=dtype, device=device)
    return r * k**-0.5


def project_keys_values(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    e: torch.Tensor,
    f: torch.Tensor | None = None,
    *,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Linformer's projected keys and values ``E K`` and ``F V`` (Wang et al. 2020, eq. 7): the
    ``k`` rows :func:`linformer_attention` attends over. Masked keys and values are zeroed
    before the projection; projections longer than ``T_k`` are cut to their first ``T_k``
    columns.

    Args:
        query: ``(..., H, T_q, D)`` (checked against the keys, and for the mask's shape).
        key: ``(..., H_kv, T_k, D)``.
        value: ``(..., H_kv, T_k, D_v)``.
        e: ``E``, ``(k, n)`` or ``(H_kv, k, n)``, ``n >= T_k``.
        f: ``F``, shaped like ``e``; default ``e``.
        mask: boolean key mask broadcastable to ``(..., H, 1, T_k)``, or ``None``.

    Returns:
        ``(E K, F V)``.

    Raises:
        TypeError: a non-tensor or non-floating input, a non-boolean mask.
        ValueError: mismatched shapes, projections shorter than ``T_k``, a per-query mask.

    Shape:
        key ``(B, H_kv, T_k, D)``, value ``(B, H_kv, T_k, D_v)`` → ``(B, H_kv, k, D)``,
        ``(B, H_kv, k, D_v)``.
    """
    check_qkv(query, key, value)
    if key.shape[:-1] != value.shape[:-1]:
        raise ArgumentError(
            f"key and value must agree in (..., H_kv, T_k), got {shape_str(key.shape)} and "
            f"{shape_str(value.shape)}"
        )
    t_k, h_kv = key.shape[-2], key.shape[-3] if key.dim() >= 3 else 1
    e = _check_projection("e", e, t_k, h_kv)
    f = e if f is None else _check_projection("f", f, t_k, h_kv)
    if f.shape[:-1] != e.shape[:-1]:
        raise ArgumentError(
            f"f must have the shape of e in its leading dims (..., k), got {shape_str(f.shape)} "
            f"and {shape_str(e.shape)}"
        )
    heads = query.shape[-3] if query.dim() >= 3 else 1
    batch = query.shape[0] if query.dim() >= 4 else 1
    m = key_mask(mask, batch, heads, t_k, "Linformer attention")
    if m is not None:
        if m.shape[1] != 1 and m.shape[1] != h_kv:
            raise ArgumentError(
                f"mask has {m.shape[1]} heads but the keys have H_kv = {h_kv}: a per-head key mask "
                f"must match the key/value heads"
            )
        # masked keys and values contribute nothing to E K and F V (NaN in padding included)
        m = m[..., None]  # (B or 1, H or 1, T_k, 1)
        key = key.masked_fill(~m, 0.0)
        value = value.masked_fill(~m, 0.0)
    e_t, f_t = e[..., :t_k].to(key.dtype), f[..., :t_k].to(value.dtype)
    # K̄ = E K,  V̄ = F V: the sequence axis projected to k rows          (B, H_kv, k, D)
    k_bar = e_t @ key
    v_bar = f_t @ value
    return k_bar, v_bar


def linformer_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    e: torch.Tensor,
    f: torch.Tensor | None = None,
    *,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    backend: Backend = "auto",
    need_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Linformer attention: ``softmax(Q (E K)ᵀ · scale) · F V`` (Wang et al. 2020, eq. 7).

    Keys and values are projected along the sequence axis to ``k`` rows, then attended to with
    ordinary softmax attention (:func:`attnlab.scaled_dot_product_attention`, so the backends,
    dropout and grouped-query heads work as there). Projections longer than ``T_k`` are cut to
    their first ``T_k`` columns. Masked keys and values are zeroed before the projection.

    Args:
        query: ``(..., H, T_q, D)``.
        key: ``(..., H_kv, T_k, D)``; ``H`` must be a multiple of ``H_kv``.
        value: ``(..., H_kv, T_k, D_v)``.
        e: the key projection ``E``, ``(k, n)`` shared by every head or ``(H_kv, k, n)`` one per
            key/value head, ``n >= T_k``.
        f: the value projection ``F``, shaped like ``e``; default ``e`` (key-value sharing).
        mask: boolean, ``True = may attend``, broadcastable to ``(..., H, 1, T_k)``: a mask of
            keys (padding). Causal or per-query masks are refused.
        scale: the score scale; default ``1 / √D``.
        dropout_p: dropout on the ``T_q × k`` weights. Default ``0.0``.
        backend: see :func:`attnlab.scaled_dot_product_attention`. Default ``"auto"``.
        need_weights: also return the weights over the ``k`` projected keys.

    Returns:
        The output ``(..., H, T_q, D_v)``, or ``(output, weights)`` with ``need_weights``, the
        weights ``(..., H, T_q, k)``.

    Raises:
        TypeError: a non-tensor or non-floating input, a non-boolean mask.
        ValueError: mismatched shapes, projections shorter than ``T_k``, a per-query mask.

    Shape:
        - query ``(B, H, T_q, D)``; key ``(B, H_kv, T_k, D)``; value ``(B, H_kv, T_k, D_v)``
        - e, f ``(k, n)`` or ``(H_kv, k, n)`` with ``n >= T_k``
        - output ``(B, H, T_q, D_v)``; weights ``(B, H, T_q, k)``

    Examples:
        >>> q = k = v = torch.randn(2, 4, 100, 16)
        >>> e = random_projection(32, 128)
        >>> linformer_attention(q, k, v, e).shape
        torch.Size([2, 4, 100, 16])
    """
    k_bar, v_bar = project_keys_values(query, key, value, e, f, mask=mask)
    return scaled_dot_product_attention(
        query,
        k_bar,
        v_bar,
        scale=scale,
        dropout_p=dropout_p,
        backend=backend,
        need_weights=need_weights,  # type: ignore[call-overload]
    )


def _check_projection(name: str, p: object, t_k: int, h_kv: int) -> torch.Tensor:
    t = check_tensor(name, p)
    if not t.is_floating_point():
        raise ArgumentTypeError(f"{name} must have a floating dtype, got {t.dtype}")
    if t.dim() not in (2, 3) or (t.dim() == 3 and t.shape[0] not in (1, h_kv)):
        raise ArgumentError(
            f"{name} must have shape (k, n) or (H_kv, k, n) = (H_kv={h_kv}, k, n), got "
            f"{shape_str(t.shape)}"
        )
    if t.shape[-1] < t_k:
        raise ArgumentError(
            f"{name} projects sequences of at most n = {t.shape[-1]} positions (its last dim), "
            f"got T_k = {t_k} keys"
        )
    return t


# ----------------------------------------------------------------------------------------- layer


class LinformerAttention(MultiHeadAttention):
    """Multi-head Linformer attention (Wang et al. 2020): keys and values projected along the
    sequence axis to ``k`` rows by learned ``E`` and ``F``.

    The query/key/value and output projections, their names (``in_proj_weight``, ``out_proj``),
    grouped-query heads, the head mask and the hook points are those of
    :class:`~attnlab.nn.multihead.MultiHeadAttention`; ``hook_k`` and ``hook_v`` see the keys
    and values *before* the sequence projection, ``hook_weights`` the ``T_q × k`` weights.

    Args:
        d_model: model width; must be divisible by ``num_heads``.
        num_heads: query heads ``H``.
        k: the projected length (rows of ``E`` and ``F``).
        max_len: the longest key sequence ``n`` (columns of ``E`` and ``F``); shorter sequences
            use the first ``T_k`` columns.
        sharing: ``"headwise"`` (default: one ``E`` and one ``F`` for all heads), ``"key-value"``
            (one ``E = F``) or ``"none"`` (``E_i``, ``F_i`` per key/value head), as in §4.
        num_kv_heads: key/value heads ``H_kv`` (default ``num_heads``).
        dropout: dropout on the ``T_q × k`` attention weights while training. Default ``0.0``.
        bias: whether the projections ``W^Q``, ``W^K``, ``W^V``, ``W^O`` have biases. Default ``True``.
        backend: the softmax-attention backend over the projected keys, see
            :func:`attnlab.scaled_dot_product_attention`. Default ``"auto"``.
        device: where to create the parameters; default the current default device.
        dtype: dtype of the parameters; default the current default dtype.

    ``E`` and ``F`` are the parameters ``proj_e`` and ``proj_f`` (``proj_f`` is ``None`` with
    key-value sharing), initialised as :func:`random_projection` (entries ``N(0, 1/k)``).

    Shape:
        - query ``(B, T_q, d_model)``; key/value ``(B, T_k, d_model)``, ``T_k <= max_len``
        - mask broadcastable to ``(B, H, 1, T_k)`` (keys only), ``True = may attend``
        - proj_e, proj_f ``(k, max_len)``, or ``(H_kv, k, max_len)`` with ``sharing="none"``
        - output ``(B, T_q, d_model)``; weights ``(B, H, T_q, k)``

    Examples:
        >>> layer = LinformerAttention(64, num_heads=4, k=16, max_len=128)
        >>> layer(torch.randn(2, 100, 64)).shape
        torch.Size([2, 100, 64])
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        k: int,
        max_len: int,
        sharing: Sharing = "headwise",
        num_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        backend: Backend = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            d_model,
            num_heads,
            num_kv_heads=num_kv_heads,
            dropout=dropout,
            bias=bias,
            backend=backend,
            device=device,
            dtype=dtype,
        )
        self.k = check_positive_int("k", k)
        self.max_len = check_positive_int("max_len", max_len)
        self.sharing: Sharing = check_choice("sharing", sharing, SHARING)  # type: ignore[assignment]
        shape = (k, max_len) if sharing != "none" else (self.num_kv_heads, k, max_len)
        self.proj_e = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        self.proj_f = (
            None
            if sharing == "key-value"
            else nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        )
        self.reset_projections()

    def reset_projections(self, generator: torch.Generator | None = None) -> None:
        """Draw ``E`` and ``F`` afresh, entries ``N(0, 1/k)`` (:func:`random_projection`).

        Args:
            generator: the random generator; default the global one.
        """
        with torch.no_grad():
            for p in (self.proj_e, self.proj_f):
                if p is not None:
                    p.normal_(0.0, self.k**-0.5, generator=generator)

    def projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(E, F)``; ``F`` is ``E`` with key-value sharing.

        Returns:
            The key and value projections.

        Shape:
            ``(k, max_len)`` each, or ``(H_kv, k, max_len)`` with ``sharing="none"``.
        """
        return self.proj_e, self.proj_e if self.proj_f is None else self.proj_f

    def check_call(self, call: AttentionCall) -> None:
        """Refuse what Linformer cannot do: causal attention, a KV cache (every key enters every
        projected row), rotary positions, a window or a block layout.

        Args:
            call: the call's options.

        Raises:
            ValueError: one of them was asked for.
        """
        if call.is_causal:
            raise ArgumentError(
                "is_causal=True is not supported by LinformerAttention: each projected key mixes "
                "every position, future ones included, so the method cannot be causal"
            )
        if call.cache is not None:
            raise ArgumentError("cache must be None: LinformerAttention has no KV cache")
        call.refuse("LinformerAttention", "positions", "window", "block_mask")

    def attend_heads(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        call: AttentionCall,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Softmax attention over the ``k`` projected keys and values,
        ``softmax(Q (E K)ᵀ / √d_head) (F V)`` (:func:`linformer_attention`).

        ``hook_k``/``hook_v`` see the keys and values before the sequence projection; the mask
        (``call.mask``) must hide keys only (broadcastable to ``(B, H, 1, T_k)``, e.g. a padding
        mask): hidden keys and values are zeroed before the projection.

        Args:
            q: queries ``(B, H, T_q, d_head)``.
            k: keys ``(B, H_kv, T_k, d_head)``, ``T_k <= max_len``.
            v: values, likewise.
            call: the call's options.

        Returns:
            ``z``, or ``(z, weights)`` with the weights over the projected keys ``(B, H, T_q, k)``.

        Raises:
            ValueError: ``T_k > max_len``, or a causal or per-query mask.

        Shape:
            q ``(B, H, T_q, d_head)``; k, v ``(B, H_kv, T_k, d_head)``; z ``(B, H, T_q, d_head)``.
        """
        if k is None or v is None:  # unreachable: no cache, so every call projects K and V
            raise RuntimeError("keys and values were not projected")
        k, v = self.hook_k(k), self.hook_v(v)
        t_k = k.shape[-2]
        if t_k > self.max_len:
            raise ArgumentError(
                f"key has T_k = {t_k} positions but the layer projects at most max_len = "
                f"{self.max_len}"
            )
        e, f = self.projections()
        # K̄ = E K, V̄ = F V (hidden keys zeroed first)                         (B, H_kv, k, d_head)
        k_bar, v_bar = project_keys_values(q, k, v, e, f, mask=call.mask)
        # an observer (a hook on hook_weights) must not change what forward computes: the kernel
        # is the one "auto" picks for the caller's need_weights (after the projection nothing is
        # masked: hidden keys were zeroed), and it returns exact weights as well
        nothing = Masking(None, None, None)
        backend = choose_backend(self.backend, call.need_weights, nothing)
        # softmax(Q K̄ᵀ / √d_head) V̄                                          (B, H, T_q, d_head)
        result = scaled_dot_product_attention(
            q,
            k_bar,
            v_bar,
            scale=self.d_head**-0.5,
            dropout_p=self.dropout if self.training else 0.0,
            backend=backend,  # type: ignore[arg-type]
            need_weights=call.need_weights or self.hook_weights.active,  # type: ignore[call-overload]
        )
        if self.hook_call.active:
            e_h, f_h = self.head_projections(t_k)
            hidden = key_mask(call.mask, q.shape[0], self.num_heads, t_k, "Linformer attention")
            # V as the projection saw it (hidden positions zeroed): v_bar = F · token_values
            tokens = v if hidden is None else v.masked_fill(~hidden[..., None], 0.0)
            self.emit_call(
                call, q, k_bar, v_bar, nothing, result, method="linformer",
                key_projection=e_h, value_projection=f_h, key_mask=hidden, token_values=tokens,
            )  # fmt: skip
        return result

    def head_projections(self, t_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``E`` and ``F`` of each query head, cut to the ``T_k`` keys of a call: what
        :class:`~attnlab.nn.resolved_call.ResolvedCall` carries as ``key_projection`` and
        ``value_projection`` (shared or per-key/value-head projections repeated to the heads).

        Args:
            t_k: the call's key length ``T_k <= max_len``.

        Returns:
            ``(E, F)`` per query head (detached).

        Shape:
            ``(H, k, T_k)`` each.
        """
        heads, group = self.num_heads, self.num_heads // self.num_kv_heads

        def per_head(p: torch.Tensor) -> torch.Tensor:
            p = p[..., :t_k].detach()
            if p.dim() == 2:  # one projection for every head               (k, T_k)
                return p.expand(heads, *p.shape).contiguous()
            return p.repeat_interleave(group, dim=0)  # one per key/value head → (H, k, T_k)

        e, f = self.projections()
        return per_head(e), per_head(f)

    def new_cache(self, batch: int, capacity: int, **kwargs: Any) -> LayerCache:
        """Linformer keeps no cache: every key enters every projected row.

        Args:
            batch: ``B``.
            capacity: positions.
            **kwargs: as :meth:`MultiHeadAttention.new_cache`.

        Returns:
            Never: it raises.

        Raises:
            ValueError: always.
        """
        raise ArgumentError(
            "LinformerAttention has no decoding cache: it cannot be causal (use it in an encoder)"
        )
