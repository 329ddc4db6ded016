"""The encoder-decoder Transformer (Vaswani et al. 2017, "Attention Is All You Need").

Read top to bottom in the order the data flows:

    source tokens ─► embed·√d_model + PE ─► N × EncoderLayer ─► memory
    target tokens ─► embed·√d_model + PE ─► N × DecoderLayer(memory) ─► linear ─► logits

The padding masks and the look-ahead rule come from ``config.pad_id`` when none are given. With a
KV cache, :meth:`Transformer.decode` takes only the new target tokens; their positions start at
``cache.length``, the self-attention caches grow, and the cross-attention caches are filled with the
projected memory on the first step and reused afterwards.

Heads are switched off with Hugging Face BART's three head masks (1 keeps a head, 0 removes its
output; Michel et al. 2019): ``head_mask`` (encoder self-attention), ``decoder_head_mask``
(decoder self-attention) and ``cross_attn_head_mask`` (decoder cross-attention). With
``gradient_checkpointing`` each layer's activations are recomputed in the backward pass instead of
kept (Chen et al. 2016), as :class:`attnlab.GPT` does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from attnlab._checks import check_positive_int, check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.config import TransformerConfig
from attnlab.models.outputs import Seq2SeqOutput
from attnlab.nn import masks
from attnlab.nn.head_mask import layer_head_masks
from attnlab.nn.hooks import HookPoint
from attnlab.nn.kinds import AttentionSite
from attnlab.nn.kv_cache import LayerCache, ModelCache
from attnlab.nn.layers import DecoderLayer, EncoderLayer
from attnlab.nn.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

__all__ = [
    "Seq2SeqCache",
    "Seq2SeqRecomputeCache",
    "Transformer",
    "TransformerDecoder",
    "TransformerEncoder",
    "attention_site",
    "position_encoding",
]


class Seq2SeqCache(ModelCache):
    """A decoder's :class:`~attnlab.nn.kv_cache.ModelCache` that also remembers the target
    tokens seen so far (for their padding mask) and the source mask given on the first step.

    Attributes:
        layers: one growing self-attention :class:`KVCache` per decoder layer (a
            :class:`~attnlab.nn.kv_cache.PerformerState` for Performer attention).
        cross: one :class:`~attnlab.nn.cache_policies.CrossKVCache` per decoder layer (filled
            once from the encoder memory).
        tokens: ``(B, capacity)`` target ids so far (``pad_id`` beyond ``length``).
        src_mask: the source mask of the first decode step, reused when a later step passes none.

    Args:
        layers: the self-attention caches, one per decoder layer, first layer first.
        cross: the cross-attention caches, one per decoder layer.
        tokens: a buffer for the target ids, filled with ``pad_id``.

    Shape:
        tokens ``(B, capacity)``.
    """

    def __init__(
        self,
        layers: Sequence[LayerCache],
        cross: list[LayerCache],
        tokens: torch.Tensor,
    ) -> None:
        super().__init__(layers, cross)
        self.tokens = tokens
        self.src_mask: torch.Tensor | None = None

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows everywhere (beam search): row ``b`` becomes old row ``index[b]``.

        Args:
            index: integer indices of the rows to keep, on the caches' device; may repeat rows.

        Shape:
            index ``(B_new,)``; every cache, ``tokens`` and a per-row ``src_mask`` then hold
            ``B_new`` rows.
        """
        super().reorder(index)
        self.tokens = self.tokens.index_select(0, index)
        if self.src_mask is not None and self.src_mask.shape[0] > 1:
            self.src_mask = self.src_mask.index_select(0, index)

    @property
    def capacity(self) -> int:
        """The most target positions it holds (a rolling sliding-window cache holds fewer keys,
        but takes this many positions)."""
        return self.tokens.shape[1]


class Seq2SeqRecomputeCache(Seq2SeqCache):
    """A decoder "cache" that keeps no keys or values: it remembers the target ids only and
    every :meth:`Transformer.decode` step runs the decoder again over the whole target prefix
    (cross-attention included) and returns the new positions. The reference cached decoding is
    checked against (Performer attention decodes from running sums instead, see
    :meth:`Transformer.new_cache`).

    Args:
        tokens: a buffer for the target ids, filled with ``pad_id``.

    Shape:
        tokens ``(B, capacity)``.
    """

    recomputes = True

    def __init__(self, tokens: torch.Tensor) -> None:
        super().__init__([], [], tokens)
        self._length = 0

    @property
    def length(self) -> int:
        """Target positions decoded so far."""
        return self._length


