"""Fully sharded data parallelism: FSDP2 (``torch.distributed.fsdp.fully_shard``) for the trainer.

With data parallelism (DDP) every rank holds the whole model, its gradients and the optimizer's
moments. Fully sharded data parallelism (ZeRO-3; Rajbhandari et al. 2020, FSDP: Zhao et al. 2023)
keeps only ``1/N`` of each on each of ``N`` ranks: every parameter is a ``DTensor`` split along
its first dimension (``Shard(0)``), and a block's whole weights exist only while the block runs::

    forward, block i:   all-gather W_i (from N shards)  → compute → free W_i
    backward, block i:  all-gather W_i again            → compute ∇ → reduce-scatter ∇W_i
    optimizer step:     on the local shard only (Adam's moments are sharded like W)

The gradient each rank keeps is the *average* over the ranks of its shard, as DDP's all-reduce
gives it, so the trainer's token weighting (one process = N processes on the same global batch)
is unchanged. Clipping needs the norm of the whole gradient: ``clip_grad_norm_`` on ``DTensor``
parameters computes the local sum of squares and all-reduces it (the norm is a replicated
``DTensor``, the same on every rank).

:class:`FSDPStrategy` is what ``attnlab train ... --parallel fsdp`` gives the
:class:`~attnlab.training.trainer.Trainer`: each transformer block (:func:`transformer_blocks`)
becomes one FSDP unit, then the root (embeddings, final norm, head and anything not in a block),
so that one block's weights are gathered at a time. Its checkpoints are sharded (every rank
writes its part, :mod:`attnlab.distributed.checkpoint`) and resume on any number of processes.

Without ``torchrun`` (one process, no process group) there is nothing to shard: the model
trains as it is, and the checkpoints are still written in the sharded layout (one shard), so a
run can move between one process and several in both directions. Under ``torchrun`` the FSDP
code path runs on the CPU with gloo as on GPUs with NCCL.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.optim import Optimizer

from attnlab.distributed.checkpoint import load_sharded_state, save_sharded_state
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.training.processes import DistInfo, ParallelStrategy, is_initialized

__all__ = ["FSDPStrategy", "shard_model", "transformer_blocks"]


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the elements of its outermost ``nn.ModuleList``s.

    That is GPT's ``transformer.h[i]`` and the encoder-decoder's ``encoder.layers[i]`` and
    ``decoder.layers[i]``; the search does not look inside a block (a list inside a block is
    the block's business).

    Args:
        model: any module.

    Returns:
        The blocks, in the order ``model.modules()`` meets them (empty for a model without a
        ``ModuleList``).
    """
    blocks: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if isinstance(child, nn.ModuleList):
                blocks.extend(child)
            else:
                visit(child)

    visit(model)
    return blocks


def shard_model(
    model: nn.Module,
    *,
    world_size: int,
    device_type: str = "cpu",
    blocks: Sequence[nn.Module] | None = None,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Shard ``model`` over the ranks of the default process group with ``fully_shard`` (FSDP2).

    Each block becomes one FSDP unit (bottom-up, as FSDP2 requires), then the root; the
    parameters become ``DTensor`` shards (``Shard(0)``) in place, so build the optimizer *after*
    this call. Every rank must call it on the same model. A parameter that is not contiguous in
    memory is made contiguous first (FSDP2 shards only contiguous ones).

    Args:
        model: the model, on this rank's device (changed in place).
        world_size: the number of ranks (the device mesh is 1-D).
        device_type: ``"cpu"`` (gloo) or ``"cuda"`` (NCCL). Default ``"cpu"``.
        blocks: the units to shard separately (default :func:`transformer_blocks`).
        reshard_after_forward: free each unit's gathered weights after its forward (gathered
            again in the backward pass: less memory, one more all-gather). Default ``True``.

    Returns:
        ``model`` itself (now an ``FSDPModule``).

    Raises:
        ValueError: ``world_size`` is not a positive int.
        RuntimeError: no process group (start the processes with ``torchrun``).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ArgumentError(f"world_size must be a positive int, got {world_size!r}")
    if not is_initialized():
        raise RuntimeError("shard_model needs a process group: start the processes with torchrun")
    mesh = init_device_mesh(device_type, (world_size,))
    # FSDP2 shards contiguous parameters only (generation may have laid the fp32 matrices out
    # (in, out) for fast decoding, see attnlab.decoding.layout)
    with torch.no_grad():
        for p in model.parameters():
            if not p.is_contiguous():
                p.data = p.data.contiguous()
    for block in transformer_blocks(model) if blocks is None else blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


