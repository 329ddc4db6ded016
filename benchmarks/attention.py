"""Attention speed and memory: attnlab's backends against raw torch SDPA and nn.MultiheadAttention.

For every sequence length ``T`` (512 … 8192), dtype (fp32, bf16) and causal on/off, with ``H = 12``
heads of ``d_head = 64`` and batch 1, it measures

* **forward** time (under ``torch.no_grad()``) and **forward + backward** time — the median of
  several runs after a warm-up, all implementations of one case interleaved in one process so
  that a loaded machine slows them alike;
* **peak memory** of one forward and of one forward + backward, each in a fresh subprocess: the
  growth of the process's peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs``)
  over the resident size just before the step, after the inputs exist and a tiny warm-up step
  has loaded the kernels, measured by :func:`attnlab.inspect.memory.peak_memory`. This is what
  the operating system actually had to give the step (allocator caches included); its floor is
  a few MB of noise. Linux only.

Rows: ``torch.sdpa`` (``torch.nn.functional.scaled_dot_product_attention`` on ``(1, 12, T, 64)``
tensors), attnlab's backends ``math``, ``sdpa``, ``blockwise``, ``auto`` on the same tensors, and
the modules ``torch.MHA`` (``nn.MultiheadAttention(768, 12)``, ``need_weights=False``) and
``attnlab.MHA`` (``MultiHeadAttention.from_torch`` of it) on ``(1, T, 768)`` inputs. Ratios are
against ``torch.sdpa`` for the functional rows and against ``torch.MHA`` for ``attnlab.MHA``.

Usage::

    python benchmarks/attention.py            # full grid (minutes; math at T=8192 needs ~10 GB)
    python benchmarks/attention.py --quick    # T = 512, 1024; a few seconds
    attnlab bench attention [--quick]

The issue's targets are checked at the end (``sdpa`` within 5% of torch SDPA; ``blockwise``
forward <= 1.3x torch SDPA at T=4096 causal fp32; ``blockwise`` peak memory at T=8192 <= 1/16 of
``math``'s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from _common import (  # benchmarks/_common.py (the script's folder is on sys.path)
    as_step,
    available_bytes,
    fmt_mb,
    fmt_ms,
    fmt_ratio,
    median_times,
    probe_in_subprocess,
)
from rich.console import Console
from rich.table import Table
from torch import nn

import attnlab as al
from attnlab.inspect.memory import peak_memory, stabilize_allocator

H, D = 12, 64
FUNCTIONAL = ("torch.sdpa", "sdpa", "math", "blockwise", "auto")
MODULES = ("torch.MHA", "attnlab.MHA")
IMPLS = FUNCTIONAL + MODULES
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Case:
    impl: str
    t: int
    dtype: str
    causal: bool


def make_step(case: Case, backward: bool) -> Callable[[], None]:
    """A closure running one forward (and backward) of the case on fixed random inputs."""
    dtype = DTYPES[case.dtype]
    gen = torch.Generator().manual_seed(0)
    if case.impl in MODULES:
        ref = nn.MultiheadAttention(H * D, H, batch_first=True, dtype=dtype)
        ours = al.MultiHeadAttention.from_torch(ref)
        x = torch.randn(1, case.t, H * D, generator=gen).to(dtype).requires_grad_(backward)
        ignore = ~al.masks.causal_mask(case.t) if case.causal else None

        def forward() -> torch.Tensor:
            if case.impl == "torch.MHA":
                return ref(x, x, x, attn_mask=ignore, is_causal=case.causal, need_weights=False)[0]
            return ours(x, is_causal=case.causal)  # type: ignore[return-value]

    else:
        q, k, v = (
            torch.randn(1, H, case.t, D, generator=gen).to(dtype).requires_grad_(backward)
            for _ in range(3)
        )

        def forward() -> torch.Tensor:
            if case.impl == "torch.sdpa":
                return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)
            return al.scaled_dot_product_attention(  # type: ignore[return-value]
                q, k, v, is_causal=case.causal, backend=case.impl
            )

    return as_step(forward, backward)


def probe_memory(case: Case, backward: bool) -> int:
    """In this (fresh) process: growth of the peak resident set over one step, in bytes.

    Measured by :func:`attnlab.inspect.memory.peak_memory`: ``VmHWM`` of ``/proc/self/status``,
    reset just before the step through ``/proc/self/clear_refs`` (Linux >= 4.0), minus the
    resident size before it. (``getrusage``'s ``ru_maxrss`` would be wrong here: Linux carries
    the parent's high-water mark into an exec'd child.)
    """
    stabilize_allocator()  # before anything is allocated: see attnlab.inspect.memory
    make_step(Case(case.impl, 16, case.dtype, case.causal), backward)()  # load kernels
    step = make_step(case, backward)
    return peak_memory(step)


def peak_memory_in_subprocess(case: Case, backward: bool) -> int | None:
    """Run :func:`probe_memory` in a subprocess; ``None`` when it failed (e.g. out of memory)."""
    return probe_in_subprocess(__file__, {**case.__dict__, "backward": backward})


def math_bytes(t: int, dtype: str, backward: bool) -> int:
    """A rough peak of the math backend: a few (H, T, T) tensors (scores, weights, their grads)."""
    per = H * t * t * (4 if dtype == "fp32" else 2)
    return per * (6 if backward else 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="T = 512, 1024 only; fewer runs")
    parser.add_argument(
        "--lengths", type=int, nargs="+", help="sequence lengths (default 512…8192)"
    )
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--impls", nargs="+", choices=list(IMPLS), default=list(IMPLS))
    parser.add_argument("--repeats", type=int, help="timed runs per case (default 5; quick: 3)")
    parser.add_argument(
        "--no-memory", action="store_true", help="skip the peak-memory subprocesses"
    )
    parser.add_argument(
        "--memory-lengths",
        type=int,
        nargs="+",
        help="lengths whose memory is probed (default: all; --quick: the longest)",
    )
    parser.add_argument("--no-backward", action="store_true", help="time the forward only")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.probe:
        spec = json.loads(args.probe)
        backward = spec.pop("backward")
        print(probe_memory(Case(**spec), backward))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = args.lengths or ([512, 1024] if args.quick else [512, 1024, 2048, 4096, 8192])
    repeats = args.repeats or (3 if args.quick else 5)
    memory_lengths = set(args.memory_lengths or (lengths[-1:] if args.quick else lengths))
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    console = Console()
    console.print(
        f"[bold]attention benchmark[/]: H={H}, d_head={D}, batch 1, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}"
    )
    results: dict[tuple[str, int, str, bool], dict[str, float | int | None]] = {}
    for dtype in args.dtypes:
        for causal in causals:
            table = Table(
                title=f"{dtype}, {'causal' if causal else 'full'} — ms (ratio) and peak MB"
            )
            for col in (
                "T",
                "impl",
                "fwd ms",
                "fwd ×",
                "fwd+bwd ms",
                "fwd+bwd ×",
                "fwd MB",
                "fwd+bwd MB",
            ):
                table.add_column(col, justify="right")
            for t in lengths:
                row: dict[str, dict[str, float | int | None]] = {impl: {} for impl in args.impls}
                for backward in (False, True):
                    key = "bwd" if backward else "fwd"
                    steps = {}
                    for impl in args.impls:
                        too_big = (
                            impl == "math"
                            and math_bytes(t, dtype, backward) > 0.7 * available_bytes()
                        )
                        row[impl][key] = row[impl][key + "_mem"] = None
                        if not (too_big or (backward and args.no_backward)):
                            steps[impl] = make_step(Case(impl, t, dtype, causal), backward)
                    for impl, seconds in median_times(steps, repeats, enough_seconds=15.0).items():
                        row[impl][key] = seconds
                    del steps
                    if not args.no_memory and t in memory_lengths:
                        for impl in args.impls:
                            if row[impl][key] is not None:
                                mem = peak_memory_in_subprocess(
                                    Case(impl, t, dtype, causal), backward
                                )
                                row[impl][key + "_mem"] = mem
                for impl, r in row.items():
                    results[(impl, t, dtype, causal)] = r
                for impl, r in row.items():
                    base = row.get("torch.MHA" if impl in MODULES else "torch.sdpa", {})
                    table.add_row(
                        str(t),
                        impl,
                        fmt_ms(r["fwd"]),
                        fmt_ratio(r["fwd"], base.get("fwd")),  # type: ignore[arg-type]
                        fmt_ms(r["bwd"]),
                        fmt_ratio(r["bwd"], base.get("bwd")),  # type: ignore[arg-type]
                        fmt_mb(r["fwd_mem"]),
                        fmt_mb(r["bwd_mem"]),  # type: ignore[arg-type]
                        end_section=impl == args.impls[-1],
                    )
            console.print(table)
    _report_targets(console, results)
    return 0


def _report_targets(console: Console, results: dict) -> None:
    """The issue's three targets, where the grid measured them."""

    def get(impl: str, t: int, dtype: str, causal: bool, key: str) -> float | None:
        return results.get((impl, t, dtype, causal), {}).get(key)

    lines = []
    sdpa_ratios = [
        r["fwd"] / results[("torch.sdpa", t, d, c)]["fwd"]
        for (impl, t, d, c), r in results.items()
        if impl == "sdpa" and r.get("fwd") and results.get(("torch.sdpa", t, d, c), {}).get("fwd")
    ]
    if sdpa_ratios:
        worst = max(sdpa_ratios)
        lines.append(
            f"sdpa / torch SDPA forward: median {statistics.median(sdpa_ratios):.3f}x, worst {worst:.3f}x (target <= 1.05x)"
        )
    b, s = get("blockwise", 4096, "fp32", True, "fwd"), get("torch.sdpa", 4096, "fp32", True, "fwd")
    if b and s:
        lines.append(
            f"blockwise / torch SDPA forward at T=4096 causal fp32: {b / s:.2f}x (target <= 1.3x)"
        )
    for causal in (False, True):
        bm, mm = (
            get("blockwise", 8192, "fp32", causal, "fwd_mem"),
            get("math", 8192, "fp32", causal, "fwd_mem"),
        )
        if bm is not None and mm:
            lines.append(
                f"blockwise / math peak memory at T=8192 fp32 {'causal' if causal else 'full'} forward: "
                f"{bm / 2**20:.0f} MB / {mm / 2**20:.0f} MB = 1/{mm / max(bm, 1):.0f} (target <= 1/16)"
            )
    for line in lines:
        console.print(line)


if __name__ == "__main__":
    sys.exit(main())
