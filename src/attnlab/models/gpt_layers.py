"""The parts of a GPT: its self-attention layers under GPT-2's names, the MLP, the block, and
the recomputing decoding reference (:class:`RecomputeCache`).

The config's attention spec builds each block's attention
(:meth:`~attnlab.nn.kinds.AttentionSpec.build`) at the GPT's :func:`attention_site`: causal,
over ``n_positions`` tokens, with GPT-2's ``c_attn``/``c_proj`` names (:func:`gpt_layer_class`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.errors import ArgumentError
from attnlab.models.config import GPTConfig
from attnlab.nn.block_layout import BlockLayout
from attnlab.nn.hooks import HookPoint
from attnlab.nn.kinds import AttentionSite
from attnlab.nn.kv_cache import LayerCache, ModelCache
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.norms import RMSNorm
from attnlab.nn.performer import PerformerAttention
from attnlab.nn.positional import RotaryEmbedding

__all__ = [
    "GPTMLP",
    "BlockParts",
    "GPTBlock",
    "GPTPerformerAttention",
    "GPTProjections",
    "GPTSelfAttention",
    "LMHead",
    "RecomputeCache",
    "attention_site",
    "block_parts",
    "gpt_layer_class",
]


class GPTProjections:
    """GPT-2's fused projections ``c_attn`` and ``c_proj`` (and residual dropout), for any
    :class:`~attnlab.nn.multihead.MultiHeadAttention` subclass it is mixed into (first):
    ``class GPTSelfAttention(GPTProjections, MultiHeadAttention)``.

    Args:
        *args: the base class's positional arguments.
        resid_dropout: dropout on what the layer adds to the residual stream. Default 0.
        proj_bias: a bias on ``c_proj``; ``None`` (default) means the layer's ``bias`` (which
            ``c_attn`` has): Qwen2 has query/key/value biases and none on the output.
        score_scale: the score scale (``None``: ``1 / √d_head``).
        softcap: soft-capping of the scores, ``c · tanh(s / c)``, or ``None``.
        **kwargs: the base class's keyword arguments.
    """

    d_model: int
    num_kv_heads: int
    d_head: int
    c_attn: nn.Linear
    c_proj: nn.Linear
    resid_dropout: nn.Dropout

    def __init__(
        self,
        *args: Any,
        resid_dropout: float = 0.0,
        proj_bias: bool | None = None,
        score_scale: float | None = None,
        softcap: float | None = None,
        **kwargs: Any,
    ) -> None:
        object.__setattr__(self, "_proj_bias", proj_bias)  # read by _build_projections
        super().__init__(*args, **kwargs)
        self.resid_dropout = nn.Dropout(resid_dropout)
        if score_scale is not None or softcap is not None:
            # the scale and the cap act in MultiHeadAttention's softmax call: a kind that
            # attends otherwise (its own attend_heads: FAVOR+) would ignore them
            if getattr(type(self), "attend_heads", None) is not MultiHeadAttention.attend_heads:
                raise ArgumentError(
                    f"attn_scale and attn_softcap need softmax attention (full, sliding, a "
                    f"block layout), got the layer {type(self).__name__}"
                )
            self.softcap = softcap
            if score_scale is not None:
                self.score_scale = score_scale

    def _build_projections(self, bias: bool, device: object, dtype: torch.dtype | None) -> None:
        kv = self.num_kv_heads * self.d_head
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        proj_bias = bias if self.__dict__["_proj_bias"] is None else self.__dict__["_proj_bias"]
        self.c_attn = nn.Linear(self.d_model, self.d_model + 2 * kv, bias=bias, **factory)
        self.c_proj = nn.Linear(self.d_model, self.d_model, bias=proj_bias, **factory)

    def qkv_parameters(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The fused projection's weight and bias, ``c_attn``'s.

        Returns:
            ``(weight, bias)``; ``bias`` is ``None`` when the config has no biases.

        Shape:
            weight ``(n_embd + 2 · H_kv · d_head, n_embd)``; bias ``(n_embd + 2 · H_kv · d_head,)``.
        """
        return self.c_attn.weight, self.c_attn.bias

    def fused_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """``[Q | K | V] = x W_attn + b_attn``: the three projections in one matmul.

        Args:
            x: the block's input after ``ln_1``.

        Returns:
            Q, K and V side by side along the last dimension.

        Shape:
            x ``(B, T, n_embd)`` → ``(B, T, n_embd + 2 · H_kv · d_head)``.
        """
        return self.c_attn(x)

    def project_out(self, x: torch.Tensor) -> torch.Tensor:
        """The output projection ``c_proj`` of the concatenated heads, then residual dropout.

        Args:
            x: the heads' outputs, concatenated.

        Returns:
            What the layer adds to the residual stream.

        Shape:
            ``(B, T, n_embd)`` → ``(B, T, n_embd)``.
        """
        return _dropout(self.resid_dropout, self.c_proj(x))


