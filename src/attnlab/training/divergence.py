"""Divergence: a non-finite loss, gradient norm or weight stops the run.

Training on once the loss is NaN only overwrites good checkpoints with NaN ones. The trainer
checks each step's loss and gradient norm *before* the optimizer step; when one is not finite it
does not take the step, puts the data position and random states back to where they were before
it, saves that last finite state (unless it is saved already) and raises :class:`DivergenceError`
naming the step. It never saves weights that are not finite (:func:`all_finite`).

In fp16 runs a non-finite gradient is the gradient scaler's business (the step is skipped and
the scale lowered); only a non-finite loss stops them.
"""

from __future__ import annotations

from attnlab._checks import all_finite, first_non_finite
from attnlab.errors import ArgumentError

__all__ = ["DivergenceError", "all_finite", "first_non_finite"]


class DivergenceError(ArgumentError):
    """Training diverged: a loss, gradient norm or weight became NaN or infinite.

    Args:
        message: what diverged, for the user.
        step: the step that diverged.

    Attributes:
        step: the step that diverged (not taken when its loss or gradient norm was not finite).
    """

    def __init__(self, message: str, step: int) -> None:
        super().__init__(message)
        self.step = step
