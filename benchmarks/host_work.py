"""Host work of one attention call on the CPU: ``attnlab.scaled_dot_product_attention`` (the
``sdpa`` backend) against raw ``F.scaled_dot_product_attention`` on the same tensors, µs per call,
median of 7 runs, one thread. For a decoding step (``T_q = 1``) and a short call the difference is
what attnlab adds on the host (checks, the mask's structure, the CPU non-finite guard); at
``T = 1024`` the kernel dominates and the ratio is what a user pays.

    python benchmarks/host_work.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import attnlab as al


def median_us(fn: Callable[[], object], calls: int) -> float:
    """Median over 7 runs of ``calls`` calls, µs per call (10 calls of warm-up first)."""
    for _ in range(10):
        fn()
    runs = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


def compare(t_q: int, t_k: int, heads: int, d: int, calls: int) -> str:
    """One shape: raw SDPA and attnlab's ``sdpa`` backend, µs per call and their ratio."""
    q, k = torch.randn(1, heads, t_q, d), torch.randn(1, heads, t_k, d)
    v = torch.randn(1, heads, t_k, d)
    # bottom-right causal: a decoding step sees every key, as raw SDPA without a mask
    raw = median_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=t_q == t_k), calls)
    ours = median_us(
        lambda: al.scaled_dot_product_attention(q, k, v, is_causal=True, backend="sdpa"), calls
    )
    return (
        f"T_q={t_q} T_k={t_k} H={heads} d={d}: raw {raw:.1f} µs, attnlab sdpa {ours:.1f} µs, "
        f"+{ours - raw:.1f} µs, ratio {ours / raw:.3f}"
    )


def main() -> None:
    torch.set_num_threads(1)
    for shape in [(1, 128, 9, 64, 2000), (16, 16, 9, 64, 2000), (1024, 1024, 16, 64, 20)]:
        print(compare(*shape))


if __name__ == "__main__":
    main()