class GPTSelfAttention(GPTProjections, MultiHeadAttention):
    """Causal self-attention with GPT-2's fused projections ``c_attn`` and ``c_proj``.

    A :class:`~attnlab.nn.multihead.MultiHeadAttention` (hooks, KV cache, GQA, rotary, window
    and block layout work as there) whose weights are stored as GPT-2 stores them:

        [Q | K | V] = x W_attn + b_attn          (c_attn: d_model → d_model + 2 · H_kv · d_head)
        out = Dropout(Concat(heads) W_proj + b_proj)    (c_proj: d_model → d_model)

    The config's attention spec builds it (:meth:`~attnlab.nn.kinds.AttentionSpec.build`, with
    :func:`gpt_layer_class` giving the names), with the sliding window ``(w, 0)`` for
    :class:`~attnlab.nn.kinds.SlidingSpec` and the causal layout for
    :class:`~attnlab.nn.kinds.BigBirdSpec`.

    Args:
        *args: as :class:`~attnlab.nn.multihead.MultiHeadAttention` (``d_model``, ``num_heads``).
        resid_dropout: dropout on the output. Default 0.
        proj_bias: a bias on ``c_proj``; ``None`` means the layer's ``bias``.
        score_scale: the score scale (``None``: ``1 / √d_head``).
        softcap: soft-capping of the scores, ``c · tanh(s / c)``, or ``None``.
        **kwargs: as :class:`~attnlab.nn.multihead.MultiHeadAttention`.

    Shape:
        as :class:`~attnlab.nn.multihead.MultiHeadAttention`: x ``(B, T, n_embd)`` → ``(B, T, n_embd)``.
    """

    causal = True  # forward hides future keys unless is_causal=False is passed


class GPTPerformerAttention(GPTProjections, PerformerAttention):
    """Causal FAVOR+ self-attention (Choromanski et al. 2021) with GPT-2's ``c_attn``/``c_proj``.

    A :class:`~attnlab.nn.performer.PerformerAttention` (random features ``features``, hook
    points and head mask as there) whose projections are stored as :class:`GPTSelfAttention`
    stores them, so that a checkpoint's names are GPT-2's. It keeps no keys or values: it
    decodes from a :class:`~attnlab.nn.kv_cache.PerformerState` (running sums, ``O(1)`` per
    token, its :meth:`~attnlab.nn.performer.PerformerAttention.new_cache`).

    Args:
        *args: as :class:`~attnlab.nn.performer.PerformerAttention`.
        resid_dropout: dropout on the output. Default 0.
        proj_bias: a bias on ``c_proj``; ``None`` means the layer's ``bias``.
        score_scale: refused (FAVOR+ has no score matrix to scale); ``None``.
        softcap: refused likewise; ``None``.
        **kwargs: as :class:`~attnlab.nn.performer.PerformerAttention`.

    Shape:
        x ``(B, T, n_embd)`` → ``(B, T, n_embd)``; mask broadcastable to ``(B, H, 1, T)`` (keys).
    """


#: the GPT-2-named class of each attention class (others are made on first use)
_GPT_CLASSES: dict[type, type] = {
    MultiHeadAttention: GPTSelfAttention,
    PerformerAttention: GPTPerformerAttention,
}


