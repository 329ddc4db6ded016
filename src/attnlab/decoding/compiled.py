"""A decoding step compiled with ``torch.compile``: static shapes, no host synchronisation.

gpt-fast's ``decode_one_token`` (PyTorch Labs, 2023) made one decoding step a single graph that
``torch.compile`` traces once and reuses for every token. A step with a growing KV cache is not
static: its keys grow by one position, and the length is a Python int that changes each step,
so every step would be a new graph. Here the step is made static:

* the KV cache is preallocated at its capacity ``C`` (:class:`~attnlab.nn.kv_cache.KVCache`
  buffers of ``(B, H_kv, C, d_head)``, never rolled) and the new key and value are written at a
  slot held in a **tensor** (``index_copy_``), not at a Python int;
* every step attends over all ``C`` slots, the ones not written yet hidden by a mask built from
  the same tensor, ``j <= slot`` (and ``slot − j <= w`` under a sliding window ``(w, 0)``, and the
  padding of left-padded rows), so the shapes never change;
* positions (rotary or learned) come from a ``(B,)`` tensor that the step advances; nothing is
  read back to the host.

The step is compiled once per ``(batch, capacity, dtype, device, padded)`` and kept on the model
(:func:`compiled_step`), so a second :func:`attnlab.generate` call reuses it. The capacity is
rounded up to a multiple of 128 (at most ``n_positions``), so calls with nearby lengths share one
graph.

What it covers: a :class:`~attnlab.GPT` whose attention is exact softmax attention over a KV cache
(:class:`~attnlab.nn.multihead.MultiHeadAttention` itself, full or sliding window), learned,
rotary (either pairing) or ALiBi positions, LayerNorm or RMSNorm, the standard or gated MLP, MHA,
GQA or MQA, sequential or parallel residual. Other models (Performer's running sums, BigBird's
block layout, a new kind that overrides ``attend_heads``, an encoder-decoder) decode eagerly
(:func:`static_unsupported` says why). The attention's own hook points are not called inside the
compiled step; the block's residual rule is the block's own (:meth:`GPTBlock.add_to_stream
<attnlab.models.gpt_layers.GPTBlock.add_to_stream>`).
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F

from attnlab.decoding.steppers import CausalStepper
from attnlab.models.gpt import GPT
from attnlab.models.gpt_layers import GPTBlock
from attnlab.nn.kinds import FullSpec, SlidingSpec
from attnlab.nn.kv_cache import KVCache, ModelCache
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.positional import alibi_slopes

__all__ = ["CompiledStepper", "compiled_step", "static_capacity", "static_unsupported"]

#: the capacity of a static cache is rounded up to a multiple of this (fewer distinct graphs)
CAPACITY_MULTIPLE = 128


def static_unsupported(model: Any) -> str | None:
    """Why ``model`` cannot decode with the static compiled step, or ``None`` when it can.

    Args:
        model: the model :func:`attnlab.generate` was given.

    Returns:
        A reason (for the log), or ``None``.
    """
    if not isinstance(model, GPT):
        return f"{type(model).__name__} is not an attnlab.GPT"
    spec = model.config.attention
    if not isinstance(spec, (FullSpec, SlidingSpec)):
        return f"attention kind {type(spec).__name__} keeps no plain KV cache"
    for block in model.transformer.h:
        attn = cast(GPTBlock, block).attn
        if type(attn).attend_heads is not MultiHeadAttention.attend_heads:
            return f"{type(attn).__name__} overrides attend_heads"
        if attn.block_mask is not None:
            return "a block layout"
        if attn.window is not None and attn.window[1] not in (0, None):
            return "a window that reaches future keys"
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


def _decode_one_token(
    model: GPT,
    tokens: torch.Tensor,
    slot: torch.Tensor,
    positions: torch.Tensor,
    keep: torch.Tensor | None,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
) -> torch.Tensor:
    """One token per row through the model, over caches of a fixed capacity (the traced step).

    Shape:
        tokens ``(B, 1)``; slot ``(1,)``; positions ``(B,)``; keep ``(B, C)`` bool or ``None``;
        keys[i], values[i] ``(B, H_kv, C, d_head)``; logits ``(B, vocab_size)``.
    """
    cfg = model.config
    trunk = model.transformer
    b = tokens.shape[0]
    cap = keys[0].shape[2]
    h, h_kv, d_head = cfg.n_head, cfg.num_kv_heads or cfg.n_head, cfg.n_embd // cfg.n_head
    group = h // h_kv

    x = trunk.wte(tokens)  # (B, 1, n_embd)
    if trunk.wpe is not None:
        x = x + trunk.wpe.weight[positions][:, None]  # (B, 1, n_embd)

    # which slots the new token sees: written ones (j <= slot), in the window, not padding
    j = torch.arange(cap, device=tokens.device)
    distance = slot - j  # (C,)
    visible = distance >= 0
    first = cast(GPTBlock, trunk.h[0]).attn
    if first.window is not None and first.window[0] is not None:
        visible = visible & (distance <= first.window[0])
    mask = visible[None, None, None, :]  # (1, 1, 1, C)
    if keep is not None:
        mask = mask & keep[:, None, None, :]  # (B, 1, 1, C)
    attn_mask: torch.Tensor = mask
    if cfg.positions == "alibi":
        # −m_h · (i − j), the query heads of one key/value head along the query axis
        slopes = alibi_slopes(h).to(device=tokens.device).view(1, h_kv, group, 1)
        bias = -slopes * distance.float()  # (1, H_kv, group, C)
        attn_mask = torch.where(mask, bias, torch.finfo(torch.float32).min)
    rope_positions = positions[:, None]  # (B, 1)

    for i, module in enumerate(trunk.h):
        block = cast(GPTBlock, module)
        attn = block.attn
        q, k_new, v_new = attn.project_qkv(block.ln_1(x))
        k, v = cast(torch.Tensor, k_new), cast(torch.Tensor, v_new)  # self-attention: both made
        q = q.view(b, 1, h, d_head).transpose(1, 2)  # (B, H, 1, d_head)
        k = k.view(b, 1, h_kv, d_head).transpose(1, 2)  # (B, H_kv, 1, d_head)
        v = v.view(b, 1, h_kv, d_head).transpose(1, 2)
        if attn.rotary is not None:
            q = attn.rotary(q, rope_positions, check=False)
            k = attn.rotary(k, rope_positions, check=False)
        keys[i].index_copy_(2, slot, k.to(keys[i].dtype))
        values[i].index_copy_(2, slot, v.to(values[i].dtype))
        # the query heads that share a key/value head go along the query axis: no copies of K, V
        q = q.reshape(b, h_kv, group, d_head)  # (B, H_kv, group, d_head)
        kc, vc = keys[i].to(q.dtype), values[i].to(q.dtype)
        m = attn_mask if attn_mask.dtype == torch.bool else attn_mask.to(q.dtype)
        z = F.scaled_dot_product_attention(q, kc, vc, attn_mask=m, scale=d_head**-0.5)
        z = z.reshape(b, 1, h * d_head)  # (B, 1, n_embd): heads concatenated
        x = block.add_to_stream(x, attn.project_out(z))  # the block's own residual rule
    x = trunk.ln_f(x)
    return model.lm_head(x)[:, -1]  # (B, vocab_size)


def compiled_step(
    model: GPT, batch: int, capacity: int, dtype: torch.dtype, device: torch.device, padded: bool
) -> Any:
    """The compiled step for one ``(batch, capacity, dtype, device, padded)``, made on first use
    and kept on the model (``model._attnlab_compiled_steps``), so later calls do not recompile.

    Args:
        model: a GPT that :func:`static_unsupported` accepts.
        batch: rows ``B``.
        capacity: the static cache's capacity ``C``.
        dtype: the cache's dtype.
        device: the model's device.
        padded: whether the rows carry a padding mask.

    Returns:
        ``step(tokens, slot, positions, keep, keys, values) → logits`` (a ``torch.compile``'d
        function with ``dynamic=False``).
    """
    steps: dict[tuple[Any, ...], Any] | None = model.__dict__.get("_attnlab_compiled_steps")
    if steps is None:
        steps = {}
        model.__dict__["_attnlab_compiled_steps"] = steps
    key = (batch, capacity, dtype, str(device), padded)
    step = steps.get(key)
    if step is None:

        def step_fn(
            tokens: torch.Tensor,
            slot: torch.Tensor,
            positions: torch.Tensor,
            keep: torch.Tensor | None,
            keys: list[torch.Tensor],
            values: list[torch.Tensor],
        ) -> torch.Tensor:
            return _decode_one_token(model, tokens, slot, positions, keep, keys, values)

        step = steps[key] = torch.compile(step_fn, dynamic=False, fullgraph=True)
    return step


class CompiledStepper(CausalStepper):
    """A decoder-only GPT whose steps after the prompt run the static compiled step.

    A :class:`~attnlab.decoding.steppers.CausalStepper` (the prompt runs eagerly through
    ``model.forward``; rows are reordered the same way) over a :class:`~attnlab.nn.kv_cache.KVCache`
    per layer of the static capacity (no rolling window: the step masks the window instead), its
    padding mask preallocated at that capacity; each later token goes through
    :func:`compiled_step`.

    Args:
        model: a GPT that :func:`static_unsupported` accepts.
        input_ids: prompt ``(N, T)``, left-padded when ``attention_mask`` has zeros.
        attention_mask: ``(N, T)`` 0/1, or ``None`` when no row is padded.
        capacity: positions needed, ``T + max_new_tokens`` (rounded up by
            :func:`static_capacity`).

    Shape:
        input_ids and attention_mask ``(N, T)``.
    """

    def __init__(
        self,
        model: GPT,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        capacity: int,
    ) -> None:
        n, t = input_ids.shape
        cfg = model.config
        device = input_ids.device
        cap = static_capacity(model, capacity)
        dtype = model.transformer.wte.weight.dtype
        if torch.is_autocast_enabled(device.type):
            dtype = torch.get_autocast_dtype(device.type)
        h_kv, d_head = cfg.num_kv_heads or cfg.n_head, cfg.n_embd // cfg.n_head
        layers = [
            KVCache(n, h_kv, cap, d_head, dtype=dtype, device=device) for _ in range(cfg.n_layer)
        ]
        super().__init__(model, input_ids, attention_mask, cap, cache=ModelCache(layers))
        if attention_mask is not None:
            # a new token's position counts the real tokens before it
            self.positions = attention_mask.long().sum(-1)  # (N,)
        else:
            self.positions = torch.full((n,), t, dtype=torch.long, device=device)
        self.slot = torch.tensor([t], dtype=torch.long, device=device)
        self.step_fn = compiled_step(model, n, cap, dtype, device, self.mask is not None)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row through the compiled step.

        Args:
            tokens: the new token of each row.

        Returns:
            The logits of the token after them.

        Shape:
            tokens ``(N,)`` → logits ``(N, V)``.
        """
        layers = cast(list[KVCache], self.cache.layers)
        logits = self.step_fn(
            tokens[:, None],
            self.slot,
            self.positions,
            self.mask,  # (N, C): the padding of every slot, True beyond the prompt
            [c.k for c in layers],
            [c.v for c in layers],
        )
        self.slot += 1
        self.positions += 1
        self.length += 1
        for c in layers:
            c.length += 1
        return cast(torch.Tensor, logits)

    def reorder(self, index: torch.Tensor) -> None:
        """Select rows of the cache, the padding mask and the positions (beam search).

        Args:
            index: integer row indices on the model's device; may repeat rows.

        Shape:
            index ``(N_new,)``.
        """
        super().reorder(index)
        self.positions = self.positions.index_select(0, index)
