"""Label-smoothed cross-entropy that ignores padding (Szegedy et al. 2016; Vaswani et al. 2017 §5.4).

With smoothing ε over a vocabulary of V classes the one-hot target q becomes

    q'(k) = (1 - ε) · q(k) + ε / V

and the loss is the cross-entropy H(q', p) = -Σ_k q'(k) log p(k), averaged over the positions whose
target is not ``ignore_index`` (padding). This is PyTorch's own ``label_smoothing``.

:class:`TokenLoss` is what the trainer's loss functions return: a mean loss together with the
number of positions it averages over, so the trainer can weight micro-batches and ranks by their
token counts and give exactly the loss of the whole global batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnlab._checks import check_choice, check_probability, check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError

__all__ = ["TokenLoss", "label_smoothed_cross_entropy", "token_loss"]


@dataclass
class TokenLoss:
    """A loss averaged over ``count`` positions.

    Attributes:
        loss: the mean loss, a 0-dim tensor (differentiable).
        count: the number of positions the mean is over (a 0-dim tensor or a number; 0 allowed,
            then ``loss`` is 0).

    Shape:
        loss ``()``; count ``()`` when a tensor.
    """

    loss: torch.Tensor
    count: torch.Tensor | int | float


def _check(logits: object, targets: object) -> tuple[torch.Tensor, torch.Tensor]:
    logits = check_tensor("logits", logits)
    targets = check_tensor("targets", targets)
    if not logits.is_floating_point():
        raise ArgumentTypeError(f"logits must have a floating dtype, got {logits.dtype}")
    if targets.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise ArgumentTypeError(f"targets must hold integer class ids, got {targets.dtype}")
    if logits.dim() < 1 or tuple(logits.shape[:-1]) != tuple(targets.shape):
        raise ArgumentError(
            f"targets has shape {shape_str(targets.shape)} but must be logits.shape[:-1] = "
            f"{shape_str(logits.shape[:-1])} (logits: (..., V) = {shape_str(logits.shape)})"
        )
    return logits, targets


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 logits are reduced in float32 (log-softmax over a large vocabulary)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def token_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    smoothing: float = 0.0,
    ignore_index: int = -100,
) -> TokenLoss:
    """Label-smoothed cross-entropy, mean over the non-ignored positions, with their count.

    Args:
        logits: unnormalised scores.
        targets: class ids; positions equal to ``ignore_index`` do not count.
        smoothing: ε in [0, 1). Default: 0.
        ignore_index: the target id to ignore (padding). Default: -100.

    Returns:
        :class:`TokenLoss` with the mean loss (0 when every position is ignored) and the count.

    Shape:
        logits (..., V); targets (...).
    """
    logits, targets = _check(logits, targets)
    eps = check_probability("smoothing", smoothing)
    flat_logits = _upcast(logits.reshape(-1, logits.shape[-1]))  # (N, V)
    flat_targets = targets.reshape(-1).long()  # (N,)
    count = (flat_targets != ignore_index).sum()
    # Σ_positions H(q', p) with q'(k) = (1 - ε) q(k) + ε / V (PyTorch's label_smoothing)
    total = F.cross_entropy(
        flat_logits,
        flat_targets,
        ignore_index=ignore_index,
        label_smoothing=eps,
        reduction="sum",
    )
    return TokenLoss(loss=total / count.clamp(min=1), count=count)


def label_smoothed_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    smoothing: float = 0.0,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Label-smoothed cross-entropy that ignores padding.

    Args:
        logits: unnormalised scores.
        targets: class ids; positions equal to ``ignore_index`` (padding) do not count.
        smoothing: ε in [0, 1); the target distribution is q'(k) = (1-ε)·q(k) + ε/V. Default: 0.
        ignore_index: the target id to ignore. Default: -100.
        reduction: ``"mean"`` (over non-ignored positions; 0 when there are none), ``"sum"``
            or ``"none"`` (per position, 0 at ignored ones). Default: ``"mean"``.

    Returns:
        A 0-dim tensor, or a tensor of ``targets``' shape for ``reduction="none"``.

    Shape:
        logits (..., V); targets (...).
    """
    check_choice("reduction", reduction, ("mean", "sum", "none"))
    if reduction == "mean":
        return token_loss(logits, targets, smoothing=smoothing, ignore_index=ignore_index).loss
    logits, targets = _check(logits, targets)
    eps = check_probability("smoothing", smoothing)
    out = F.cross_entropy(
        _upcast(logits.reshape(-1, logits.shape[-1])),
        targets.reshape(-1).long(),
        ignore_index=ignore_index,
        label_smoothing=eps,
        reduction=reduction,
    )
    return out.reshape(targets.shape) if reduction == "none" else out