def gpt_layer_class(base: type) -> type:
    """The class with GPT-2's projection names (``c_attn``, ``c_proj``, residual dropout) for an
    attention class: :class:`GPTSelfAttention` for
    :class:`~attnlab.nn.multihead.MultiHeadAttention`, :class:`GPTPerformerAttention` for
    :class:`~attnlab.nn.performer.PerformerAttention`, and for another kind's class (a new
    attention kind) ``GPT<Name>`` made once, :class:`GPTProjections` mixed in first.

    Args:
        base: a :class:`~attnlab.nn.multihead.MultiHeadAttention` subclass.

    Returns:
        The class a GPT builds.
    """
    made = _GPT_CLASSES.get(base)
    if made is None:
        attrs = {"__module__": base.__module__, "__doc__": base.__doc__, "causal": True}
        made = _GPT_CLASSES[base] = type(f"GPT{base.__name__}", (GPTProjections, base), attrs)
    return made


def attention_site(config: GPTConfig, rotary: RotaryEmbedding | None = None) -> AttentionSite:
    """The place of a GPT's self-attention layers, as the config's attention spec builds them:
    causal, over ``n_positions`` tokens, with GPT-2's projection names.

    Args:
        config: the model's :class:`~attnlab.models.config.GPTConfig`.
        rotary: the shared :class:`~attnlab.nn.positional.RotaryEmbedding`, or ``None``.

    Returns:
        The :class:`~attnlab.nn.kinds.AttentionSite`.
    """
    return AttentionSite(
        d_model=config.n_embd,
        num_heads=config.n_head,
        num_kv_heads=config.num_kv_heads,
        causal=True,
        max_len=config.n_positions,
        dropout=config.dropout,
        bias=config.bias_of("qkv"),
        backend=config.backend,
        positions=config.positions,
        rotary=rotary,
        layer_class=gpt_layer_class,
        layer_kwargs={
            "resid_dropout": config.dropout,
            "proj_bias": config.bias_of("proj"),
            "score_scale": config.attn_scale,
            "softcap": config.attn_softcap,
        },
    )


class RecomputeCache(ModelCache):
    """A decoding "cache" that keeps no keys or values, only the token ids seen so far: each
    step runs the whole prefix again and returns the new positions' logits.

    ``O(T²)`` work to decode ``T`` tokens with a linear-time layer (``O(T)`` each step). Any
    :class:`GPT` accepts it: the reference that cached decoding is checked against, and the
    baseline of the Performer's running state (:meth:`GPT.new_cache` gives a
    :class:`~attnlab.nn.kv_cache.PerformerState` per layer for Performer attention,
    ``O(1)`` per token).

    Args:
        batch: rows ``B``.
        capacity: the most positions it holds (prompt + new tokens).
        device: where to keep the ids.

    Attributes:
        tokens: ``(B, capacity)`` the ids so far (zeros beyond ``length``).

    Shape:
        tokens ``(B, capacity)``.
    """

    recomputes = True

    def __init__(self, batch: int, capacity: int, device: torch.device | str | None = None) -> None:
        super().__init__([])
        self.tokens = torch.zeros(batch, capacity, dtype=torch.long, device=device)
        self._length = 0

    @property
    def length(self) -> int:
        """Positions processed so far (the next token's position)."""
        return self._length

    @property
    def capacity(self) -> int:
        """The most positions it holds."""
        return self.tokens.shape[1]

    def extend(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Append new ids and return every id so far.

        Args:
            input_ids: the new ids.

        Returns:
            The ids of the past and the new positions (a view).

        Raises:
            ValueError: the capacity would be exceeded, or the batch differs.

        Shape:
            input_ids ``(B, T)`` → ``(B, T_past + T)``.
        """
        b, t = input_ids.shape
        if b != self.tokens.shape[0]:
            raise ArgumentError(
                f"cache was made for batch {self.tokens.shape[0]}, input_ids has batch {b}"
            )
        if self._length + t > self.capacity:
            raise ArgumentError(
                f"cache capacity exceeded: it holds {self._length} of {self.capacity} positions "
                f"and {t} more were added; make the cache larger (max_length)"
            )
        self.tokens[:, self._length : self._length + t] = input_ids
        self._length += t
        return self.tokens[:, : self._length]

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search): row ``b`` becomes old row ``index[b]``.

        Args:
            index: integer indices of the rows to keep; may repeat rows.

        Shape:
            index ``(B_new,)``; ``tokens`` becomes ``(B_new, capacity)``.
        """
        self.tokens = self.tokens.index_select(0, index)

    def nbytes(self) -> int:
        """Bytes held: the token ids only (no keys or values).

        Returns:
            The size of ``tokens`` in bytes.
        """
        return self.tokens.nbytes


#: the MLP nonlinearities by the config's ``activation`` name
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    # GELU(u) ≈ ½ u (1 + tanh(√(2/π) (u + 0.044715 u³))), GPT-2's gelu_new
    "gelu_tanh": lambda u: F.gelu(u, approximate="tanh"),
    "gelu": F.gelu,  # GELU(u) = u Φ(u), exact (GPT-NeoX)
    "silu": F.silu,  # SiLU(u) = u σ(u) (Llama's SwiGLU gate)
    "relu": F.relu,
}


