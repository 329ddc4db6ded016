"""What one attention call computed with: the layer's resolved call (:class:`ResolvedCall`).

Every attention layer emits, through its ``hook_call`` hook point, the call it actually ran —
the queries and keys as the scores saw them (projected, rotated, the KV cache included), the
values, the mask in its normalised form (:class:`~attnlab.nn.mask_spec.Masking`: the causal
rule, the sliding window and the block layout kept as structure), the score scale, the
grouped-query mapping and, where the call computed them, the weights and the per-head outputs.
Inspection reads this object; it never parses a layer's forward arguments or re-derives what the
layer would have done (``plot steps``, capture's statistics, ablation's traces, the viewer).

Nothing is built unless something listens (``layer.hook_call.active``), so a model that is not
inspected pays one attribute check per call.

Kinds that are not softmax over the keys say what their fields mean (``method``):

* ``"softmax"``: ``A = softmax(q kᵀ · scale + bias, hidden → −∞)``, ``z = A v``;
* ``"linformer"``: ``k`` and ``v`` are the *projected* keys and values ``E K`` and ``F V``
  (``k`` rows, Wang et al. 2020); the weights are over those rows, and ``key_projection``,
  ``value_projection`` hold ``E`` and ``F`` (cut to ``T_k`` columns, one per query head), and
  ``token_values`` the values ``V`` before the projection, so that ``z = A (F V) = (A F) V``;
* ``"favor"``: Performer's FAVOR+ (Choromanski et al. 2021): ``q_features`` and ``k_features``
  are ``φ(q)`` and ``φ(k)``; the implied weights are ``D⁻¹ φ(q) φ(k)ᵀ``, i.e. the softmax of
  ``log φ(q) φ(k)ᵀ`` over the visible keys (:meth:`ResolvedCall.scores`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from attnlab.errors import ArgumentError
from attnlab.nn.mask_spec import Masking

if TYPE_CHECKING:
    from attnlab.nn.multihead import MultiHeadAttention
    from attnlab.nn.multihead_call import AttentionCall

__all__ = ["ResolvedCall"]

Method = Literal["softmax", "linformer", "favor"]


@dataclass(frozen=True, eq=False)
class ResolvedCall:
    """One attention call as the layer ran it (emitted through ``hook_call``).

    Attributes:
        query_input: the layer's query input ``x`` (before the projections).
        key_input: the key/value input of a cross-attention call (the encoder memory); ``None``
            for self-attention.
        q: the queries as the scores saw them (heads split, rotated).
        k: the keys as the scores saw them: the KV cache's past keys and the new ones, rotated
            (a sink cache's by their places in the cache); Linformer's projected keys ``E K``.
        v: the values the weights multiply (Linformer's ``F V``).
        masking: the normalised mask over ``T_q × T_k`` (the causal rule, the window and the
            block layout as structure; padding and biases as tensors).
        scale: the score scale (``1 / √d_head``).
        num_heads: query heads ``H``.
        num_kv_heads: key/value heads ``H_kv`` (query head ``h`` reads ``h // (H // H_kv)``).
        cross: cross-attention.
        past: positions the cache held before this call (``0`` without a cache).
        method: ``"softmax"``, ``"linformer"`` or ``"favor"`` (see the module docstring).
        weights: the attention weights the call computed (before dropout and the head mask),
            or ``None`` when no one asked for them (``need_weights`` or a hook on
            ``hook_weights``).
        output: the per-head outputs ``z`` (before the head mask and ``W^O``).
        key_projection: Linformer's ``E`` per query head, else ``None``.
        value_projection: Linformer's ``F`` per query head, else ``None``.
        key_mask: Linformer's key mask as the projection applied it (hidden keys and values
            were zeroed before ``E K``, ``F V``), or ``None`` (no mask, or another method).
        token_values: Linformer's values ``V`` as the projection saw them (hidden positions
            zeroed), one row per key token, else ``None``: ``v`` is ``F`` times them.
        q_features: FAVOR+'s ``φ(q)``, else ``None``.
        k_features: FAVOR+'s ``φ(k)``, else ``None``.

    Shape:
        query_input ``(B, T_q, d_model)``; key_input ``(B, T_k, d_model)``; q
        ``(B, H, T_q, d_head)``; k ``(B, H_kv, T_k, d_head)``; v ``(B, H_kv, T_k, d_v)``
        (Linformer: ``(B, H_kv, k, ·)``); weights ``(B, H, T_q, T_k)``; output
        ``(B, H, T_q, d_v)``; key/value projections ``(H, k, T_k)``; key_mask
        ``(B or 1, H or 1, T_k)``; features ``(B, H, T, m)``; token_values
        ``(B, H_kv, T_k, d_v)``.
    """

    query_input: torch.Tensor
    key_input: torch.Tensor | None
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    masking: Masking
    scale: float
    num_heads: int
    num_kv_heads: int
    cross: bool
    past: int = 0
    method: Method = "softmax"
    weights: torch.Tensor | None = None
    output: torch.Tensor | None = None
    key_projection: torch.Tensor | None = None
    value_projection: torch.Tensor | None = None
    key_mask: torch.Tensor | None = None
    q_features: torch.Tensor | None = None
    k_features: torch.Tensor | None = None
    token_values: torch.Tensor | None = None

    @classmethod
    def of(
        cls,
        layer: MultiHeadAttention,
        call: AttentionCall,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        masking: Masking,
        result: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        **fields: Any,
    ) -> ResolvedCall:
        """The resolved call of one run of ``layer`` (:meth:`MultiHeadAttention.emit_call
        <attnlab.nn.multihead.MultiHeadAttention.emit_call>`).

        Args:
            layer: the attention layer that ran.
            call: the call's options (its ``query``/``memory`` inputs included).
            q: the queries as scored.
            k: the keys as scored (cache included, rotated).
            v: the values.
            masking: the normalised mask.
            result: what the kernel returned, ``z`` or ``(z, weights)``.
            **fields: further fields (``method``, Linformer's projections, FAVOR+'s features).

        Returns:
            The resolved call.

        Shape:
            q ``(B, H, T_q, d_head)``; k, v ``(B, H_kv, T_k, d_head)``.
        """
        z, weights = result if isinstance(result, tuple) else (result, None)
        cache = call.cache
        past = 0 if cache is None or call.cross else int(getattr(cache, "length", 0)) - q.shape[-2]
        return cls(
            query_input=call.query if call.query is not None else q.new_empty(0),
            key_input=call.memory,
            q=q,
            k=k,
            v=v,
            masking=masking,
            scale=layer.score_scale,
            num_heads=layer.num_heads,
            num_kv_heads=layer.num_kv_heads,
            cross=call.cross,
            past=max(past, 0),
            weights=weights,
            output=z,
            **fields,
        )

    @property
    def group(self) -> int:
        """Query heads per key/value head, ``H // H_kv``."""
        return self.num_heads // self.num_kv_heads

    def kv_head(self, head: int) -> int:
        """The key/value head query head ``head`` reads.

        Args:
            head: a query head in ``[0, H)``.

        Returns:
            ``head // (H // H_kv)``.

        Raises:
            ValueError: ``head`` out of range.
        """
        if not 0 <= head < self.num_heads:
            raise ArgumentError(f"head must be in [0, {self.num_heads}), got {head}")
        return head // self.group

    def visible(self) -> torch.Tensor:
        """The keys each query may see (mask, causal rule, window and layout together).

        Returns:
            Boolean, ``True = may attend``, expanded to every batch row and query head.

        Shape:
            ``(B, H, T_q, T_k)``.
        """
        b, h, t_q, _ = self.q.shape
        t_k = self.k.shape[-2]
        vis = self.masking.visible(t_q, t_k, self.q.device)
        if vis is None:
            return torch.ones(b, h, t_q, t_k, dtype=torch.bool, device=self.q.device)
        return vis.expand(b, h, t_q, t_k)

    def scores(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The scores whose softmax over the visible keys is the call's weights.

        ``"softmax"`` and ``"linformer"``: ``S = q kᵀ · scale + bias`` (the additive mask as the
        backend added it, each row's ``shift`` restored so a user's bias reads as given);
        ``"favor"``: ``S = log φ(q) φ(k)ᵀ``, whose softmax is FAVOR+'s ``D⁻¹ φ(q) φ(k)ᵀ``.
        Hidden entries are ``−∞`` (:meth:`visible`).

        Args:
            dtype: computed in this dtype (default float64, for figures and references).

        Returns:
            The scores, every query head (grouped keys repeated).

        Shape:
            ``(B, H, T_q, T_k)``.
        """
        from attnlab.nn.backends.math import attention_scores

        if self.method == "favor":
            if self.q_features is None or self.k_features is None:
                raise ArgumentError("a FAVOR+ call carries no features to score")
            qf, kf = self.q_features.to(dtype), self.k_features.to(dtype)
            kf = kf.repeat_interleave(qf.shape[1] // kf.shape[1], dim=1)
            kernel = qf @ kf.transpose(-2, -1)  # φ(q) φ(k)ᵀ > 0             (B, H, T_q, T_k)
            return kernel.log().masked_fill(~self.visible(), float("-inf"))
        masking = self.masking
        if masking.bias is not None and masking.shift is not None:
            bias = masking.bias.to(dtype) + masking.shift.to(dtype)
            masking = dataclasses.replace(masking, bias=bias, shift=None)
        s = attention_scores(self.q, self.k, masking, self.scale, dtype=dtype)
        return s.expand(self.visible().shape)
