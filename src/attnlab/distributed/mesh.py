"""Data × context × tensor parallelism over one device mesh, for the trainer.

``attnlab train ... --context-parallel C --tensor-parallel N`` under ``torchrun`` with ``W``
processes arranges them as a named 3-D device mesh ``(dp, cp, tp) = (W / (C·N), C, N)``
(``torch.distributed.device_mesh.init_device_mesh``, the last dimension the fastest: the
``N`` ranks of a tensor-parallel group are neighbours, on one machine when ``--nproc-per-node``
is a multiple of ``N``)::

    rank = (d · C + c) · N + t        (d, c, t: the data-, context- and tensor-parallel places)

What each dimension does with the *same global batch* every rank draws:

- **dp** — rank ``d`` keeps rows ``d · B/D … (d+1) · B/D − 1`` (as DDP does);
- **cp** — rank ``c`` keeps its part of every sequence of those rows (``"zigzag"`` layout by
  default, :func:`~attnlab.distributed.ring_schedule.shard_sequence`), and the model's attention
  is ring attention over the cp group (:mod:`attnlab.distributed.context_parallel`);
- **tp** — the ranks of a tp group see the same tokens and hold ``1/N`` of every attention
  layer's heads and feed-forward units (:mod:`attnlab.distributed.tensor_parallel`): DTensor
  parameters on the tp sub-mesh, whose gradients DTensor itself completes.

The ``D · C`` ranks that share a tp coordinate computed the gradient of different tokens of the
global batch: after the last micro-batch of a step, each gradient (a DTensor's local shard under
tensor parallelism) is averaged over them with one all-reduce per dtype, and the loss and token
totals are summed over them only (the ranks of a tp group hold the same loss, counted once), so
that the trainer's token weighting gives the single-process step: the same loss curve and, in
float64, the same weights to rounding.

Checkpoints are the single folder every command reads: under tensor parallelism every rank takes
part in gathering the whole weights and optimizer state (the fused QKV rows put back in their
single-process order), then rank 0 writes them, and a resumed run cuts them again for its own
mesh — so a run moves freely between ``--tensor-parallel`` degrees, ``--context-parallel``
sizes, DDP and one process. Evaluation and the final report run on rank 0, on a whole copy of
the model (the memory of one more model on rank 0).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.optim import Optimizer

from attnlab._checks import check_choice, check_positive_int, shape_str
from attnlab.distributed.context_parallel import (
    ContextParallelModel,
    check_context_parallel,
    context_parallelize,
)
from attnlab.distributed.ring_schedule import LAYOUTS, shard_sequence
from attnlab.distributed.tensor_parallel import (
    full_optimizer_state_dict,
    full_state_dict,
    load_full_optimizer_state_dict,
    load_full_state_dict,
    parallelize,
)
from attnlab.errors import ArgumentError
from attnlab.training.checkpoint import MODEL, CheckpointError
from attnlab.training.processes import (
    DistInfo,
    ParallelStrategy,
    all_reduce_sum,
    is_initialized,
    local_tensor,
    map_batch,
    shard_batch,
)

__all__ = ["MeshStrategy"]


class MeshStrategy(ParallelStrategy):
    """Data, context and tensor parallelism on a ``(dp, cp, tp)`` device mesh (module docstring).

    Args:
        context_parallel: ``C``, the ranks each sequence is spread over (ring attention).
        tensor_parallel: ``N``, the ranks each layer's heads and feed-forward units are split
            over.
        layout: the context-parallel layout, ``"zigzag"`` (default) or ``"contiguous"``.

    Attributes:
        mesh: the device mesh (after :meth:`wrap`).
        dp, cp, tp: this rank's coordinates on it (after :meth:`wrap`).

    Raises:
        ValueError: a degree below 1, or an unknown layout.

    Examples:
        >>> strategy = MeshStrategy(context_parallel=2, tensor_parallel=2)  # doctest: +SKIP
        >>> trainer = Trainer(gpt, ..., dist=init_distributed(), strategy=strategy)  # doctest: +SKIP
    """

    name = "mesh"
    sharded = False
    runs_alone = False

    def __init__(
        self, *, context_parallel: int = 1, tensor_parallel: int = 1, layout: str = "zigzag"
    ) -> None:
        self.context_parallel = check_positive_int("context_parallel", context_parallel)
        self.tensor_parallel = check_positive_int("tensor_parallel", tensor_parallel)
        self.layout = check_choice("layout", layout, LAYOUTS)
        self.data_parallel = 1
        self.mesh: DeviceMesh | None = None
        self.dp = self.cp = self.tp = 0
        self._replicas: Any = None  # the group of the ranks with this rank's tp coordinate
        self._model: nn.Module | None = None
        self._full: nn.Module | None = None

    # ------------------------------------------------------------------ the mesh

    def wrap(self, model: nn.Module, info: DistInfo) -> nn.Module:
        """Build the mesh, shard the model's heads over tp and turn its attention into ring
        attention over cp (in place); checks every option before anything changes.

        Args:
            model: a GPT (or, tensor parallel only, a Transformer), on ``info.device``.
            info: this process's :class:`~attnlab.training.processes.DistInfo`.

        Returns:
            The module the loss function calls (:class:`ContextParallelModel` under context
            parallelism, else ``model``).

        Raises:
            ValueError: no process group, or a world size not divisible by ``C · N``.
            TypeError, ValueError: a model the asked parallelism cannot split (see
                :func:`~attnlab.distributed.tensor_parallel.parallelize` and
                :func:`~attnlab.distributed.context_parallel.context_parallelize`).
        """
        c, n = self.context_parallel, self.tensor_parallel
        if c > 1:  # what the model allows first: it does not depend on the processes
            check_context_parallel(model)
        if not is_initialized():
            raise ArgumentError(
                f"--context-parallel {c} --tensor-parallel {n} needs {c * n} processes or a "
                f"multiple: start them with torchrun --nproc-per-node {c * n}"
            )
        if info.world_size % (c * n):
            raise ArgumentError(
                f"the number of processes {info.world_size} must be a multiple of "
                f"--context-parallel × --tensor-parallel = {c} × {n} = {c * n}"
            )
        self.data_parallel = info.world_size // (c * n)
        self.mesh = init_device_mesh(
            info.device.type, (self.data_parallel, c, n), mesh_dim_names=("dp", "cp", "tp")
        )
        self.dp, self.cp, self.tp = (
            info.rank // (c * n), (info.rank // n) % c, info.rank % n,
        )  # fmt: skip
        # every rank builds every replica group, in the same order (new_group is collective)
        for t in range(n):
            ranks = list(range(t, info.world_size, n))
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if t == self.tp:
                self._replicas = group
        if info.is_main:
            self._full = copy.deepcopy(model)  # evaluation's whole model, filled on demand
        if n > 1:
            parallelize(model, self.mesh["tp"])
        self._model = model
        if c == 1:
            return model
        gpt = context_parallelize(model, self.mesh["cp"].get_group(), layout=self.layout)
        return ContextParallelModel(gpt, self.cp, c, self.layout)

    def local_batch(self, batch: Any, info: DistInfo) -> Any:
        """Rows by data-parallel rank, then this rank's part of every sequence.

        Args:
            batch: the global batch; every tensor ``(B, T, ...)`` under context parallelism.
            info: this process's :class:`~attnlab.training.processes.DistInfo`.

        Returns:
            This rank's part.

        Raises:
            ValueError: ``B`` not divisible by the data-parallel size, or ``T`` by the chunks
                of the layout (``C``, or ``2C`` for zigzag).

        Shape:
            each tensor ``(B, T, ...)`` → ``(B / D, T / C, ...)``.
        """
        rows = shard_batch(batch, self.dp, self.data_parallel)
        c = self.context_parallel
        if c == 1:
            return rows
        parts = 2 * c if self.layout == "zigzag" else c

        def split(t: torch.Tensor) -> torch.Tensor:
            if t.dim() < 2 or t.shape[1] % parts:
                raise ArgumentError(
                    f"context parallelism over {c} ranks ({self.layout} layout) cuts every "
                    f"sequence into {parts} chunks: the batch's tensors must be (B, T, ...) "
                    f"with T divisible by {parts}, got {shape_str(t.shape)}"
                )
            return shard_sequence(t, 1, rank=self.cp, world_size=c, layout=self.layout)

        return map_batch(split, rows)

    def reduce_totals(self, totals: torch.Tensor, info: DistInfo) -> torch.Tensor:
        """The totals summed over the ranks that share this rank's tp coordinate.

        Args:
            totals: this rank's totals, float64.
            info: this process's :class:`~attnlab.training.processes.DistInfo`.

        Returns:
            Their sum over the data- and context-parallel ranks.

        Shape:
            ``(n,)`` → ``(n,)``.
        """
        if self._replicas is None:  # no other rank computed another part of the batch
            return totals
        return all_reduce_sum(totals, group=self._replicas)

    def gradient_replicas(self, info: DistInfo) -> int:
        """``D · C``: the gradients are averaged over the data- and context-parallel ranks.

        Args:
            info: this process's :class:`~attnlab.training.processes.DistInfo`.

        Returns:
            ``D · C``.
        """
        return self.data_parallel * self.context_parallel

    def gradient_sync(
        self, forward_model: nn.Module, sync: bool
    ) -> contextlib.AbstractContextManager[Any]:
        """After the last micro-batch's backward, average the gradients over ``D · C`` ranks.

        Args:
            forward_model: what :meth:`wrap` returned.
            sync: whether this is the step's last micro-batch.

        Returns:
            A context manager whose exit all-reduces the gradients when ``sync``.
        """
        return self._averaged(sync)

    @contextlib.contextmanager
    def _averaged(self, sync: bool) -> Iterator[None]:
        yield
        if not sync or self._replicas is None or self._model is None:
            return
        # one all-reduce per dtype over the flattened gradients (their local shards)
        grads = [local_tensor(p.grad) for p in self._model.parameters() if p.grad is not None]
        replicas = self.data_parallel * self.context_parallel
        for dtype in sorted({g.dtype for g in grads}, key=str):
            same = [g for g in grads if g.dtype == dtype]
            flat = torch.cat([g.reshape(-1) for g in same])
            dist.all_reduce(flat, group=self._replicas)
            flat.div_(replicas)
            offset = 0
            for g in same:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    def grad_scaler(self, info: DistInfo) -> torch.amp.GradScaler:
        """fp16's scaler; under tensor parallelism one that agrees over the ranks on whether a
        gradient overflowed (each rank sees its shards only).

        Args:
            info: this process's :class:`~attnlab.training.processes.DistInfo`.

        Returns:
            The scaler.
        """
        if self.tensor_parallel == 1:
            return torch.amp.GradScaler(info.device.type)
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(info.device.type)

    # ------------------------------------------------------------------ whole weights

    def gathered_model(self, model: nn.Module, info: DistInfo) -> nn.Module | None:
        """The whole model on rank 0, a plain copy (every rank must call it).

        Args:
            model: the model :meth:`wrap` prepared.
            info: this process's :class:`~attnlab.training.processes.DistInfo`.

        Returns:
            Rank 0's whole copy with the current weights; ``None`` on the other ranks.
        """
        state = full_state_dict(model) if self.tensor_parallel > 1 else None
        if not info.is_main or self._full is None:
            return None
        self._full.load_state_dict(state if state is not None else model.state_dict())
        return self._full

    def whole_optimizer_state(
        self, model: nn.Module, optimizer: Optimizer, info: DistInfo
    ) -> dict[str, Any] | None:
        """The optimizer state as one process has it, on rank 0 (gathered under tensor
        parallelism: every rank must call it).

        Args:
            model: the model :meth:`wrap` prepared.
            optimizer: its optimizer.
            info: this process's :class:`~attnlab.training.processes.DistInfo`.

        Returns:
            The whole state on rank 0, ``None`` on the other ranks.
        """
        if self.tensor_parallel == 1:
            state = optimizer.state_dict()
        else:
            state = full_optimizer_state_dict(model, optimizer)
        return state if info.is_main else None

    def load_weights(self, ckpt: Path, model: nn.Module) -> None:
        """Load a single-folder checkpoint's weights, each rank keeping its shards.

        Args:
            ckpt: the checkpoint directory (verified).
            model: the model :meth:`wrap` prepared (loaded in place).

        Raises:
            CheckpointError: the weights cannot be read or do not fit the model.
        """
        if self.tensor_parallel == 1:
            super().load_weights(ckpt, model)
            return
        try:
            tensors = load_file(str(ckpt / MODEL))
            load_full_state_dict(model, tensors)
        except (SafetensorError, OSError, KeyError, ValueError, RuntimeError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CheckpointError(f"checkpoint {ckpt}: cannot load {MODEL} ({first})") from None

    def load_optimizer_state(
        self, model: nn.Module, optimizer: Optimizer, optimizer_state: Any
    ) -> None:
        """Load a single-folder checkpoint's optimizer state, each rank keeping its shards.

        Args:
            model: the model :meth:`wrap` prepared.
            optimizer: its optimizer (loaded in place).
            optimizer_state: ``optimizer.state_dict()`` as one process has it.
        """
        if self.tensor_parallel == 1:
            optimizer.load_state_dict(optimizer_state)
        else:
            load_full_optimizer_state_dict(model, optimizer, optimizer_state)