def _layer_options(c: TransformerConfig) -> dict[str, Any]:
    """The keyword options every encoder and decoder layer takes from the config."""
    return {
        "num_kv_heads": c.num_kv_heads,
        "dropout": c.dropout,
        "attention_dropout": c.attention_dropout,
        "activation": c.activation,
        "norm_first": c.norm_first,
        "layer_norm_eps": c.layer_norm_eps,
        "backend": c.backend,
    }


def attention_site(c: TransformerConfig, *, decoder: bool) -> AttentionSite:
    """Where the encoder's or the decoder's self-attention layers go, as the config's attention
    spec builds them (:meth:`~attnlab.nn.kinds.AttentionSpec.build`): bidirectional in the
    encoder, causal in the decoder, over ``max_len`` positions. Cross-attention is always full.

    Args:
        c: the model's configuration.
        decoder: the decoder's (causal) site, else the encoder's.

    Returns:
        The :class:`~attnlab.nn.kinds.AttentionSite`.
    """
    return AttentionSite(
        d_model=c.d_model,
        num_heads=c.num_heads,
        num_kv_heads=c.num_kv_heads,
        causal=decoder,
        max_len=c.max_len,
        dropout=c.attention_dropout,
        bias=True,
        backend=c.backend,
        positions="sinusoidal",
    )


def _checkpointing(stack: nn.Module) -> bool:
    """Recompute activations in backward: asked for, training, and building a graph."""
    return bool(stack.gradient_checkpointing) and stack.training and torch.is_grad_enabled()


class TransformerEncoder(nn.Module):
    """The encoder stack (§3.1): ``N`` identical layers, plus a final LayerNorm when pre-norm.

    Args:
        config: the model's :class:`~attnlab.models.config.TransformerConfig`.

    Attributes:
        gradient_checkpointing: recompute each layer in the backward pass while training
            (settable; default ``config.gradient_checkpointing``).

    Shape:
        x ``(B, S, d_model)``, mask broadcastable to ``(B, H, S, S)`` → ``(B, S, d_model)``;
        head_mask ``(N, H)`` or ``(H,)``.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        c = config
        self.num_heads = c.num_heads
        self.gradient_checkpointing = c.gradient_checkpointing
        site = attention_site(c, decoder=False)
        self.layers = nn.ModuleList(
            EncoderLayer(
                c.d_model, c.num_heads, c.d_ff, **_layer_options(c),
                self_attention=lambda: c.attention.build(site),
            )
            for _ in range(c.num_encoder_layers)
        )  # fmt: skip
        self.norm: nn.Module = (
            nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.norm_first else nn.Identity()
        )

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the ``N`` encoder layers (each checkpointed while training when
        :attr:`gradient_checkpointing` is set), then the final LayerNorm of a pre-norm stack.

        Args:
            x: the embedded source (positions added).
            mask: mask over the source keys, ``True = may attend``, or ``None``.
            head_mask: per-layer head mask (1 keeps a head, 0 removes its output), or ``None``.

        Returns:
            The encoder memory.

        Shape:
            x ``(B, S, d_model)``; mask broadcastable to ``(B, H, S, S)``; head_mask ``(N, H)`` or
            ``(H,)``; output ``(B, S, d_model)``.
        """
        head_masks = layer_head_masks("head_mask", head_mask, len(self.layers), self.num_heads)
        recompute = _checkpointing(self)
        for layer, layer_head_mask in zip(self.layers, head_masks):
            if recompute:
                x = checkpoint(layer, x, mask, layer_head_mask, use_reentrant=False)
            else:
                x = layer(x, mask, layer_head_mask)
        return self.norm(x)


