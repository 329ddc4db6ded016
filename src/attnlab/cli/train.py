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
import dataclasses

from rich.console import Console

from attnlab.cli._device import device
from attnlab.cli._help import plain
from attnlab.cli._terminal import TextConsole
from attnlab.cli.options import attention_spec, non_negative_int, positive_int, seed
from attnlab.cli.task_arguments import add_task_arguments
from attnlab.distributed.ring_schedule import LAYOUTS
from attnlab.tasks.driver import train
from attnlab.tasks.registry import available_tasks, get_task
from attnlab.tasks.train_options import PARALLEL, TrainOptions, options_class


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
    g.add_argument("--seed", type=seed, default=0, help="random seed (default 0)")
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
        description=plain(__doc__),
    )
    tasks = p.add_subparsers(dest="task", metavar="TASK", parser_class=type(p))
    tasks.required = True
    for name, task in available_tasks().items():
        tp = tasks.add_parser(name, help=task.help, description=task.help)
        add_common_arguments(tp)
        add_probe_arguments(tp)
        before = {a.dest for a in tp._actions}
        add_task_arguments(tp, name, task)
        task_dests = [a.dest for a in tp._actions if a.dest not in before and a.dest != "help"]
        tp.set_defaults(func=run, _task_dests=task_dests)


def _options(args: argparse.Namespace) -> TrainOptions:
    """The task's options dataclass, from the parsed command line."""
    task = get_task(args.task)
    dests = getattr(args, "_task_dests", [])
    cls = options_class(task, {d: getattr(args, d) for d in dests})
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vars(args).items() if k in names}
    if "attention" in names and "attention" in dests:
        values["attention"] = attention_spec(args)  # --attention NAME and its kind's options
    return cls(**values)


def run(args: argparse.Namespace) -> int:
    options = _options(args)
    console = Console(stderr=True)
    result = train(options, progress=console, report=TextConsole())
    if result.interrupted and result.is_main:
        console.print(
            f"interrupted at step {result.step}; checkpoint saved to {result.checkpoint}; "
            f"continue with --resume"
        )
    return 130 if result.interrupted else 0
