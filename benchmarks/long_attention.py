"""Long-context attention: sliding window, BigBird, Linformer and Performer against torch SDPA.

For every sequence length ``T`` (1024 … 65536), with ``H = 12`` heads of ``d_head = 64``, batch 1
and fp32, it measures for each method

* **forward** time (under ``torch.no_grad()``) and **forward + backward** time (gradients of
  ``q``, ``k``, ``v``) — the median of several runs after a warm-up, every method of one length
  taking turns in one process (on the same inputs), so that a loaded machine slows them alike;
  each time also as a ratio against ``torch.sdpa`` at the same ``T``;
* **peak memory** of one forward and of one forward + backward, each in a fresh subprocess: the
  growth of the process's peak resident set over the resident size just before the step, after
  the inputs exist and a small warm-up step has loaded the kernels
  (:func:`attnlab.inspect.memory.peak_memory`, as in ``benchmarks/attention.py``; Linux only);
  and that peak divided by ``T`` — **memory per query**, flat in ``T`` for a method whose memory
  is linear in ``T``.

Methods (``H = 12``, ``d_head = 64``):

* ``torch.sdpa`` — ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)``,
  full causal attention: **the peer** every ratio is taken against;
* ``blockwise`` — :func:`attnlab.scaled_dot_product_attention` with ``backend="blockwise"``,
  full causal (online softmax; memory ``O(T · block)``, time ``O(T²)``);
* ``sliding`` — the same backend with ``window=256`` and ``is_causal=True``: each query sees
  itself and the 256 keys before it; the backend visits only the tiles the band meets;
* ``bigbird`` — BigBird's block-sparse layout (:func:`attnlab.nn.masks.bigbird_layout`, blocks of
  64: one global block, a band of three blocks, two random blocks a row; Zaheer et al. 2020),
  causal, passed as ``block_mask=`` to the blockwise backend, which visits the visible tiles
  only — when that API exists; a marked TODO row otherwise;
* ``linformer`` — :func:`attnlab.nn.linformer.linformer_attention` with fixed random ``E``,
  ``F`` of ``k = 256`` rows: keys and values projected along the sequence axis. **Not causal**
  (Linformer has no causal form): it does different, cheaper work than the causal rows;
* ``performer`` — :func:`attnlab.nn.performer.favor_attention` with 256 orthogonal random
  features, causal (chunked prefix sums).

A case is skipped, with the reason printed, when its predicted peak memory exceeds 70% of the
memory available now, or its predicted time for one forward + backward exceeds ``--max-seconds``
(the quadratic methods at ``T >= 32768`` by default) — both decided from formulas before running.

Usage::

    python benchmarks/long_attention.py                  # T = 1k … 64k (about 10 minutes)
    python benchmarks/long_attention.py --quick          # T = 512, 1024, one run; seconds
    python benchmarks/long_attention.py --figure build/long_attention.png
    attnlab bench long_attention [--quick] [--args "--lengths 4096 16384 --figure f.png"]

The issue's target is checked at the end: the sliding window (``w = 256``) at ``T = 16384`` takes
at most 1/10 of full causal torch SDPA's time, and its memory per query is flat in ``T``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

import attnlab as al
from attnlab.inspect.memory import peak_memory, stabilize_allocator
from attnlab.nn import masks
from attnlab.nn.linformer import linformer_attention, random_projection
from attnlab.nn.performer import favor_attention, orthogonal_random_features

H, D = 12, 64
WINDOW = 256  # sliding window: keys before each query
PROJECTED = 256  # Linformer's k
FEATURES = 256  # Performer's m
BIGBIRD_BLOCK = 64  # BigBird's block size (window, global and random blocks of this many keys)
PEER = "torch.sdpa"
METHODS = ("torch.sdpa", "blockwise", "sliding", "bigbird", "linformer", "performer")
LABELS = {
    "torch.sdpa": "torch.sdpa, full causal (peer)",
    "blockwise": "attnlab blockwise, full causal",
    "sliding": f"sliding window w={WINDOW}, causal",
    "bigbird": f"BigBird block-sparse b={BIGBIRD_BLOCK}, causal",
    "linformer": f"Linformer k={PROJECTED}, NON-causal",
    "performer": f"Performer m={FEATURES}, causal",
}
QUADRATIC = ("torch.sdpa", "blockwise")
FP32 = 4  # bytes per element
FLOP_RATE = 100e9  # fp32 FLOP/s assumed by the time prediction (~190 peak on 2 cores, shared)
BACKWARD_FACTOR = 4.0  # predicted forward + backward time / forward time
BANDWIDTH = 10e9  # bytes/s assumed for memory-bound work (~22 GB/s on two idle cores)


# ------------------------------------------------------------------------------------- methods


def bigbird_builder() -> Callable[..., object] | None:
    """:func:`attnlab.nn.masks.bigbird_layout`, when it exists and
    :func:`attnlab.scaled_dot_product_attention` takes its ``block_mask=`` (so that the blockwise
    backend visits only the visible tiles); ``None`` otherwise."""
    builder = getattr(masks, "bigbird_layout", None)
    takes = "block_mask" in inspect.signature(al.scaled_dot_product_attention).parameters
    return builder if callable(builder) and takes else None


@dataclass(frozen=True)
class Case:
    method: str
    t: int
    backward: bool


def make_inputs(t: int, backward: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return tuple(  # type: ignore[return-value]
        torch.randn(1, H, t, D, generator=gen).requires_grad_(backward) for _ in range(3)
    )


def make_forward(
    method: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> Callable[[], torch.Tensor]:
    """A closure computing the method's output on fixed inputs (its constants drawn once)."""
    t = q.shape[-2]
    gen = torch.Generator().manual_seed(1)
    if method == "torch.sdpa":
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if method == "blockwise":
        return lambda: al.scaled_dot_product_attention(q, k, v, is_causal=True, backend="blockwise")
    if method == "sliding":
        return lambda: al.scaled_dot_product_attention(
            q, k, v, is_causal=True, window=WINDOW, backend="blockwise"
        )
    if method == "linformer":
        e = random_projection(PROJECTED, t, generator=gen)
        f = random_projection(PROJECTED, t, generator=gen)
        return lambda: linformer_attention(q, k, v, e, f)  # type: ignore[return-value]
    if method == "performer":
        w = orthogonal_random_features(FEATURES, D, generator=gen)
        return lambda: favor_attention(q, k, v, w, is_causal=True)  # type: ignore[return-value]
    if method == "bigbird":
        builder = bigbird_builder()
        if builder is None:
            raise ValueError("no BigBird mask builder in attnlab.nn.masks")
        # BigBird's defaults: 1 global block, a band of 3 blocks, 2 random blocks a row; causal
        sparse: dict[str, Any] = {
            "block_mask": builder(t, block_size=BIGBIRD_BLOCK, generator=gen, causal=True)
        }
        return lambda: al.scaled_dot_product_attention(q, k, v, backend="blockwise", **sparse)
    raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")


