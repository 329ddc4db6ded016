"""attnlab.inspect.memory: the peak resident set growth of one call (Linux)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from attnlab.inspect.memory import (
    peak_memory,
    peak_memory_supported,
    resident_bytes,
    stabilize_allocator,
)

MiB = 2**20
linux_only = pytest.mark.skipif(
    not peak_memory_supported(), reason="needs /proc/self/status and /proc/self/clear_refs"
)


@linux_only
def test_peak_memory_sees_a_tensor_and_its_arguments() -> None:
    assert isinstance(stabilize_allocator(), bool)
    # 64 MiB written (ones touches every page): the OS had to hand out 64 MiB
    grown = peak_memory(torch.ones, 16, 1024, 1024)
    assert 64 * MiB <= grown < 70 * MiB
    grown = peak_memory(lambda n: torch.ones(n, 1024, 1024), n=32)
    assert 128 * MiB <= grown < 134 * MiB

    # an allocation freed during the call still counts: it is the peak, not what is left
    def transient() -> None:
        x = torch.ones(8, 1024, 1024)
        del x

    assert 31 * MiB <= peak_memory(transient) < 36 * MiB


@linux_only
def test_peak_memory_of_nothing_is_the_noise_floor_and_freed_memory_is_not_reused() -> None:
    assert peak_memory(lambda: None) < 1 * MiB
    # memory the process freed before is given back first, so reusing it still shows
    junk = [torch.ones(256, 1024) for _ in range(32)]  # 32 MiB in 1 MiB pieces (glibc's heap)
    del junk
    grown = peak_memory(lambda: [torch.ones(256, 1024) for _ in range(32)])
    assert 31 * MiB <= grown < 36 * MiB
    assert resident_bytes() > 0


@linux_only
def test_math_attention_holds_the_t_by_t_matrix_and_blockwise_does_not() -> None:
    # measured in a fresh process, as the benchmarks do: a test worker that ran other tests first
    # may serve the matrix from pages it already holds, and its resident set would not grow
    code = (
        "import json, torch, attnlab as al\n"
        "from attnlab.inspect.memory import peak_memory, stabilize_allocator\n"
        "stabilize_allocator()\n"
        "q = torch.randn(1, 2, 2048, 16)\n"
        "peaks = {}\n"
        "for backend in ('math', 'blockwise'):\n"
        "    al.scaled_dot_product_attention(q[:, :, :16], q[:, :, :16], q[:, :, :16], backend=backend)\n"
        "    peaks[backend] = peak_memory(al.scaled_dot_product_attention, q, q, q, backend=backend)\n"
        "print(json.dumps(peaks))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    peaks = json.loads(out.stdout.strip().splitlines()[-1])
    matrix = 2 * 2048 * 2048 * 4  # (H, T, T) fp32 = 32 MiB
    assert peaks["math"] >= matrix  # the scores, then the weights: at least one T x T matrix
    assert peaks["blockwise"] < matrix / 4  # tiles of 64 query rows


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="fn must be callable, got int"):
        peak_memory(3)  # type: ignore[arg-type]


def test_not_linux_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import attnlab.inspect.memory as memory

    monkeypatch.setattr(memory, "_STATUS", "/nonexistent/status")
    assert not memory.peak_memory_supported()
    with pytest.raises(OSError, match="peak memory needs Linux's /nonexistent/status"):
        memory.peak_memory(lambda: None)
    monkeypatch.setattr(memory, "_STATUS", "/proc/self/status" if sys.platform == "linux" else "")
    monkeypatch.setattr(memory, "_CLEAR_REFS", "/nonexistent/clear_refs")
    if sys.platform == "linux":
        with pytest.raises(OSError, match="resets the peak through /nonexistent/clear_refs"):
            memory.peak_memory(lambda: None)


@linux_only
def test_a_freed_heap_does_not_hide_memory() -> None:
    """After many mid-sized buffers were freed (glibc would have raised its mmap threshold and
    served them from the heap), a computation of the same size still reads as its own size."""
    stabilize_allocator()
    for _ in range(3):
        keep = [torch.ones(4, 1024, 1024) for _ in range(8)]  # 8 x 16 MiB
        del keep
    grown = peak_memory(lambda: [torch.ones(4, 1024, 1024) for _ in range(8)])
    assert 127 * MiB <= grown < 134 * MiB
