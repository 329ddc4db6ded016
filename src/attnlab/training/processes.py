"""Multi-process training under ``torchrun`` (DistributedDataParallel).

``torchrun --nproc_per_node N -m attnlab train TASK ...`` starts N processes with ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set; :func:`init_distributed`
reads them and joins the process group (gloo on CPU, nccl on GPU). Without them it returns a
single-process :class:`DistInfo` and nothing else changes.

The trainer keeps the *same global batch* whatever the number of processes: every rank draws the
same batch from the batch source and keeps its own slice (:func:`shard_batch`), and losses are
weighted by the number of tokens of each slice, so N processes give the result of one process
within float tolerance. Only rank 0 writes files (checkpoints, metrics).

How the model itself is spread over the processes is a :class:`ParallelStrategy` that the
:class:`~attnlab.training.trainer.Trainer` is given: :class:`DDPStrategy` (the default) keeps a
whole replica on every rank and averages the gradients (``DistributedDataParallel``), its
checkpoints a single folder written by rank 0;
:class:`attnlab.distributed.fsdp.FSDPStrategy` shards parameters, gradients and optimizer state
over the ranks (``fully_shard``, FSDP2) and every rank writes its shards of a checkpoint.

A rank that dies (killed, out of memory, its machine gone) breaks the collectives of the others:
gloo raises a ``RuntimeError`` ("Connection closed by peer"), NCCL a
``torch.distributed.DistBackendError``. :func:`peer_lost_error` tells such a failure from any
other error and turns it into a :class:`PeerLostError`, one line naming the lost rank and the
checkpoint to resume from (the trainer raises it; ``attnlab train`` prints it, exit 2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from attnlab.errors import ArgumentError, AttnlabError

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = [
    "DDPStrategy",
    "DistInfo",
    "ParallelStrategy",
    "PeerLostError",
    "all_reduce_sum",
    "barrier",
    "broadcast_text",
    "cleanup_distributed",
    "init_distributed",
    "is_initialized",
    "local_tensor",
    "map_batch",
    "peer_lost_error",
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


def is_initialized() -> bool:
    """Whether this process belongs to a process group (``torch.distributed`` is set up).

    Returns:
        ``True`` under ``torchrun`` once :func:`init_distributed` ran, else ``False``.
    """
    return dist.is_available() and dist.is_initialized()


def broadcast_text(text: str | None) -> str:
    """Rank 0's ``text`` on every rank.

    Args:
        text: the string to send (read on rank 0 only; other ranks may pass ``None``).

    Returns:
        Rank 0's string (``text`` itself when not distributed).

    Raises:
        ValueError: ``text`` is ``None`` on rank 0 (or in a single process).
    """
    if not is_initialized():
        if text is None:
            raise ArgumentError("text must be a str on rank 0, got None")
        return text
    box: list[str | None] = [text]
    dist.broadcast_object_list(box, src=0)
    if box[0] is None:
        raise ArgumentError("text must be a str on rank 0, got None")
    return box[0]


class PeerLostError(AttnlabError):
    """Another process of the training ended, or stopped answering, in the middle of a collective.

    Not a mistake in the input, yet reported like one — in one line (exit 2 from the command
    line): which rank was lost, the intact checkpoint the run resumes from, and how.

    Args:
        lost: the rank that was lost, or ``None`` when it cannot be told.
        world_size: the number of ranks of the training.
        checkpoint: the run's last complete checkpoint, or ``None`` when none was written yet.

    Attributes:
        lost: the rank that was lost, or ``None`` when it cannot be told (more than two ranks).
        checkpoint: the run's last checkpoint, or ``None`` when none was written yet.
    """

    def __init__(self, lost: int | None, world_size: int, checkpoint: Path | None) -> None:
        who = "another rank" if lost is None else f"rank {lost}"
        if checkpoint is None:
            then = "no checkpoint was written yet: rerun the same command"
        else:
            then = f"the last checkpoint, {checkpoint}, is intact: rerun the same command with --resume"
        super().__init__(
            f"{who} of {world_size} was lost (its process ended or stopped answering); {then}"
        )
        self.lost = lost
        self.checkpoint = checkpoint


#: what gloo's transport says when the process at the other end of a connection is gone
_GLOO_PEER_GONE = ("gloo/transport", "Connection closed by peer", "Connection reset by peer")


def peer_lost_error(
    exc: BaseException, info: DistInfo, checkpoint: Path | None
) -> PeerLostError | None:
    """The :class:`PeerLostError` that ``exc`` means, or ``None`` when it is another error.

    Args:
        exc: an exception raised while training in a process group.
        info: this process's place in it.
        checkpoint: the run's last complete checkpoint (``None``: none yet).

    Returns:
        A :class:`PeerLostError` when ``exc`` is a collective's failure to reach another rank
        (a ``torch.distributed.DistError`` — NCCL's ``DistBackendError`` among them — or gloo's
        transport ``RuntimeError``) in a process group of several ranks; ``None`` otherwise.
    """
    if info.world_size < 2 or not isinstance(exc, RuntimeError):
        return None
    if not isinstance(exc, dist.DistError) and not any(m in str(exc) for m in _GLOO_PEER_GONE):
        return None
    lost = 1 - info.rank if info.world_size == 2 else None  # of two, the other one
    return PeerLostError(lost, info.world_size, checkpoint)


def barrier() -> None:
    """Wait for every rank (no-op when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_reduce_sum(value: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The sum of ``value`` over ranks.

    Args:
        value: a tensor on this rank's device, the same shape on every rank.
        group: the process group to sum over (default: all the ranks).

    Returns:
        The sum over ranks (a new tensor), or ``value`` itself when not distributed.

    Shape:
        any; the result has ``value``'s shape.
    """
    if dist.is_available() and dist.is_initialized():
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM, group=group)
    return value


def is_dtensor(t: object) -> TypeGuard[DTensor]:
    """Whether ``t`` is a ``DTensor``, without importing ``torch.distributed.tensor``.

    A ``DTensor`` can exist only once its module has been imported (by FSDP, tensor parallelism or
    a checkpoint): until then the answer is ``False``. Importing the module costs about a second
    of CPU, which every process that only trains on one device (a notebook, a test) would pay.

    Args:
        t: any object.

    Returns:
        ``True`` for a ``torch.distributed.tensor.DTensor``.
    """
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: a ``DTensor``'s local shard, any other tensor itself.

    Args:
        t: a tensor or a ``DTensor`` (FSDP's and tensor parallelism's parameters).

    Returns:
        The local tensor (no copy).

    Shape:
        a ``DTensor``'s local shard shape; any other tensor's own.
    """
    return t.to_local() if is_dtensor(t) else t


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
            raise ArgumentError(
                f"batch size must be divisible by the number of processes {world_size}, "
                f"got a tensor of shape {tuple(t.shape)}"
            )
        n = t.shape[0] // world_size
        return t[rank * n : (rank + 1) * n]

    return map_batch(shard, batch)


class ParallelStrategy:
    """How the :class:`~attnlab.training.trainer.Trainer` spreads one model over the processes.

    The trainer calls :meth:`wrap` once, before the optimizer is made (so that the optimizer
    holds the parameters as the strategy left them), runs every micro-batch's forward and
    backward inside :meth:`gradient_sync`, evaluates and reports with :meth:`gathered_model`,
    and, when :attr:`sharded` is true, writes and reads the model and optimizer state of its
    checkpoints with :meth:`save_state` / :meth:`load_state` on every rank (the rest of the
    training state — step, scheduler, random states, data position — stays rank 0's, in JSON and
    safetensors, as in every checkpoint).

    Subclasses: :class:`DDPStrategy` (replicas; single-folder checkpoints) and
    :class:`attnlab.distributed.fsdp.FSDPStrategy` (sharded).

    Attributes:
        name: the strategy's name on the command line (``--parallel NAME``).
        sharded: whether each rank holds only a part of the model, so that checkpoints are
            written by every rank (:meth:`save_state`) and evaluation needs
            :meth:`gathered_model`.
        runs_alone: whether rank 0 can run the training model by itself (a callback such as
            the attention probe does); ``False`` when the model's forward pass is a collective
            (sharded parameters, ring attention).
    """

    name: str = "none"
    sharded: bool = False
    runs_alone: bool = True

    def wrap(self, model: nn.Module, info: DistInfo) -> nn.Module:
        """Prepare ``model`` for training on this process (in place where the strategy can).

        Args:
            model: the model, already on ``info.device``.
            info: this process's :class:`DistInfo`.

        Returns:
            The module the loss function calls (``model`` itself or a wrapper around it).
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement wrap")

    def local_batch(self, batch: Any, info: DistInfo) -> Any:
        """This rank's part of a global batch.

        Args:
            batch: the global batch (every rank draws the same one).
            info: this process's :class:`DistInfo`.

        Returns:
            The part this rank computes with: by default its slice along dim 0 of every tensor
            (:func:`shard_batch` by rank and world size).
        """
        return shard_batch(batch, info.rank, info.world_size)

    def reduce_totals(self, totals: torch.Tensor, info: DistInfo) -> torch.Tensor:
        """The sum of a step's totals (loss · count, count, tokens, stop flag) over the ranks
        that computed different parts of the global batch.

        Args:
            totals: this rank's totals, float64.
            info: this process's :class:`DistInfo`.

        Returns:
            Their sum over those ranks (by default all of them).

        Shape:
            ``(n,)`` → ``(n,)``.
        """
        return all_reduce_sum(totals)

    def gradient_replicas(self, info: DistInfo) -> int:
        """Over how many ranks' gradients the strategy averages (the trainer rescales by it).

        Args:
            info: this process's :class:`DistInfo`.

        Returns:
            By default the number of processes (DDP and FSDP average over all of them).
        """
        return info.world_size

    def whole_optimizer_state(
        self, model: nn.Module, optimizer: Optimizer, info: DistInfo
    ) -> dict[str, Any] | None:
        """The optimizer state, whole, for a single-folder checkpoint (every rank calls it;
        rank 0 writes it beside :meth:`gathered_model`'s weights).

        Args:
            model: the model :meth:`wrap` prepared.
            optimizer: its optimizer.
            info: this process's :class:`DistInfo`.

        Returns:
            ``optimizer.state_dict()`` as one process has it, on rank 0 (strategies that gather
            it return ``None`` on the other ranks).
        """
        return optimizer.state_dict()

    def load_weights(self, ckpt: Path, model: nn.Module) -> None:
        """Load a single-folder checkpoint's ``model.safetensors`` (on every rank).

        Args:
            ckpt: the checkpoint directory (verified).
            model: the model :meth:`wrap` prepared (loaded in place).
        """
        from attnlab.training.checkpoint import read_model_weights  # (it imports this module)

        read_model_weights(ckpt, model)

    def load_optimizer_state(
        self, model: nn.Module, optimizer: Optimizer, optimizer_state: Any
    ) -> None:
        """Load a single-folder checkpoint's optimizer state (on every rank).

        Args:
            model: the model :meth:`wrap` prepared.
            optimizer: its optimizer (loaded in place).
            optimizer_state: the checkpoint's ``optimizer.state_dict()``, as one process has it.
        """
        optimizer.load_state_dict(optimizer_state)

    def gradient_sync(
        self, forward_model: nn.Module, sync: bool
    ) -> contextlib.AbstractContextManager[Any]:
        """The context of one micro-batch's forward and backward.

        Args:
            forward_model: what :meth:`wrap` returned.
            sync: ``True`` for the last micro-batch of a step (the gradients are reduced over
                the ranks); ``False`` to accumulate them locally first.

        Returns:
            A context manager (a no-op unless the strategy can skip the reduction).
        """
        return contextlib.nullcontext()

    def grad_scaler(self, info: DistInfo) -> torch.amp.GradScaler:
        """The fp16 gradient scaler of a run (``TrainConfig(fp16=True)``).

        Args:
            info: this process's :class:`DistInfo`.

        Returns:
            A ``torch.amp.GradScaler`` for ``info.device``; sharded strategies return one that
            agrees over the ranks on whether a gradient overflowed.
        """
        return torch.amp.GradScaler(info.device.type)

    def gathered_model(self, model: nn.Module, info: DistInfo) -> nn.Module | None:
        """The whole model, on rank 0, for evaluation and reports (every rank must call it).

        Args:
            model: the model :meth:`wrap` prepared.
            info: this process's :class:`DistInfo`.

        Returns:
            A module holding the full current weights on rank 0, ``None`` on the other ranks.
        """
        return model if info.is_main else None

    def save_state(self, directory: Path, model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
        """Write this rank's part of the model and optimizer state into ``directory``.

        Called on every rank with the same ``directory`` (sharded strategies only).

        Args:
            directory: an existing, empty folder shared by the ranks.
            model: the model :meth:`wrap` prepared.
            optimizer: its optimizer.

        Returns:
            The optimizer state's JSON-able rest (hyper-parameters, non-tensor entries), kept
            in the checkpoint's training state and given back to :meth:`load_state`.
        """
        raise NotImplementedError(f"{type(self).__name__} writes no sharded checkpoints")

    def load_state(
        self, directory: Path, model: nn.Module, optimizer: Optimizer, rest: Mapping[str, Any]
    ) -> None:
        """Read the model and optimizer state that :meth:`save_state` wrote (on every rank).

        The number of processes may differ from the run that saved it.

        Args:
            directory: the folder :meth:`save_state` wrote.
            model: the model :meth:`wrap` prepared (loaded in place).
            optimizer: its optimizer (loaded in place).
            rest: what :meth:`save_state` returned.
        """
        raise NotImplementedError(f"{type(self).__name__} reads no sharded checkpoints")


class DDPStrategy(ParallelStrategy):
    """Data parallelism: a whole replica of the model on every rank (``DistributedDataParallel``).

    Each rank computes the gradient of its slice of the global batch and DDP averages the
    gradients over the ranks during the backward pass of the last micro-batch of each step
    (``no_sync`` before). Checkpoints are the single folder rank 0 writes
    (:mod:`attnlab.training.checkpoint`). In a single process the model is used as it is.
    """

    name = "ddp"
    sharded = False

    def wrap(self, model: nn.Module, info: DistInfo) -> nn.Module:
        """``DistributedDataParallel(model)`` when distributed, else ``model``.

        Args:
            model: the model, already on ``info.device``.
            info: this process's :class:`DistInfo`.

        Returns:
            The module the loss function calls.
        """
        if not info.distributed:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [info.device.index] if info.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def gradient_sync(
        self, forward_model: nn.Module, sync: bool
    ) -> contextlib.AbstractContextManager[Any]:
        """DDP's ``no_sync()`` for the micro-batches before the last.

        Args:
            forward_model: what :meth:`wrap` returned.
            sync: whether this micro-batch's backward reduces the gradients.

        Returns:
            ``forward_model.no_sync()``, or a no-op context.
        """
        from torch.nn.parallel import DistributedDataParallel

        if sync or not isinstance(forward_model, DistributedDataParallel):
            return contextlib.nullcontext()
        return forward_model.no_sync()