def make_step(
    method: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backward: bool
) -> Callable[[], None]:
    """One forward (under no_grad) or one forward + backward of the method."""
    return as_step(make_forward(method, q, k, v), backward, (q, k, v))


# ---------------------------------------------------------------------------------- predictions


def predicted_flops(method: str, t: int) -> float:
    """Forward FLOPs (multiply-adds count 2) of one method at length ``t``."""
    if method in QUADRATIC:
        return 2.0 * H * t * t * D  # QKᵀ and weights·V, half of the T × T under the causal mask
    if method == "sliding":
        return 4.0 * H * t * (WINDOW + 64) * D  # the band plus the tiles it cuts
    if method == "bigbird":
        return 4.0 * H * t * 6 * BIGBIRD_BLOCK * D  # ~5 visible key blocks a query block
    if method == "linformer":
        return 4.0 * H * t * PROJECTED * D * 2  # E K, F V, then T × k attention
    if method == "performer":
        return 4.0 * H * t * FEATURES * D * 2  # φ(Q), φ(K), prefix sums, the chunk products
    raise ValueError(f"unknown method {method!r}")


def predicted_seconds(method: str, t: int, backward: bool) -> float:
    fwd = predicted_flops(method, t) / FLOP_RATE
    if not backward:
        return fwd
    extra = 0.0
    if method == "performer":
        # the causal prefix sums slice φ(Q) and φ(K) once per chunk of 128 queries, and autograd
        # turns each slice's gradient into a full (H, T, m) tensor: (T / 128) · H · T · m
        # elements for each, written and added (~3 passes of 4 bytes at ~10 GB/s) — quadratic
        extra = 2 * (t / 128) * H * t * FEATURES * FP32 * 3 / BANDWIDTH
    return fwd * BACKWARD_FACTOR + extra


def predicted_bytes(method: str, t: int, backward: bool) -> float:
    """A generous peak: inputs, gradients and the method's own O(T) or O(T²) state."""
    per_tensor = H * t * D * FP32  # one (1, H, T, D) tensor
    base = per_tensor * (3 + (7 if backward else 1))  # q, k, v, output (+ grads, temporaries)
    extra = {
        "torch.sdpa": 2 * per_tensor,
        "blockwise": 2 * per_tensor + 4 * H * 64 * 8192 * FP32,
        "sliding": 2 * per_tensor,
        "bigbird": 2 * per_tensor + 4 * H * 64 * 8192 * FP32,
        "linformer": 3 * H * t * PROJECTED * FP32,  # the T × k weights (and their gradient)
        "performer": (8 if backward else 3) * H * t * FEATURES * FP32,  # φ(Q), φ(K), states
    }[method]
    return base + extra


