"""Performer: softmax attention through positive orthogonal random features, FAVOR+
(Choromanski et al. 2021, "Rethinking Attention with Performers").

The softmax kernel is an expectation over Gaussian directions ``ω ~ N(0, I_d)`` (Lemma 1):

    exp(xᵀy) = E_ω[ exp(ωᵀx − ‖x‖²/2) · exp(ωᵀy − ‖y‖²/2) ]

so with ``m`` samples ``ω_1 … ω_m`` (the rows of ``W``) and the positive feature map

    φ(x) = exp(W x − ‖x‖²/2) / √m                                        (§2.3, eq. 7)

``exp(qᵀk) ≈ φ(q)ᵀ φ(k)``, and attention becomes linear in the sequence length (§2.2):

    Att(Q, K, V) ≈ D⁻¹ (φ(Q) (φ(K)ᵀ V)),   D = diag(φ(Q) (φ(K)ᵀ 1_T))          bidirectional
    out_i = φ(q_i)ᵀ S_i / φ(q_i)ᵀ z_i,  S_i = Σ_{j ≤ i} φ(k_j) v_jᵀ,  z_i = Σ_{j ≤ i} φ(k_j)   causal

(prefix sums, §2.6; computed chunk by chunk, memory ``O(m · d + C · (m + C))`` for ``C``
queries a chunk). The score scale ``1/√d`` enters as
``q, k ← q / d^{1/4}, k / d^{1/4}``. The ``ω`` are drawn in blocks of ``d`` exactly orthogonal
directions (§2.4), each row rescaled to the length of an independent Gaussian vector (a chi
distribution with ``d`` degrees of freedom), which keeps the estimate unbiased and lowers its
variance (:func:`orthogonal_random_features`).

Numerical stabilisation (as the paper's code does): a constant subtracted inside ``exp`` cancels
between the numerator and ``D``: the maximum over each query's features for ``φ(Q)``, and one
maximum over all (visible) keys and features, per batch and head, for ``φ(K)``. Unlike the
paper's code no ``ε`` is added to the features, so the estimate stays unbiased.

Masks: only keys can be masked (a padding mask, ``(B, 1, 1, T_k)``): a masked key gets
``φ(k) = 0`` and a zeroed value, so it contributes nothing, whatever it holds. A query that sees
no key gets a zero output row.

Decoding: causal linear attention is a recurrent network (Katharopoulos et al. 2020, §3.4),
``S_t = S_{t−1} + φ(k_t) v_tᵀ``, ``z_t = z_{t−1} + φ(k_t)``, ``o_t = φ(q_t)ᵀ S_t / φ(q_t)ᵀ z_t``,
so a causal layer given a :class:`~attnlab.nn.kv_cache.PerformerState` (``favor_attention(...,
state=)``, ``PerformerAttention.forward(cache=)``) continues from the sums of the keys before and
adds the new ones: ``O(m · D_v)`` memory and work per token instead of the whole prefix again. The
one maximum over all keys of the stabiliser is unknown while decoding; the state keeps a running
maximum and rescales its sums when it grows (:meth:`PerformerState.append
<attnlab.nn.kv_cache.PerformerState.append>`), which gives the same outputs up to rounding.
"""

from __future__ import annotations

import math

import torch

from attnlab._budget import check_fits
from attnlab._checks import check_positive_int, check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.nn.approximation import key_mask
from attnlab.nn.backends.common import repeat_kv
from attnlab.nn.kv_cache import PerformerState
from attnlab.nn.mask_spec import Masking
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.multihead_call import AttentionCall
from attnlab.nn.nonfinite import guard_nonfinite, poison_rows
from attnlab.nn.random_features import (
    _exponents,
    _kept_keys,
    _phi,
    favor_features,
    orthogonal_random_features,
    softmax_features,
)

__all__ = [
    "PerformerAttention",
    "favor_attention",
    "favor_features",
    "orthogonal_random_features",
    "softmax_features",
]


