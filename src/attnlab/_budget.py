"""The memory a run may take, and the one-line refusal of sizes that exceed it.

A size option (``--batch-size``, ``--n-embd``, a vocabulary, ``--beams``) is turned into the bytes
it will ask for *before* anything of that size is allocated, and compared with the memory of the
machine: :func:`check_fits` refuses in one line, naming the option, the bytes needed and the bytes
there are, what would otherwise end in the allocator's error (or abort inside a library, or swap
until killed). The estimates are the caller's (:mod:`attnlab.inspect.footprint` for a model and a
training step, :func:`attnlab.generate` for a beam set); they count what certainly has to be
held, so a run this check lets through may still be close to the limit, but a run it refuses
could never have fit.

The memory of the machine (:func:`available_memory`) is the physical memory (or the cgroup's
limit when lower) for the CPU, and the free memory of the device for CUDA.

Examples:
    >>> from attnlab._budget import format_bytes
    >>> format_bytes(3 * 2**30)
    '3.0 GiB'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from attnlab.errors import ArgumentError

__all__ = [
    "BPE_TRAINING_BYTES_PER_TOKEN",
    "available_memory",
    "bpe_training_bytes",
    "check_at_most",
    "check_bpe_vocab",
    "check_fits",
    "format_bytes",
]

#: bytes the BPE trainer of the ``tokenizers`` library reserves per vocabulary entry before it
#: reads a word (its id → token table and token → id map, sized for the whole vocabulary)
BPE_TRAINING_BYTES_PER_TOKEN = 64

_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)


def _cgroup_limit() -> int | None:
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def _physical_memory() -> int:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_limit()
    return total if limit is None else min(total, limit)


def available_memory(device: Any = None) -> int:
    """Bytes a run on ``device`` may hold at most.

    Args:
        device: a ``torch.device`` or its name; ``None`` or a CPU device is the machine's
            physical memory (the cgroup's limit when lower); a CUDA device its free memory.

    Returns:
        The bytes.
    """
    kind = getattr(device, "type", None) or (str(device).split(":")[0] if device else "cpu")
    if kind == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    return _physical_memory()


def format_bytes(n: int) -> str:
    """``n`` bytes in binary units, one decimal (``'1.5 GiB'``).

    Args:
        n: a byte count (``>= 0``).

    Returns:
        The text.
    """
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def check_fits(
    option: str, needed: int, *, what: str, device: Any = None, available: int | None = None
) -> None:
    """Refuse a size whose memory exceeds the machine's, before it is allocated.

    Args:
        option: the option (and its value) the message names, e.g. ``"--batch-size 1000000"``.
        needed: the bytes it needs.
        what: what they hold, e.g. ``"one training step's activations"``.
        device: where they would be allocated (see :func:`available_memory`); default the CPU.
        available: the bytes there are; default :func:`available_memory` of ``device``.

    Raises:
        ArgumentError: ``needed`` exceeds ``available`` (one line: the option, both sizes).
    """
    have = available_memory(device) if available is None else available
    if needed > have:
        cpu = device is None or str(device).startswith("cpu")
        where = "the machine has" if cpu else f"{device} has"
        raise ArgumentError(
            f"{option} needs about {format_bytes(needed)} ({needed} bytes) for {what}, but "
            f"{where} {format_bytes(have)} ({have} bytes) of memory"
        )


def check_at_most(option: str, value: int, cap: int, why: str) -> None:
    """Refuse a count that only costs time above a bound no sane run needs.

    Args:
        option: the option, e.g. ``"--eval-iters"``.
        value: its value.
        cap: the largest value accepted.
        why: what the count is and why more does not help, for the message.

    Raises:
        ArgumentError: ``value > cap`` (one line naming the option and the cap).
    """
    if value > cap:
        raise ArgumentError(f"{option} must be at most {cap} ({why}), got {value}")


def bpe_training_bytes(vocab_size: int) -> int:
    """Bytes the ``tokenizers`` BPE trainer reserves up front for a vocabulary of
    ``vocab_size`` tokens (:data:`BPE_TRAINING_BYTES_PER_TOKEN` each; the trainer aborts the
    whole process when it cannot have them).

    Args:
        vocab_size: the vocabulary size asked for.

    Returns:
        The bytes.
    """
    return vocab_size * BPE_TRAINING_BYTES_PER_TOKEN


def check_bpe_vocab(option: str, vocab_size: int) -> None:
    """Refuse a BPE vocabulary whose up-front reservation (:func:`bpe_training_bytes`) exceeds
    the machine's memory, before the trainer aborts the process.

    Args:
        option: how the caller names the size (``"vocab_size"``, ``"--src-vocab"``).
        vocab_size: the vocabulary size asked for.

    Raises:
        ArgumentError: it does not fit (one line naming ``option``).
    """
    check_fits(
        f"{option} {vocab_size}", bpe_training_bytes(vocab_size), what="training a BPE vocabulary"
    )
