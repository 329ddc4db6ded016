"""Context (sequence) parallelism for a model: its attention layers turned into ring attention.

With ``C`` context-parallel ranks every rank holds ``T / C`` tokens of each sequence — its part
in the ``"zigzag"`` (default) or ``"contiguous"`` layout of
:mod:`attnlab.distributed.ring_schedule` — and runs the whole model on them. Everything a
Transformer does is per token except attention, so only attention needs the other ranks::

    embeddings, LayerNorm, MLP, LM head, loss   per token: on the local tokens as they are
    positional embeddings (learned, rotary)     at each local token's *global* position
    attention                                   ring_attention over the context-parallel group

The per-token parts read position ``p`` where the whole sequence has it
(:func:`~attnlab.distributed.ring_schedule.sequence_positions`), so a token's embedding is the
one it has in one process; attention is :func:`~attnlab.distributed.ring.ring_attention`, exact
over the whole sequence. The loss of the local tokens is the local part of the sum over the
sequence, and the gradient of a parameter is the *sum* over the ranks of their gradients (the
ring's backward pass already carries every key's and value's gradient home to its rank), which
the trainer's strategy (:class:`~attnlab.distributed.mesh.MeshStrategy`) all-reduces.

:func:`context_parallelize` switches a GPT's self-attention layers to
:class:`ContextParallelAttention` (the same class switch as tensor parallelism's, and composable
with it: a layer that holds ``H/N`` heads sends those heads around the ring), and
:class:`ContextParallelModel` is the module the loss function calls: it feeds the model its local
tokens with their global positions.

Limits, refused with a ``ValueError``: GPT with ``attention="full"`` and learned or rotary
positions (ALiBi's bias and the sliding, BigBird and Performer patterns are built for one
process's whole sequence); no attention dropout (``GPTConfig.dropout`` applies to the attention
weights); no padding mask, KV cache or returned weights in the model's forward pass (training
reads none of them).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from attnlab._checks import check_choice, check_positive_int
from attnlab.distributed.ring import ring_attention
from attnlab.distributed.ring_schedule import LAYOUTS, sequence_positions
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.gpt import GPT, GPTSelfAttention
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.multihead_call import AttentionCall

__all__ = ["ContextParallelAttention", "ContextParallelModel", "context_parallelize"]


class ContextParallelAttention(MultiHeadAttention):
    """A self-attention layer whose heads attend over a sequence spread across processes.

    Not constructed directly: :func:`context_parallelize` switches a built layer's class to a
    subclass of this one and of the layer's own class, so the projections (and a tensor-parallel
    layer's share of the heads) are the layer's; only the kernel call
    (:meth:`~attnlab.nn.multihead.MultiHeadAttention.attend_heads`) becomes
    :func:`~attnlab.distributed.ring.ring_attention` over :attr:`cp_group`.

    Attributes:
        cp_group: the process group of the ring (the context-parallel ranks).
        cp_layout: which tokens each rank holds, ``"zigzag"`` or ``"contiguous"``.

    Shape:
        as the layer: query ``(B, T / C, d_model)`` → ``(B, T / C, d_model)``.
    """

    cp_group: Any
    cp_layout: str

    def __init__(self) -> None:
        raise ArgumentTypeError(
            "ContextParallelAttention is not built directly: use context_parallelize(model, "
            "group) on a built model"
        )

    def attend_heads(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        call: AttentionCall,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Causal ring attention of this rank's queries over every rank's keys and values.

        Args:
            q: this rank's queries, heads split, rotated at their global positions.
            k: this rank's keys.
            v: this rank's values.
            call: the call's options: causal self-attention without masks, windows, block
                layouts, a cache or weights (the ring applies the causal rule over the whole
                sequence).

        Returns:
            ``z`` ``(B, H, T / C, d_head)``.

        Raises:
            ValueError: a mask, window or block layout, non-causal attention, dropout, a KV cache
                or weights were asked for.

        Shape:
            q ``(B, H, T / C, d_head)``; k, v ``(B, H_kv, T / C, d_head)``.
        """
        if call.need_weights or self.hook_weights.active:
            raise ArgumentError(
                "need_weights=True under context parallelism: ring attention never forms the "
                "weights; capture attention with the whole model in one process"
            )
        dropout_p = self.dropout if self.training else 0.0
        if dropout_p > 0:
            raise ArgumentError(f"ring attention has no attention dropout, got dropout={dropout_p}")
        layout = call.block_mask if call.block_mask is not None else self.block_mask
        masked = call.mask is not None
        windowed = call.window is not None or layout not in (None, False)
        if masked or windowed or not call.is_causal or call.cache is not None or k is None:
            raise ArgumentError(
                "context parallelism supports causal self-attention without masks, windows, "
                "block layouts or a KV cache; got "
                + (
                    "a padding or attention mask"
                    if masked
                    else "a window or block layout"
                    if windowed
                    else "non-causal attention or a cache"
                )
            )
        if k is None or v is None:  # unreachable: no cache, so every call projects K and V
            raise RuntimeError("keys and values were not projected")
        return ring_attention(
            q, k, v, is_causal=True, group=self.cp_group, layout=self.cp_layout,
            scale=self.d_head**-0.5,
        )  # fmt: skip


