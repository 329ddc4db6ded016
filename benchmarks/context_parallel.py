"""A GPT training step with its sequence spread over 1, 2 and 4 processes: peak memory and time.

One forward + backward of the language-model loss of a GPT over a batch of one sequence of ``T``
tokens (default ``T = 8192``; 4 layers, ``n_embd = 128``, 4 heads, 65 characters, fp32), run as
``attnlab train lm --context-parallel C`` runs it: each of ``C`` processes holds ``T / C`` tokens
in the ``zigzag`` layout, at their global positions, and attention is ring attention over the
processes (:mod:`attnlab.distributed.context_parallel`; gloo on the CPU on 127.0.0.1, one thread
per process). ``C = 1`` is the plain model in one process (no ring), the baseline.

For each ``C`` it reports the **peak memory per process** (the growth of each process's peak
resident set over one step — :func:`attnlab.inspect.memory.peak_memory`, ``VmHWM`` reset just
before the step, after the model exists and a short warm-up step — the largest over the ranks)
and its ratio to one process, whose target is ``1/C``: everything a Transformer keeps for the
backward pass is per token (the activations of every layer, the logits), and attention's share
is the ring's chunk-sized buffers; and the **wall time** of the step from a barrier to a barrier (the median of ``--repeats``
runs, default 3; the memory is the first run's),
as a speed-up over one process (one thread) doing the same work. On a 2-core machine 4 processes
share 2 cores: memory still falls, time cannot.

Usage::

    python benchmarks/context_parallel.py                # T = 8192 (about a minute)
    python benchmarks/context_parallel.py --quick        # T = 1024; seconds
    python benchmarks/context_parallel.py --length 16384 --worlds 1 2
    attnlab bench context_parallel [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from _common import (
    fmt_mb,
    measure_ranks,
)  # benchmarks/_common.py (the script's folder is on sys.path)
from rich.console import Console
from rich.table import Table

LAYERS, EMBD, HEADS, VOCAB = 4, 128, 4, 65


def _make_step(rank: int, world: int, length: int) -> Callable[[], None]:
    """One process's step (after a short warm-up that loads the kernels and the process group's
    buffers): forward + backward of the LM loss over its ``length / world`` tokens."""
    import torch.nn.functional as F

    from attnlab.distributed.context_parallel import ContextParallelModel, context_parallelize
    from attnlab.distributed.ring_schedule import shard_sequence
    from attnlab.models.config import GPTConfig
    from attnlab.models.gpt import GPT

    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=VOCAB, n_positions=length, n_embd=EMBD, n_layer=LAYERS, n_head=HEADS,
        dropout=0.0,
    )  # fmt: skip
    model: Any = GPT(cfg)
    if world > 1:
        model = ContextParallelModel(context_parallelize(model, None), rank, world, "zigzag")
    ids = torch.randint(VOCAB, (1, length + 1), generator=torch.Generator().manual_seed(1))

    def step_of(t: int) -> Callable[[], None]:
        whole = ids[:, : t + 1]
        inputs, targets = (
            shard_sequence(x, 1, rank=rank, world_size=world, layout="zigzag")
            for x in (whole[:, :-1], whole[:, 1:])
        )

        def step() -> None:
            logits = model(inputs).logits
            F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
            model.zero_grad(set_to_none=True)

        return step

    step_of(4 * world)()
    return step_of(length)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="T = 1024; seconds")
    parser.add_argument("--length", type=int, help="the sequence length T (default 8192)")
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (median; default 3)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    args = parser.parse_args(argv)
    length = args.length or (1024 if args.quick else 8192)
    if any(w < 1 or length % (2 * w) for w in args.worlds):
        parser.error(f"--length {length} must be divisible by 2 × every --worlds value")

    console = Console(width=max(Console().width, 100))
    console.print(
        f"[bold]GPT context parallel[/]: one forward + backward of the LM loss, T = {length}, "
        f"{LAYERS} layers, n_embd = {EMBD}, {HEADS} heads, fp32, torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    table = Table(title="peak memory per process (largest over the ranks) and wall time")
    for col in ("processes", "T / process", "peak MB", "× 1 proc", "wall s", "speed-up"):
        table.add_column(col, justify="right")
    base: tuple[int, float] | None = None
    for world in args.worlds:
        got = measure_ranks(
            _make_step, world, (length,), repeats=args.repeats, timeout=args.timeout
        )
        if isinstance(got, str):
            table.add_row(str(world), str(length // world), "—", "", "—", got)
            continue
        peak, wall = got
        if world == 1:
            base = got
        table.add_row(
            str(world),
            str(length // world),
            fmt_mb(peak),
            f"{peak / base[0]:.2f}" if base and base[0] else "—",
            f"{wall:.2f}",
            f"{base[1] / wall:.2f}x" if base else "—",
        )
    console.print(table)
    console.print(
        "× 1 proc: peak memory against one process (target 1/C: 0.50 for 2, 0.25 for 4); "
        "speed-up: one process's wall time over this row's."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