class TransformerDecoder(nn.Module):
    """The decoder stack (§3.1): ``N`` identical layers, plus a final LayerNorm when pre-norm.

    Args:
        config: the model's :class:`~attnlab.models.config.TransformerConfig`.

    Attributes:
        gradient_checkpointing: recompute each layer in the backward pass while training without
            a KV cache (settable; default ``config.gradient_checkpointing``).

    Shape:
        x ``(B, T, d_model)``, memory ``(B, S, d_model)`` → ``(B, T, d_model)``;
        head_mask and cross_attn_head_mask ``(N, H)`` or ``(H,)``.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        c = config
        self.num_heads = c.num_heads
        self.gradient_checkpointing = c.gradient_checkpointing
        site = attention_site(c, decoder=True)
        self.layers = nn.ModuleList(
            DecoderLayer(
                c.d_model, c.num_heads, c.d_ff, **_layer_options(c),
                self_attention=lambda: c.attention.build(site),
            )
            for _ in range(c.num_decoder_layers)
        )  # fmt: skip
        self.norm: nn.Module = (
            nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.norm_first else nn.Identity()
        )

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        *,
        self_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        cache: ModelCache | None = None,
        head_mask: torch.Tensor | None = None,
        cross_attn_head_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the ``N`` decoder layers (causal self-attention, cross-attention, feed-forward;
        each checkpointed while training without a cache when :attr:`gradient_checkpointing` is
        set), then the final LayerNorm of a pre-norm stack.

        Args:
            x: the embedded target tokens (with a cache, only the new ones).
            memory: the encoder output.
            self_mask: mask over the target keys (past + new), ``True = may attend``; the
                look-ahead rule applies on top.
            memory_mask: mask over the memory positions, ``True = may attend``.
            cache: a :class:`~attnlab.nn.kv_cache.ModelCache` with ``layers`` (and ``cross``)
                caches, or ``None``.
            head_mask: per-layer self-attention head mask, or ``None``.
            cross_attn_head_mask: per-layer cross-attention head mask, or ``None``.

        Returns:
            The decoder's hidden states.

        Shape:
            x ``(B, T, d_model)``; memory ``(B, S, d_model)``; self_mask broadcastable to
            ``(B, H, T, T_past + T)``; memory_mask to ``(B, H, T, S)``; head masks ``(N, H)`` or
            ``(H,)``; output ``(B, T, d_model)``.
        """
        n, h = len(self.layers), self.num_heads
        self_masks = layer_head_masks("decoder_head_mask", head_mask, n, h)
        cross_masks = layer_head_masks("cross_attn_head_mask", cross_attn_head_mask, n, h)
        recompute = cache is None and _checkpointing(self)
        for i, layer in enumerate(self.layers):
            options: dict[str, Any] = {
                "self_mask": self_mask,
                "is_causal": True,
                "memory_mask": memory_mask,
                "self_cache": None if cache is None else cache.layers[i],
                "cross_cache": None if cache is None or cache.cross is None else cache.cross[i],
                "head_mask": self_masks[i],
                "cross_attn_head_mask": cross_masks[i],
            }
            if recompute:
                x = checkpoint(layer, x, memory, use_reentrant=False, **options)
            else:
                x = layer(x, memory, **options)
        return self.norm(x)


