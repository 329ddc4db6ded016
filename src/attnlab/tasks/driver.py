"""Train a task from Python: :func:`train`, the one place where a task meets the trainer.

``attnlab train TASK``, the notebooks and the benchmarks all call it. It checks the run folder,
seeds the generators, lets the task build model, data and optimizer from its options
(:mod:`attnlab.tasks.train_options`), and runs the :class:`~attnlab.training.trainer.Trainer`:
with a progress bar, the attention probe, resumption, a lock on the run folder, and under
``torchrun`` the chosen parallel strategy.

Examples:
    >>> from attnlab import tasks
    >>> result = tasks.train("reverse", out="runs/rev", steps=1200)   # doctest: +SKIP
    >>> result.eval_metrics["exact_match"]                            # doctest: +SKIP
    1.0
    >>> opts = tasks.LMOptions(data="tinyshakespeare", out="runs/shk", steps=2000)
    >>> result = tasks.train(opts, eval_every=500)                    # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from torch import nn

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.tasks.base import TaskSetup
from attnlab.tasks.probe import AttentionProbe
from attnlab.tasks.registry import get_task
from attnlab.tasks.train_options import TrainOptions, options_class, run_args
from attnlab.training.checkpoint import list_checkpoints, read_config, resolve_checkpoint
from attnlab.training.processes import (
    DDPStrategy,
    ParallelStrategy,
    cleanup_distributed,
    init_distributed,
)
from attnlab.training.progress import RichProgress
from attnlab.training.rng import seed_everything
from attnlab.training.run_dir import check_run_dir, claim_run_dir
from attnlab.training.trainer import METRICS_FILE, TrainConfig, Trainer, TrainerCallback

__all__ = ["TaskRun", "strategy_of", "train"]


@dataclass
class TaskRun:
    """What :func:`train` did.

    Attributes:
        options: the options the run trained with.
        run_dir: its folder (checkpoints, ``metrics.jsonl``, the task's report files).
        model: the trained model: on rank 0 the whole model; on other ranks of a sharded run
            the process's own part of it.
        setup: what the task built (batches, loss, evaluation, its text path ``setup.io``).
        step: steps done in total.
        interrupted: stopped early (Ctrl-C, SIGTERM, or a callback's ``request_stop``); a
            checkpoint was saved, and ``resume=True`` continues it.
        losses: the training loss of each step this call ran.
        eval_metrics: the last evaluation, if any.
        checkpoint: the last checkpoint written (``None`` on ranks other than 0).
        elapsed: seconds of training.
        is_main: whether this process is rank 0 (the one that writes and reports).
    """

    options: TrainOptions
    run_dir: Path
    model: nn.Module
    setup: TaskSetup
    step: int
    interrupted: bool
    losses: list[float]
    eval_metrics: dict[str, float] | None
    checkpoint: Path | None
    elapsed: float
    is_main: bool = True


def strategy_of(options: TrainOptions) -> ParallelStrategy:
    """The trainer's :class:`~attnlab.training.processes.ParallelStrategy` for ``parallel``,
    ``context_parallel`` and ``tensor_parallel``.

    Args:
        options: the run's options.

    Returns:
        DDP, FSDP or a (data, context, tensor) mesh.

    Raises:
        ValueError: ``parallel="fsdp"`` with context or tensor parallelism.
    """
    # attnlab.distributed is imported only in the branch that uses it: it pulls in
    # torch.distributed.checkpoint, which DDP — and every run on one device — never needs
    # (DTensor comes anyway: the optimizer imports torch._dynamo, which imports it)
    cp, tp = options.context_parallel, options.tensor_parallel
    if cp == 1 and tp == 1:
        if options.parallel != "fsdp":
            return DDPStrategy()
        from attnlab.distributed.fsdp import FSDPStrategy

        return FSDPStrategy()
    if options.parallel == "fsdp":
        raise ArgumentError(
            "--parallel fsdp does not combine with --context-parallel or --tensor-parallel: "
            "their data-parallel dimension replicates the model (use --parallel ddp)"
        )
    from attnlab.distributed.mesh import MeshStrategy

    return MeshStrategy(context_parallel=cp, tensor_parallel=tp, layout=options.context_layout)


def _options(task: str | TrainOptions, overrides: dict[str, Any]) -> TrainOptions:
    if isinstance(task, TrainOptions):
        return dataclasses.replace(task, **overrides) if overrides else task
    if not isinstance(task, str):
        raise ArgumentTypeError(
            f"task must be a task's name or a TrainOptions, got {type(task).__name__}"
        )
    cls = options_class(get_task(task))
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ArgumentError(
            f"options must be fields of {cls.__name__}, got {', '.join(map(repr, unknown))}"
        )
    return cls(**{**overrides, "task": task})


def _check_out(options: TrainOptions) -> Path:
    """The run folder, refused in one line when it cannot take this run (before any set-up)."""
    out = Path(options.out)
    if out.exists() and not out.is_dir():
        raise ArgumentError(f"--out must be a folder, got the file {out}")
    if options.resume:
        ckpt = resolve_checkpoint(out)
        done = dict((path, step) for step, path in list_checkpoints(out)).get(ckpt)
        if done is not None and done > options.steps:
            raise ArgumentError(
                f"--steps must be at least the {done} steps the checkpoint has done, "
                f"got {options.steps}"
            )
    elif list_checkpoints(out) or (out / "checkpoints" / "latest").exists():
        raise ArgumentError(
            f"{out} already holds a checkpoint; pass --resume to continue it or choose another --out"
        )
    check_run_dir(out, force=options.force)  # a user's folder is refused before any set-up
    return out


def _resumed_warmup(options: TrainOptions, out: Path) -> TrainOptions:
    """A default warm-up (``None``) depends on the run's length; a resumed run keeps the one it
    saved, so that ``--resume --steps`` with more steps continues the same schedule."""
    if not options.resume or getattr(options, "warmup", 0) is not None:
        return options
    saved = read_config(resolve_checkpoint(out)).get("args", {}).get("warmup")
    if isinstance(saved, int) and not isinstance(saved, bool):
        return dataclasses.replace(options, warmup=saved)  # type: ignore[call-arg]
    return options


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def _print_summary(console: Any, result: Any) -> None:
    if result.losses:
        console.print(f"step {result.step}: loss {result.losses[-1]:.4f}")
    if result.eval_metrics:
        text = "  ".join(f"{k} {v:.4g}" for k, v in result.eval_metrics.items())
        console.print(f"evaluation: {text}")
    console.print(f"checkpoint: {result.checkpoint}")


def train(
    task: str | TrainOptions,
    /,
    *,
    progress: Console | bool = True,
    report: Any = None,
    callbacks: Sequence[TrainerCallback] = (),
    **overrides: Any,
) -> TaskRun:
    """Train a task: its options checked, its model built and trained, its run folder written.

    ``steps`` is the total number of optimizer steps: ``resume=True, steps=40`` on a run
    stopped at 20 trains 20 more. Ctrl-C saves a checkpoint and returns with ``interrupted``.
    Under ``torchrun`` every process calls it; rank 0 writes and reports.

    Args:
        task: a task's name (``"lm"``, ``"translate"``, ``"copy"``, ``"reverse"``, ``"sort"``)
            with its options as ``overrides``, or a :class:`~attnlab.tasks.train_options.TrainOptions`
            (e.g. :class:`~attnlab.tasks.train_options.LMOptions`), which ``overrides`` replace
            fields of.
        progress: a progress bar on this rich ``Console``, on stderr (``True``), or none
            (``False``).
        report: where the summary (last loss, evaluation, checkpoint) and the task's report
            (accuracy, samples, BLEU; files in the run folder) are printed after training — an
            object with ``print`` such as a rich ``Console`` — or ``None`` for neither (the
            task's report files are not written then).
        callbacks: more trainer callbacks (rank 0), after the progress bar and the probe.
        **overrides: the options' fields (``out``, ``steps``, ``seed``, ``block_size``, ...).

    Returns:
        A :class:`TaskRun`: the trained model, what the task built, and the trainer's result.

    Raises:
        TypeError: ``task`` is neither a name nor options, or a field has the wrong type.
        ValueError: an unknown task or field, an option out of range, options that do not fit
            together, a run folder that cannot take the run, unreadable data (one line each,
            before any step).
    """
    options = _options(task, overrides)
    runner = get_task(options.task)
    out = _check_out(options)
    options = _resumed_warmup(options, out)
    strategy = strategy_of(options)  # options that do not fit together: before any set-up
    dist = init_distributed(options.device)
    lock = None
    trainer: Trainer | None = None
    try:
        seed_everything(options.seed)
        setup = runner.build(options, dist.device)
        # not part of the run's configuration: recomputing activations does not change results
        if options.grad_checkpoint:
            if not hasattr(setup.model, "gradient_checkpointing"):
                raise ArgumentError(
                    f"--grad-checkpoint: the model of task {options.task!r} "
                    f"({type(setup.model).__name__}) has no gradient checkpointing"
                )
            setattr(setup.model, "gradient_checkpointing", True)  # noqa: B010
        config = TrainConfig(
            steps=options.steps, grad_accum=options.grad_accum, clip=options.clip,
            bf16=options.bf16, fp16=options.fp16, eval_every=options.eval_every,
            save_every=options.save_every, keep_last=options.keep_last,
        )  # fmt: skip
        hooks: list[TrainerCallback] = []
        if progress is not False:
            console = progress if isinstance(progress, Console) else Console(stderr=True)
            hooks.append(RichProgress(console, description=options.task))
        if options.probe is not None:
            if not strategy.runs_alone and dist.distributed:
                raise ArgumentError(
                    "--probe records on rank 0 alone, which cannot run a model spread over "
                    "the processes (--parallel fsdp, --context-parallel, --tensor-parallel): "
                    "drop --probe or train with --parallel ddp"
                )
            if setup.io is None:
                raise ArgumentError(
                    f"--probe: the task {options.task!r} has no text path to encode it"
                )
            probe = setup.io.probe_inputs(options.probe)
            hooks.append(AttentionProbe(out, probe, options.probe_every, options.probe))
        hooks.extend(callbacks)
        trainer = Trainer(
            setup.model,
            make_optimizer=setup.make_optimizer,
            batches=setup.batches,
            loss_fn=setup.loss_fn,
            config=config,
            run_dir=out,
            run_config={
                "task": options.task,
                "args": run_args(options),
                "model": _jsonable(dict(setup.model_config)),
            },
            files=setup.files,
            evaluate=setup.evaluate,
            callbacks=hooks,
            dist=dist,
            data_files=setup.data_files,
            strategy=strategy,
        )
        # every option checked: lock the folder for this one training before writing into it
        if dist.is_main:
            lock = claim_run_dir(out, resume=options.resume, force=options.force)
        if options.resume:
            trainer.resume(allow_data_change=options.allow_data_change)
        elif dist.is_main and (out / METRICS_FILE).exists():
            (out / METRICS_FILE).unlink()  # left by a run killed before its first checkpoint
        result = trainer.fit()
        # the whole model (every rank takes part when it is sharded)
        model = trainer.gathered_model() if not result.interrupted else None
        if dist.is_main and not result.interrupted and report is not None:
            _print_summary(report, result)
            if setup.report is not None and model is not None:
                setup.report(model, out, report)
        return TaskRun(
            options=options, run_dir=out, model=model if model is not None else setup.model,
            setup=setup, step=result.step, interrupted=result.interrupted,
            losses=result.losses, eval_metrics=result.eval_metrics,
            checkpoint=result.checkpoint, elapsed=result.elapsed, is_main=dist.is_main,
        )  # fmt: skip
    finally:
        if lock is not None:
            lock.release()
        if trainer is not None:
            trainer.close()  # DDP's reducer first: see Trainer.close
        cleanup_distributed()
