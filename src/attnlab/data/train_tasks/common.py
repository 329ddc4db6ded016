"""Pieces the tasks share: options, the Noam optimizer and the encoder-decoder loss."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from attnlab.data.batching import Seq2SeqBatch
from attnlab.training.losses import TokenLoss, token_loss
from attnlab.training.schedules import NoamLR, noam_rate

__all__ = [
    "add_transformer_arguments",
    "cooldown_factor",
    "noam_adam",
    "positive_float",
    "positive_int",
    "seq2seq_loss",
]


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an int >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative int, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative int, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive float, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive float, got {value}")
    return value


def probability(text: str) -> float:
    """argparse type: a float in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a float in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a float in [0, 1), got {value}")
    return value


def add_transformer_arguments(
    parser: argparse.ArgumentParser,
    *,
    d_model: int,
    layers: int,
    heads: int,
    d_ff: int,
    dropout: float,
    warmup: int,
    batch_size: int | None,
    label_smoothing: float = 0.1,
    lr_factor: float = 1.0,
) -> None:
    """The encoder-decoder's size and optimisation options, with task-specific defaults."""
    g = parser.add_argument_group("model")
    g.add_argument("--d-model", type=positive_int, default=d_model, help=f"default {d_model}")
    g.add_argument(
        "--layers",
        type=positive_int,
        default=layers,
        help=f"encoder and decoder layers each (default {layers})",
    )
    g.add_argument("--heads", type=positive_int, default=heads, help=f"default {heads}")
    g.add_argument("--d-ff", type=positive_int, default=d_ff, help=f"default {d_ff}")
    g.add_argument("--dropout", type=probability, default=dropout, help=f"default {dropout}")
    g.add_argument(
        "--label-smoothing",
        type=probability,
        default=label_smoothing,
        help=f"default {label_smoothing}",
    )
    o = parser.add_argument_group("optimisation")
    if batch_size is not None:
        o.add_argument(
            "--batch-size", type=positive_int, default=batch_size, help=f"default {batch_size}"
        )
    o.add_argument(
        "--warmup", type=positive_int, default=warmup, help=f"Noam warm-up steps (default {warmup})"
    )
    o.add_argument(
        "--cooldown",
        type=non_negative_int,
        default=0,
        help="anneal the rate linearly to 0 over this many steps (default 0: plain Noam)",
    )
    o.add_argument(
        "--cooldown-end",
        type=non_negative_int,
        default=0,
        help="the step at which the cool-down reaches 0 (needed with --cooldown)",
    )
    o.add_argument(
        "--lr-factor",
        type=positive_float,
        default=lr_factor,
        help=f"Noam factor (default {lr_factor})",
    )


def cooldown_factor(step: int, cooldown: int, end: int) -> float:
    """1 until ``end - cooldown``, then falling linearly to 0 at step ``end`` (steps from 1).

    factor(s) = clamp((end - s + 1) / cooldown, 0, 1); ``cooldown = 0`` means no cool-down.
    """
    if cooldown == 0:
        return 1.0
    return min(1.0, max(0.0, (end - step + 1) / cooldown))


def noam_adam(
    d_model: int, warmup: int, factor: float, *, cooldown: int = 0, cooldown_end: int = 0
) -> Callable[[nn.Module], tuple[torch.optim.Optimizer, LRScheduler]]:
    """``model -> (Adam, schedule)`` as in Vaswani et al. (2017) §5.3: β = (0.9, 0.98), ε = 1e-9,

    lr(s) = factor · d_model^-0.5 · min(s^-0.5, s · warmup^-1.5) · cooldown_factor(s)

    With ``cooldown = 0`` the schedule is :class:`attnlab.training.NoamLR` itself; otherwise the
    Noam rate is annealed linearly to 0 over the ``cooldown`` steps that end at ``cooldown_end``
    (a fixed step, part of the run's configuration, so that a resumed run follows the same rates).
    """
    if cooldown < 0 or (cooldown and cooldown_end < cooldown):
        raise ValueError(
            f"--cooldown-end must be >= --cooldown ({cooldown}) when cooling down, got {cooldown_end}"
        )

    def make(model: nn.Module) -> tuple[torch.optim.Optimizer, LRScheduler]:
        opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
        if not cooldown:
            return opt, NoamLR(opt, d_model, warmup_steps=warmup, factor=factor)
        # LambdaLR's epoch e is the number of steps done, so the coming step is e + 1
        return opt, LambdaLR(
            opt,
            lambda e: (
                noam_rate(e + 1, d_model, warmup, factor)
                * cooldown_factor(e + 1, cooldown, cooldown_end)
            ),
        )

    return make


def seq2seq_loss(pad_id: int, smoothing: float) -> Callable[[nn.Module, Any], TokenLoss]:
    """``(model, Seq2SeqBatch) -> TokenLoss``: label-smoothed cross-entropy over non-pad targets."""

    def loss(model: nn.Module, batch: Seq2SeqBatch) -> TokenLoss:
        logits = model(batch.src, batch.tgt_in).logits  # (B, T, V)
        return token_loss(logits.float(), batch.targets, smoothing=smoothing, ignore_index=pad_id)

    return loss