def _dropout(module: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``, or ``x`` itself where the dropout would return it unchanged (in evaluation,
    or ``p = 0``) and no hook listens on the module: a decoding step passes two of them a layer,
    each a call into PyTorch for nothing.

    Args:
        module: the dropout module.
        x: its input.

    Returns:
        ``module(x)``.

    Shape:
        any; the output has the input's shape.
    """
    if (module.training and module.p) or module._forward_hooks or module._forward_pre_hooks:
        return cast(torch.Tensor, module(x))
    return x


class GPTMLP(nn.Module):
    """The position-wise feed-forward network of a decoder block: GPT-2's (Radford et al. 2019;
    GELU, Hendrycks & Gimpel 2016) or a gated one (Shazeer 2020; SwiGLU in Llama, Mistral,
    Qwen2), as the config says:

        standard:  MLP(x) = act(x W_fc + b_fc) W_proj + b_proj
        gated:     MLP(x) = (act(x W_gate) ⊙ (x W_fc)) W_proj

    Args:
        config: the model's :class:`~attnlab.models.config.GPTConfig`: the hidden width
            ``ff_width``, ``activation``, ``mlp`` (``"standard"`` or ``"gated"``), biases
            ``bias_of("mlp")``, dropout.

    Shape:
        ``(B, T, n_embd)`` → ``(B, T, n_embd)``.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        d, d_ff, bias = config.n_embd, config.ff_width, config.bias_of("mlp")
        self.act = _ACTIVATIONS[config.activation]
        self.c_gate = nn.Linear(d, d_ff, bias=bias) if config.mlp == "gated" else None
        self.c_fc = nn.Linear(d, d_ff, bias=bias)
        self.c_proj = nn.Linear(d_ff, d, bias=bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP, then dropout.

        Args:
            x: the block's input after ``ln_2``.

        Returns:
            What the MLP adds to the residual stream.

        Shape:
            ``(B, T, n_embd)`` → ``(B, T, n_embd)``.
        """
        if self.c_gate is None:
            h = self.act(self.c_fc(x))  # act(x W_fc + b_fc): (B, T, d_ff)
        else:
            h = self.act(self.c_gate(x)) * self.c_fc(x)  # act(x W_gate) ⊙ x W_fc: (B, T, d_ff)
        return _dropout(self.dropout, self.c_proj(h))


class LMHead(nn.Linear):
    """The output projection ``z = h W_Uᵀ`` (no bias), soft-capped when the config says so
    (Gemma 2's ``final_logit_softcapping``): ``z = c · tanh(h W_Uᵀ / c)``. The cap is part of the
    head, so whatever reads the model's ``lm_head`` (the logit lens) gives the model's logits.

    Args:
        d_model: the model width.
        vocab_size: the vocabulary.
        softcap: ``c``, or ``None`` for none.

    Shape:
        ``(..., d_model)`` → ``(..., vocab_size)``.
    """

    def __init__(self, d_model: int, vocab_size: int, softcap: float | None = None) -> None:
        super().__init__(d_model, vocab_size, bias=False)
        self.softcap = softcap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits.

        Args:
            x: the final hidden states (after ``ln_f``).

        Returns:
            ``x W_Uᵀ``, soft-capped.

        Shape:
            ``(..., d_model)`` → ``(..., vocab_size)``.
        """
        z = super().forward(x)
        if self.softcap is None:
            return z
        return torch.tanh(z / self.softcap) * self.softcap  # z = c · tanh(z / c)


@dataclass(frozen=True)
class BlockParts:
    """What a decoder block is made of: one factory per part. The model-family dimension lives
    here, as the attention kind lives in the spec: the config chooses the parts
    (:func:`block_parts`: GPT-2's LayerNorm and GELU MLP, Llama's RMSNorm and SwiGLU, NeoX's
    parallel residual), and the block, its hook points and its forward stay one.

    Attributes:
        norm: makes a normalisation layer over ``d_model`` (``ln_1``, ``ln_2``).
        attention: makes the self-attention layer (the config's attention spec at the model's
            site).
        mlp: makes the position-wise feed-forward network, or ``None``: an attention-only
            block (no MLP, no ``ln_2``; ``hook_mlp_out`` never fires).
        parallel_residual: the attention and the MLP read the same residual stream and both
            add to it (GPT-NeoX), instead of one after the other.
        sandwich_norm: what the attention and the MLP add is normalised too (Gemma 2).
    """

    norm: Callable[[], nn.Module]
    attention: Callable[[], MultiHeadAttention]
    mlp: Callable[[], nn.Module] | None
    parallel_residual: bool = False
    sandwich_norm: bool = False


def block_parts(
    config: GPTConfig, rotary: RotaryEmbedding | None = None, layer: int = 0
) -> BlockParts:
    """The parts the config chooses: LayerNorm (biases as ``bias``) or
    :class:`~attnlab.nn.norms.RMSNorm`, with ``layer_norm_epsilon``; the layer's attention
    (:meth:`~attnlab.models.config.GPTConfig.attention_of`) at :func:`attention_site`; and
    :class:`GPTMLP`. GPT-2's by default.

    Args:
        config: the model's :class:`~attnlab.models.config.GPTConfig`.
        rotary: the shared :class:`~attnlab.nn.positional.RotaryEmbedding`, or ``None``.
        layer: the block's index (a layer of ``full_layers`` attends fully). Default 0.

    Returns:
        The :class:`BlockParts`.
    """
    site = attention_site(config, rotary)
    eps = config.layer_norm_epsilon

    def norm() -> nn.Module:
        if config.norm in ("rmsnorm", "rmsnorm_offset"):  # Gemma's gain is 1 + g
            return RMSNorm(config.n_embd, eps=eps, offset=float(config.norm == "rmsnorm_offset"))
        return nn.LayerNorm(config.n_embd, eps=eps, bias=config.bias_of("norm"))

    return BlockParts(
        norm=norm,
        attention=lambda: config.attention_of(layer).build(site),
        mlp=None if config.mlp == "none" else lambda: GPTMLP(config),
        parallel_residual=config.parallel_residual,
        sandwich_norm=config.sandwich_norm,
    )


class GPTBlock(nn.Module):
    """One pre-norm decoder block (GPT-2, §2.3):

        x = x + Attention(LN_1(x))
        x = x + MLP(LN_2(x))

    or, with a parallel residual (GPT-J, GPT-NeoX), ``x = x + Attention(LN_1(x)) + MLP(LN_2(x))``.

    Hook points: ``hook_resid_pre``, ``hook_attn_out``, ``hook_mlp_out``, ``hook_resid_post``
    (and those of ``attn``: ``hook_q``, ``hook_k``, ``hook_v``, ``hook_weights``, ``hook_z``).

    Args:
        parts: the factories of its parts (:func:`block_parts`).

    Shape:
        x ``(B, T, n_embd)`` → ``(B, T, n_embd)``; mask broadcastable to ``(B, H, T, T_past + T)``;
        head_mask ``(H,)`` or ``(B, H)`` (1 keeps a head, 0 removes its output).
    """

    def __init__(self, parts: BlockParts) -> None:
        super().__init__()
        self.ln_1 = parts.norm()
        self.attn = parts.attention()
        self.ln_2 = None if parts.mlp is None else parts.norm()
        self.mlp = None if parts.mlp is None else parts.mlp()
        self.parallel_residual = parts.parallel_residual
        # Gemma 2's sandwich: what the attention and the MLP add is normalised too
        self.ln_attn_out = parts.norm() if parts.sandwich_norm else None
        self.ln_mlp_out = parts.norm() if parts.sandwich_norm and parts.mlp else None
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        positions: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
        block_mask: BlockLayout | Literal[False] | None = None,
    ) -> torch.Tensor:
        """One block: causal self-attention, then the MLP, each added to the residual stream.

        Args:
            x: the residual stream.
            mask: padding and/or additive (ALiBi) mask, ``True = may attend``; the causal rule
                always applies on top.
            cache: this block's :class:`~attnlab.nn.kv_cache.KVCache` (a
                :class:`~attnlab.nn.kv_cache.PerformerState` for a Performer layer), or ``None``.
            positions: rotary position ids, or ``None``.
            head_mask: head mask (1 keeps a head, 0 removes its output), or ``None``.
            block_mask: the attention's block layout for this call: ``None`` (default) the
                layer's own, ``False`` none (``mask`` then holds the pattern, see
                :meth:`GPT.forward`), or a layout (see
                :meth:`~attnlab.nn.multihead.MultiHeadAttention.forward`).

        Returns:
            The residual stream after the block.

        Shape:
            x ``(B, T, n_embd)`` → ``(B, T, n_embd)``; mask broadcastable to
            ``(B, H, T, T_past + T)``; positions ``(B, T)`` or ``(T,)``; head_mask ``(H,)`` or
            ``(B, H)``.
        """
        x = self.hook_resid_pre(x)
        a = self.attn(
            self.ln_1(x),
            mask=mask,
            is_causal=True,
            cache=cache,
            positions=positions,
            head_mask=head_mask,
            check_positions=False,  # GPT.forward checked them once for every block
            block_mask=block_mask,
        )
        return self.hook_resid_post(self.add_to_stream(x, a))

    def add_to_stream(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The block's residual rule, once its attention has written ``a``: ``x + a``, then the
        MLP's ``+ MLP(LN_2(·))`` (sequential), or ``x + a + MLP(LN_2(x))`` (parallel), or
        nothing more (attention-only). Through ``hook_attn_out`` and ``hook_mlp_out``; the one
        rule :meth:`forward` and the compiled decoding step
        (:mod:`attnlab.decoding.compiled`) both follow.

        Args:
            x: the residual stream entering the block.
            a: what the block's attention adds to it.

        Returns:
            The residual stream after the block (before ``hook_resid_post``).

        Shape:
            x, a ``(B, T, n_embd)`` → ``(B, T, n_embd)``.
        """
        if self.ln_attn_out is not None:  # sandwich: x + LN(Attention(LN_1(x)))
            a = self.ln_attn_out(a)
        if self.mlp is None or self.ln_2 is None:  # attention-only
            return x + self.hook_attn_out(a)
        if self.parallel_residual:  # x + Attention(LN_1(x)) + MLP(LN_2(x))
            m = self.hook_mlp_out(self._mlp(self.ln_2(x)))
            return x + self.hook_attn_out(a) + m
        x = x + self.hook_attn_out(a)
        return x + self.hook_mlp_out(self._mlp(self.ln_2(x)))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP, and with a sandwich norm its norm (``ln_mlp_out``).

        Shape:
            ``(B, T, n_embd)`` → ``(B, T, n_embd)``.
        """
        m = cast(nn.Module, self.mlp)(x)
        return m if self.ln_mlp_out is None else self.ln_mlp_out(m)
