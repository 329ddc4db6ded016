"""One optimizer step of the trainer: micro-batches, token weighting, loss scaling, clipping.

:func:`train_step` is the step the :class:`~attnlab.training.trainer.Trainer`'s loop takes (the
trainer's module docstring says what a step does); the gradients of its micro-batches are
weighted by their token counts over the whole global batch, whatever the number of ranks.

Mixed precision. bf16 has fp32's exponent range, so it needs nothing but autocast. fp16 does
not: gradients below ~6e-8 flush to zero. With ``fp16=True`` the loss is multiplied by a scale
``S`` before the backward pass (``torch.amp.GradScaler``), so the fp16 gradients are ``S · g``;
before clipping they are divided by ``S`` again (``unscale_``), and the optimizer step is taken
only when they are all finite:

    backward(S · Σ_micro count · loss)      →  grads = S · ∇
    unscale_: grads /= S                    (records whether any is inf/NaN)
    clip, then step if all finite else skip;  S ← S / 2 after an overflow,
                                               S ← 2 · S after 2000 clean steps

A skipped step still counts (the step number, the scheduler and the data move on) and is logged
as a warning and with ``"skipped": true``. The scaler's state (``S`` and its growth counter) is
part of the training state, so a resumed fp16 run stays bit-identical. fp16 autocast and the
gradient scaler run on the CPU too (PyTorch ≥ 2.3), slowly: fp16 is for GPUs; on a CPU bf16
is the fast reduced precision.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from attnlab.errors import ArgumentTypeError
from attnlab.training.losses import TokenLoss
from attnlab.training.processes import is_dtensor, map_batch

if TYPE_CHECKING:
    from attnlab.training.trainer import Trainer

__all__ = ["train_step"]


def _to_device(batch: Any, device: torch.device) -> Any:
    return map_batch(lambda t: t.to(device, non_blocking=True), batch)


def _as_float(t: torch.Tensor) -> float:
    """A scalar tensor's value (a ``DTensor`` norm is replicated: its whole value)."""
    return float(t.full_tensor() if is_dtensor(t) else t)


def _first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        batch = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for v in batch:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def _autocast(trainer: Trainer) -> contextlib.AbstractContextManager[Any]:
    if trainer.config.bf16:
        return torch.autocast(trainer.dist.device.type, dtype=torch.bfloat16)
    if trainer.config.fp16:
        return torch.autocast(trainer.dist.device.type, dtype=torch.float16)
    return contextlib.nullcontext()


def train_step(trainer: Trainer) -> tuple[float, float, float, bool, bool, bool]:
    """One optimizer step of ``trainer``, not taken when the loss or the gradient norm is not
    finite (every rank must call it).

    Args:
        trainer: the :class:`~attnlab.training.trainer.Trainer` whose model, batches, loss,
            strategy, optimizer, scheduler and gradient scaler the step uses.

    Returns:
        ``(loss, grad_norm, tokens, stop requested on any rank, step skipped, diverged)``.

    Raises:
        TypeError: ``loss_fn`` returned neither a :class:`~attnlab.training.losses.TokenLoss`
            nor a tensor.
    """
    cfg = trainer.config
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    # on the model's device: one read-back per step (below), not one per micro-batch
    loss_sum = torch.zeros((), dtype=torch.float64, device=trainer.dist.device)
    weight = 0.0
    tokens = 0.0
    # fp16: backpropagate count/c · mean instead of count · mean, with c the size of the
    # step's first global micro-batch (the same number on every rank), so that the scaled
    # gradients have the size of a mean loss's and do not overflow fp16 merely because a
    # batch has many tokens. c = 1 otherwise (fp32/bf16 compute exactly as before).
    c = 1.0
    for micro in range(cfg.grad_accum):
        batch = trainer.batches.next_batch()
        local = _to_device(trainer.strategy.local_batch(batch, trainer.dist), trainer.dist.device)
        sync = micro == cfg.grad_accum - 1  # reduce the gradients over the ranks only then
        with trainer.strategy.gradient_sync(trainer.forward_model, sync):
            with _autocast(trainer):
                out = trainer.loss_fn(trainer.forward_model, local)
            if isinstance(out, TokenLoss):
                loss, count = out.loss, float(out.count)
                n_tok = count
            elif isinstance(out, torch.Tensor):
                loss, count = out, 1.0
                first = _first_tensor(local)
                n_tok = float(first.numel()) if first is not None else 1.0
            else:
                raise ArgumentTypeError(
                    f"loss_fn must return a TokenLoss or a tensor, got {type(out).__name__}"
                )
            if trainer.scaler is not None and micro == 0 and isinstance(out, TokenLoss):
                first = _first_tensor(batch)
                c = float(max(first.numel(), 1)) if first is not None else 1.0
            # Σ_micro count/c · mean  — normalised below by the global count
            total = loss.float() * (count / c)
            if trainer.scaler is not None:
                total = trainer.scaler.scale(total)  # S · Σ count/c · mean (fp16)
            total.backward()
        loss_sum += loss.detach().double() * count
        weight += count
        tokens += n_tok
    totals = torch.tensor(
        [float(loss_sum), weight, tokens, float(trainer._graceful_stop.requested)],
        dtype=torch.float64,
    )
    totals = trainer.strategy.reduce_totals(totals, trainer.dist)
    g_loss, g_weight, g_tokens, g_stop = totals.tolist()
    # DDP averages gradients over the W ranks, so grad = (1/W) Σ count/c·∇mean; rescale to
    # the token-weighted mean over the global batch: ∇ = W·c / Σcount · grad
    scale = trainer.strategy.gradient_replicas(trainer.dist) * c / max(g_weight, 1e-12)
    g_mean = g_loss / max(g_weight, 1e-12)
    if not math.isfinite(g_mean):  # diverged: no step (the same verdict on every rank)
        trainer.optimizer.zero_grad(set_to_none=True)
        return g_mean, math.nan, g_tokens, g_stop > 0, False, True
    for p in params:
        if p.grad is not None:
            p.grad.mul_(scale)
    if trainer.scaler is not None:
        trainer.scaler.unscale_(trainer.optimizer)  # grads /= S, before the norm and clipping
    # the global norm: over DTensor shards, clip_grad_norm_ all-reduces the sum of squares
    if cfg.clip is not None:
        norm = _as_float(torch.nn.utils.clip_grad_norm_(params, cfg.clip))
    elif any(is_dtensor(p) for p in params):
        grads = [p.grad for p in params if p.grad is not None]
        norm = _as_float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
    else:
        grads = [p.grad.detach().float().norm() for p in params if p.grad is not None]
        norm = float(torch.stack(grads).norm()) if grads else 0.0
    if trainer.scaler is None and not math.isfinite(norm):
        # (fp16: a non-finite gradient is the scaler's business — it skips the step)
        trainer.optimizer.zero_grad(set_to_none=True)
        return g_mean, norm, g_tokens, g_stop > 0, False, True
    skipped = False
    if trainer.scaler is not None:
        before = trainer.scaler.get_scale()
        trainer.scaler.step(trainer.optimizer)  # skipped when a gradient is inf/NaN
        trainer.scaler.update()
        skipped = trainer.scaler.get_scale() < before  # the scale backs off only on overflow
    else:
        trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    if trainer.scheduler is not None:
        with warnings.catch_warnings():
            if skipped:  # a skipped first step still counts: the schedule moves on
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler")
            trainer.scheduler.step()
    return g_mean, norm, g_tokens, g_stop > 0, skipped, False
