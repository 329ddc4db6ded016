"""A task's sizes checked against the machine before its model is built.

Each task's ``build`` calls :func:`check_training_memory` once its model config is known and
before the model (or a batch) is allocated: the model's training state (weights, gradients,
AdamW's moments) and one training step's activations
(:func:`attnlab.inspect.footprint.training_footprint`) must fit the memory of the training
device (:func:`attnlab._budget.available_memory`), or the run is refused in one line that names
the option most out of proportion (its value against its default), the bytes needed and the
bytes there are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import torch

from attnlab._budget import check_fits
from attnlab.inspect.footprint import training_footprint
from attnlab.models.config import GPTConfig, TransformerConfig

__all__ = ["Size", "check_training_memory", "option_sizes"]

#: an option's flag, its value and its default (the yardstick of "out of proportion")
Size = tuple[str, int, int]


def option_sizes(options: Any, *names: str) -> list[Size]:
    """The :data:`Size` of some int options of a task's options (a dataclass), plus its
    attention kind's int options (``--num-features``, ``--window``, …) that are set.

    Args:
        options: the task's options.
        *names: field names (``"batch_size"`` is ``--batch-size``).

    Returns:
        The sizes, in the order given, the attention's last.
    """
    defaults = {f.name: f.default for f in fields(options)}
    out = [(_flag(n), getattr(options, n), _int_or_one(defaults.get(n))) for n in names]
    spec = getattr(options, "attention", None)
    if spec is None:
        return out
    spec_defaults = {f.name: f.default for f in fields(spec)}
    for option in spec.cli_options:
        value = getattr(spec, option.dest, None)
        if isinstance(value, int) and not isinstance(value, bool):
            out.append((option.flag, value, _int_or_one(spec_defaults.get(option.dest))))
    return out


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _int_or_one(default: Any) -> int:
    ok = isinstance(default, int) and not isinstance(default, bool)
    return default if ok and default > 0 else 1


def _named(sizes: Sequence[Size]) -> str:
    """The option most out of proportion to its default, the others after it."""
    top = max(sizes, key=lambda s: s[1] / s[2])
    others = [f"{flag} {value}" for flag, value, _ in sizes if flag != top[0]]
    return f"{top[0]} {top[1]}" + (f" (with {', '.join(others)})" if others else "")


def check_training_memory(
    config: GPTConfig | TransformerConfig,
    *,
    seq_len: int,
    batch: int,
    device: torch.device | str | None,
    model_sizes: Sequence[Size],
    step_sizes: Sequence[Size],
    src_len: int | None = None,
) -> None:
    """Refuse a model or a training step that cannot fit the training device.

    Args:
        config: the model's config (nothing is built).
        seq_len: tokens per sequence (the target's for the encoder-decoder).
        batch: sequences per step.
        device: the training device (the model is built on the CPU first).
        model_sizes: the options that size the model, named when it does not fit.
        step_sizes: the options that size a training step, named when it does not fit.
        src_len: source tokens of the encoder-decoder; default ``seq_len``.

    Raises:
        ArgumentError: one line naming the option, the bytes needed and the bytes there are.
    """
    fp = training_footprint(config, seq_len, batch, src_len=src_len)
    what = f"the model's {fp.parameters} parameters"
    if device is not None and torch.device(device).type != "cpu":
        check_fits(_named(model_sizes), fp.weights, what=f"{what} (built on the CPU)")
    check_fits(
        _named(model_sizes),
        fp.training_state,
        what=f"{what}, their gradients and Adam's moments",
        device=device,
    )
    check_fits(
        _named(step_sizes),
        fp.training_state + fp.activations,
        what="one training step (the model's training state and the activations it keeps)",
        device=device,
    )
