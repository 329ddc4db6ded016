"""``attnlab checkpoint convert RUN_OR_CHECKPOINT --out DIR`` — a sharded checkpoint into one folder.

A ``--parallel fsdp`` run writes sharded checkpoints (every process its part, with
``torch.distributed.checkpoint``); they resume training on any number of processes, but the
commands that read a model (``generate``, ``translate``, ``view``, ``inspect``, ``plot``) read
attnlab's single-folder checkpoint. ``convert`` puts the weights together in this one process
(no ``torchrun``) and writes them, with the run's configuration and the task's files, as the new
run folder ``DIR`` (see :func:`attnlab.distributed.checkpoint.consolidate`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.cli._help import plain
from attnlab.cli._terminal import TextConsole
from attnlab.cli.errors import CLIError

__all__ = ["register", "run_convert"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "checkpoint",
        help="work with checkpoints (convert a sharded one into a single folder)",
        description="Work with checkpoints.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
    actions.required = True
    c = actions.add_parser(
        "convert",
        help="write a sharded (--parallel fsdp) checkpoint as a single-folder run",
        description=plain(__doc__),
    )
    c.add_argument(
        "path",
        metavar="RUN_OR_CHECKPOINT",
        help="a run folder (its latest checkpoint) or one sharded checkpoint folder",
    )
    c.add_argument("--out", required=True, help="the new run folder (must not hold files)")
    c.set_defaults(func=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CLIError(f"--out must be a new or empty folder, got {out}, which holds files")
    # imported here: torch.distributed.checkpoint (and DTensor) cost every command's start-up
    # about a second of CPU when the parser was built
    from attnlab.distributed.checkpoint import consolidate

    path = consolidate(args.path, out)
    TextConsole().print(f"checkpoint: {path}")
    return 0
