"""GPT-2: a decoder-only Transformer language model (Radford et al. 2019).

Read top to bottom in the order the data flows:

    tokens ─► wte + wpe ─► n_layer × Block(pre-norm attention, pre-norm MLP) ─► ln_f ─► lm_head

The parameter names are GPT-2's (``transformer.wte``, ``transformer.h.{i}.attn.c_attn``, …), so
Hugging Face weights map one-to-one (see :mod:`attnlab.models.hf`); ``lm_head`` shares its weight
with ``wte``. Beyond GPT-2: grouped-query attention (``num_kv_heads``), rotary or ALiBi positions,
gradient checkpointing, a preallocated KV cache for decoding, and for Performer (FAVOR+)
attention a running state in its place (``O(1)`` per token).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from attnlab._checks import check_positive_int, check_sink_rows, check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.config import GPTConfig
from attnlab.models.gpt_layers import (
    GPTMLP,
    GPTBlock,
    GPTPerformerAttention,
    GPTSelfAttention,
    LMHead,
    RecomputeCache,
    attention_site,
    block_parts,
)
from attnlab.models.outputs import CausalLMOutput
from attnlab.nn import masks
from attnlab.nn.cache_policies import SinkKVCache, SinkPlaces
from attnlab.nn.head_mask import layer_head_masks
from attnlab.nn.kv_cache import ModelCache
from attnlab.nn.positional import LearnedPositionalEmbedding, RotaryEmbedding, alibi_bias
from attnlab.nn.static_cache import StaticKVCache, StaticModelCache, StaticSlots

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = [
    "GPT",
    "GPTMLP",
    "GPTBlock",
    "GPTPerformerAttention",
    "GPTSelfAttention",
    "GPTTrunk",
    "RecomputeCache",
]

IGNORE_INDEX = -100


class GPTTrunk(nn.Module):
    """The modules of the decoder stack, under GPT-2's names (``transformer.*``): token embedding
    ``wte``, position embedding ``wpe`` (learned positions only, else ``None``), embedding dropout
    ``drop``, the blocks ``h`` and the final LayerNorm ``ln_f``. :class:`GPT` runs them in order.

    Args:
        config: the model's :class:`~attnlab.models.config.GPTConfig`.
        rotary: a :class:`~attnlab.nn.positional.RotaryEmbedding` shared by all blocks, or ``None``.
    """

    def __init__(self, config: GPTConfig, rotary: RotaryEmbedding | None = None) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe: LearnedPositionalEmbedding | None = (
            LearnedPositionalEmbedding(config.n_positions, config.n_embd)
            if config.positions == "learned"
            else None
        )
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(
            GPTBlock(block_parts(config, rotary, i)) for i in range(config.n_layer)
        )
        self.ln_f = block_parts(config, rotary).norm()


class GPT(nn.Module):
    """A GPT-2 style decoder-only language model.

    Args:
        config: a :class:`~attnlab.models.config.GPTConfig` (default GPT-2 small, 124M).

    Weights are initialised as GPT-2's: normal with std 0.02, and std ``0.02 / √(2 · n_layer)``
    for the projections that write into the residual stream (``c_proj``), so the stream's variance
    does not grow with depth (Radford et al. 2019, §2.3).

    Attributes:
        gradient_checkpointing: recompute each block's activations in the backward pass
            (``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` per block) instead of
            keeping them: about one more forward pass of compute for the activation memory of one
            block. Only while training (``model.train()``, gradients enabled, no KV cache);
            settable, default ``config.gradient_checkpointing``. Same loss and gradients, with
            dropout too (the recomputation replays the saved RNG state).

    Shape:
        - input_ids ``(B, T)`` integer token ids in ``[0, vocab_size)``
        - attention_mask ``(B, T_past + T)``, 1/True for real tokens, 0/False for (left) padding
        - logits ``(B, T, vocab_size)``

    Examples:
        >>> model = GPT(GPTConfig(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=4))
        >>> ids = torch.randint(0, 100, (2, 10))
        >>> out = model(ids, labels=ids)
        >>> out.logits.shape, out.loss.shape
        (torch.Size([2, 10, 100]), torch.Size([]))
    """

    def __init__(self, config: GPTConfig | None = None) -> None:
        super().__init__()
        config = GPTConfig() if config is None else config
        if not isinstance(config, GPTConfig):
            raise ArgumentTypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = config
        self._site = attention_site(
            config
        )  # where the blocks' attention sits (causal, n_positions)
        self.gradient_checkpointing = config.gradient_checkpointing
        rotary = None
        if config.positions == "rope":
            rotary = RotaryEmbedding(
                config.d_head,
                max_len=config.n_positions,
                base=config.rope_base,
                rotary_dim=config.rotary_dim,
                pairing=config.rope_pairing,
                scaling=config.rope_scaling,
            )
        self.transformer = GPTTrunk(config, rotary)
        self.lm_head = LMHead(config.n_embd, config.vocab_size, softcap=config.logit_softcap)
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight  # tied (Press & Wolf 2017)
        if self.lm_head.weight.is_meta:  # built to receive weights (model_from_state): a meta
            return  # tensor holds no values to draw (0.4 s of a SmolLM2 command went to it)
        self.apply(self._init_weights)
        residual_std = 0.02 / math.sqrt(2 * config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=residual_std)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # -- forward --

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: ModelCache | None = None,
        head_mask: torch.Tensor | None = None,
    ) -> CausalLMOutput:
        """Next-token logits (and the loss when ``labels`` are given).

        Args:
            input_ids: token ids ``(B, T)``; with a ``cache``, only the new tokens.
            attention_mask: ``(B, T_past + T)``, 1/True = real token, 0/False = padding (bool or
                integer). Padding keys are hidden, and the position ids are derived from it
                (``cumsum − 1``, clamped at 0) so that left padding does not shift positions;
                with ``attention="bigbird"`` the block layout is read at those positions too
                (:meth:`~attnlab.nn.masks.BlockLayout.mask_at`), so a left-padded row sees
                the blocks it would see unpadded.
            labels: ``(B, T)`` targets, usually ``input_ids``; shifted inside (token ``t`` predicts
                ``labels[t + 1]``); ``-100`` is ignored.
            position_ids: ``(B, T)`` or ``(T,)``; overrides the ones derived from the mask.
                (ALiBi reads no position ids: its bias depends on distances ``i − j`` only.)
            cache: a :class:`~attnlab.nn.kv_cache.ModelCache` from :meth:`new_cache`; the new
                keys/values are appended to it (a Performer's running sums absorb them).
            head_mask: ``(n_layer, n_head)``, or ``(n_head,)`` for every layer, floating or bool:
                head ``h`` of block ``l`` has its output multiplied by ``head_mask[l, h]`` (1 keeps
                it, 0 removes it), as in Hugging Face GPT-2 (Michel et al. 2019). ``None`` (default)
                and all ones give the same logits, bit for bit.

        Returns:
            :class:`~attnlab.models.outputs.CausalLMOutput` with ``logits`` ``(B, T, vocab_size)``,
            ``loss`` (mean cross-entropy, fp32) when ``labels`` are given, and ``cache``.

        Raises:
            ValueError: the input is longer than ``n_positions``, a token id is outside
                ``[0, vocab_size)``, or shapes disagree.
            TypeError: wrong dtypes.

        Shape:
            input_ids and labels ``(B, T)``; attention_mask ``(B, T_past + T)``; position_ids
            ``(B, T)`` or ``(T,)``; head_mask ``(n_layer, n_head)`` or ``(n_head,)``; logits
            ``(B, T, vocab_size)``; loss ``()``.
        """
        cfg = self.config
        b, t = self._check_input_ids(input_ids)
        past = self._check_cache(cache, b)
        if past + t > cfg.n_positions:
            raise ArgumentError(
                f"input_ids has {t} tokens after {past} cached ones ({past + t} positions), longer than "
                f"the position table: n_positions = {cfg.n_positions}"
            )
        streaming = cache is not None and any(isinstance(c, SinkKVCache) for c in cache.layers)
        if streaming and attention_mask is not None:
            raise ArgumentError(
                "attention_mask must be None with a sink cache (SinkKVCache): it keeps no padded "
                "rows"
            )
        keep = self._check_attention_mask(attention_mask, b, past + t)
        if keep is not None and bool(keep.all()):
            keep = None  # nothing is padded: the plain causal path
        positions = None
        if position_ids is not None:
            positions = self._check_position_ids(position_ids, b, t)
        head_masks = layer_head_masks("head_mask", head_mask, cfg.n_layer, cfg.n_head)
        if cache is not None and cache.recomputes:
            if positions is not None:
                raise ArgumentError(
                    "position_ids must be None with a RecomputeCache (it recomputes every past "
                    "position, whose ids it does not keep)"
                )
            logits = self._recompute(input_ids, keep, cast(RecomputeCache, cache), head_masks)
        else:
            if isinstance(cache, StaticModelCache):
                cache.begin(t)  # the slots this call writes (on the host, before the run)
            logits = self._run(input_ids, keep, positions, cache, head_masks)
        loss = None
        if labels is not None:
            loss = self.loss(logits, labels)
        return CausalLMOutput(logits=logits, loss=loss, cache=cache)

    def decode_step(
        self, tokens: torch.Tensor, cache: ModelCache, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One decoding step: feed one new token per row, get the logits of the token after it.

        The same computation as ``forward(tokens, attention_mask, cache=cache).logits[:, -1]``,
        without what only a call from outside needs: the token ids and the mask are trusted
        (:func:`attnlab.generate` checked the prompt, and every later token comes from this
        model's own vocabulary), so nothing is read back from the device — no host
        synchronisation, and the step can be captured whole by ``torch.compile`` (as gpt-fast's
        ``decode_one_token``).

        Args:
            tokens: ``(B, 1)`` token ids.
            cache: the :class:`~attnlab.nn.kv_cache.ModelCache` holding the past positions; the
                new key and value are appended (absorbed by a Performer's running sums).
            attention_mask: ``(B, T_past + 1)`` bool, ``True`` for real tokens (left padding), or
                ``None`` when no row is padded.

        With a :class:`~attnlab.nn.static_cache.StaticModelCache` (compiled decoding) the new key
        and value go to the slot ``cache.begin(1)`` took before the call (outside a compiled
        region: it counts on the host), ``attention_mask`` may cover all ``C`` slots, and
        positions and ALiBi distances are read from the slot tensor: the step reads no Python
        int that changes per token, so ``torch.compile`` traces it once.

        Returns:
            logits ``(B, vocab_size)``.

        Shape:
            tokens ``(B, 1)``; attention_mask ``(B, T_past + 1)``; logits ``(B, vocab_size)``.
        """
        if tokens.dim() != 2 or tokens.shape[1] != 1:
            raise ArgumentError(f"tokens must have shape (B, 1), got {shape_str(tokens.shape)}")
        heads: list[torch.Tensor | None] = [None] * self.config.n_layer
        if isinstance(cache, StaticModelCache):  # the traced step: no Python int read
            return self._run(tokens, attention_mask, None, cache, heads)[:, -1]
        if cache.next_position + 1 > self.config.n_positions:
            raise ArgumentError(
                f"position {cache.next_position} is past the model's position table "
                f"n_positions = {self.config.n_positions}"
            )
        if cache.recomputes:
            return self._recompute(tokens, attention_mask, cast(RecomputeCache, cache), heads)[
                :, -1
            ]
        return self._run(tokens, attention_mask, None, cache, heads)[:, -1]

    def _recompute(
        self,
        input_ids: torch.Tensor,
        keep: torch.Tensor | None,
        cache: RecomputeCache,
        head_masks: list[torch.Tensor | None],
    ) -> torch.Tensor:
        """The forward computation with a :class:`RecomputeCache`: the whole prefix runs again
        (no keys or values are kept) and the new positions' logits are returned.

        Shape:
            input_ids ``(B, T)``; keep ``(B, T_past + T)`` or ``None``; logits ``(B, T, vocab_size)``.
        """
        t = input_ids.shape[1]
        ids = cache.extend(input_ids)  # (B, T_past + T)
        return self._run(ids, keep, None, None, head_masks)[:, -t:]

    def _run(
        self,
        input_ids: torch.Tensor,
        keep: torch.Tensor | None,
        positions: torch.Tensor | None,
        cache: ModelCache | None,
        head_masks: list[torch.Tensor | None],
    ) -> torch.Tensor:
        """The forward computation on checked inputs; reads no tensor value back to the host.

        Shape:
            input_ids ``(B, T)``; keep ``(B, T_past + T)`` bool (True = real token) or ``None``;
            positions ``(B, T)``/``(T,)`` or ``None``; logits ``(B, T, vocab_size)``.
        """
        cfg = self.config
        block_mask: Literal[False] | None = None  # the layers' own pattern (or none: False)
        if isinstance(cache, StaticModelCache):  # positions and masks from the slot tensor
            positions, mask = self._static_inputs(keep, positions, cache)
        else:
            positions, mask, block_mask = self._inputs(input_ids, keep, positions, cache)

        # h_0 = W_e[x_t] + W_p[pos_t]   (token embedding plus, for learned positions, position embedding)
        x = self.transformer.wte(input_ids)  # (B, T, n_embd)
        if cfg.embedding_scale:  # h_0 = √d · W_e[x_t], √d in float32 then x's dtype (Gemma 2)
            x = x * torch.tensor(cfg.n_embd**0.5, dtype=torch.float32).to(x.dtype)
        if self.transformer.wpe is not None and positions is not None:
            # (B, T, n_embd) or (T, n_embd), broadcast; in range: checked, or derived from the mask
            x = x + self.transformer.wpe(positions, check=False)
        x = self.transformer.drop(x)
        rope_positions = positions if cfg.positions == "rope" else None

        checkpointing = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        rotary = getattr(self.transformer.h[0].attn, "rotary", None) if cfg.n_layer else None
        # the blocks share one rotary embedding and one positions tensor: the angles once
        shared = rotary.shared_angles() if isinstance(rotary, RotaryEmbedding) else nullcontext()
        with shared:
            for i, block in enumerate(self.transformer.h):
                layer_cache = None if cache is None else cache.layers[i]
                if checkpointing and layer_cache is None:
                    x = checkpoint(
                        block, x, mask, None, rope_positions, head_masks[i], block_mask,
                        use_reentrant=False,
                    )  # fmt: skip
                else:
                    x = block(x, mask, layer_cache, rope_positions, head_masks[i], block_mask)
        x = self.transformer.ln_f(x)
        # logits = LN_f(h_L) W_eᵀ   (the output projection is the token embedding, tied)
        return self.lm_head(x)  # (B, T, vocab_size); soft-capped with logit_softcap (Gemma 2)

    def _inputs(
        self,
        input_ids: torch.Tensor,
        keep: torch.Tensor | None,
        positions: torch.Tensor | None,
        cache: ModelCache | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, Literal[False] | None]:
        """The positions, the mask (padding, a per-row pattern, ALiBi) and the block layout of
        a call over a growing cache (or none).

        Shape:
            input_ids ``(B, T)``; keep ``(B, T_past + T)``; positions ``(B, T)``/``(T,)``; mask
            broadcastable to ``(B, H, T, T_past + T)``.
        """
        cfg = self.config
        t = input_ids.shape[1]
        past = 0 if cache is None else cache.next_position  # a sink cache: its place
        padding = None
        if keep is not None:
            padding = keep[:, None, None, :]  # (B, 1, 1, T_past + T), True = attend
            if positions is None:
                # left padding: a token's position counts only the real tokens before it
                positions = (keep.long().cumsum(-1) - 1).clamp(min=0)[:, past:]  # (B, T)
        if positions is None and cfg.positions != "alibi":
            positions = torch.arange(past, past + t, device=input_ids.device)  # (T,)
        block_mask: Literal[False] | None = None  # the layers' own pattern, cropped to T_past + T
        if padding is not None and keep is not None:
            # a pattern read at absolute positions (BigBird's blocks) under left padding: read
            # at each row's token positions (as the position ids), not at the slots, and the
            # layers' own pattern off for this call
            pattern = cfg.attention.padded_mask(self._site, keep, past)
            if pattern is not None:
                padding = padding & pattern[:, None]  # (B, 1, T, T_past + T)
                block_mask = False
        mask: torch.Tensor | None = padding
        if cfg.positions == "alibi":
            # ALiBi (Press et al. 2022): scores get −m_h · (i − j); future keys are hidden by is_causal
            bias = alibi_bias(cfg.n_head, t, past + t, device=input_ids.device)  # (H, T, T_all)
            mask = masks.combine(bias, padding)
        return positions, mask, block_mask

    def _static_inputs(
        self, keep: torch.Tensor | None, positions: torch.Tensor | None, cache: StaticModelCache
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The positions and the mask of a call over a static cache, read from its slot tensor
        ``s`` (no Python int that changes per step: a traced step is the same graph every
        token): the padding over the ``C`` slots (the caller's mask, True beyond it), positions
        ``s`` or, under left padding, the real tokens before each slot, and ALiBi's
        ``−m_h · (s_i − j)``. The cache's mask adds the causal rule and the window.

        Shape:
            keep ``(B, T_past + T)`` or ``(B, C)``; positions ``(B, T)``/``(T,)``; mask
            broadcastable to ``(B, H, T, C)``.
        """
        cfg, slots, cap = self.config, cache.slots, cache.capacity
        padding = None
        if keep is not None:
            keep = F.pad(keep, (0, cap - keep.shape[-1]), value=True)  # (B, C)
            padding = keep[:, None, None, :]  # (B, 1, 1, C)
            if positions is None:
                # left padding: a token's position counts only the real tokens before it
                positions = (keep.long().cumsum(-1) - 1).clamp(min=0).index_select(1, slots)
        if positions is None and cfg.positions != "alibi":
            positions = slots  # (T,)
        if cfg.positions != "alibi":
            return positions, padding
        bias = alibi_bias(cfg.n_head, slots.shape[0], cap, device=slots.device, slots=slots)
        return positions, masks.combine(bias, padding)  # (B?, H, T, C)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Next-token cross-entropy, in fp32:

            L = −(1/N) Σ_{t : y_{t+1} ≠ −100} log softmax(logits_t)[y_{t+1}]

        Args:
            logits: ``(B, T, vocab_size)``.
            labels: ``(B, T)``; shifted here, ``-100`` ignored.

        Returns:
            the mean loss, a scalar (NaN when every label is ignored, as in PyTorch).

        Shape:
            logits ``(B, T, vocab_size)``; labels ``(B, T)``; loss ``()``.
        """
        check_tensor("labels", labels)
        if labels.shape != logits.shape[:2]:
            raise ArgumentError(
                f"labels must have the shape of input_ids (B, T) = {shape_str(logits.shape[:2])}, "
                f"got {shape_str(labels.shape)}"
            )
        if labels.is_floating_point() or labels.dtype == torch.bool:
            raise ArgumentTypeError(f"labels must be integer token ids, got dtype {labels.dtype}")
        targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)  # (B, T): y_{t+1}
        return F.cross_entropy(
            logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX
        )

    # -- decoding --

    def new_cache(
        self,
        batch: int,
        capacity: int,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        sinks: int | Sequence[int] | None = None,
        window: int | None = None,
        static: bool = False,
    ) -> ModelCache:
        """An empty cache for decoding: one per block, made by the block's attention layer.

        Args:
            batch: batch size ``B``.
            capacity: the most positions it holds (prompt + new tokens).
            dtype: default the autocast dtype when autocast is on for the model's device, else
                the parameters' dtype.
            device: default the parameters' device.
            sinks: with ``window``, a sink cache per block instead (StreamingLLM, Xiao et al.
                2023; :class:`~attnlab.nn.kv_cache.KVCache` with ``sinks``): the first ``sinks``
                positions and the last ``window``, positions within the cache, so a
                full-attention model streams past ``n_positions``. ``0`` keeps no sink. One
                per batch row (rotary models): each row keeps its own, e.g. ``(0, 4)`` streams a
                window cache and a sink cache as one batch.
            window: the recent positions a sink cache keeps (with ``sinks``).
            static: a :class:`~attnlab.nn.static_cache.StaticModelCache` instead: ``capacity``
                slots per block written at a slot tensor, the cache compiled decoding traces
                (for a kind whose spec ``decodes_statically``).

        Returns:
            a :class:`~attnlab.nn.kv_cache.ModelCache` of the layers' own caches (each
            attention layer's ``new_cache``): ``2 · n_layer · B · H_kv · capacity · d_head``
            numbers for full attention; rolling caches of ``min(capacity, window)`` positions
            under a sliding window (the causal window never reads further back); for Performer
            attention one :class:`~attnlab.nn.kv_cache.PerformerState` per block: the running
            sums ``S``, ``z`` of causal FAVOR+, ``n_layer · B · H_kv · (m · (d_head + 1) + 1)``
            numbers whatever the length, each step ``O(1)``, kept in float32 at least. BigBird
            keeps every position (its global blocks are seen by every later token).
        """
        check_positive_int("batch", batch)
        check_positive_int("capacity", capacity)
        p = self.transformer.wte.weight
        where = p.device if device is None else torch.device(device)
        if dtype is None:
            dtype = p.dtype
            if torch.is_autocast_enabled(where.type):
                dtype = torch.get_autocast_dtype(where.type)
        if static:
            return self._static_cache(batch, capacity, dtype, where)
        if sinks is not None or window is not None:
            return self._sink_cache(batch, capacity, dtype, where, sinks, window)
        # each layer makes its own: a KV cache (rolling under a causal window), FAVOR+'s running
        # sums, or what a new kind keeps; a tensor-parallel rank's layer holds H_kv / N heads
        return ModelCache(
            [
                cast(GPTBlock, block).attn.new_cache(batch, capacity, dtype=dtype, device=where)
                for block in self.transformer.h
            ]
        )

    def _static_cache(
        self, batch: int, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> StaticModelCache:
        """:meth:`new_cache` with ``static=True``: a static cache per block, sharing one slot
        tensor."""
        if not self.config.attention.decodes_statically:
            raise ArgumentError(
                f"attention {self.config.attention.name!r} cannot decode over a static cache"
            )
        slots = StaticSlots(capacity, device)
        layers = []
        for block in self.transformer.h:
            attn = cast(GPTBlock, block).attn
            layers.append(
                StaticKVCache(
                    batch, attn.num_kv_heads, capacity, attn.d_head, dtype=dtype, device=device,
                    slots=slots,
                )
            )  # fmt: skip
        return StaticModelCache(layers, slots)

    def _sink_cache(
        self,
        batch: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
        sinks: int | Sequence[int] | None,
        window: int | None,
    ) -> ModelCache:
        """:meth:`new_cache` with ``sinks``/``window``: a sink cache per block, for full
        attention only (a window or a block layout already decides what a query sees)."""
        if sinks is None or window is None:
            raise ArgumentError(
                f"a sink cache needs both sinks and window, got sinks={sinks!r}, window={window!r}"
            )
        if self.config.attention.name != "full":
            raise ArgumentError(
                f"a sink cache is for full attention, the model has {self.config.attention.name!r}"
            )
        rows = check_sink_rows(sinks, batch)
        if len(set(rows)) > 1 and self.config.positions != "rope":
            raise ArgumentError(
                f"sinks per row {tuple(rows)} need rotary positions (a row's places count "
                f"only its own keys), the model has positions={self.config.positions!r}"
            )
        most = max(rows)
        if window + most >= self.config.n_positions and self.config.positions == "learned":
            raise ArgumentError(
                f"sinks + window = {most + window} must leave room in the position table "
                f"(n_positions = {self.config.n_positions}) for the new tokens"
            )
        layers, shared = [], SinkPlaces()  # a step's places: computed once, read by every layer
        for block in self.transformer.h:
            attn = cast(GPTBlock, block).attn
            cache = SinkKVCache(
                batch, attn.num_kv_heads, capacity, attn.d_head, dtype=dtype, device=device,
                window=window, sinks=sinks, shared=shared,
            )  # fmt: skip
            attn.check_cache(cache)
            layers.append(cache)
        return ModelCache(layers)

    # -- Hugging Face interop --

    @classmethod
    def from_hf(cls, model_or_directory: PreTrainedModel | str | Path) -> GPT:
        """A GPT with the weights of a ``transformers`` causal LM of a known family (GPT-2, Llama,
        Mistral, Qwen2, NeoX), or of one saved in a local directory (never downloaded). See
        :func:`attnlab.models.hf.from_hf`.

        Args:
            model_or_directory: a ``GPT2LMHeadModel``, or a directory holding ``config.json`` and
                ``model.safetensors`` (as ``save_pretrained`` writes it).

        Returns:
            A new :class:`GPT` with the same configuration and weights (same logits).
        """
        from attnlab.models.hf import from_hf

        return from_hf(model_or_directory)

    def to_hf(self, *, attn_implementation: str = "sdpa") -> PreTrainedModel:
        """This model's weights in its family's ``transformers`` class (``GPT2LMHeadModel``,
        ``LlamaForCausalLM``, ...). See :func:`attnlab.models.hf.to_hf`.

        Args:
            attn_implementation: Hugging Face's attention implementation (``"sdpa"`` or
                ``"eager"``). Default ``"sdpa"``.

        Returns:
            The ``transformers`` model with this model's configuration and weights.
        """
        from attnlab.models.hf import to_hf

        return to_hf(self, attn_implementation=attn_implementation)

    def num_parameters(self, *, exclude_embeddings: bool = False) -> int:
        """Number of parameters (the tied ``lm_head`` counted once); optionally without the
        position and token embeddings.

        Args:
            exclude_embeddings: leave out ``wte`` and ``wpe``. Default False.

        Returns:
            The count.
        """
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.transformer.wte.weight.numel()
            if self.transformer.wpe is not None:
                n -= self.transformer.wpe.weight.numel()
        return n

    # -- checks --

    def _check_input_ids(self, input_ids: object) -> tuple[int, int]:
        ids = check_tensor("input_ids", input_ids)
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ArgumentTypeError(f"input_ids must be integer token ids, got dtype {ids.dtype}")
        if ids.dim() != 2 or ids.shape[1] == 0:
            raise ArgumentError(
                f"input_ids must have shape (B, T) with T >= 1, got {shape_str(ids.shape)}"
            )
        # the range is read back on the CPU only: on an accelerator it would be a host
        # synchronisation in every decoding step (an id out of range fails in the embedding there)
        if ids.numel() and ids.device.type == "cpu":
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= self.config.vocab_size:
                bad = hi if hi >= self.config.vocab_size else lo
                raise ArgumentError(
                    f"input_ids must lie in [0, vocab_size = {self.config.vocab_size}), got token id {bad}"
                )
        return ids.shape[0], ids.shape[1]

    def _check_cache(self, cache: object, batch: int) -> int:
        if cache is None:
            return 0
        if isinstance(cache, ModelCache) and cache.recomputes:
            cache = cast(RecomputeCache, cache)
            if cache.tokens.shape[0] != batch:
                raise ArgumentError(
                    f"cache was made for batch {cache.tokens.shape[0]}, input_ids has batch {batch}"
                )
            return cache.length
        if not isinstance(cache, ModelCache):
            raise ArgumentTypeError(
                f"cache must be a ModelCache (see GPT.new_cache), got {type(cache).__name__}"
            )
        if len(cache.layers) != self.config.n_layer:
            raise ArgumentError(
                f"cache has {len(cache.layers)} layers, the model n_layer = {self.config.n_layer}"
            )
        for block, layer_cache in zip(self.transformer.h, cache.layers):
            cast(GPTBlock, block).attn.check_cache(layer_cache)
        if cache.layers[0].batch != batch:
            raise ArgumentError(
                f"cache was made for batch {cache.layers[0].batch}, input_ids has batch {batch}"
            )
        return cache.next_position

    @staticmethod
    def _check_attention_mask(mask: object, batch: int, total: int) -> torch.Tensor | None:
        if mask is None:
            return None
        mask = check_tensor("attention_mask", mask)
        if mask.is_floating_point() or mask.is_complex():
            raise ArgumentTypeError(
                f"attention_mask must be 0/1 integers or bool (1 = real token), got dtype {mask.dtype}"
            )
        if mask.shape != (batch, total):
            raise ArgumentError(
                f"attention_mask must have shape (B, T_past + T) = ({batch}, {total}), "
                f"got {shape_str(mask.shape)}"
            )
        return mask.bool()

    def _check_position_ids(self, position_ids: object, batch: int, t: int) -> torch.Tensor:
        pos = check_tensor("position_ids", position_ids)
        if pos.is_floating_point() or pos.dtype == torch.bool:
            raise ArgumentTypeError(f"position_ids must be integers, got dtype {pos.dtype}")
        if pos.dim() == 2 and pos.shape[0] == 1:
            pos = pos[0]
        if not (pos.shape == (t,) or pos.shape == (batch, t)):
            raise ArgumentError(
                f"position_ids must have shape (B, T) = ({batch}, {t}) or (T,) = ({t},), "
                f"got {shape_str(pos.shape)}"
            )
        limit = self.config.n_positions
        if int(pos.min()) < 0 or int(pos.max()) >= limit:
            raise ArgumentError(
                f"positions must lie in [0, {limit}) (the position table's length, n_positions = "
                f"{limit}), got values from {int(pos.min())} up to {int(pos.max())}"
            )
        return pos
