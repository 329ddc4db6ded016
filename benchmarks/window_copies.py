"""The sliding window's copies: ``torch.profiler``'s share of copy time in one window call, and
its time against full causal SDPA measured in the same run.

One call of :func:`attnlab.scaled_dot_product_attention` with ``window=256``, ``is_causal=True``
(``backend="blockwise"``, as ``"auto"`` picks) at ``T = 2048``, ``H = 12``, ``d_head = 64``,
fp32, batch 1, forward under ``torch.no_grad()``. It prints

* the **copy share**: the self CPU time of ``aten::copy_`` and ``aten::cat`` (the ops that move
  tiles between buffers) over the call's total self CPU time, and their number of calls, from
  ``torch.profiler`` — the median over ``--runs`` profiled calls;
* the **ratio** of the window call's time to full causal
  ``torch.nn.functional.scaled_dot_product_attention`` on the same inputs, taking turns in one
  process (median of ``--runs`` timings each), at ``T = 2048`` and at ``--long`` (16384).

The machine's load average is printed too: other processes make every parallel region wait for
its threads, so the numbers of a loaded machine are not those of a quiet one.

Usage::

    PYTHONPATH=src python benchmarks/window_copies.py [--runs 7] [--long 16384]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import attnlab as al

H, D, WINDOW = 12, 64, 256
COPY_OPS = ("aten::copy_", "aten::cat")


def _inputs(t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, H, t, D, generator=gen) for _ in range(3))  # type: ignore[return-value]


def _window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return al.scaled_dot_product_attention(
        q, k, v, is_causal=True, window=WINDOW, backend="blockwise"
    )


def _causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def copy_share(t: int, runs: int) -> tuple[float, int]:
    """The median share of copy time in one window call, and the copies per call."""
    q, k, v = _inputs(t)
    shares, calls = [], 0
    with torch.no_grad():
        _window(q, k, v)
        for _ in range(runs):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                _window(q, k, v)
            events = prof.key_averages()
            total = sum(e.self_cpu_time_total for e in events)
            copies = [e for e in events if e.key in COPY_OPS]
            shares.append(sum(e.self_cpu_time_total for e in copies) / total)
            calls = sum(e.count for e in copies)
    return statistics.median(shares), calls


def ratio(t: int, runs: int) -> tuple[float, float, float]:
    """``(window seconds, causal SDPA seconds, ratio)``, medians, the two taking turns."""
    q, k, v = _inputs(t)
    times: dict[str, list[float]] = {"window": [], "sdpa": []}
    with torch.no_grad():
        _window(q, k, v), _causal(q, k, v)
        for _ in range(runs):
            for name, fn in (("window", _window), ("sdpa", _causal)):
                start = time.perf_counter()
                fn(q, k, v)
                times[name].append(time.perf_counter() - start)
    w, s = statistics.median(times["window"]), statistics.median(times["sdpa"])
    return w, s, w / s


def guard_cost(t: int, runs: int) -> tuple[float, float]:
    """``(seconds with, seconds without)`` the non-finite guard (:mod:`attnlab.nn.nonfinite`,
    its check of the inputs on the CPU) around one window call, medians, taking turns: what the
    NaN rule costs when every input is finite."""
    import attnlab.nn.attention as attention

    guarded = attention.guard_nonfinite

    def unguarded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masking: object) -> tuple:
        return q, k, v, None

    q, k, v = _inputs(t)
    times: dict[str, list[float]] = {"with": [], "without": []}
    try:
        with torch.no_grad():
            _window(q, k, v)
            for _ in range(runs):
                for name, guard in (("with", guarded), ("without", unguarded)):
                    attention.guard_nonfinite = guard  # type: ignore[assignment]
                    start = time.perf_counter()
                    _window(q, k, v)
                    times[name].append(time.perf_counter() - start)
    finally:
        attention.guard_nonfinite = guarded
    return statistics.median(times["with"]), statistics.median(times["without"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--long", type=int, default=16384)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")  # fmt: skip
    share, calls = copy_share(2048, args.runs)
    print(f"T=2048 window={WINDOW}: copy share {100 * share:.1f}% ({calls} copy calls)")
    for t in (2048, args.long):
        w, s, r = ratio(t, args.runs)
        print(f"T={t}: window {1e3 * w:.1f} ms, causal sdpa {1e3 * s:.1f} ms, ratio {r:.3f}x")
    g, n = guard_cost(2048, args.runs)
    print(f"T=2048: the non-finite guard, {1e3 * g:.1f} ms with, {1e3 * n:.1f} ms without")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