class FSDPStrategy(ParallelStrategy):
    """Fully sharded data parallelism (FSDP2) for the :class:`~attnlab.training.trainer.Trainer`.

    Under ``torchrun`` the model is sharded with :func:`shard_model`; in one process without a
    process group it trains as it is. Either way checkpoints are sharded
    (:mod:`attnlab.distributed.checkpoint`) and resume on any number of processes. For
    evaluation and the final report rank 0 keeps an unsharded copy of the model (the memory of
    one whole model), into which :meth:`gathered_model` gathers the current weights.

    Args:
        blocks: ``model -> modules`` to shard as separate units (default
            :func:`transformer_blocks`).
        reshard_after_forward: see :func:`shard_model`. Default ``True``.

    Example:
        >>> from attnlab.distributed.fsdp import FSDPStrategy
        >>> trainer = Trainer(model, ..., dist=init_distributed(), strategy=FSDPStrategy())
    """

    name = "fsdp"
    sharded = True
    runs_alone = False

    def __init__(
        self,
        *,
        blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None,
        reshard_after_forward: bool = True,
    ) -> None:
        if blocks is not None and not callable(blocks):
            raise ArgumentTypeError(
                f"blocks must be callable (model -> modules), got {type(blocks).__name__}"
            )
        self.blocks = blocks
        self.reshard_after_forward = bool(reshard_after_forward)
        self._full: nn.Module | None = None

    def wrap(self, model: nn.Module, info: DistInfo) -> nn.Module:
        """Shard ``model`` in place when a process group is up (see :func:`shard_model`).

        Args:
            model: the model, on ``info.device``.
            info: this process's :class:`~attnlab.training.processes.DistInfo`.

        Returns:
            ``model`` itself.
        """
        if not is_initialized():
            return model
        if info.is_main:
            self._full = copy.deepcopy(model)  # evaluation's whole model, filled on demand
        return shard_model(
            model,
            world_size=info.world_size,
            device_type=info.device.type,
            blocks=None if self.blocks is None else self.blocks(model),
            reshard_after_forward=self.reshard_after_forward,
        )

    def gradient_sync(
        self, forward_model: nn.Module, sync: bool
    ) -> contextlib.AbstractContextManager[Any]:
        """Skip the reduce-scatter of the micro-batches before the last (gradients accumulate
        unsharded, then one reduce-scatter).

        Args:
            forward_model: the sharded model.
            sync: whether this micro-batch's backward reduces the gradients.

        Returns:
            A context manager.
        """
        if sync or not isinstance(forward_model, FSDPModule):
            return contextlib.nullcontext()
        return _no_gradient_sync(forward_model)

    def grad_scaler(self, info: DistInfo) -> torch.amp.GradScaler:
        """fp16's gradient scaler: ``ShardedGradScaler`` under a process group (each rank sees
        only its shards' gradients, so whether one overflowed is all-reduced before the step is
        taken or skipped on every rank alike).

        Args:
            info: this process's :class:`~attnlab.training.processes.DistInfo`.

        Returns:
            The scaler.
        """
        if not is_initialized():
            return torch.amp.GradScaler(info.device.type)
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(info.device.type)

    def gathered_model(self, model: nn.Module, info: DistInfo) -> nn.Module | None:
        """The whole model on rank 0 (every rank must call it: the weights are all-gathered).

        Args:
            model: the sharded model.
            info: this process's :class:`~attnlab.training.processes.DistInfo`.

        Returns:
            Rank 0's unsharded copy holding the current weights; ``None`` on the other ranks.
        """
        if not isinstance(model, FSDPModule):
            return model if info.is_main else None
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(model, options=options)
        if not info.is_main or self._full is None:
            return None
        self._full.load_state_dict(full)
        return self._full

    def save_state(self, directory: Path, model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
        """Write this rank's shards (see :func:`~attnlab.distributed.checkpoint.save_sharded_state`).

        Args:
            directory: an existing, empty folder shared by the ranks.
            model: the model :meth:`wrap` prepared.
            optimizer: its optimizer.

        Returns:
            The optimizer state's JSON-able rest.
        """
        return save_sharded_state(directory, model, optimizer)

    def load_state(
        self, directory: Path, model: nn.Module, optimizer: Optimizer, rest: Mapping[str, Any]
    ) -> None:
        """Read the shards (see :func:`~attnlab.distributed.checkpoint.load_sharded_state`).

        Args:
            directory: the folder :meth:`save_state` wrote (with any number of ranks).
            model: the model :meth:`wrap` prepared (loaded in place).
            optimizer: its optimizer (loaded in place).
            rest: what :meth:`save_state` returned.
        """
        load_sharded_state(directory, model, optimizer, rest)


@contextlib.contextmanager
def _no_gradient_sync(model: FSDPModule) -> Iterator[None]:
    """FSDP2's ``set_requires_gradient_sync(False)`` for the duration of the block."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
