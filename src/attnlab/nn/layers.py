"""Transformer layers (Vaswani et al. 2017, §3.1 and §3.3): feed-forward, encoder and decoder layers.

Every sub-layer (self-attention, cross-attention, feed-forward) is wrapped in a residual
connection with layer normalisation, in one of two forms:

    post-norm (the paper, §3.1):  x ← LayerNorm(x + Dropout(Sublayer(x)))
    pre-norm  (Xiong et al. 2020): x ← x + Dropout(Sublayer(LayerNorm(x)))

Pre-norm stacks end with one more LayerNorm (built by the model, not the layer).

Hook points (:class:`~attnlab.nn.hooks.HookPoint`, TransformerLens names) see the residual
stream and what each sub-layer adds to it; attention weights are captured through each
:class:`~attnlab.nn.multihead.MultiHeadAttention`'s own ``hook_weights``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from attnlab._checks import check_choice, check_positive_int, check_probability
from attnlab.nn.hooks import HookPoint
from attnlab.nn.multihead import MultiHeadAttention

if TYPE_CHECKING:
    from attnlab.nn.attention import Backend
    from attnlab.nn.cache_policies import CrossKVCache
    from attnlab.nn.kv_cache import LayerCache

__all__ = ["ACTIVATIONS", "DecoderLayer", "EncoderLayer", "FeedForward", "residual"]

Activation = Literal["relu", "gelu", "silu"]
ACTIVATIONS: tuple[str, ...] = ("relu", "gelu", "silu")


def _attention(
    d_model: int, num_heads: int, num_kv_heads: int | None, dropout: float, backend: Backend
) -> MultiHeadAttention:
    """A layer's full multi-head attention (self-attention by default, cross-attention too)."""
    return MultiHeadAttention(
        d_model, num_heads, num_kv_heads=num_kv_heads, dropout=dropout, backend=backend
    )


