"""A decode-time layout of a GPT's weights for one-token steps.

At batch 1 a decoding step is a chain of matrix-vector products ``y = x W^T + b``: each weight is
read from memory once per token and used for two FLOPs, so the step is bound by memory bandwidth,
not by arithmetic. How fast a CPU streams a weight depends on its layout: ``F.linear`` on the
``(out, in)`` matrix reduces along rows, while ``x @ W_t`` on a contiguous ``(in, out)`` copy is an
``axpy``-style sweep that the BLAS streams faster in fp32 (see ``benchmarks/generate.py``);
bf16/fp16 weights keep the ``(out, in)`` layout, where PyTorch's CPU kernels are faster. The fused
step below also skips what a general forward must do for ``T > 1`` (mask building, input checks,
logits for every position) and computes the logits of the last position only.

The result is the same computation in another layout: the same tokens as
:meth:`attnlab.GPT.forward` with a cache (the sums run in another order, so logits agree to float
rounding). The prepared copies are made once per model and remade when a parameter changes.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from attnlab.decoding.cache import ModelCache
from attnlab.nn.hooks import HookPoint

__all__ = ["FastDecoder"]


@dataclass(frozen=True)
class _Layer:
    ln_1: tuple[torch.Tensor, torch.Tensor | None]
    attn_w: torch.Tensor  # (d, d + 2·kv) contiguous in fp32, else (d + 2·kv, d)
    attn_b: torch.Tensor | None
    proj_w: torch.Tensor
    proj_b: torch.Tensor | None
    ln_2: tuple[torch.Tensor, torch.Tensor | None]
    fc_w: torch.Tensor
    fc_b: torch.Tensor | None
    fc_proj_w: torch.Tensor
    fc_proj_b: torch.Tensor | None


def _linear_t(x: torch.Tensor, w_t: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    # y = x W^T + b with W^T stored contiguous as (in, out)
    return torch.addmm(b, x, w_t) if b is not None else x @ w_t


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    # y = x W^T + b with W stored as (out, in)
    return F.linear(x, w, b)


class FastDecoder:
    """One-token decoding steps of a :class:`attnlab.GPT` on prepared weights.

    Args:
        model: a GPT with learned positions (``config.positions == "learned"``).

    Use :meth:`for_model` (cached per model) rather than the constructor, and :meth:`supports`
    to see whether a model can use it (hooks listening, autocast, rotary/ALiBi positions or a
    training-mode model fall back to ``model.forward``).

    Shape:
        tokens ``(N, 1)``; mask ``(N, T_past + 1)`` 0/1 or ``None``; logits ``(N, vocab_size)``.
    """

    _cache: ClassVar[weakref.WeakKeyDictionary[Any, FastDecoder]] = weakref.WeakKeyDictionary()

    def __init__(self, model: Any) -> None:
        cfg = model.config
        tr = model.transformer
        self.n_head, self.kv_heads, self.d_head = cfg.n_head, cfg.kv_heads, cfg.d_head
        self.d_model = cfg.n_embd
        self.eps = cfg.layer_norm_epsilon
        # fp32: (in, out) copies for x @ W_t; bf16/fp16 keep (out, in), where the BLAS's reduced
        # precision matrix-vector product is faster on the original layout
        self.transposed = model.lm_head.weight.dtype == torch.float32
        self.linear = _linear_t if self.transposed else _linear
        _t = _transpose if self.transposed else _detach_weight
        self.wte = tr.wte.weight.detach()  # (V, d): embedding rows
        self.wpe = tr.wpe.weight.detach()  # (n_positions, d)
        self.head_w = _t(model.lm_head.weight)  # (d, V) or (V, d)
        self.ln_f = (tr.ln_f.weight.detach(), _detach(tr.ln_f.bias))
        self.layers = [
            _Layer(
                ln_1=(blk.ln_1.weight.detach(), _detach(blk.ln_1.bias)),
                attn_w=_t(blk.attn.c_attn.weight),
                attn_b=_detach(blk.attn.c_attn.bias),
                proj_w=_t(blk.attn.c_proj.weight),
                proj_b=_detach(blk.attn.c_proj.bias),
                ln_2=(blk.ln_2.weight.detach(), _detach(blk.ln_2.bias)),
                fc_w=_t(blk.mlp.c_fc.weight),
                fc_b=_detach(blk.mlp.c_fc.bias),
                fc_proj_w=_t(blk.mlp.c_proj.weight),
                fc_proj_b=_detach(blk.mlp.c_proj.bias),
            )
            for blk in tr.h
        ]
        self._versions = _versions(model)

    @staticmethod
    def supports(model: Any) -> bool:
        """Whether ``model`` can decode through a :class:`FastDecoder` right now."""
        from attnlab.models.gpt import GPT

        if not isinstance(model, GPT) or model.config.positions != "learned" or model.training:
            return False
        p = model.lm_head.weight
        if torch.is_autocast_enabled(p.device.type) or not p.is_floating_point():
            return False
        # inspection must see what forward computes: leave hooked models to forward
        for m in model.modules():
            if (isinstance(m, HookPoint) and m.active) or m._forward_hooks or m._forward_pre_hooks:
                return False
        return True

    @classmethod
    def for_model(cls, model: Any) -> FastDecoder:
        """The prepared weights of ``model``, made on first use and again after it changed."""
        fast = cls._cache.get(model)
        if fast is None or fast._versions != _versions(model):
            fast = cls(model)
            cls._cache[model] = fast
        return fast

    @torch.no_grad()
    def __call__(
        self, tokens: torch.Tensor, mask: torch.Tensor | None, cache: ModelCache
    ) -> torch.Tensor:
        """Feed one token per row; return the next-token logits ``(N, vocab_size)``."""
        n = tokens.shape[0]
        if cache.length >= self.wpe.shape[0]:
            raise ValueError(
                f"position {cache.length} is past the model's position table "
                f"n_positions = {self.wpe.shape[0]}"
            )
        if mask is None:
            pos = self.wpe[cache.length]  # (d,)
            attend = None
        else:
            # left padding: a token's position counts the real tokens before it
            pos = self.wpe[(mask.sum(dim=1) - 1).clamp(min=0)]  # (N, d)
            attend = mask.bool()[:, None, None, :]  # (N, 1, 1, T_past + 1)
        x = self.wte[tokens[:, 0]] + pos  # (N, d)
        d, kv = self.d_model, self.kv_heads * self.d_head
        gqa = self.kv_heads != self.n_head
        for layer, layer_cache in zip(self.layers, cache.layers):
            # x = x + Attention(LN_1(x))
            h = F.layer_norm(x, (d,), *layer.ln_1, self.eps)
            q, k, v = self.linear(h, layer.attn_w, layer.attn_b).split([d, kv, kv], dim=-1)
            q = q.view(n, self.n_head, 1, self.d_head)  # (N, H, 1, d_head)
            keys, values = layer_cache.append(
                k.view(n, self.kv_heads, 1, self.d_head), v.view(n, self.kv_heads, 1, self.d_head)
            )  # (N, H_kv, T_past + 1, d_head)
            # one query sees every cached key: softmax(q Kᵀ / √d_head) V, padding hidden
            z = F.scaled_dot_product_attention(q, keys, values, attn_mask=attend, enable_gqa=gqa)
            x = x + self.linear(z.view(n, d), layer.proj_w, layer.proj_b)
            # x = x + MLP(LN_2(x)),  MLP(u) = GELU_tanh(u W_fc + b_fc) W_proj + b_proj
            h = F.layer_norm(x, (d,), *layer.ln_2, self.eps)
            h = F.gelu(self.linear(h, layer.fc_w, layer.fc_b), approximate="tanh")
            x = x + self.linear(h, layer.fc_proj_w, layer.fc_proj_b)
        x = F.layer_norm(x, (d,), *self.ln_f, self.eps)
        return self.linear(x, self.head_w, None)  # (N, vocab_size)


def _transpose(w: torch.Tensor) -> torch.Tensor:
    return w.detach().t().contiguous()


def _detach_weight(w: torch.Tensor) -> torch.Tensor:
    return w.detach()


def _detach(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def _versions(model: Any) -> tuple[tuple[Any, ...], ...]:
    """Identity, storage, dtype and in-place version of every parameter: changes when the
    weights do (an optimizer step, ``load_state_dict``, ``model.to(dtype)``)."""
    return tuple((id(p), p.data_ptr(), p.dtype, p._version) for p in model.parameters())