def favor_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    features: torch.Tensor,
    is_causal: bool = False,
    *,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    need_weights: bool = False,
    chunk_size: int = 128,
    state: PerformerState | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FAVOR+ attention: ``D⁻¹ φ(Q) (φ(K)ᵀ V)`` with positive random features
    (Choromanski et al. 2021, §2.2–2.6), bidirectional or causal by prefix sums.

    Causal masking is bottom-right (query ``i`` sees keys ``j <= i + T_k − T_q``), as everywhere
    in attnlab. The causal form runs the prefix sums chunk by chunk: a running state
    ``S = Σ φ(k_j) v_jᵀ``, ``z = Σ φ(k_j)`` over the keys every query of a chunk sees, plus the
    masked ``C × C`` products of the chunk's own keys — memory ``O(m · D_v + C · (m + C))``
    instead of the ``O(T · m · D_v)`` of a cumulative sum, the same numbers.

    With a ``state`` (decoding) the keys before were absorbed into it: ``q``, ``k`` and ``v``
    are the ``T`` new positions (``T_q = T_k``), each query sees the state and the new keys up to
    its own, and the state absorbs the new keys (Katharopoulos et al. 2020, §3.4):

        o_i = φ(q_i)ᵀ (S_past + Σ_{j ≤ i} φ(k_j) v_jᵀ) / φ(q_i)ᵀ (z_past + Σ_{j ≤ i} φ(k_j))

    ``O(T · m · D_v)`` work, whatever the number of positions before.

    Args:
        q: queries ``(..., H, T_q, D)``.
        k: keys ``(..., H_kv, T_k, D)``; ``H`` must be a multiple of ``H_kv``.
        v: values ``(..., H_kv, T_k, D_v)``.
        features: ``W`` ``(m, D)`` from :func:`orthogonal_random_features`.
        is_causal: query ``i`` attends only to keys ``j <= i + T_k − T_q``. Default ``False``.
        mask: boolean key mask, ``True = may attend``, broadcastable to ``(..., H, 1, T_k)``
            (padding); per-query masks are refused.
        scale: the score scale; default ``1 / √D``.
        need_weights: also return the implied weights ``D⁻¹ φ(Q) φ(K)ᵀ`` (forms ``T_q × T_k``).
        chunk_size: queries per chunk ``C`` of the causal form. Default 128.
        state: a :class:`~attnlab.nn.kv_cache.PerformerState` holding the sums of the keys
            before (causal only; 4-D inputs, ``T_q = T_k``; ``mask`` then covers the new keys
            only and must be the same for the heads of a group), updated in place; ``None``
            (default): no keys before.

    Returns:
        The output ``(..., H, T_q, D_v)``, or ``(output, weights)`` with ``need_weights``.

    Raises:
        TypeError: non-tensor or non-floating inputs, a non-boolean mask.
        ValueError: mismatched shapes or head counts, features of the wrong width, a per-query
            mask; with a ``state``: not causal, ``need_weights``, ``T_q != T_k``, or a state of
            other shapes.

    Shape:
        - q ``(B, H, T_q, D)``; k ``(B, H_kv, T_k, D)``; v ``(B, H_kv, T_k, D_v)``
        - features ``(m, D)``; mask broadcastable to ``(B, H, 1, T_k)``
        - state: ``s`` ``(B, H_kv, m, D_v)``, ``z`` ``(B, H_kv, m)``
        - output ``(B, H, T_q, D_v)``; weights ``(B, H, T_q, T_k)``

    Examples:
        >>> q = k = v = torch.randn(2, 4, 50, 16)
        >>> w = orthogonal_random_features(64, 16)
        >>> favor_attention(q, k, v, w, is_causal=True).shape
        torch.Size([2, 4, 50, 16])
    """
    for name, x in (("q", q), ("k", k), ("v", v), ("features", features)):
        t = check_tensor(name, x)
        if not t.is_floating_point():
            raise ArgumentTypeError(f"{name} must have a floating dtype, got {t.dtype}")
    if q.dim() < 3 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ArgumentError(
            f"q, k and v must have shape (..., H, T, D) with the same number of dims, got "
            f"{shape_str(q.shape)}, {shape_str(k.shape)} and {shape_str(v.shape)}"
        )
    if k.shape[:-1] != v.shape[:-1] or k.shape[-1] != q.shape[-1]:
        raise ArgumentError(
            f"k must be (..., H_kv, T_k, D) with the D of q and v (..., H_kv, T_k, D_v), got "
            f"q {shape_str(q.shape)}, k {shape_str(k.shape)}, v {shape_str(v.shape)}"
        )
    h, h_kv = q.shape[-3], k.shape[-3]
    if h_kv == 0 or h % h_kv != 0:
        raise ArgumentError(f"q's heads H = {h} must be a multiple of k's H_kv = {h_kv}")
    if features.dim() != 2 or features.shape[-1] != q.shape[-1]:
        raise ArgumentError(
            f"features must have shape (m, D) = (m, {q.shape[-1]}), got {shape_str(features.shape)}"
        )
    t_q, t_k = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if state is not None:
        chunk = check_positive_int("chunk_size", chunk_size)
        return _favor_recurrent(
            q, k, v, features, is_causal, mask, scale, need_weights, chunk, state
        )
    k, v = repeat_kv(k, h // h_kv), repeat_kv(v, h // h_kv)  # (..., H, T_k, D)
    keep = _kept_keys(q, k, mask)
    if keep is not None:
        v = v.masked_fill(~keep[..., None], 0.0)  # NaN in padding never reaches the output
    # NaN/inf reach exactly the rows that may see them (a future key's inf would make the keys'
    # stabiliser inf; a hidden value's inf, 0 · inf = NaN in the chunk products): finite inputs
    allowed, offset = None if keep is None else keep.unsqueeze(-2), t_k - t_q if is_causal else None
    q, k, v, reach = guard_nonfinite(q, k, v, Masking(allowed, None, offset))
    phi_q, phi_k = _phi(q, k, features, scale, keep)  # (..., H, T_q | T_k, m)

    if not is_causal:
        kv = phi_k.transpose(-2, -1) @ v  # φ(K)ᵀ V                              (..., H, m, D_v)
        num = phi_q @ kv  # φ(Q) (φ(K)ᵀ V)                                       (..., H, T_q, D_v)
        den = phi_q @ phi_k.sum(-2)[..., None]  # φ(Q) (φ(K)ᵀ 1)                 (..., H, T_q, 1)
    else:
        num, den = _causal_prefix(phi_q, phi_k, v, check_positive_int("chunk_size", chunk_size))
    # a query that sees no key has num = 0 and den = 0: output 0, never NaN
    tiny = torch.finfo(den.dtype).tiny
    out = poison_rows(num / den.clamp_min(tiny), reach)
    if not need_weights:
        return out
    a = phi_q @ phi_k.transpose(-2, -1)  # φ(Q) φ(K)ᵀ                             (..., H, T_q, T_k)
    if is_causal:
        a = a.masked_fill(~_causal(t_q, t_k, q.device), 0.0)
    weights = poison_rows(a / a.sum(-1, keepdim=True).clamp_min(tiny), reach)
    return out, weights


def _favor_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    features: torch.Tensor,
    is_causal: bool,
    mask: torch.Tensor | None,
    scale: float,
    need_weights: bool,
    chunk: int,
    state: PerformerState,
) -> torch.Tensor:
    """Causal FAVOR+ continued from ``state`` (the keys before), which absorbs the new keys.

    Grouped-query heads share one state per key/value head: the ``G = H / H_kv`` query heads of a
    group are read against it together, ``φ(Q)`` viewed ``(B, H_kv, G, T, m)``.
    """
    if not is_causal:
        raise ArgumentError(
            "is_causal must be True with a PerformerState: its running sums serve causal "
            "attention only (each query sees the keys before it)"
        )
    if need_weights:
        raise ArgumentError(
            "need_weights is not available with a PerformerState: it keeps no keys to weigh; "
            "run the whole sequence without a cache to see the weights"
        )
    if q.dim() != 4:
        raise ArgumentError(
            f"q must have shape (B, H, T, D) with a PerformerState, got {shape_str(q.shape)}"
        )
    b, h, t, _ = q.shape
    h_kv, t_k, d_v = k.shape[1], k.shape[2], v.shape[3]
    if t_k != t:
        raise ArgumentError(
            f"with a PerformerState q, k and v are the same new positions: T_q = {t} but "
            f"T_k = {t_k}"
        )
    m = features.shape[0]
    if (state.batch, state.num_kv_heads, state.num_features, state.s.shape[3]) != (
        b, h_kv, m, d_v,
    ):  # fmt: skip
        raise ArgumentError(
            f"state holds (B, H_kv, m, D_v) = {shape_str(tuple(state.s.shape))} but the inputs "
            f"have {shape_str((b, h_kv, m, d_v))}"
        )
    keep = key_mask(mask, b, h, t, "FAVOR+ attention")  # (B or 1, H or 1, T)
    if keep is not None and keep.shape[1] not in (1, h_kv):
        raise ArgumentError(
            f"mask has {keep.shape[1]} heads but with a PerformerState the query heads of a "
            f"group share one state: it must have 1 or H_kv = {h_kv} heads"
        )
    # the sums keep their own dtype (float32 or wider); compute in the wider of the two
    out_dtype, dt = q.dtype, torch.promote_types(q.dtype, state.dtype)
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    if keep is not None:
        v = v.masked_fill(~keep[..., None], 0.0)  # NaN in padding never reaches the state
    # l_j = ωᵀk'_j − ‖k'_j‖²/2, −∞ at masked keys; the state moves its stabiliser to the
    # largest exponent so far and rescales S, z (PerformerState.append)
    logits = _exponents(k, features, scale, keep)  # (B, H_kv, T, m)
    phi_k, s_past, z_past = state.append(logits, v)  # (B, H_kv, T, m), (B, H_kv, m, D_v), (…, m)
    phi_q = softmax_features(q, features, scale=scale, stabilize="row")  # (B, H, T, m)
    phi_q = phi_q.view(b, h_kv, h // h_kv, t, m)  # the query heads of a group  (B, H_kv, G, T, m)
    if t == 1:  # one new token (a decoding step): it sees the state after its own key
        # φ(q)ᵀ S̃', φ(q)ᵀ z̃'                                          (B, H_kv, G, 1, D_v | 1)
        num = phi_q @ state.s.to(dt)[:, :, None]
        den = phi_q @ state.z.to(dt)[:, :, None, :, None]
    else:
        # φ(q_i)ᵀ (S_past + Σ_{j ≤ i} φ(k_j) v_jᵀ) and φ(q_i)ᵀ (z_past + Σ_{j ≤ i} φ(k_j))
        num, den = _causal_prefix(
            phi_q, phi_k[:, :, None], v[:, :, None], chunk,
            s_past[:, :, None], z_past[:, :, None, :, None],
        )  # fmt: skip
    out = num / den.clamp_min(torch.finfo(den.dtype).tiny)  # (B, H_kv, G, T, D_v)
    return out.reshape(b, h, t, d_v).to(out_dtype)


def _causal_prefix(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    chunk: int,
    s0: torch.Tensor | None = None,
    z0: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal ``φ(q_i)ᵀ S_i`` and ``φ(q_i)ᵀ z_i`` by chunks of queries (bottom-right).

    Chunk ``c`` (queries ``[i_c, i_c + C)``) sees every key before ``b_c = i_c + T_k − T_q + 1``
    through the running state ``S = Σ φ(k_j) v_jᵀ``, ``z = Σ φ(k_j)``, and its own keys
    ``[b_c, b_{c+1})`` through a masked ``C × n`` product. The inputs are split once
    (``torch.split``), so the backward pass is one concatenation, linear in ``T``: slicing them
    chunk by chunk made autograd write a full-size gradient per chunk, ``O(T²)``. ``s0``
    ``(..., m, D_v)`` and ``z0`` ``(..., m, 1)``, when given, are sums of earlier keys every
    query sees (a decoding state).
    """
    t_q, t_k = phi_q.shape[-2], phi_k.shape[-2]
    off = t_k - t_q
    starts = list(range(0, t_q, chunk))
    bounds = [min(max(i0 + off + 1, 0), t_k) for i0 in starts] + [t_k]
    sizes = [bounds[0]] + [bounds[c + 1] - bounds[c] for c in range(len(starts))]
    k_parts, v_parts = phi_k.split(sizes, dim=-2), v.split(sizes, dim=-2)
    pk = k_parts[0].transpose(-2, -1)  # keys every query sees                     (..., H, m, n)
    s = pk @ v_parts[0]  # S = Σ φ(k_j) v_jᵀ                                     (..., H, m, D_v)
    z = pk.sum(-1, keepdim=True)  # z = Σ φ(k_j)                                   (..., H, m, 1)
    if s0 is not None and z0 is not None:  # the keys before (a decoding state)
        s, z = s0 + s, z0 + z
    nums, dens = [], []
    for c, pq in enumerate(phi_q.split(chunk, dim=-2)):  # (..., H, C, m)
        kc, vc = k_parts[c + 1], v_parts[c + 1]
        num, den = pq @ s, pq @ z  # (..., H, C, D_v), (..., H, C, 1)
        if kc.shape[-2]:
            a = pq @ kc.transpose(-2, -1)  # the chunk's own keys, seen in part      (..., H, C, n)
            i = torch.arange(starts[c], starts[c] + pq.shape[-2], device=a.device)[:, None]
            j = torch.arange(bounds[c], bounds[c + 1], device=a.device)[None, :]
            a = a * (j <= i + off).to(a.dtype)
            num = num + a @ vc
            den = den + a.sum(-1, keepdim=True)
            if c + 1 < len(starts):  # the chunk's keys join the state of the chunks after it
                pk = kc.transpose(-2, -1)
                s = s + pk @ vc
                z = z + pk.sum(-1, keepdim=True)
        nums.append(num)
        dens.append(den)
    return torch.cat(nums, dim=-2), torch.cat(dens, dim=-2)