class FeedForward(nn.Module):
    """Position-wise feed-forward network (§3.3), applied to each position separately:

        FFN(x) = act(x W_1 + b_1) W_2 + b_2,   act = max(0, ·) (ReLU, the paper), GELU or SiLU

    Args:
        d_model: input and output width.
        d_ff: inner width (2048 in the base model).
        activation: ``"relu"``, ``"gelu"`` (exact, erf form) or ``"silu"`` (``x·σ(x)``, Marian's
            "swish"). Default ``"relu"``.
        dropout: dropout on the inner activations while training. Default ``0.0``.

    Shape:
        ``(..., d_model)`` → ``(..., d_model)``.

    Hook points:
        ``hook_pre`` (before the activation, ``(..., d_ff)``), ``hook_post`` (after it).

    Examples:
        >>> ff = FeedForward(16, 64, activation="gelu")
        >>> ff(torch.randn(2, 5, 16)).shape
        torch.Size([2, 5, 16])
    """

    def __init__(
        self, d_model: int, d_ff: int, *, activation: Activation = "relu", dropout: float = 0.0
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("d_ff", d_ff)
        self.activation = cast(Activation, check_choice("activation", activation, ACTIVATIONS))
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(check_probability("dropout", dropout))
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()
        nn.init.xavier_uniform_(self.linear1.weight)
        nn.init.xavier_uniform_(self.linear2.weight)
        nn.init.zeros_(self.linear1.bias)
        nn.init.zeros_(self.linear2.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the network to every position.

        Args:
            x: the activations.

        Returns:
            ``FFN(x)``, the same shape as ``x``.

        Shape:
            ``(..., d_model)`` → ``(..., d_model)``.
        """
        # h = act(x W_1 + b_1)
        h = self.hook_pre(self.linear1(x))  # (..., d_ff)
        act = (
            F.relu if self.activation == "relu" else F.silu if self.activation == "silu" else F.gelu
        )
        h = self.hook_post(act(h))
        # FFN(x) = h W_2 + b_2
        return self.linear2(self.dropout(h))  # (..., d_model)


def residual(
    x: torch.Tensor,
    sublayer: Callable[[torch.Tensor], torch.Tensor],
    norm: nn.LayerNorm,
    dropout: nn.Dropout,
    hook_out: HookPoint,
    *,
    norm_first: bool,
) -> torch.Tensor:
    """One residual sub-layer connection (§3.1, §5.4 residual dropout).

        post-norm: LayerNorm(x + Dropout(Sublayer(x)))
        pre-norm:  x + Dropout(Sublayer(LayerNorm(x)))

    ``hook_out`` sees ``Dropout(Sublayer(·))``, the term added to the residual stream.

    Args:
        x: the residual stream.
        sublayer: the sub-layer, e.g. self-attention or the feed-forward network, shape-preserving.
        norm: the layer norm of this connection.
        dropout: the residual dropout (§5.4).
        hook_out: the hook point that sees the dropped-out sub-layer output.
        norm_first: pre-norm (``True``, GPT-2) or post-norm (``False``, the paper).

    Returns:
        The new residual stream.

    Shape:
        ``(B, T, d_model)`` → ``(B, T, d_model)``.
    """
    if norm_first:
        return x + hook_out(dropout(sublayer(norm(x))))
    return norm(x + hook_out(dropout(sublayer(x))))


class EncoderLayer(nn.Module):
    """One encoder layer (§3.1): self-attention, then the feed-forward network, each in a residual
    connection with layer normalisation.

    Args:
        d_model: model width.
        num_heads: attention heads.
        d_ff: feed-forward inner width.
        num_kv_heads: key/value heads (grouped-query attention); default ``num_heads``.
        dropout: residual dropout (§5.4) and feed-forward dropout. Default ``0.0``.
        attention_dropout: dropout on attention weights. Default ``0.0``.
        activation: ``"relu"``, ``"gelu"`` or ``"silu"``. Default ``"relu"``.
        norm_first: pre-norm when true, post-norm (the paper) when false. Default ``False``.
        layer_norm_eps: LayerNorm epsilon. Default ``1e-5``.
        backend: attention backend. Default ``"auto"``.
        self_attention: a factory of the self-attention layer (e.g. a model's attention spec
            building a window or a Performer layer, :meth:`attnlab.nn.kinds.AttentionSpec.build`);
            ``None`` (default) builds a :class:`~attnlab.nn.multihead.MultiHeadAttention` from the
            arguments above.

    Shape:
        - x ``(B, S, d_model)`` → ``(B, S, d_model)``
        - mask broadcastable to ``(B, H, S, S)``, ``True = may attend`` (e.g. a padding mask
          ``(B, 1, 1, S)``)

        - head_mask ``(H,)`` or ``(B, H)``: 1 keeps a self-attention head, 0 removes it

    Hook points:
        ``hook_resid_pre``, ``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_out``,
        ``hook_resid_post``; attention weights: ``self_attn.hook_weights``.

    Examples:
        >>> layer = EncoderLayer(32, 4, 64)
        >>> layer(torch.randn(2, 7, 32)).shape
        torch.Size([2, 7, 32])
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        num_kv_heads: int | None = None,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        activation: Activation = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        backend: Backend = "auto",
        self_attention: Callable[[], MultiHeadAttention] | None = None,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = (
            _attention(d_model, num_heads, num_kv_heads, attention_dropout, backend)
            if self_attention is None
            else self_attention()
        )
        self.ff = FeedForward(d_model, d_ff, activation=activation, dropout=dropout)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(check_probability("dropout", dropout))
        self.dropout2 = nn.Dropout(dropout)
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Self-attention over the source, then the feed-forward network.

        Args:
            x: ``(B, S, d_model)``.
            mask: self-attention mask, broadcastable to ``(B, H, S, S)``.
            head_mask: ``ξ`` of the self-attention heads, ``(H,)`` or ``(B, H)``; see
                :meth:`MultiHeadAttention.forward <attnlab.nn.multihead.MultiHeadAttention.forward>`.

        Returns:
            The layer's output, ``(B, S, d_model)``.

        Shape:
            - x ``(B, S, d_model)``; mask broadcastable to ``(B, H, S, S)``
            - head_mask ``(H,)`` or ``(B, H)``
            - output ``(B, S, d_model)``
        """
        x = self.hook_resid_pre(x)

        def attend(h: torch.Tensor) -> torch.Tensor:
            return self.self_attn(h, mask=mask, head_mask=head_mask)

        x = self.hook_resid_mid(
            residual(
                x, attend, self.norm1, self.dropout1, self.hook_attn_out, norm_first=self.norm_first
            )
        )
        x = residual(
            x, self.ff, self.norm2, self.dropout2, self.hook_mlp_out, norm_first=self.norm_first
        )
        return self.hook_resid_post(x)


class DecoderLayer(nn.Module):
    """One decoder layer (§3.1): masked self-attention, cross-attention over the encoder output
    ("memory"), then the feed-forward network — each in a residual connection with layer
    normalisation.

    Args:
        d_model: model width.
        num_heads: attention heads.
        d_ff: feed-forward inner width.
        num_kv_heads: key/value heads (grouped-query attention); default ``num_heads``.
        dropout: residual dropout (§5.4) and feed-forward dropout. Default ``0.0``.
        attention_dropout: dropout on attention weights. Default ``0.0``.
        activation: ``"relu"``, ``"gelu"`` or ``"silu"``. Default ``"relu"``.
        norm_first: pre-norm when true, post-norm (the paper) when false. Default ``False``.
        layer_norm_eps: LayerNorm epsilon. Default ``1e-5``.
        backend: attention backend. Default ``"auto"``.
        self_attention: a factory of the self-attention layer (e.g. a model's attention spec
            building a window or a Performer layer, :meth:`attnlab.nn.kinds.AttentionSpec.build`);
            ``None`` (default) builds a :class:`~attnlab.nn.multihead.MultiHeadAttention` from the
            arguments above.

    Shape:
        - x ``(B, T, d_model)``; memory ``(B, S, d_model)`` → ``(B, T, d_model)``
        - self_mask broadcastable to ``(B, H, T, T_past + T)``; memory_mask to ``(B, H, T, S)``
        - head_mask / cross_attn_head_mask ``(H,)`` or ``(B, H)``: 1 keeps a head, 0 removes it

    Hook points:
        ``hook_resid_pre``, ``hook_self_attn_out``, ``hook_resid_mid``, ``hook_cross_attn_out``,
        ``hook_resid_mid2``, ``hook_mlp_out``, ``hook_resid_post``; attention weights:
        ``self_attn.hook_weights`` and ``cross_attn.hook_weights``.

    Examples:
        >>> layer = DecoderLayer(32, 4, 64)
        >>> layer(torch.randn(2, 5, 32), torch.randn(2, 7, 32), is_causal=True).shape
        torch.Size([2, 5, 32])
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        num_kv_heads: int | None = None,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        activation: Activation = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        backend: Backend = "auto",
        self_attention: Callable[[], MultiHeadAttention] | None = None,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = (
            _attention(d_model, num_heads, num_kv_heads, attention_dropout, backend)
            if self_attention is None
            else self_attention()
        )
        self.cross_attn = _attention(d_model, num_heads, num_kv_heads, attention_dropout, backend)
        self.ff = FeedForward(d_model, d_ff, activation=activation, dropout=dropout)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(check_probability("dropout", dropout))
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)
        self.hook_resid_pre = HookPoint()
        self.hook_self_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_cross_attn_out = HookPoint()
        self.hook_resid_mid2 = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        *,
        self_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        memory_mask: torch.Tensor | None = None,
        self_cache: LayerCache | None = None,
        cross_cache: CrossKVCache | None = None,
        head_mask: torch.Tensor | None = None,
        cross_attn_head_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Masked self-attention, cross-attention over ``memory``, then the feed-forward network.

        Args:
            x: target-side activations ``(B, T, d_model)`` (only the new positions with a cache).
            memory: encoder output ``(B, S, d_model)``.
            self_mask: self-attention mask over ``T_past + T`` keys.
            is_causal: the look-ahead rule on self-attention (bottom-right, works with a cache).
            memory_mask: cross-attention mask, e.g. the source padding mask ``(B, 1, 1, S)``.
            self_cache: self-attention cache (e.g. a :class:`~attnlab.nn.kv_cache.KVCache`).
            cross_cache: a :class:`~attnlab.nn.cache_policies.CrossKVCache` (filled on first
                use, then reused).
            head_mask: ``ξ`` of the self-attention heads, ``(H,)`` or ``(B, H)`` (Hugging Face
                BART's ``layer_head_mask``); see :meth:`MultiHeadAttention.forward
                <attnlab.nn.multihead.MultiHeadAttention.forward>`.
            cross_attn_head_mask: ``ξ`` of the cross-attention heads, ``(H,)`` or ``(B, H)``.

        Returns:
            The layer's output, ``(B, T, d_model)``.

        Shape:
            - x ``(B, T, d_model)``; memory ``(B, S, d_model)``
            - self_mask broadcastable to ``(B, H, T, T_past + T)``; memory_mask to ``(B, H, T, S)``
            - head_mask, cross_attn_head_mask ``(H,)`` or ``(B, H)``
            - output ``(B, T, d_model)``
        """
        x = self.hook_resid_pre(x)

        def self_attend(h: torch.Tensor) -> torch.Tensor:
            return self.self_attn(
                h, mask=self_mask, is_causal=is_causal, cache=self_cache, head_mask=head_mask
            )

        def cross_attend(h: torch.Tensor) -> torch.Tensor:
            return self.cross_attn(
                h, memory, mask=memory_mask, cache=cross_cache, head_mask=cross_attn_head_mask
            )

        nf = self.norm_first
        x = self.hook_resid_mid(
            residual(
                x, self_attend, self.norm1, self.dropout1, self.hook_self_attn_out, norm_first=nf
            )
        )
        x = self.hook_resid_mid2(
            residual(
                x, cross_attend, self.norm2, self.dropout2, self.hook_cross_attn_out, norm_first=nf
            )
        )
        x = residual(x, self.ff, self.norm3, self.dropout3, self.hook_mlp_out, norm_first=nf)
        return self.hook_resid_post(x)
