"""Ring attention: peak memory per process and wall time, 1, 2 and 4 processes, same whole sequence.

One causal forward + backward of :func:`attnlab.distributed.ring_attention` over a whole sequence
of ``T`` tokens (default ``T = 32768``, batch 1, ``H = 4`` heads of ``d_head = 64``, fp32; the
inputs laid out as a model makes them, ``(B, T, H, D)`` viewed as ``(B, H, T, D)``), the
sequence spread over ``N`` processes (``T / N`` tokens each; gloo on the CPU on 127.0.0.1, one
thread per process), for every ``N`` and layout asked for. For each run it reports

* **peak memory per process** — the growth of each process's peak resident set over one step
  (:func:`attnlab.inspect.memory.peak_memory`, as in ``benchmarks/attention.py``: ``VmHWM``
  reset just before the step, after the inputs exist and a tiny warm-up step has loaded the
  kernels and the process group's buffers), the largest over the ranks; and its ratio to the
  one-process ring (the target: ``1/N``);
* **wall time** of the step, from a barrier before it to a barrier after it (so the slowest rank
  counts; the median of ``--repeats`` runs, default 3, the memory being the first run's), and the speed-up over one process (one thread) doing the same whole work.

Rows: ``torch.sdpa`` (``F.scaled_dot_product_attention(is_causal=True)`` on the whole sequence,
one process, the peer), ``ring`` with one process (no process group: the same kernel, merged by
nothing, the baseline of the ratios), with one process and two threads (the machine's cores in
one process), and ``ring`` on 2 and 4 processes in the ``zigzag`` layout (every rank the same
causal work) and, for comparison, the ``contiguous`` one (the last rank does the most work).
On a 2-core machine 4 processes share 2 cores: memory still falls as ``1/N``, time cannot.

What to expect of the memory: the inputs exist before the step and are not counted, so one
process alone holds about five chunk-sized tensors (``O``, ``dO`` and the kernel's ``dQ``, ``dK``,
``dV``). A rank of a ring holds the same five — ``O``, ``dO``, ``dQ`` and its own chunk's ``dK``,
``dV`` — plus about a dozen *slice*-sized buffers (the key/value chunks and the ``dK``/``dV``
shares travel in slices of 1024 tokens, 1 MiB each here: the slice in hand and the next one in
flight, the share being summed and the ones being exchanged, the kernel's gradients of one call),
about 13 MB whatever ``N``. The memory per process is therefore about five chunk-sized tensors of
``T / N`` tokens plus that constant: a bit more than half the single process's on two processes,
about a third on four at the default ``T`` (the ``KB / local token`` column is flat but for the
constant). Splitting into slices makes more, smaller kernel calls: the step takes a little longer
than with the chunks sent whole.

Usage::

    python benchmarks/ring_attention.py                 # T = 32768 (a few minutes)
    python benchmarks/ring_attention.py --quick         # T = 2048; seconds
    python benchmarks/ring_attention.py --length 16384 --worlds 1 2 --layouts zigzag
    attnlab bench ring_attention [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from _common import (
    fmt_mb,
    measure_ranks,
)  # benchmarks/_common.py (the script's folder is on sys.path)
from rich.console import Console
from rich.table import Table

H, D = 4, 64


@dataclass(frozen=True)
class Run:
    impl: str  # "torch.sdpa" | "ring"
    world: int
    layout: str
    threads: int

    @property
    def label(self) -> str:
        if self.impl == "torch.sdpa":
            return "torch.sdpa"
        return f"ring {self.layout}" if self.world > 1 else "ring"


def _make_step(rank: int, world: int, run: Run, length: int) -> Callable[[], None]:
    """One process's step (after a tiny warm-up that loads the kernels and the process group's
    buffers): a causal forward + backward over its ``length / world`` tokens."""
    import torch.nn.functional as F

    from attnlab.distributed import ring_attention

    def step_of(t_local: int) -> Callable[[], None]:
        gen = torch.Generator().manual_seed(rank)
        # as a model makes them: (B, T, H, D) viewed as (B, H, T, D)
        q, k, v = (
            torch.randn(1, t_local, H, D, generator=gen).transpose(1, 2).requires_grad_()
            for _ in range(3)
        )

        def step() -> None:
            if run.impl == "torch.sdpa":
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                out = ring_attention(q, k, v, is_causal=True, layout=run.layout)
            out.backward(torch.ones_like(out))
            for t in (q, k, v):
                t.grad = None

        return step

    step_of(16)()
    return step_of(length // world)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="T = 2048; seconds")
    parser.add_argument("--length", type=int, help="the whole sequence length T (default 32768)")
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--layouts", nargs="+", choices=["zigzag", "contiguous"], default=["zigzag", "contiguous"]
    )
    parser.add_argument("--no-peer", action="store_true", help="skip the torch.sdpa row")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (median; default 3)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    args = parser.parse_args(argv)
    length = args.length or (2048 if args.quick else 32768)

    runs = [] if args.no_peer else [Run("torch.sdpa", 1, "contiguous", 1)]
    if 1 in args.worlds:
        runs += [Run("ring", 1, "contiguous", 1), Run("ring", 1, "contiguous", 2)]
    for layout in args.layouts:
        runs += [Run("ring", w, layout, 1) for w in args.worlds if w > 1]

    console = Console(width=max(Console().width, 110))
    console.print(
        f"[bold]ring attention[/]: one causal forward + backward, T = {length}, B = 1, H = {H}, "
        f"d_head = {D}, fp32, torch {torch.__version__}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    table = Table(title="peak memory per process (largest over the ranks) and wall time")
    for col in (
        "impl",
        "processes",
        "threads",
        "T / process",
        "peak MB",
        "KB / local token",
        "× 1 proc",
        "wall s",
        "speed-up",
    ):
        table.add_column(col, justify="right")
    base: tuple[int, float] | None = None
    for run in runs:
        got = measure_ranks(
            _make_step,
            run.world,
            (run, length),
            threads=run.threads,
            repeats=args.repeats,
            timeout=args.timeout,
        )
        if isinstance(got, str):
            table.add_row(run.label, str(run.world), str(run.threads), "", "—", "", "", "—", got)
            continue
        peak, wall = got
        if run.impl == "ring" and run.world == 1 and run.threads == 1:
            base = got
        mem_ratio = f"{peak / base[0]:.2f}" if base and base[0] else "—"
        speed = f"{base[1] / wall:.2f}x" if base else "—"
        table.add_row(
            run.label,
            str(run.world),
            str(run.threads),
            str(length // run.world),
            fmt_mb(peak),
            f"{peak / (length // run.world) / 1024:.1f}",
            mem_ratio,
            f"{wall:.2f}",
            speed,
        )
    console.print(table)
    console.print(
        "× 1 proc: peak memory against the one-process ring (target 1/N: 0.50 for 2, 0.25 for 4); "
        "KB / local token: the peak over the tokens a process holds (flat when memory falls as "
        "1/N); speed-up: the one-process, one-thread ring's wall time over this row's."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