def _causal(t_q: int, t_k: int, device: torch.device) -> torch.Tensor:
    """Bottom-right causal visibility ``(T_q, T_k)``: key ``j`` visible from query ``i`` when
    ``j <= i + T_k − T_q``."""
    i = torch.arange(t_q, device=device)[:, None]
    j = torch.arange(t_k, device=device)[None, :]
    return j <= i + (t_k - t_q)


class PerformerAttention(MultiHeadAttention):
    """Multi-head Performer attention, FAVOR+ (Choromanski et al. 2021).

    The projections, their names (``in_proj_weight``, ``out_proj``), grouped-query heads, the head
    mask and the hook points are those of :class:`~attnlab.nn.multihead.MultiHeadAttention`;
    softmax attention is replaced by :func:`favor_attention` with ``m`` orthogonal random
    features ``W`` shared by every head (the buffer ``features``, saved with the weights).
    ``hook_weights`` (and ``need_weights``) give the implied weights ``D⁻¹ φ(Q) φ(K)ᵀ``,
    formed only when asked for.

    Causal self-attention decodes from a :class:`~attnlab.nn.kv_cache.PerformerState` passed as
    ``cache`` (the running sums ``S``, ``z`` of the keys so far: ``O(1)`` per token). A state is
    tied to the features it was filled with: ``forward`` never redraws them while given a cache,
    and refuses a state after a redraw.

    Args:
        d_model: model width; must be divisible by ``num_heads``.
        num_heads: query heads ``H``.
        num_features: random features ``m``; default ``round(d_head · ln d_head)`` (at least
            ``d_head``), the paper's choice.
        num_kv_heads: key/value heads ``H_kv`` (default ``num_heads``).
        dropout: while training, each key is dropped for every query with this probability and
            the kept ones scaled by ``1 / (1 − p)`` (dropout on the weights with one draw per
            key, which the linear form allows). Default ``0.0``.
        bias: whether the projections have biases. Default ``True``.
        redraw_interval: in training mode, draw new features every ``redraw_interval`` forward
            calls without a cache (§4.1's feature redrawing); ``None`` (default) never redraws
            by itself.
        causal: the default of ``forward``'s ``is_causal``. Default ``False``.
        device: where to create the parameters; default the current default device.
        dtype: dtype of the parameters; default the current default dtype.

    Shape:
        - query ``(B, T_q, d_model)``; key/value ``(B, T_k, d_model)``
        - mask broadcastable to ``(B, H, 1, T_k)`` (keys only), ``True = may attend``
        - features ``(m, d_head)``
        - output ``(B, T_q, d_model)``; weights ``(B, H, T_q, T_k)``

    Examples:
        >>> layer = PerformerAttention(64, num_heads=4, num_features=32)
        >>> layer(torch.randn(2, 100, 64), is_causal=True).shape
        torch.Size([2, 100, 64])
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        num_features: int | None = None,
        num_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        redraw_interval: int | None = None,
        causal: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            d_model,
            num_heads,
            num_kv_heads=num_kv_heads,
            dropout=dropout,
            bias=bias,
            device=device,
            dtype=dtype,
        )
        d = self.d_head
        self.num_features = (
            max(d, round(d * math.log(d)))
            if num_features is None
            else check_positive_int("num_features", num_features)
        )
        self.redraw_interval = (
            None
            if redraw_interval is None
            else check_positive_int("redraw_interval", redraw_interval)
        )
        if not isinstance(causal, bool):
            raise ArgumentTypeError(f"causal must be a bool, got {type(causal).__name__}")
        self.causal = causal
        m, what = self.num_features, "a Performer layer's random features (drawn in float64)"
        check_fits(f"num_features {m}", 8 * m * d, what=what, device=device)
        self.register_buffer(
            "features",
            orthogonal_random_features(self.num_features, d, dtype=dtype, device=device),
        )
        # forward calls in training mode since the last draw (saved: a resumed run keeps the rhythm)
        self.register_buffer("calls_since_redraw", torch.zeros((), dtype=torch.long, device=device))

    features: torch.Tensor
    calls_since_redraw: torch.Tensor

    @torch.no_grad()
    def redraw_features(self, generator: torch.Generator | None = None) -> None:
        """Draw new orthogonal random features ``W`` in place (§4.1: "feature redrawing").

        Args:
            generator: the random generator; default the global one.
        """
        w = orthogonal_random_features(
            self.num_features, self.d_head, generator=generator, dtype=self.features.dtype
        )
        self.features.copy_(w.to(self.features.device))
        self.calls_since_redraw.zero_()

    def check_call(self, call: AttentionCall) -> None:
        """Refuse what FAVOR+ cannot do here: rotary positions, a window, a block layout; a
        cache other than a :class:`~attnlab.nn.kv_cache.PerformerState`.

        Args:
            call: the call's options.

        Raises:
            ValueError: one of them was asked for.
        """
        call.refuse("PerformerAttention", "positions", "window", "block_mask")
        if call.cache is not None:
            self.check_cache(call.cache)

    def attend_heads(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        call: AttentionCall,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """FAVOR+ in place of softmax attention (:func:`favor_attention`).

        In training mode with a ``redraw_interval``, new features are drawn before every
        ``redraw_interval``-th call without a cache (a call with a cache neither redraws nor
        counts). The mask (``call.mask``) hides keys only, broadcastable to ``(B, H, 1, T_k)``.
        With a :class:`~attnlab.nn.kv_cache.PerformerState` (causal self-attention, decoding)
        the queries are the new positions only, the state supplies the keys before them and
        absorbs the new ones, and the mask covers the past and new keys
        ``(B, H, 1, T_past + T)``. Weights (``need_weights`` or a hook on ``hook_weights``) are
        the implied ``D⁻¹ φ(Q) φ(K)ᵀ``, not available with a state.

        Args:
            q: queries ``(B, H, T_q, d_head)``.
            k: keys ``(B, H_kv, T_k, d_head)``.
            v: values, likewise.
            call: the call's options.

        Returns:
            ``z``, or ``(z, weights)`` with the implied weights ``(B, H, T_q, T_k)``.

        Raises:
            ValueError: a per-query mask; with a state: cross-attention, ``is_causal=False``,
                weights asked for, or features redrawn since it was filled.

        Shape:
            q ``(B, H, T_q, d_head)``; k, v ``(B, H_kv, T_k, d_head)``; z ``(B, H, T_q, d_head)``.
        """
        if k is None or v is None:  # unreachable: a PerformerState is never static
            raise RuntimeError("keys and values were not projected")
        if call.cache is None and self.training and self.redraw_interval is not None:
            if int(self.calls_since_redraw) >= self.redraw_interval:
                self.redraw_features()
            self.calls_since_redraw += 1
        k, v = self.hook_k(k), self.hook_v(v)
        state, mask = None, call.mask
        if call.cache is not None:
            state, mask = self._check_state(call, q.shape[-2])
        if self.training and self.dropout > 0.0:
            # one draw per key, shared by every query: Σ_j a_ij (δ_j / (1 − p)) v_j
            keep = torch.full((*v.shape[:-1], 1), 1.0 - self.dropout, device=v.device)
            v = v * torch.bernoulli(keep).to(v.dtype) / (1.0 - self.dropout)
        result = favor_attention(
            q,
            k,
            v,
            self.features,
            call.is_causal,
            mask=mask,
            scale=self.d_head**-0.5,
            need_weights=call.need_weights or self.hook_weights.active,
            state=state,
        )
        if self.hook_call.active:
            self._emit_favor(call, q, k, v, mask, result)
        return result

    def _emit_favor(
        self,
        call: AttentionCall,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        result: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    ) -> None:
        """The resolved call of FAVOR+ (``method="favor"``): ``φ(q)``, ``φ(k)`` from
        :func:`favor_features`, the key mask and the causal rule as its masking. With a
        :class:`~attnlab.nn.kv_cache.PerformerState` its keys are the new ones only (the state
        holds the sums of the others)."""
        scale = self.d_head**-0.5
        phi_q, phi_k = favor_features(q, k, self.features, mask=mask, scale=scale)
        keep = _kept_keys(q, repeat_kv(k, self.num_heads // self.num_kv_heads), mask)
        t_q, t_k = q.shape[-2], k.shape[-2]
        masking = Masking(
            None if keep is None else keep.unsqueeze(-2),  # (B, H, 1, T_k)
            None,
            t_k - t_q if call.is_causal else None,
        )
        self.emit_call(
            call, q, k, v, masking, result, method="favor", q_features=phi_q, k_features=phi_k
        )

    def new_cache(
        self,
        batch: int,
        capacity: int,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> PerformerState:
        """FAVOR+'s running sums for causal decoding, in float32 at least (a running sum of
        many terms in a half type drifts): ``B · H_kv · (m · (d_head + 1) + 1)`` numbers
        whatever the length, ``O(1)`` per token.

        Args:
            batch: ``B``.
            capacity: the most positions decoded.
            dtype: the model's dtype (promoted to float32 at least); default the features'.
            device: default the features' device.

        Returns:
            An empty :class:`~attnlab.nn.kv_cache.PerformerState`.
        """
        dtype = self.features.dtype if dtype is None else dtype
        return PerformerState(
            batch,
            self.num_kv_heads,
            capacity,
            self.num_features,
            self.d_head,
            dtype=torch.promote_types(dtype, torch.float32),
            device=self.features.device if device is None else device,
        )

    def check_cache(self, cache: object) -> None:
        """Refuse a cache other than a :class:`~attnlab.nn.kv_cache.PerformerState`.

        Args:
            cache: what a caller passed as ``cache``.

        Raises:
            ValueError: a KV cache, or anything else.
        """
        if not isinstance(cache, PerformerState):
            raise ArgumentError(
                "cache must be None or a PerformerState (the running sums of causal FAVOR+; "
                f"see GPT.new_cache): FAVOR+ keeps no keys and values, got {type(cache).__name__}"
            )

    def _check_state(
        self, call: AttentionCall, t: int
    ) -> tuple[PerformerState, torch.Tensor | None]:
        """Check a decoding call with a :class:`PerformerState`; return it and the mask of the
        new keys (the state applied the past ones when it absorbed them)."""
        cache, mask = call.cache, call.mask
        self.check_cache(cache)
        if call.cross:
            raise ArgumentError(
                "key and value must be None with a PerformerState: it serves causal "
                "self-attention (decoding), not cross-attention"
            )
        if not call.is_causal:
            raise ArgumentError("is_causal must be True with a PerformerState (causal decoding)")
        if call.need_weights or self.hook_weights.active:
            raise ArgumentError(
                "attention weights (need_weights, or a hook on hook_weights) are not available "
                "with a PerformerState: it keeps no keys to weigh; run the sequence without a cache"
            )
        if (cache.num_kv_heads, cache.num_features) != (self.num_kv_heads, self.num_features):
            raise ArgumentError(
                f"cache holds H_kv = {cache.num_kv_heads} heads and m = {cache.num_features} "
                f"features but the layer has {self.num_kv_heads} and {self.num_features}"
            )
        cache.bind_features(self.features)
        if not isinstance(mask, torch.Tensor) or mask.dim() == 0:
            return cache, mask  # None, or what favor_attention refuses
        total = cache.length + t
        if mask.shape[-1] == total:
            return cache, mask[..., total - t :]  # (…, T): the new keys
        if mask.shape[-1] != 1:
            raise ArgumentError(
                f"mask has shape {shape_str(mask.shape)} but with a PerformerState it covers the "
                f"past and new keys: it must broadcast to (B, H, 1, T_past + T) = "
                f"{shape_str((cache.batch, self.num_heads, 1, total))}"
            )
        return cache, mask