class Transformer(nn.Module):
    """The encoder-decoder Transformer (Vaswani et al. 2017).

    * §3.1 encoder and decoder stacks, post-norm (the paper) or pre-norm (``norm_first``);
    * §3.3 position-wise feed-forward networks;
    * §3.4 embeddings multiplied by ``√d_model``; optionally one matrix shared by the source and
      target embeddings (``share_embeddings``) and by the pre-softmax projection (``tie_output``);
    * §3.5 sinusoidal positional encodings, then dropout (§5.4);
    * §5.4 label-smoothed cross-entropy when targets are given.

    Args:
        config: a :class:`~attnlab.models.config.TransformerConfig`.

    Shape:
        - src ``(B, S)``, tgt_in / targets ``(B, T)`` integer ids
        - memory ``(B, S, d_model)``; logits ``(B, T, tgt_vocab_size)``
        - src_mask broadcastable to ``(B, H, ·, S)``; default ``masks.padding_mask(src, pad_id)``
          ``(B, 1, 1, S)``

    Hook points:
        ``hook_src_embed``, ``hook_tgt_embed`` (embeddings + positions after dropout),
        ``hook_memory`` (encoder output), and those of every layer, e.g.
        ``decoder.layers.0.cross_attn.hook_weights``.

    Attributes:
        gradient_checkpointing: recompute every encoder and decoder layer in the backward pass
            while training (and not decoding with a cache): less activation memory for about one
            more forward of compute. Default ``config.gradient_checkpointing``; settable, e.g.
            ``model.gradient_checkpointing = True``.

    Examples:
        >>> cfg = TransformerConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=32, num_heads=4,
        ...                         num_encoder_layers=2, num_decoder_layers=2, d_ff=64)
        >>> model = Transformer(cfg)
        >>> src = torch.randint(3, 50, (2, 7)); tgt = torch.randint(3, 50, (2, 5))
        >>> out = model(src, tgt[:, :-1], targets=tgt[:, 1:])
        >>> out.logits.shape, out.loss.shape
        (torch.Size([2, 4, 50]), torch.Size([]))
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise ArgumentTypeError(
                f"config must be a TransformerConfig, got {type(config).__name__}"
            )
        self.config = config
        c = config
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model)
        self.tgt_embed = (
            self.src_embed if c.share_embeddings else nn.Embedding(c.tgt_vocab_size, c.d_model)
        )
        if c.positions == "learned":  # BART: a table each, position ids + position_offset
            rows = c.max_len + c.position_offset
            self.src_positions = LearnedPositionalEmbedding(rows, c.d_model)
            self.tgt_positions = LearnedPositionalEmbedding(rows, c.d_model)
        else:
            self.positions = position_encoding(c)
        if c.norm_embeddings:  # BART's layernorm_embedding, one for each side
            self.src_embed_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
            self.tgt_embed_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.dropout)
        self.encoder = TransformerEncoder(c)
        self.decoder = TransformerDecoder(c)
        self.lm_head = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        self.hook_src_embed = HookPoint()
        self.hook_tgt_embed = HookPoint()
        self.hook_memory = HookPoint()
        if c.final_logits_bias:  # logits = h W_out^T + b (a buffer: Marian and BART never train it)
            self.register_buffer("final_logits_bias", torch.zeros(c.tgt_vocab_size))
        # Embeddings ~ N(0, 1/d_model), so that embed·√d_model has unit variance, like the PE.
        nn.init.normal_(self.src_embed.weight, std=c.d_model**-0.5)
        nn.init.normal_(self.tgt_embed.weight, std=c.d_model**-0.5)
        if c.tie_output:
            self.lm_head.weight = self.tgt_embed.weight
        else:
            nn.init.xavier_uniform_(self.lm_head.weight)

    @property
    def gradient_checkpointing(self) -> bool:
        """Whether the encoder and decoder layers are recomputed in the backward pass."""
        return bool(self.encoder.gradient_checkpointing and self.decoder.gradient_checkpointing)

    @gradient_checkpointing.setter
    def gradient_checkpointing(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise ArgumentTypeError(
                f"gradient_checkpointing must be a bool, got {type(value).__name__}"
            )
        self.encoder.gradient_checkpointing = value
        self.decoder.gradient_checkpointing = value

    # -- embeddings --

    def _embed(self, tokens: torch.Tensor, side: str, offset: int) -> torch.Tensor:
        # §3.4, §3.5: x = Dropout(Embedding(tokens) · √d_model + PE(offset + t))
        c = self.config
        x = getattr(self, f"{side}_embed")(tokens)  # (B, T, d_model)
        if c.scale_embedding:
            x = x * math.sqrt(c.d_model)
        if c.positions == "learned":  # x + P[offset + t + position_offset]
            t = torch.arange(offset, offset + tokens.shape[1], device=tokens.device)
            x = x + getattr(self, f"{side}_positions")(t + c.position_offset)
        else:
            x = self.positions(x, offset=offset)
        if c.norm_embeddings:
            x = getattr(self, f"{side}_embed_norm")(x)
        return self.dropout(x)

    # -- encoder --

    def encode(
        self,
        src: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        *,
        head_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the encoder.

        Args:
            src: source ids ``(B, S)``.
            src_mask: mask over source keys, ``True = may attend``; default
                ``masks.padding_mask(src, pad_id)``.
            head_mask: encoder self-attention head mask ``(num_encoder_layers, num_heads)``, or
                ``(num_heads,)`` for every layer, floating or bool: head ``h`` of layer ``l`` has
                its output multiplied by ``head_mask[l, h]`` (1 keeps it, 0 removes it).

        Returns:
            memory ``(B, S, d_model)``. Rows at padded positions are computed but never read
            when the same ``src_mask`` is passed to :meth:`decode`.

        Shape:
            src ``(B, S)``; src_mask broadcastable to ``(B, H, S, S)``; head_mask
            ``(num_encoder_layers, num_heads)`` or ``(num_heads,)``; memory ``(B, S, d_model)``.
        """
        _check_tokens("src", src, self.config.src_vocab_size, "src_vocab_size")
        if src_mask is None:
            src_mask = masks.padding_mask(src, self.config.pad_id)
        x = self.hook_src_embed(self._embed(src, "src", 0))
        return self.hook_memory(self.encoder(x, src_mask, head_mask))

    # -- decoder --

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        *,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
        cache: ModelCache | None = None,
        decoder_head_mask: torch.Tensor | None = None,
        cross_attn_head_mask: torch.Tensor | None = None,
    ) -> Seq2SeqOutput:
        """Run the decoder on target tokens given the encoder memory.

        Args:
            tgt: target ids ``(B, T)``; with a cache only the new tokens (positions
                ``cache.length …``).
            memory: encoder output ``(B, S, d_model)``.
            src_mask: mask over memory positions, e.g. ``masks.padding_mask(src, pad_id)``. Without
                one every memory position is visible — pass it when the source is padded. With a
                cache it is remembered from the first step.
            tgt_mask: mask over target keys (past + new), broadcastable to
                ``(B, H, T, T_past + T)``; default the padding mask of the target ids from
                ``pad_id``. The look-ahead rule always applies on top (bottom-right aligned).
            cache: from :meth:`new_cache`; self-attention caches grow by ``T``, cross-attention
                caches are filled on the first step.
            decoder_head_mask: decoder self-attention head mask ``(num_decoder_layers,
                num_heads)`` or ``(num_heads,)``; 1 keeps a head, 0 removes its output.
            cross_attn_head_mask: cross-attention head mask, same shapes. With a cache, pass the
                masks at every step (or use :func:`attnlab.inspect.masked_heads`).

        Returns:
            :class:`~attnlab.models.outputs.Seq2SeqOutput` with ``logits`` ``(B, T, tgt_vocab_size)``
            and ``cache``.

        Shape:
            tgt ``(B, T)``; memory ``(B, S, d_model)``; src_mask broadcastable to
            ``(B, H, T, S)``; tgt_mask to ``(B, H, T, T_past + T)``; head masks
            ``(num_decoder_layers, num_heads)`` or ``(num_heads,)``; logits
            ``(B, T, tgt_vocab_size)``.
        """
        c = self.config
        _check_tokens("tgt", tgt, c.tgt_vocab_size, "tgt_vocab_size")
        check_tensor("memory", memory)
        if memory.dim() != 3 or memory.shape[0] != tgt.shape[0] or memory.shape[2] != c.d_model:
            raise ArgumentError(
                f"memory must have shape (B, S, d_model) = ({tgt.shape[0]}, S, {c.d_model}), "
                f"got {shape_str(memory.shape)}"
            )
        past, t = 0, tgt.shape[1]
        key_tokens = tgt
        if cache is not None:
            past = cache.length
            if past + t > cache.capacity:
                raise ArgumentError(
                    f"KV cache capacity exceeded: it holds {past} of {cache.capacity} positions "
                    f"and {t} more were added; make the cache larger (max_length)"
                )
            if isinstance(cache, Seq2SeqCache):
                if cache.tokens.shape[0] != tgt.shape[0]:
                    raise ArgumentError(
                        f"tgt has batch {tgt.shape[0]} but the cache was made for batch "
                        f"{cache.tokens.shape[0]}"
                    )
                cache.tokens[:, past : past + t] = tgt
                key_tokens = cache.tokens[:, : past + t]
                if src_mask is None:
                    src_mask = cache.src_mask
                else:
                    cache.src_mask = src_mask
                if cache.recomputes:
                    # no keys or values kept: run the whole target prefix again
                    cast(Seq2SeqRecomputeCache, cache)._length += t
                    out = self.decode(
                        key_tokens, memory, src_mask=src_mask, tgt_mask=tgt_mask,
                        decoder_head_mask=decoder_head_mask,
                        cross_attn_head_mask=cross_attn_head_mask,
                    )  # fmt: skip
                    return Seq2SeqOutput(logits=out.logits[:, -t:], cache=cache)
        if (
            tgt_mask is None
            and c.mask_target_padding
            and (cache is None or isinstance(cache, Seq2SeqCache))
        ):
            tgt_mask = masks.padding_mask(key_tokens, c.pad_id)  # (B, 1, 1, T_past + T)
        x = self.hook_tgt_embed(self._embed(tgt, "tgt", past))
        x = self.decoder(
            x,
            memory,
            self_mask=tgt_mask,
            memory_mask=src_mask,
            cache=cache,
            head_mask=decoder_head_mask,
            cross_attn_head_mask=cross_attn_head_mask,
        )
        logits = self.lm_head(x)  # (B, T, tgt_vocab_size)
        if c.final_logits_bias:
            logits = logits + self.final_logits_bias
        return Seq2SeqOutput(logits=logits, cache=cache)

    # -- training forward --

    def forward(
        self,
        src: torch.Tensor,
        tgt_in: torch.Tensor,
        *,
        targets: torch.Tensor | None = None,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
        decoder_head_mask: torch.Tensor | None = None,
        cross_attn_head_mask: torch.Tensor | None = None,
    ) -> Seq2SeqOutput:
        """Encode ``src``, decode ``tgt_in`` (teacher forcing) and, with ``targets``, the loss.

        §5.4, label smoothing ``ε_ls``: the target distribution puts ``1 − ε_ls`` on the true
        token and spreads ``ε_ls`` uniformly over the vocabulary,

            loss = mean over non-pad targets of  −Σ_v q(v) log softmax(logits)_v

        (``F.cross_entropy(label_smoothing=ε_ls, ignore_index=pad_id)``).

        Args:
            src: source ids ``(B, S)``.
            tgt_in: decoder input ids ``(B, T)`` (``<bos> y_1 … y_{T-1}``).
            targets: ids to predict ``(B, T)`` (``y_1 … y_T``); ``pad_id`` entries are ignored.
            src_mask: default ``masks.padding_mask(src, pad_id)``.
            tgt_mask: default ``masks.padding_mask(tgt_in, pad_id)`` (plus the look-ahead rule).
            head_mask: encoder self-attention head mask ``(num_encoder_layers, num_heads)`` or
                ``(num_heads,)`` (Hugging Face BART's names and semantics: 1 keeps a head, 0
                removes its output).
            decoder_head_mask: decoder self-attention head mask ``(num_decoder_layers, num_heads)``
                or ``(num_heads,)``.
            cross_attn_head_mask: decoder cross-attention head mask, same shapes.

        Returns:
            :class:`~attnlab.models.outputs.Seq2SeqOutput` with ``logits`` ``(B, T, tgt_vocab_size)``
            and ``loss`` (a scalar) when targets are given.

        Shape:
            src ``(B, S)``; tgt_in and targets ``(B, T)``; src_mask broadcastable to
            ``(B, H, ·, S)``; tgt_mask to ``(B, H, T, T)``; head masks ``(layers, num_heads)`` or
            ``(num_heads,)``; logits ``(B, T, tgt_vocab_size)``; loss ``()``.
        """
        if src_mask is None:
            _check_tokens("src", src, self.config.src_vocab_size, "src_vocab_size")
            src_mask = masks.padding_mask(src, self.config.pad_id)
        memory = self.encode(src, src_mask, head_mask=head_mask)
        out = self.decode(
            tgt_in,
            memory,
            src_mask=src_mask,
            tgt_mask=tgt_mask,
            decoder_head_mask=decoder_head_mask,
            cross_attn_head_mask=cross_attn_head_mask,
        )
        if targets is not None:
            check_tensor("targets", targets)
            if targets.shape != tgt_in.shape:
                raise ArgumentError(
                    f"targets must have the shape of tgt_in {shape_str(tgt_in.shape)}, "
                    f"got {shape_str(targets.shape)}"
                )
            out.loss = F.cross_entropy(
                out.logits.flatten(0, 1).float(),
                targets.flatten(),
                ignore_index=self.config.pad_id,
                label_smoothing=self.config.label_smoothing,
            )
        return out

    # -- KV cache --

    def new_cache(
        self,
        batch: int,
        capacity: int,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        src_len: int | None = None,
    ) -> Seq2SeqCache:
        """A preallocated decoder cache.

        Args:
            batch: batch size ``B``.
            capacity: the most target positions it holds.
            dtype: default the autocast dtype when autocast is on, else the parameters' dtype.
            device: default the parameters' device.
            src_len: capacity of the cross-attention caches; default ``config.max_len``.

        Returns:
            a :class:`Seq2SeqCache` with the caches each decoder layer's attention makes
            (``new_cache``): a self-attention :class:`~attnlab.nn.kv_cache.KVCache` (rolling,
            of ``window`` positions, under a sliding window; every position under BigBird), or
            for Performer attention :class:`~attnlab.nn.kv_cache.PerformerState` running sums
            (``B · H_kv · (m · (d_head + 1) + 1)`` numbers a layer whatever the length,
            ``O(1)`` per token; float32 at least); and a
            :class:`~attnlab.nn.cache_policies.CrossKVCache` of ``src_len`` positions per layer.
        """
        check_positive_int("batch", batch)
        check_positive_int("capacity", capacity)
        c = self.config
        src_len = c.max_len if src_len is None else check_positive_int("src_len", src_len)
        param = self.lm_head.weight
        device = param.device if device is None else torch.device(device)
        if dtype is None:
            autocast = torch.is_autocast_enabled(device.type)
            dtype = torch.get_autocast_dtype(device.type) if autocast else param.dtype
        tokens = torch.full((batch, capacity), c.pad_id, dtype=torch.long, device=device)
        # each layer makes its own: self-attention as its kind keeps it (a KV cache, a rolling
        # one under a window, FAVOR+'s running sums), cross-attention a KV cache of the source
        decoder = [cast(DecoderLayer, layer) for layer in self.decoder.layers]
        layers = [
            layer.self_attn.new_cache(batch, capacity, dtype=dtype, device=device)
            for layer in decoder
        ]
        cross: list[LayerCache] = [
            layer.cross_attn.new_cross_cache(batch, src_len, dtype=dtype, device=device)
            for layer in decoder
        ]
        return Seq2SeqCache(layers, cross, tokens)