def skip_reason(method: str, t: int, backward: bool, max_seconds: float) -> str | None:
    """Why a case is not run (predicted from formulas, before running), or ``None``."""
    if method == "bigbird" and bigbird_builder() is None:
        return "TODO: needs masks.bigbird_layout and scaled_dot_product_attention(block_mask=)"
    need, have = predicted_bytes(method, t, backward), 0.7 * available_bytes()
    if need > have:
        return f"predicted {need / 2**30:.1f} GiB > 70% of {have / 0.7 / 2**30:.1f} GiB available"
    secs = predicted_seconds(method, t, True)  # a length is run fully or not at all
    if secs > max_seconds:
        return f"predicted {secs:.0f} s per forward+backward > --max-seconds {max_seconds:g}"
    return None


# -------------------------------------------------------------------------------- measurements


def probe_memory(case: Case) -> int:
    """In this (fresh) process: growth of the peak resident set over one step, in bytes."""
    stabilize_allocator()  # before anything is allocated: see attnlab.inspect.memory
    warm = make_inputs(256, case.backward)
    make_step(case.method, *warm, case.backward)()  # load kernels, start thread pools
    del warm
    step = make_step(case.method, *make_inputs(case.t, case.backward), case.backward)
    return peak_memory(step)


def peak_memory_in_subprocess(case: Case) -> int | None:
    """Run :func:`probe_memory` in a subprocess; ``None`` when it failed (e.g. out of memory)."""
    return probe_in_subprocess(__file__, case.__dict__)


# ------------------------------------------------------------------------------------- report

Results = dict[tuple[str, int], dict[str, float | None]]


def fmt_per_query(m: float | None, t: int) -> str:
    return "—" if m is None else f"{m / t / 1024:,.1f}"


def flatness(results: Results, method: str, key: str, lengths: list[int]) -> float | None:
    """max / min of the memory per query over the lengths >= 4096 measured (1.0 = flat)."""
    per = [
        m / t
        for t in lengths
        if t >= 4096 and (m := results.get((method, t), {}).get(key)) is not None
    ]
    return max(per) / min(per) if len(per) >= 2 and min(per) > 0 else None


def report_target(console: Console, results: Results, lengths: list[int]) -> None:
    """The issue's target: sliding window at T = 16384 <= 1/10 of torch SDPA, memory flat."""
    t = 16384
    s, p = results.get(("sliding", t), {}), results.get((PEER, t), {})
    for key, what in (("fwd", "forward"), ("bwd", "forward+backward")):
        a, b = s.get(key), p.get(key)
        if a is None or b is None:
            console.print(f"target (time, {what}): not measured at T={t}")
            continue
        verdict = "MET" if a <= b / 10 else "NOT MET"
        console.print(
            f"target: sliding w={WINDOW} / torch SDPA full causal {what} at T={t}: "
            f"{a * 1e3:,.0f} ms / {b * 1e3:,.0f} ms = {a / b:.3f}x = 1/{b / a:.1f} "
            f"(target <= 1/10): [bold]{verdict}[/]"
        )
    for key, what in (("fwd_mem", "forward"), ("bwd_mem", "forward+backward")):
        for method in ("sliding", "linformer", "performer", "bigbird"):
            spread = flatness(results, method, key, lengths)
            if spread is None:
                continue
            measured = [t for t in lengths if t >= 4096 and results[(method, t)].get(key)]
            line = (
                f"memory per query, {what}, {method}: max/min over T = "
                f"{measured[0]}…{measured[-1]} is {spread:.2f}"
            )
            if method == "sliding":
                verdict = "MET" if spread <= 1.5 else "NOT MET"
                line += f" (target: flat, taken as <= 1.5): [bold]{verdict}[/]"
            console.print(line)


