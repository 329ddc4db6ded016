"""Peak CPU memory of one call, as the operating system saw it (Linux).

:func:`peak_memory` runs a function once and returns how far the process's peak resident set
grew over what was resident just before: the bytes the operating system actually had to hand the
call (every tensor, the allocator's own slack and anything a kernel allocated on the side), not an
estimate from tensor sizes. The peak is ``VmHWM`` of ``/proc/self/status``, reset right before the
call by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0). (``resource.getrusage``'s
``ru_maxrss`` cannot be reset, and Linux carries a parent's high-water mark into an exec'd child.)

The resident set follows the live tensors only if the allocator gives freed memory back. glibc
maps every buffer above its *mmap threshold* on its own (and unmaps it on ``free``), but raises
that threshold (up to 32 MiB) each time such a buffer is freed; buffers below it then come from the
heap, whose freed middle stays resident, and the same computation can read as twice its memory
depending on what ran before. :func:`stabilize_allocator` fixes the threshold at 128 KiB,
glibc's starting value (``mallopt(M_MMAP_THRESHOLD)``), which also switches the raising off, for
the rest of the process: call it at the start of a program (or notebook) that measures, before
the heap has grown; :func:`peak_memory` calls it too, late being better than never. Before each
call the garbage collector runs and ``malloc_trim(0)`` hands free heap pages back. What remains
is a floor of a few hundred KB of noise. (With another C library neither is done.) Other threads
of the process count too. For numbers free of the process's history altogether, measure in a
fresh process (as ``benchmarks/attention.py`` does).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable
from functools import cache
from typing import Any

from attnlab.errors import ArgumentTypeError

__all__ = ["peak_memory", "peak_memory_supported", "resident_bytes", "stabilize_allocator"]

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def _status_bytes(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes."""
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError as e:
        raise OSError(
            f"peak memory needs Linux's {_STATUS} (reading it failed: {e.strerror or e})"
        ) from e
    raise OSError(f"{field} is not in {_STATUS}; peak memory needs Linux")


def resident_bytes() -> int:
    """The process's resident set size now (``VmRSS``), in bytes.

    Returns:
        Bytes of physical memory the process holds.

    Raises:
        OSError: ``/proc/self/status`` cannot be read (not Linux).
    """
    return _status_bytes("VmRSS")


def _reset_peak() -> None:
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")  # 5: reset the peak resident set size (VmHWM) to the current one
    except OSError as e:
        raise OSError(
            f"peak memory resets the peak through {_CLEAR_REFS} (Linux >= 4.0), which failed: "
            f"{e.strerror or e}"
        ) from e


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 128 * 1024  # glibc's initial (and documented default) threshold


@cache
def _glibc() -> Any | None:
    """glibc, with the mmap threshold fixed (once per process); ``None`` for another C library."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        libc.malloc_trim  # noqa: B018  (only glibc has it)
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    except (OSError, AttributeError):  # not glibc
        return None
    return libc


def stabilize_allocator() -> bool:
    """Fix glibc's mmap threshold at 128 KiB for the rest of the process (see the module
    docstring), so that every buffer above it is returned to the system when freed and the
    resident set follows the live tensors. Idempotent; large allocations become a little slower
    (each one maps fresh pages, as in a fresh process).

    Returns:
        ``True`` when the C library is glibc and the threshold is fixed, else ``False``
        (nothing is changed).

    Examples:
        >>> from attnlab.inspect.memory import stabilize_allocator
        >>> stabilize_allocator()  # first thing in a script that measures memory
        True
    """
    return _glibc() is not None


def _release_free_memory() -> None:
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def peak_memory_supported() -> bool:
    """Whether :func:`peak_memory` works here (Linux with a resettable ``VmHWM``).

    Returns:
        ``True`` when ``/proc/self/status`` can be read and ``/proc/self/clear_refs`` written.
    """
    try:
        _status_bytes("VmHWM")
        _reset_peak()
    except OSError:
        return False
    return True


def peak_memory(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Bytes the peak resident set grew by while ``fn(*args, **kwargs)`` ran.

    The measure is ``VmHWM`` after the call minus ``VmRSS`` before it, with the peak reset just
    before the call (see the module docstring; it calls :func:`stabilize_allocator`, which is
    best called earlier, at the start of the program). The first run of a computation also loads what it needs once (kernels,
    thread pools): run it once before measuring. Whatever ``fn`` returns is dropped after the
    measurement; anything it keeps alive (a returned tensor, a graph for backward) counts only
    while it ran, up to its peak.

    Args:
        fn: the function to run, once.
        *args: positional arguments for ``fn``.
        **kwargs: keyword arguments for ``fn``.

    Returns:
        The growth of the peak resident set in bytes (``>= 0``); a call that allocates nothing
        reads as a few hundred KB at most.

    Raises:
        TypeError: ``fn`` is not callable.
        OSError: not on Linux (no ``/proc/self/status`` or ``/proc/self/clear_refs``).

    Examples:
        >>> import torch
        >>> n = peak_memory(torch.ones, 64, 1024, 1024)       # a 256 MiB tensor
        >>> round(n / 2**20)
        256
    """
    if not callable(fn):
        raise ArgumentTypeError(f"fn must be callable, got {type(fn).__name__}")
    _release_free_memory()
    before = resident_bytes()
    _reset_peak()
    result = fn(*args, **kwargs)
    peak = _status_bytes("VmHWM")
    del result
    return max(0, peak - before)
