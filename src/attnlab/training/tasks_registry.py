"""The tasks ``attnlab train TASK`` knows, and the protocol a task implements.

A task is an object with a ``name``, a one-line ``help``, ``add_arguments(parser)`` (its own
options; the common ones — ``--out --steps --seed --resume --grad-accum --clip --bf16
--eval-every --save-every --keep-last --device`` — are already there, and a task may change their
defaults with ``parser.set_defaults(eval_every=200, ...)``) and ``build(args, device) ->
TaskSetup``. ``build`` runs after the random generators are seeded with ``--seed``; it must
create the model, the data and the optimizer deterministically from ``args``.

Register a task with :func:`register_task` at import time of its module, and list that module in
:data:`TASK_MODULES` so the command line imports it::

    # src/attnlab/data/train_tasks.py (for example)
    from attnlab.training.tasks_registry import TaskSetup, register_task

    class ReverseTask:
        name = "reverse"
        help = "learn to reverse strings (encoder-decoder)"
        def add_arguments(self, parser): parser.add_argument("--max-len", type=int, default=12)
        def build(self, args, device): ...; return TaskSetup(...)

    register_task(ReverseTask())

What ends up in the checkpoint's ``config.json``::

    {"task": NAME, "args": {"seed": S, <every option the task added>: value, ...},
     "model": TaskSetup.model_config, "train": {"grad_accum", "clip", "bf16"}}

(``--steps``, ``--out``, ``--resume``, ``--device`` and the eval/save/keep cadence are not part of
it, so they may change on resume; everything else must match or ``--resume`` fails.) A schedule
that depends on the length of the run (warmup + cosine) should take it from a task option such as
``--decay-steps`` rather than from ``args.steps``: then ``--steps 20`` followed by ``--resume
--steps 40`` follows the same trajectory as ``--steps 40``. Batch sources must be synchronous and
deterministic (no prefetching worker processes), so that their saved position is exact. To rebuild a
model from a run folder (``attnlab generate RUN``), read it with
``attnlab.training.checkpoint.load_config(RUN)``, build the model from ``config["model"]`` and
load its weights with ``load_model_weights(RUN, model)``; task files (the tokenizer) come back with
``read_checkpoint_file(RUN, name)``.
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from attnlab.training.trainer import BatchSource

__all__ = [
    "TASK_MODULES",
    "Task",
    "TaskSetup",
    "available_tasks",
    "get_task",
    "register_task",
]

#: modules imported to register the built-in tasks (a missing module is skipped)
TASK_MODULES: tuple[str, ...] = ("attnlab.data.train_tasks",)

_REGISTRY: dict[str, Task] = {}


@dataclass
class TaskSetup:
    """Everything the trainer needs from a task.

    Attributes:
        model: the model (on the CPU is fine; the trainer moves it).
        make_optimizer: ``model -> optimizer`` or ``model -> (optimizer, scheduler)``.
        batches: the global batches, with a resumable position (see
            :class:`attnlab.training.trainer.BatchSource`).
        loss_fn: ``(model, batch) -> TokenLoss | Tensor``; must call ``model(...)`` (it may be
            wrapped in DistributedDataParallel).
        model_config: JSON-able description of the model (e.g. ``config_to_dict(config)``),
            stored under ``"model"`` in ``config.json``.
        evaluate: ``model -> {metric: value}`` run every ``--eval-every`` steps and at the end
            (rank 0, eval mode, no grad), or ``None``.
        files: files stored in every checkpoint, e.g. ``{"tokenizer.json": tokenizer_json}``.
        report: called once after training on rank 0 with ``(model, run_dir, console)`` to print
            the task's summary (accuracy, decoded examples, BLEU, figures), or ``None``.
    """

    model: nn.Module
    make_optimizer: Callable[[nn.Module], Any]
    batches: BatchSource
    loss_fn: Callable[[nn.Module, Any], Any]
    model_config: Mapping[str, Any]
    evaluate: Callable[[nn.Module], Mapping[str, float]] | None = None
    files: Mapping[str, str | bytes | os.PathLike[str]] = field(default_factory=dict)
    report: Callable[..., None] | None = None


@runtime_checkable
class Task(Protocol):
    """What ``attnlab train TASK`` needs from a task."""

    name: str
    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the task's own options."""
        ...

    def build(self, args: argparse.Namespace, device: torch.device) -> TaskSetup:
        """Create model, data and optimizer from the parsed options."""
        ...


def register_task(task: Task) -> Task:
    """Make ``task`` available to ``attnlab train`` (a later registration of a name replaces it).

    Args:
        task: an object following :class:`Task`.

    Returns:
        ``task`` (so this works as a class-instance decorator helper).
    """
    for attr in ("name", "help", "add_arguments", "build"):
        if not hasattr(task, attr):
            raise TypeError(f"task must have {attr!r} (see attnlab.training.tasks_registry.Task)")
    if not isinstance(task.name, str) or not task.name.isidentifier():
        raise ValueError(f"task.name must be an identifier-like string, got {task.name!r}")
    _REGISTRY[task.name] = task
    return task


def _load_builtin() -> None:
    for module in TASK_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def available_tasks() -> dict[str, Task]:
    """The registered tasks by name (importing :data:`TASK_MODULES` first)."""
    _load_builtin()
    return dict(sorted(_REGISTRY.items()))


def get_task(name: str) -> Task:
    """The task called ``name``; ``ValueError`` listing the known ones otherwise."""
    tasks = available_tasks()
    if name not in tasks:
        known = ", ".join(tasks) or "none registered"
        raise ValueError(f"unknown task {name!r}; known tasks: {known}")
    return tasks[name]