def draw_figure(path: Path, results: Results, lengths: list[int]) -> None:
    from attnlab.viz.costs import scaling_figure

    def series(key: str) -> dict[str, list[float]]:
        out = {}
        for method in METHODS:
            values = [results.get((method, t), {}).get(key) for t in lengths]
            if any(v is not None for v in values):
                out[LABELS[method]] = [math.nan if v is None else float(v) for v in values]
        return out

    plot = scaling_figure(
        lengths,
        series("bwd"),
        series("bwd_mem") or None,
        title=f"Forward + backward of attention, H={H}, d_head={D}, batch 1, fp32",
    )
    plot.save(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="T = 512, 1024, one run; seconds")
    parser.add_argument("--lengths", type=int, nargs="+", help="sequence lengths (1024…65536)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--repeats", type=int, help="timed runs per case (default 3; quick: 1)")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=30.0,
        help="skip a length for a method whose predicted forward+backward is slower (default 30)",
    )
    parser.add_argument(
        "--no-memory", action="store_true", help="skip the peak-memory subprocesses"
    )
    parser.add_argument(
        "--memory-lengths",
        type=int,
        nargs="+",
        help="lengths whose memory is probed (default: all; --quick: the longest)",
    )
    parser.add_argument("--figure", type=Path, help="write a log-log figure of time and memory")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.probe:
        print(probe_memory(Case(**json.loads(args.probe))))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    default = [1024 << i for i in range(7)]  # 1024 … 65536
    lengths = sorted(set(args.lengths or ([512, 1024] if args.quick else default)))
    repeats = args.repeats or (1 if args.quick else 3)
    memory_lengths = set(args.memory_lengths or (lengths[-1:] if args.quick else lengths))
    methods = [m for m in METHODS if m in args.methods]
    if PEER not in methods:
        methods.insert(0, PEER)  # the ratios need it
    console = Console(width=None if sys.stdout.isatty() else 170)
    console.print(
        f"[bold]long-context attention benchmark[/]: H={H}, d_head={D}, batch 1, fp32, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.1f}; median of {repeats} interleaved runs"
    )
    results: Results = {}
    skipped: dict[tuple[str, int], str] = {}
    for method in methods:  # load the kernels and thread pools once, on small inputs
        if skip_reason(method, 256, True, math.inf) is None:
            for backward in (False, True):
                make_step(method, *make_inputs(256, backward), backward)()
    for t in lengths:
        for method in methods:
            reason = skip_reason(method, t, True, args.max_seconds)
            if reason is not None:
                skipped[(method, t)] = reason
                if not reason.startswith("TODO"):
                    console.print(f"skip {method} at T={t}: {reason}")
            results[(method, t)] = {"fwd": None, "bwd": None, "fwd_mem": None, "bwd_mem": None}
        running = [m for m in methods if (m, t) not in skipped]
        for backward in (False, True):
            key = "bwd" if backward else "fwd"
            q, k, v = make_inputs(t, backward)
            steps = {m: make_step(m, q, k, v, backward) for m in running}
            # a warm-up run at this T only where it is cheap: the median absorbs a slow first run
            cheap = all(predicted_seconds(m, t, backward) < 2.0 for m in running)
            for method, seconds in median_times(steps, repeats, warm_up=cheap).items():
                results[(method, t)][key] = seconds
            del steps, q, k, v
            if not args.no_memory and t in memory_lengths:
                for method in running:
                    results[(method, t)][key + "_mem"] = peak_memory_in_subprocess(
                        Case(method, t, backward)
                    )
        console.print(
            f"T={t}: "
            + ", ".join(f"{m} {fmt_ms(results[(m, t)]['bwd'])} ms" for m in running)
            + " (forward+backward)"
        )

    table = Table(
        title="time in ms (ratio against torch.sdpa full causal at the same T), peak memory "
        "growth in MB, and per query in KB"
    )
    for col in ("T", "method", "fwd ms", "fwd ×", "fwd+bwd ms", "fwd+bwd ×",
                "fwd MB", "fwd+bwd MB", "fwd KB/q", "fwd+bwd KB/q"):  # fmt: skip
        table.add_column(col, justify="left" if col == "method" else "right")
    for t in lengths:
        peer = results[(PEER, t)]
        for method in methods:
            r = results[(method, t)]
            if (method, t) in skipped:
                note = "TODO" if method == "bigbird" and bigbird_builder() is None else "skipped"
                cells = [note, "", "", "", "", "", "", ""]
            else:
                cells = [
                    fmt_ms(r["fwd"]),
                    fmt_ratio(r["fwd"], peer["fwd"], 3),
                    fmt_ms(r["bwd"]),
                    fmt_ratio(r["bwd"], peer["bwd"], 3),
                    fmt_mb(r["fwd_mem"]),
                    fmt_mb(r["bwd_mem"]),
                    fmt_per_query(r["fwd_mem"], t),
                    fmt_per_query(r["bwd_mem"], t),
                ]
            table.add_row(str(t), LABELS[method], *cells, end_section=method == methods[-1])
    console.print(table)
    for (method, t), reason in skipped.items():
        if not (method == "bigbird" and bigbird_builder() is None):
            console.print(f"skipped {method} at T={t}: {reason}")
    if "bigbird" in methods and bigbird_builder() is None:
        console.print(
            "bigbird: TODO — needs attnlab.nn.masks.bigbird_layout and "
            "scaled_dot_product_attention(block_mask=); the row is a placeholder"
        )
    console.print(
        "Linformer is not causal (it projects the whole sequence); its row does other, cheaper "
        "work than the causal rows."
    )
    report_target(console, results, lengths)
    if args.figure:
        args.figure.parent.mkdir(parents=True, exist_ok=True)
        draw_figure(args.figure, results, lengths)
        console.print(f"figure: {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