#: the class each layer class becomes (made on first use)
_CLASSES: dict[type[nn.Module], type[ContextParallelAttention]] = {}


def _context_parallel_class(cls: type[nn.Module]) -> type[ContextParallelAttention]:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(
            f"ContextParallel{cls.__name__.lstrip('_')}", (ContextParallelAttention, cls), {}
        )
    return _CLASSES[cls]


def check_context_parallel(model: nn.Module) -> GPT:
    """Raise unless ``model`` can run context parallel (see the module's limits).

    Args:
        model: the model.

    Returns:
        ``model``, as a GPT.

    Raises:
        TypeError: not a :class:`~attnlab.GPT`.
        ValueError: its attention pattern, positions or attention dropout do not allow it.
    """
    if not isinstance(model, GPT):
        raise ArgumentTypeError(
            f"context parallelism runs a GPT (a decoder over one long sequence), got "
            f"{type(model).__name__}"
        )
    cfg = model.config
    if cfg.attention.name != "full":
        raise ArgumentError(
            f"context parallelism needs attention='full' (ring attention), got "
            f"{cfg.attention.name!r}"
        )
    if cfg.positions == "alibi":
        raise ArgumentError(
            "context parallelism supports positions 'learned' or 'rope', got 'alibi' (its bias "
            "is built for the whole sequence on one process)"
        )
    layers = [m for m in model.modules() if isinstance(m, GPTSelfAttention)]
    if any(m.dropout > 0 for m in layers):
        raise ArgumentError(
            f"context parallelism: ring attention has no attention dropout, but the model's "
            f"dropout is {cfg.dropout} (GPTConfig.dropout applies to the attention weights); "
            f"train with dropout 0"
        )
    return model


def context_parallelize(model: nn.Module, group: Any, *, layout: str = "zigzag") -> GPT:
    """Make a GPT's self-attention layers ring attention over ``group`` (in place).

    Call it once, on every rank of ``group``, after moving the model to its device (and after
    :func:`~attnlab.distributed.tensor_parallel.parallelize` when both are used). Feed the
    result through :class:`ContextParallelModel`, which gives each rank its tokens' positions.

    Args:
        model: a :class:`~attnlab.GPT` (see the module's limits).
        group: the context-parallel process group (``None``: the default group).
        layout: ``"zigzag"`` (default; every rank does the same causal work) or
            ``"contiguous"``.

    Returns:
        ``model`` itself.

    Raises:
        TypeError: ``model`` is not a GPT.
        ValueError: the model cannot run context parallel, or ``layout`` is unknown.
    """
    check_choice("layout", layout, LAYOUTS)
    gpt = check_context_parallel(model)
    for module in gpt.modules():
        if isinstance(module, GPTSelfAttention) and not isinstance(
            module, ContextParallelAttention
        ):
            layer: nn.Module = module
            layer.__class__ = _context_parallel_class(type(module))
            cast(ContextParallelAttention, layer).cp_group = group
            cast(ContextParallelAttention, layer).cp_layout = layout
    return gpt


class ContextParallelModel(nn.Module):
    """The module a loss function calls under context parallelism: the model run on this rank's
    tokens at their global positions.

    Args:
        model: a GPT prepared by :func:`context_parallelize`.
        rank: this rank's place in the context-parallel group.
        world_size: the group's size ``C``.
        layout: the layout the batch was sharded in (as given to :func:`context_parallelize`).

    Shape:
        input_ids ``(B, T / C)`` (this rank's tokens, sharded with
        :func:`~attnlab.distributed.ring_schedule.shard_sequence`) → logits ``(B, T / C, V)``.
    """

    def __init__(self, model: GPT, rank: int, world_size: int, layout: str) -> None:
        super().__init__()
        self.module = model
        self.world_size = check_positive_int("world_size", world_size)
        self.rank = int(rank)
        self.layout = check_choice("layout", layout, LAYOUTS)

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        """The model's forward pass on this rank's tokens, at their global positions.

        Args:
            input_ids: this rank's tokens ``(B, T / C)``.
            **kwargs: passed to the model; ``attention_mask``, ``labels`` (shifted inside the
                model, across the ranks' chunks), ``position_ids`` and ``cache`` are refused.

        Returns:
            What the model returns (:class:`~attnlab.models.outputs.CausalLMOutput`).

        Raises:
            ValueError: a refused keyword argument.

        Shape:
            input_ids ``(B, T / C)``; logits ``(B, T / C, vocab_size)``.
        """
        refused = sorted(
            k
            for k in ("attention_mask", "labels", "position_ids", "cache")
            if kwargs.get(k) is not None
        )
        if refused:
            raise ArgumentError(
                f"under context parallelism the model takes each rank's tokens only, not "
                f"{', '.join(refused)} (shift the targets before sharding the sequence)"
            )
        positions = sequence_positions(
            input_ids.shape[-1] * self.world_size, rank=self.rank, world_size=self.world_size,
            layout=self.layout, device=input_ids.device,
        )  # fmt: skip
        return self.module(input_ids, position_ids=positions, **kwargs)
