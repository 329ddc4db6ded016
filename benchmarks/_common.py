"""What the attention benchmarks share: timing steps that take turns, one forward (or forward +
backward) as a step, a peak-memory probe in a fresh subprocess, and the table's number formats."""

from __future__ import annotations

import datetime
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def as_step(
    forward: Callable[[], torch.Tensor], backward: bool, grads: tuple[torch.Tensor, ...] = ()
) -> Callable[[], None]:
    """One forward under ``no_grad``, or one forward + backward (then ``grads``' ``.grad`` are
    cleared, so that every run writes fresh gradients)."""
    if not backward:

        def step() -> None:
            with torch.no_grad():
                forward()

        return step

    def step_bwd() -> None:
        out = forward()
        out.backward(torch.ones_like(out))
        for t in grads:
            t.grad = None

    return step_bwd


def median_times(
    steps: dict[str, Callable[[], None]],
    repeats: int,
    *,
    warm_up: bool = True,
    enough_seconds: float | None = None,
    device: torch.device | None = None,
) -> dict[str, float]:
    """Median wall time of each step; the steps take turns, so that a load spike hits all alike.

    ``warm_up=False`` skips the untimed first run (for slow cases, after a small warm-up); with
    ``enough_seconds`` a step stops after three runs that took longer than that in all; a CUDA
    ``device`` is synchronised around each timed run (its kernels run asynchronously).
    """

    def sync() -> None:
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)

    if warm_up:
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            if enough_seconds is not None and len(times[name]) >= 3:
                if sum(times[name]) > enough_seconds:
                    continue
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def probe_in_subprocess(script: str | Path, spec: dict[str, object]) -> int | None:
    """Run ``script --probe SPEC`` in a fresh process with this one's threads; the last line it
    prints (bytes) as an int, or ``None`` when it failed (e.g. out of memory)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    proc = subprocess.run(
        [sys.executable, str(script), "--probe", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        return None
    return int(proc.stdout.strip().splitlines()[-1])


def available_bytes() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` (unbounded where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _peak_and_wall(
    step: Callable[[], None], barrier: Callable[[], None], repeats: int
) -> tuple[int, float]:
    """One rank's figures of a step: the peak-memory growth of its first run
    (:func:`attnlab.inspect.memory.peak_memory`) and the median wall time of ``repeats`` runs,
    each timed from a barrier to a barrier (so that the slowest rank counts)."""
    from attnlab.inspect.memory import peak_memory

    walls = []
    peak = 0
    for i in range(max(1, repeats)):
        barrier()
        t0 = time.perf_counter()
        if i == 0:
            peak = peak_memory(step)
        else:
            step()
        barrier()
        walls.append(time.perf_counter() - t0)
    return peak, statistics.median(walls)


def _rank_entry(
    rank: int,
    world: int,
    threads: int,
    repeats: int,
    port: int,
    queue: Any,
    make_step: Callable[..., Callable[[], None]],
    args: tuple[Any, ...],
) -> None:
    """One process of :func:`measure_ranks`: put ``(rank, peak bytes, wall seconds, error text
    or None)`` on ``queue``."""
    try:
        from attnlab.inspect.memory import stabilize_allocator

        stabilize_allocator()  # before anything is allocated: see attnlab.inspect.memory
        torch.set_num_threads(threads)
        import torch.distributed as dist

        if world > 1:
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                timeout=datetime.timedelta(minutes=10),
            )  # fmt: skip

        def barrier() -> None:
            if world > 1:
                dist.barrier()

        step = make_step(rank, world, *args)
        peak, wall = _peak_and_wall(step, barrier, repeats)
        queue.put((rank, peak, wall, None))
        if world > 1:
            dist.destroy_process_group()
    except BaseException as e:  # reported by the parent
        queue.put((rank, 0, 0.0, f"{type(e).__name__}: {e}"))


def measure_ranks(
    make_step: Callable[..., Callable[[], None]],
    world: int,
    args: tuple[Any, ...],
    *,
    threads: int = 1,
    repeats: int = 3,
    timeout: float = 600.0,
) -> tuple[int, float] | str:
    """One step measured on ``world`` fresh processes of ``threads`` threads each, joined in a
    gloo process group when ``world > 1``: each calls ``make_step(rank, world, *args)`` (a
    module-level function that builds its inputs, warms up and returns the step), then measures
    the step's peak-memory growth (first run) and median wall time (``repeats`` runs, barrier to
    barrier). Returns the largest peak and wall time over the ranks, or the first error text.

    The processes are forked from a ``forkserver`` that imported torch and attnlab once (a
    spawned process pays ~2-3 CPU seconds of imports each, every run of every world): each is
    still a process of its own, its memory measured from its own peak after the warm-up."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "attnlab"])  # read at its start
    queue = ctx.Queue()
    # read at torch's import (the fork server's, at its start); each process then sets its own
    os.environ["OMP_NUM_THREADS"] = str(threads)
    port = free_port()
    procs = [
        ctx.Process(
            target=_rank_entry,
            args=(r, world, threads, repeats, port, queue, make_step, args),
            daemon=True,
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in range(world):
            results.append(queue.get(timeout=timeout))
    except Exception:
        return f"no result within {timeout:.0f} s"
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    errors = [e for *_, e in results if e]
    if errors:
        return errors[0]
    return max(r[1] for r in results), max(r[2] for r in results)


def fmt_ms(t: float | None) -> str:
    return "—" if t is None else f"{t * 1e3:,.1f}"


def fmt_ratio(a: float | None, b: float | None, digits: int = 2) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.{digits}f}x"


def fmt_mb(m: float | None) -> str:
    return "—" if m is None else f"{m / 2**20:,.0f}"
