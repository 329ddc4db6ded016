"""Learning-rate schedules: the Noam schedule of the Transformer paper and warmup + cosine decay.

Both are ordinary ``torch.optim.lr_scheduler.LRScheduler`` subclasses, so ``state_dict`` /
``load_state_dict`` and ``get_last_lr`` work as usual, and both count steps from 1: the first
optimizer step uses the rate of step 1, and after ``k`` calls of ``scheduler.step()`` the rate is
that of step ``k + 1`` (``step = last_epoch + 1``).
"""

from __future__ import annotations

import math
from typing import overload

import numpy as np
import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from attnlab._checks import check_positive_int
from attnlab.errors import ArgumentError, ArgumentTypeError

__all__ = ["NoamLR", "WarmupCosineLR", "noam_rate", "warmup_cosine_factor"]


def _check_non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ArgumentError(f"{name} must be a non-negative int, got {value}")
    return value


def _check_positive_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"{name} must be a float, got {type(value).__name__}")
    if not float(value) > 0.0 or not math.isfinite(float(value)):
        raise ArgumentError(f"{name} must be a positive finite float, got {value}")
    return float(value)


@overload
def noam_rate(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float: ...


@overload
def noam_rate(
    step: np.ndarray, d_model: int, warmup_steps: int, factor: float = 1.0
) -> np.ndarray: ...


@overload
def noam_rate(
    step: torch.Tensor, d_model: int, warmup_steps: int, factor: float = 1.0
) -> torch.Tensor: ...


def noam_rate(
    step: int | np.ndarray | torch.Tensor, d_model: int, warmup_steps: int, factor: float = 1.0
) -> float | np.ndarray | torch.Tensor:
    """The Noam learning rate of one step, or of many (Vaswani et al. 2017, §5.3).

    The rate of :class:`NoamLR`, and of the curves of :func:`attnlab.viz.lessons.noam_curve`.

    Args:
        step: the step number, counted from 1: an ``int``, or an array / tensor of step numbers.
        d_model: the model width.
        warmup_steps: steps of linear warmup.
        factor: a constant multiplier. Default: 1.0.

    Returns:
        ``factor · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)``: a ``float`` for an
        ``int`` step, else an array / tensor of rates (float64 for integer steps, else the steps'
        dtype).

    Shape:
        - step: ``()`` for an ``int``, or any shape ``(*)``.
        - output: the shape of ``step``, ``(*)``.

    Examples:
        >>> noam_rate(4000, d_model=512, warmup_steps=4000)  # the peak, (512 · 4000)^-0.5
        0.000698...
        >>> noam_rate(np.arange(1, 20001), 512, 4000).shape
        (20000,)
    """
    # lr = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)
    if isinstance(step, torch.Tensor):
        s = step if step.is_floating_point() else step.to(torch.float64)
        return factor * d_model**-0.5 * torch.minimum(s**-0.5, s * warmup_steps**-1.5)
    if isinstance(step, np.ndarray):
        a = step if np.issubdtype(step.dtype, np.floating) else step.astype(np.float64)
        return factor * d_model**-0.5 * np.minimum(a**-0.5, a * warmup_steps**-1.5)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


class NoamLR(LRScheduler):
    """The Transformer schedule: linear warmup, then decay with the inverse square root of the step.

    The rate is absolute (the optimizer's own ``lr`` is overwritten, as in the paper, where Adam's
    rate is set by this formula alone); scale it with ``factor``. Steps count from 1: the first
    optimizer step uses the rate of step 1, and after ``k`` calls of :meth:`step` the rate is that
    of step ``k + 1``. The peak, ``factor · (d_model · warmup_steps)^-0.5``, is reached at step
    ``warmup_steps``.

    Args:
        optimizer: the wrapped optimizer (every parameter group gets the same rate).
        d_model: the model width (> 0).
        warmup_steps: steps of linear warmup (> 0). Default: 4000.
        factor: constant multiplier (> 0). Default: 1.0.
        last_epoch: as in ``LRScheduler``; leave at -1 and use ``load_state_dict`` to resume.

    Examples:
        >>> opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
        >>> sched = NoamLR(opt, d_model=512, warmup_steps=4000)
        >>> for batch in batches:
        ...     loss(batch).backward(); opt.step(); opt.zero_grad(); sched.step()
    """

    def __init__(
        self,
        optimizer: Optimizer,
        d_model: int,
        warmup_steps: int = 4000,
        factor: float = 1.0,
        last_epoch: int = -1,
    ) -> None:
        self.d_model = check_positive_int("d_model", d_model)
        self.warmup_steps = check_positive_int("warmup_steps", warmup_steps)
        self.factor = _check_positive_float("factor", factor)
        super().__init__(optimizer, last_epoch)

    def rate(self, step: int) -> float:
        """The rate of one step.

        Args:
            step: the optimizer step, counted from 1.

        Returns:
            ``factor · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)``.
        """
        return noam_rate(step, self.d_model, self.warmup_steps, self.factor)

    def get_lr(self) -> list[float]:  # type: ignore[override]
        """The rate of the next step for every parameter group.

        Returns:
            :meth:`rate` of step ``last_epoch + 1``, once per parameter group.
        """
        return [self.rate(self.last_epoch + 1) for _ in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        return self.get_lr()


def warmup_cosine_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """The multiplier of the base rate at ``step`` (counted from 1) under warmup + cosine decay.

    Args:
        step: the step number, counted from 1.
        warmup_steps: steps of linear warmup (0 for none).
        total_steps: the step at which the decay reaches ``min_ratio``; constant after it.
        min_ratio: the final multiplier, in [0, 1].

    Returns:
        ``step / warmup_steps`` during warmup, then
        ``min_ratio + (1 - min_ratio) · ½(1 + cos(π · (step - warmup) / (total - warmup)))``.
    """
    if step <= warmup_steps:
        return step / warmup_steps
    if step >= total_steps:
        return min_ratio
    # progress p ∈ (0, 1); factor = min + (1 - min) · ½ (1 + cos πp)
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class WarmupCosineLR(LRScheduler):
    """Linear warmup to the optimizer's base rate, then cosine decay to ``min_ratio`` of it.

    The usual schedule for language models (GPT-2, nanoGPT). Steps count from 1, as in
    :class:`NoamLR`; the rate is ``base_lr · warmup_cosine_factor(step, ...)``.

    Args:
        optimizer: the wrapped optimizer; each group's ``lr`` is its base rate.
        warmup_steps: steps of linear warmup (>= 0, < total_steps).
        total_steps: the step at which the rate reaches ``min_ratio · base_lr`` (> 0).
        min_ratio: the final rate as a fraction of the base rate, in [0, 1]. Default: 0.1.
        last_epoch: as in ``LRScheduler``.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_steps: int,
        total_steps: int,
        min_ratio: float = 0.1,
        last_epoch: int = -1,
    ) -> None:
        self.warmup_steps = _check_non_negative_int("warmup_steps", warmup_steps)
        self.total_steps = check_positive_int("total_steps", total_steps)
        if self.warmup_steps >= self.total_steps:
            raise ArgumentError(
                f"warmup_steps must be < total_steps = {total_steps}, got {warmup_steps}"
            )
        if isinstance(min_ratio, bool) or not isinstance(min_ratio, (int, float)):
            raise ArgumentTypeError(f"min_ratio must be a float, got {type(min_ratio).__name__}")
        if not 0.0 <= float(min_ratio) <= 1.0:
            raise ArgumentError(f"min_ratio must be in [0, 1], got {min_ratio}")
        self.min_ratio = float(min_ratio)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:  # type: ignore[override]
        """The rate of the next step for every parameter group.

        Returns:
            ``base_lr · factor(last_epoch + 1)`` for each group, with its own ``base_lr``.
        """
        f = warmup_cosine_factor(
            self.last_epoch + 1, self.warmup_steps, self.total_steps, self.min_ratio
        )
        return [float(base) * f for base in self.base_lrs]

    def _get_closed_form_lr(self) -> list[float]:
        return self.get_lr()