def position_encoding(config: TransformerConfig) -> SinusoidalPositionalEncoding:
    """The sinusoidal positions of a config (§3.5), its columns in the config's
    ``sinusoid_layout``: interleaved, or Marian's halves (``sin(pos·ω_i)`` for every ``i``, then
    ``cos(pos·ω_i)``). A loader built on the ``meta`` device makes its table again with this.

    Args:
        config: the model's configuration.

    Returns:
        The module (no parameters; its table a buffer that is not saved).

    Shape:
        table ``(max_len, d_model)``.
    """
    positions = SinusoidalPositionalEncoding(config.d_model, config.max_len)
    if config.sinusoid_layout == "halves":
        table = positions.table
        positions.table = torch.cat([table[:, 0::2], table[:, 1::2]], dim=1)
    return positions


def _check_tokens(name: str, tokens: object, vocab_size: int, vocab_name: str) -> None:
    t = check_tensor(name, tokens)
    if t.dim() != 2 or t.shape[1] == 0:
        raise ArgumentError(f"{name} must have shape (B, T) with T >= 1, got {shape_str(t.shape)}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ArgumentTypeError(f"{name} must hold integer token ids, got dtype {t.dtype}")
    if t.numel() and (int(t.max()) >= vocab_size or int(t.min()) < 0):
        raise ArgumentError(
            f"{name} ids must lie in [0, {vocab_name} = {vocab_size}), "
            f"got values in [{int(t.min())}, {int(t.max())}]"
        )
