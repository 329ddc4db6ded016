"""``attnlab train TASK --out DIR --steps N --seed S [--resume] [task options]``.

The generic driver: it seeds the generators, lets the task (see
:mod:`attnlab.tasks`) build model, data and optimizer, and runs the
:class:`~attnlab.training.trainer.Trainer` with a rich progress bar. ``--steps`` is the total
number of optimizer steps: ``--resume --steps 40`` on a run stopped at 20 trains 20 more. Ctrl-C
saves a checkpoint and exits with code 130. Under ``torchrun --nproc_per_node N`` it trains with
DistributedDataParallel on the same global batch; rank 0 writes and prints.

``--parallel fsdp`` shards the model, its gradients and the optimizer state over the processes
instead (FSDP2, :class:`attnlab.distributed.fsdp.FSDPStrategy`): every rank writes its shards of
each checkpoint, which resumes with any number of processes (``--parallel fsdp`` again) and
becomes a single folder with ``attnlab checkpoint convert``. Without ``torchrun`` it trains one
process, unsharded, writing the same sharded checkpoints (one shard).

``--context-parallel C`` spreads every sequence over ``C`` processes (ring attention) and
``--tensor-parallel N`` every layer's heads and feed-forward units over ``N``; the ``W``
processes form a ``(data, context, tensor)`` mesh of ``W / (C·N) × C × N``
(:class:`attnlab.distributed.mesh.MeshStrategy`). Their checkpoints are single folders that
resume with any other layout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from attnlab.cli._device import device
from attnlab.cli._terminal import TextConsole
from attnlab.cli.errors import CLIError
from attnlab.distributed.fsdp import FSDPStrategy
from attnlab.distributed.mesh import MeshStrategy
from attnlab.distributed.ring_schedule import LAYOUTS
from attnlab.tasks.options import attention_dests, non_negative_int, positive_int
from attnlab.tasks.probe import AttentionProbe
from attnlab.tasks.registry import available_tasks, get_task
from attnlab.training.checkpoint import list_checkpoints, resolve_checkpoint
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


def _clip(text: str) -> float | None:
    if text.lower() in ("none", "0", "off"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive float or 'none', got {text!r}"
        ) from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive float or 'none', got {text!r}")
    return value


#: ``--parallel`` choices
PARALLEL = ("ddp", "fsdp")


def strategy_of(args: argparse.Namespace) -> ParallelStrategy:
    """The trainer's :class:`~attnlab.training.processes.ParallelStrategy` for ``--parallel``,
    ``--context-parallel`` and ``--tensor-parallel``."""
    name = getattr(args, "parallel", "ddp")
    cp = getattr(args, "context_parallel", 1)
    tp = getattr(args, "tensor_parallel", 1)
    if cp == 1 and tp == 1:
        return FSDPStrategy() if name == "fsdp" else DDPStrategy()
    if name == "fsdp":
        raise CLIError(
            "--parallel fsdp does not combine with --context-parallel or --tensor-parallel: "
            "their data-parallel dimension replicates the model (use --parallel ddp)"
        )
    return MeshStrategy(
        context_parallel=cp, tensor_parallel=tp, layout=getattr(args, "context_layout", "zigzag")
    )


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    """The options every task shares."""
    g = p.add_argument_group("training")
    g.add_argument("--out", required=True, help="run folder (checkpoints, metrics.jsonl)")
    g.add_argument(
        "--steps",
        type=non_negative_int,
        required=True,
        help="total number of optimizer steps (a resumed run continues up to it)",
    )
    g.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default 0)")
    g.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    g.add_argument(
        "--grad-accum",
        type=positive_int,
        default=1,
        help="micro-batches per optimizer step (default 1)",
    )
    g.add_argument(
        "--clip",
        type=_clip,
        default=1.0,
        help="clip the gradient norm to this ('none' to disable; default 1.0)",
    )
    precision = g.add_mutually_exclusive_group()
    precision.add_argument("--bf16", action="store_true", help="bf16 autocast")
    precision.add_argument(
        "--fp16",
        action="store_true",
        help="fp16 autocast with a gradient scaler (part of the run's configuration)",
    )
    g.add_argument(
        "--grad-checkpoint",
        action="store_true",
        help="gradient checkpointing: recompute activations in the backward pass, trading "
        "compute for memory; results do not change, so it may differ on --resume",
    )
    g.add_argument(
        "--eval-every",
        type=non_negative_int,
        default=0,
        help="evaluate every N steps (0: at the end only)",
    )
    g.add_argument(
        "--save-every",
        type=non_negative_int,
        default=0,
        help="checkpoint every N steps (0: at the end only)",
    )
    g.add_argument(
        "--keep-last", type=positive_int, default=2, help="checkpoints to keep (default 2)"
    )
    g.add_argument(
        "--parallel",
        choices=PARALLEL,
        default="ddp",
        help="under torchrun: ddp (a replica per process; default) or fsdp (parameters, "
        "gradients and optimizer state sharded over the processes, FSDP2; sharded checkpoints "
        "that resume on any number of processes, `attnlab checkpoint convert` makes one folder)",
    )
    g.add_argument(
        "--context-parallel",
        type=positive_int,
        default=1,
        metavar="C",
        help="under torchrun: spread every sequence over C processes, attention as ring "
        "attention (GPT, attention full, no dropout); default 1",
    )
    g.add_argument(
        "--context-layout",
        choices=LAYOUTS,
        default="zigzag",
        help="which tokens each context-parallel process holds: zigzag (an early and a late "
        "chunk, the causal work balanced; default) or contiguous",
    )
    g.add_argument(
        "--tensor-parallel",
        type=positive_int,
        default=1,
        metavar="N",
        help="under torchrun: split every layer's heads and feed-forward units over N "
        "processes (Megatron-style, DTensor); the processes form a (data, context, tensor) "
        "mesh of W / (C·N) × C × N; default 1",
    )
    g.add_argument(
        "--device",
        type=device,
        default=None,
        help="cpu or cuda (default: cuda when available)",
    )
    g.add_argument(
        "--force",
        action="store_true",
        help="train in a non-empty --out that is not an attnlab run (overwrites its files)",
    )
    g.add_argument(
        "--allow-data-change",
        action="store_true",
        help="--resume even though a data file changed since the checkpoint",
    )


def add_probe_arguments(p: argparse.ArgumentParser) -> None:
    """``--probe TEXT --probe-every N``: record a fixed input's attention while training."""
    g = p.add_argument_group("attention during training")
    g.add_argument(
        "--probe",
        default=None,
        metavar="TEXT",
        help="record the attention of this input every --probe-every steps (RUN/probe/; "
        "`attnlab plot training RUN` draws it); translate takes 'SOURCE ||| TARGET'",
    )
    g.add_argument(
        "--probe-every",
        type=positive_int,
        default=50,
        help="steps between probe records (default 50; step 0 and the last step always)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a model on a task (resumable; torchrun-ready)",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    tasks = p.add_subparsers(dest="task", metavar="TASK", parser_class=type(p))
    tasks.required = True
    for name, task in available_tasks().items():
        tp = tasks.add_parser(name, help=task.help, description=task.help)
        add_common_arguments(tp)
        add_probe_arguments(tp)
        before = {a.dest for a in tp._actions}
        task.add_arguments(tp)
        task_dests = [a.dest for a in tp._actions if a.dest not in before and a.dest != "help"]
        tp.set_defaults(func=run, _task_dests=task_dests)


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def run_config_of(args: argparse.Namespace, model_config: Any) -> dict[str, Any]:
    """What ``config.json`` holds besides ``"train"`` (see attnlab.tasks.base)."""
    task_args = {"seed": args.seed}
    unset_is_absent = attention_dests()
    for dest in getattr(args, "_task_dests", []):
        if dest in unset_is_absent and getattr(args, dest) is None:
            continue  # unset: as a run saved before the option existed
        task_args[dest] = _jsonable(getattr(args, dest))
    return {"task": args.task, "args": task_args, "model": _jsonable(dict(model_config))}


def _check_resumable(out: Path, steps: int) -> None:
    """A one-line error when ``out`` has no checkpoint to resume, or one past ``--steps``."""
    ckpt = resolve_checkpoint(out)
    done = dict((path, step) for step, path in list_checkpoints(out)).get(ckpt)
    if done is not None and done > steps:
        raise CLIError(
            f"--steps must be at least the {done} steps the checkpoint has done, got {steps}"
        )


def run(args: argparse.Namespace) -> int:
    task = get_task(args.task)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out must be a folder, got the file {out}")
    has_ckpt = bool(list_checkpoints(out)) or (out / "checkpoints" / "latest").exists()
    if args.resume:
        _check_resumable(out, args.steps)
    elif has_ckpt:
        raise CLIError(
            f"{out} already holds a checkpoint; pass --resume to continue it or choose another --out"
        )
    check_run_dir(out, force=args.force)  # a user's folder is refused before any set-up
    strategy = strategy_of(args)  # options that do not fit together: before any set-up
    dist = init_distributed(args.device)
    console = Console(stderr=True)
    lock = None
    trainer: Trainer | None = None
    try:
        seed_everything(args.seed)
        setup = task.build(args, dist.device)
        # not part of the run's configuration: recomputing activations does not change results
        if getattr(args, "grad_checkpoint", False):
            if not hasattr(setup.model, "gradient_checkpointing"):
                raise CLIError(
                    f"--grad-checkpoint: the model of task {args.task!r} "
                    f"({type(setup.model).__name__}) has no gradient checkpointing"
                )
            setattr(setup.model, "gradient_checkpointing", True)  # noqa: B010
        config = TrainConfig(
            steps=args.steps,
            grad_accum=args.grad_accum,
            clip=args.clip,
            bf16=args.bf16,
            fp16=getattr(args, "fp16", False),
            eval_every=args.eval_every,
            save_every=args.save_every,
            keep_last=args.keep_last,
        )
        progress = RichProgress(console, description=args.task)
        callbacks: list[TrainerCallback] = [progress]
        if args.probe is not None:
            if not strategy.runs_alone and dist.distributed:
                raise CLIError(
                    "--probe records on rank 0 alone, which cannot run a model spread over "
                    "the processes (--parallel fsdp, --context-parallel, --tensor-parallel): "
                    "drop --probe or train with --parallel ddp"
                )
            if setup.io is None:
                raise CLIError(f"--probe: the task {args.task!r} has no text path to encode it")
            probe = setup.io.probe_inputs(args.probe)
            callbacks.append(AttentionProbe(out, probe, args.probe_every, args.probe))
        trainer = Trainer(
            setup.model,
            make_optimizer=setup.make_optimizer,
            batches=setup.batches,
            loss_fn=setup.loss_fn,
            config=config,
            run_dir=out,
            run_config=run_config_of(args, setup.model_config),
            files=setup.files,
            evaluate=setup.evaluate,
            callbacks=callbacks,
            dist=dist,
            data_files=setup.data_files,
            strategy=strategy,
        )
        # every option checked: lock the folder for this one training before writing into it
        if dist.is_main:
            lock = claim_run_dir(out, resume=args.resume, force=args.force)
        if args.resume:
            trainer.resume(allow_data_change=args.allow_data_change)
        elif dist.is_main and (out / METRICS_FILE).exists():
            (out / METRICS_FILE).unlink()  # left by a run killed before its first checkpoint
        result = trainer.fit()
        # the whole model for the report (every rank takes part when it is sharded)
        model = (
            trainer.gathered_model()
            if setup.report is not None and not result.interrupted
            else None
        )
        if not dist.is_main:
            return 130 if result.interrupted else 0
        if result.interrupted:
            console.print(
                f"interrupted at step {result.step}; checkpoint saved to {result.checkpoint}; "
                f"continue with --resume"
            )
            return 130
        stdout = TextConsole()  # a report's text: control characters escaped on a terminal
        if result.losses:
            stdout.print(f"step {result.step}: loss {result.losses[-1]:.4f}")
        if result.eval_metrics:
            text = "  ".join(f"{k} {v:.4g}" for k, v in result.eval_metrics.items())
            stdout.print(f"evaluation: {text}")
        stdout.print(f"checkpoint: {result.checkpoint}")
        if setup.report is not None and model is not None:
            setup.report(model, out, stdout)
        return 0
    finally:
        if lock is not None:
            lock.release()
        if trainer is not None:
            trainer.close()  # DDP's reducer first: see Trainer.close
        cleanup_distributed()
