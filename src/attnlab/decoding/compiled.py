"""Compiled decoding: ``torch.compile`` of the model's own decoding step over a static cache.

gpt-fast's ``decode_one_token`` (PyTorch Labs, 2023) made one decoding step a single graph that
``torch.compile`` traces once and reuses for every token. A step over a growing KV cache is not
static (its keys grow by one, its length is a Python int that changes every step), so here the
step runs over a :class:`~attnlab.nn.static_cache.StaticModelCache` (fixed capacity, written at
a slot *tensor* from which :meth:`attnlab.GPT.decode_step` reads the mask, positions and ALiBi
distances). What is compiled is that step itself, no second copy of the model:
``torch.compile(_decode, fullgraph=True, dynamic=False)``, ``mode="reduce-overhead"`` (CUDA
graphs) on CUDA, the logits cloned out of the graph's output buffer. The host's bookkeeping
(:meth:`~attnlab.nn.static_cache.StaticSlots.begin`) runs before each call, outside the graph.

``_decode`` is one module-level function: dynamo keeps its graphs on its code object, so every
:func:`attnlab.generate` call reuses them, and nothing is stored on the model. The capacity is
rounded up to a multiple of 128 (at most ``n_positions``): nearby lengths share one graph. The
prompt runs eagerly through ``model.forward`` over the same static cache (the same ``update``,
slots ``arange(T)``): one path, nothing copied, and no graph per prompt length.

Whether a model can: its attention kind declares it
(:attr:`~attnlab.nn.kinds.base.AttentionSpec.decodes_statically`), no layer overrides
``attend_heads``, and it is a decoder-only GPT (:func:`static_unsupported` says why not, and
:func:`attnlab.generate` logs it and decodes eagerly).
"""

from __future__ import annotations

from typing import Any, cast

import torch

from attnlab.decoding.steppers import CausalStepper
from attnlab.models.gpt import GPT
from attnlab.models.gpt_layers import GPTBlock
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.static_cache import StaticModelCache

__all__ = ["CompiledStepper", "static_capacity", "static_unsupported"]

#: the capacity of a static cache is rounded up to a multiple of this (fewer distinct graphs)
CAPACITY_MULTIPLE = 128
#: graphs ``_decode`` may hold (one per model, batch, capacity, dtype, padding): dynamo's default
#: 8 would be a hard error under ``fullgraph=True``
RECOMPILE_LIMIT = 64


def static_unsupported(model: Any) -> str | None:
    """Why ``model`` cannot decode over a static cache with a compiled step, or ``None``.

    Args:
        model: the model :func:`attnlab.generate` was given.

    Returns:
        A reason (for the log), or ``None``.
    """
    if not isinstance(model, GPT):
        return f"{type(model).__name__} is not a decoder-only attnlab.GPT"
    spec = model.config.attention
    if not spec.decodes_statically:
        return f"attention {spec.name!r} does not decode over a static cache"
    for block in model.transformer.h:
        attn = cast(GPTBlock, block).attn
        if type(attn).attend_heads is not MultiHeadAttention.attend_heads:
            return f"{type(attn).__name__} overrides attend_heads"
    return None


def static_capacity(model: GPT, needed: int) -> int:
    """The capacity of the static cache for ``needed`` positions: rounded up to a multiple of
    :data:`CAPACITY_MULTIPLE`, at most ``n_positions`` (and at least ``needed``).

    Args:
        model: the GPT.
        needed: prompt length plus new tokens.

    Returns:
        The capacity.
    """
    rounded = -(-needed // CAPACITY_MULTIPLE) * CAPACITY_MULTIPLE
    return max(needed, min(rounded, model.config.n_positions))


def _decode(
    model: GPT, tokens: torch.Tensor, cache: StaticModelCache, mask: torch.Tensor | None
) -> torch.Tensor:
    """The traced step: :meth:`attnlab.GPT.decode_step` over the static cache.

    Shape:
        tokens ``(B, 1)``; mask ``(B, C)``; logits ``(B, vocab_size)``.
    """
    return model.decode_step(tokens, cache, mask)


class CompiledStepper(CausalStepper):
    """A :class:`~attnlab.decoding.steppers.CausalStepper` over a static cache whose steps run
    the compiled ``decode_step``.

    Args:
        model: a GPT that :func:`static_unsupported` accepts.
        input_ids: prompt ``(N, T)``, left-padded when ``mask`` has zeros.
        mask: ``(N, T)`` 0/1, or ``None`` when no row is padded.
        capacity: positions needed, ``T + max_new_tokens`` (see :func:`static_capacity`).

    Shape:
        input_ids and mask ``(N, T)``.
    """

    #: ``torch.compile``'s backend (``"eager"`` traces the same graph and runs it uncompiled)
    backend = "inductor"

    def __init__(
        self, model: GPT, input_ids: torch.Tensor, mask: torch.Tensor | None, capacity: int
    ) -> None:
        cap = static_capacity(model, capacity)
        device = input_ids.device
        cache = model.new_cache(input_ids.shape[0], cap, device=device, static=True)
        super().__init__(model, input_ids, mask, cap, cache=cache)
        self.graphs = device.type == "cuda" and self.backend == "inductor"  # one launch a step
        mode = "reduce-overhead" if self.graphs else None
        self.step_fn = torch.compile(
            _decode, backend=self.backend, fullgraph=True, dynamic=False, mode=mode
        )

    def prefill(self) -> torch.Tensor:
        """Run the prompt through ``model.forward`` (eagerly), filling the static cache, under
        ``no_grad`` as every step is (:meth:`step`): the cache holds no autograd history, which
        the compiled step would otherwise guard on (``requires_grad``) and compile again for.

        Returns:
            The logits of the token after the prompt.

        Shape:
            ``(N, V)``.
        """
        with torch.no_grad():
            return super().prefill()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row through the compiled step.

        Args:
            tokens: the new token of each row.

        Returns:
            The logits of the token after them.

        Shape:
            tokens ``(N,)`` → logits ``(N, V)``.
        """
        self.length += 1
        cast(StaticModelCache, self.cache).begin(1)  # host side, before the graph
        # self.mask: the padding of every slot (True beyond the prompt), one shape every step
        # contiguous: dynamo guards strides, and a column of a token matrix is another graph
        args = (self.model, tokens[:, None].contiguous(), self.cache, self.mask)
        # a decoding step never differentiates: under no_grad whatever the caller's mode, so that
        # a caller with gradients on neither compiles a second graph (dynamo guards the grad mode)
        # nor has autograd trace a backward of the step and its writes into the cache
        with torch.no_grad():
            if self.length > self.input_ids.shape[1] + 1:
                logits = self.step_fn(*args)
            else:  # the first step may compile: room for a graph per shape under fullgraph=True
                limit = torch._dynamo.config.recompile_limit
                torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)
                try:
                    logits = self.step_fn(*args)
                finally:
                    torch._dynamo.config.recompile_limit = limit
        # a CUDA graph's output buffer is overwritten by its next replay
        return cast(torch.Tensor, logits.clone() if self.graphs else logits)
