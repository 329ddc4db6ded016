"""What the trainer is told and what it tells: :class:`TrainConfig` (the loop's settings),
:class:`StepMetrics` (one step, as callbacks and ``metrics.jsonl`` see it), :class:`TrainResult`,
the :class:`TrainerCallback` hooks, and :func:`config_difference` (why a run does not resume)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnlab.errors import ArgumentError, ArgumentTypeError, AttnlabError
from attnlab.models.config import GPTConfig, TransformerConfig, config_from_dict, config_to_dict
from attnlab.nn.kinds import cli_dests, spec_from_cli, spec_to_cli

if TYPE_CHECKING:
    from attnlab.training.trainer import Trainer

__all__ = [
    "StepMetrics",
    "TrainConfig",
    "TrainResult",
    "TrainerCallback",
    "canonical_run_config",
    "config_difference",
]


@dataclass(frozen=True)
class TrainConfig:
    """How to train (what to train is the task's business).

    Args:
        steps: total number of optimizer steps of the run (a resumed run continues up to it).
        grad_accum: micro-batches per optimizer step. Default: 1.
        clip: clip the gradient's global L2 norm to this (``None``: no clipping). Default: 1.0.
        bf16: run forward and loss under ``torch.autocast(dtype=torch.bfloat16)``. Default: False.
        fp16: run forward and loss under ``torch.autocast(dtype=torch.float16)`` with a gradient
            scaler (see the module docstring). Not together with ``bf16``. Default: False.
        eval_every: evaluate every this many steps (0: only at the end). Default: 0.
        save_every: checkpoint every this many steps (0: only at the end). Default: 0.
        keep_last: how many checkpoints to keep. Default: 2.
        log_every: write a train line to ``metrics.jsonl`` every this many steps. Default: 1.
        eval_at_end: evaluate after the last step. Default: True.
    """

    steps: int
    grad_accum: int = 1
    clip: float | None = 1.0
    bf16: bool = False
    eval_every: int = 0
    save_every: int = 0
    keep_last: int = 2
    log_every: int = 1
    eval_at_end: bool = True
    fp16: bool = False

    def __post_init__(self) -> None:
        for name in ("bf16", "fp16"):
            v = getattr(self, name)
            if not isinstance(v, bool):
                raise ArgumentTypeError(f"{name} must be a bool, got {type(v).__name__}")
        if self.bf16 and self.fp16:
            raise ArgumentError(
                "bf16 and fp16 exclude each other: choose one reduced precision, "
                "got bf16=True and fp16=True"
            )
        for name in ("steps", "eval_every", "save_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ArgumentError(f"{name} must be a non-negative int, got {v!r}")
        for name in ("grad_accum", "keep_last", "log_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ArgumentError(f"{name} must be a positive int, got {v!r}")
        if self.clip is not None and (
            isinstance(self.clip, bool)
            or not isinstance(self.clip, (int, float))
            or not self.clip > 0
        ):
            raise ArgumentError(f"clip must be a positive float or None, got {self.clip!r}")

    def trajectory(self) -> dict[str, Any]:
        """The fields that change what is computed (saved in ``config.json`` and compared on resume).

        ``{"grad_accum", "clip", "bf16"}``, plus ``"fp16": True`` only in an fp16 run: the
        configurations saved before fp16 existed compare equal to fp32/bf16 runs of today, and
        resuming an fp16 run without fp16 (or the reverse) is refused.

        Returns:
            The trajectory fields by name.
        """
        out: dict[str, Any] = {"grad_accum": self.grad_accum, "clip": self.clip, "bf16": self.bf16}
        if self.fp16:
            out["fp16"] = True
        return out


@dataclass
class StepMetrics:
    """What one optimizer step did.

    Attributes:
        step: steps done so far (1 after the first step).
        total_steps: the run's ``TrainConfig.steps``.
        loss: token-weighted mean training loss of the step (over all ranks).
        lr: learning rate used by the step (first parameter group).
        grad_norm: global gradient L2 norm before clipping (unscaled in fp16 runs; inf/NaN
            when the step was skipped).
        tokens: tokens (loss positions) of the step over all ranks.
        tokens_per_s: tokens per second of the step.
        elapsed: seconds since :meth:`Trainer.fit` started.
        loss_scale: the fp16 gradient scaler's scale used by the step (``None`` unless fp16).
        skipped: the fp16 gradients overflowed, so the optimizer step was skipped (the step
            still counts).
    """

    step: int
    total_steps: int
    loss: float
    lr: float
    grad_norm: float
    tokens: float
    tokens_per_s: float
    elapsed: float
    loss_scale: float | None = None
    skipped: bool = False


@dataclass
class TrainResult:
    """The end of :meth:`Trainer.fit`.

    Attributes:
        step: steps done in total.
        interrupted: stopped early by SIGINT/SIGTERM or :meth:`Trainer.request_stop`.
        losses: the training loss of each step run by this call.
        checkpoint: the last checkpoint written (``None`` on ranks other than 0).
        eval_metrics: the last evaluation, if any.
        elapsed: seconds.
    """

    step: int
    interrupted: bool
    losses: list[float]
    checkpoint: Path | None
    eval_metrics: dict[str, float] | None
    elapsed: float


class TrainerCallback:
    """Hooks for display; override what you need (all run on rank 0 only)."""

    def on_start(self, trainer: Trainer) -> None:
        """Before the first step of :meth:`Trainer.fit`.

        Args:
            trainer: the trainer that is starting (its step is the one resumed from, or 0).
        """

    def on_step(self, metrics: StepMetrics) -> None:
        """After every optimizer step.

        Args:
            metrics: the step's loss, learning rate, gradient norm, tokens and timing.
        """

    def on_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        """After every evaluation.

        Args:
            step: the step evaluated at.
            metrics: what ``evaluate`` returned, ``{name: value}``.
        """

    def on_save(self, step: int, path: Path) -> None:
        """After every checkpoint.

        Args:
            step: the step saved.
            path: the checkpoint directory written.
        """

    def on_end(self, result: TrainResult) -> None:
        """When :meth:`Trainer.fit` returns (also when interrupted).

        Args:
            result: how the run ended (steps, losses, interruption, last checkpoint and evaluation).
        """


def canonical_run_config(config: Any) -> Any:
    """A run configuration (``config.json``'s tree) in today's form, so that one written by an
    earlier release compares equal to the same run now: a model config's flat attention fields
    (``"attention": "sliding", "window": 256``) become its spec's dict, and the attention options
    among ``"args"`` become every option of the spec they describe (BigBird's defaults written
    out). A part that does not read as a config is left as it is (the comparison then names it).

    Args:
        config: the tree (a dict with ``"model"`` and ``"args"``), or anything else.

    Returns:
        The tree, canonical.
    """
    if not isinstance(config, dict):
        return config
    out = dict(config)
    model = out.get("model")
    classes = {"GPTConfig": GPTConfig, "TransformerConfig": TransformerConfig}
    if isinstance(model, dict) and model.get("kind") in classes:
        with contextlib.suppress(AttnlabError):
            out["model"] = config_to_dict(config_from_dict(classes[model["kind"]], model))
    args = out.get("args")
    dests = cli_dests()
    if isinstance(args, dict) and any(args.get(d) is not None for d in dests):
        with contextlib.suppress(AttnlabError):
            spec = spec_from_cli(args.get("attention"), {d: args.get(d) for d in dests[1:]})
            rest = {k: v for k, v in args.items() if k not in dests}
            out["args"] = {**rest, **spec_to_cli(spec)}
    return out


def config_difference(saved: Any, current: Any, prefix: str = "") -> str | None:
    """The first difference between two JSON trees.

    Args:
        saved: the tree read from a checkpoint.
        current: the tree of this run.
        prefix: the dotted key of the trees within a larger one (for the message); default ``""``.

    Returns:
        ``"key: A (saved) vs B (now)"`` for the first difference, or ``None`` when they are equal.
    """
    if isinstance(saved, dict) and isinstance(current, dict):
        for key in sorted(set(saved) | set(current)):
            name = f"{prefix}.{key}" if prefix else str(key)
            if key not in saved:
                return f"{name}: absent in the checkpoint vs {current[key]!r} now"
            if key not in current:
                return f"{name}: {saved[key]!r} in the checkpoint vs absent now"
            diff = config_difference(saved[key], current[key], name)
            if diff:
                return diff
        return None
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        for i, (a, b) in enumerate(zip(saved, current)):
            diff = config_difference(a, b, f"{prefix}[{i}]")
            if diff:
                return diff
        return None
    if saved != current:
        return f"{prefix or 'config'}: {saved!r} in the checkpoint vs {current!r} now"
    return None
