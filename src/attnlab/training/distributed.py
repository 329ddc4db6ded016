"""Multi-process training under ``torchrun`` (DistributedDataParallel).

``torchrun --nproc_per_node N -m attnlab train TASK ...`` starts N processes with ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set; :func:`init_distributed`
reads them and joins the process group (gloo on CPU, nccl on GPU). Without them it returns a
single-process :class:`DistInfo` and nothing else changes.

The trainer keeps the *same global batch* whatever the number of processes: every rank draws the
same batch from the batch source and keeps its own slice (:func:`shard_batch`), and losses are
weighted by the number of tokens of each slice, so N processes give the result of one process
within float tolerance. Only rank 0 writes files (checkpoints, metrics).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "DistInfo",
    "all_reduce_sum",
    "barrier",
    "cleanup_distributed",
    "init_distributed",
    "map_batch",
    "shard_batch",
]


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands.

    Attributes:
        rank: global rank (0 for a single process).
        world_size: number of processes (1 for a single process).
        local_rank: rank on this machine.
        device: the device this process trains on.
        backend: ``"gloo"``, ``"nccl"`` or ``None`` when not distributed.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None

    @property
    def distributed(self) -> bool:
        """Whether more than one process trains (or a process group was set up)."""
        return self.world_size > 1 or self.backend is not None

    @property
    def is_main(self) -> bool:
        """True on rank 0, the process that writes files and prints."""
        return self.rank == 0


def init_distributed(device: str | torch.device | None = None) -> DistInfo:
    """Join the process group when started by ``torchrun``; otherwise describe one process.

    Args:
        device: ``"cpu"``, ``"cuda"`` or ``None`` (CUDA when available). Under torchrun on GPU,
            each process takes ``cuda:LOCAL_RANK``.

    Returns:
        A :class:`DistInfo`.
    """
    want = torch.device(device) if device is not None else None
    if want is None:
        want = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return DistInfo(device=want)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if want.type == "cuda":
        want = torch.device("cuda", local)
        torch.cuda.set_device(want)
    backend = "nccl" if want.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world)
    return DistInfo(rank=rank, world_size=world, local_rank=local, device=want, backend=backend)


def cleanup_distributed() -> None:
    """Leave the process group (no-op when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    """Wait for every rank (no-op when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    """The sum of ``value`` over ranks.

    Args:
        value: a tensor on this rank's device, the same shape on every rank.

    Returns:
        The sum over ranks (a new tensor), or ``value`` itself when not distributed.

    Shape:
        any; the result has ``value``'s shape.
    """
    if dist.is_available() and dist.is_initialized():
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def map_batch(fn: Callable[[torch.Tensor], torch.Tensor], batch: Any) -> Any:
    """Apply ``fn`` to every tensor of a batch, keeping its structure.

    Args:
        fn: tensor -> tensor.
        batch: a tensor, or a dict / list / tuple / namedtuple / dataclass of them (other values
            pass as they are).

    Returns:
        The same structure with each tensor ``t`` replaced by ``fn(t)``.

    Shape:
        each tensor as ``fn`` maps it (``t.to(device)`` keeps every shape).
    """
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {
            f.name: map_batch(fn, getattr(batch, f.name))
            for f in dataclasses.fields(batch)
            if f.init
        }
        return dataclasses.replace(batch, **changes)
    cls: Any = type(batch)
    if isinstance(batch, Mapping):
        return cls({k: map_batch(fn, v) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return cls(*(map_batch(fn, v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return cls(map_batch(fn, v) for v in batch)
    return batch


def shard_batch(batch: Any, rank: int, world_size: int) -> Any:
    """This rank's slice of a global batch, along dim 0 of every tensor.

    Args:
        batch: a tensor, or a dict / list / tuple / dataclass of them (other values pass as they
            are). Every tensor's dim 0 must be divisible by ``world_size``.
        rank: this process's rank.
        world_size: number of processes.

    Returns:
        The same structure with each tensor ``t`` replaced by ``t.chunk(world_size)[rank]``.
    """
    if world_size == 1:
        return batch

    def shard(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0 or t.shape[0] % world_size:
            raise ValueError(
                f"batch size must be divisible by the number of processes {world_size}, "
                f"got a tensor of shape {tuple(t.shape)}"
            )
        n = t.shape[0] // world_size
        return t[rank * n : (rank + 1) * n]

    return map_batch(shard, batch)
