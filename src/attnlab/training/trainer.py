"""One training loop for every task.

A :class:`Trainer` takes

- ``model``: any ``nn.Module``;
- ``make_optimizer(model) -> optimizer`` or ``(optimizer, scheduler or None)``;
- ``batches``: a :class:`BatchSource` — ``next_batch()`` returns the next *global* batch, and
  ``state_dict()`` / ``load_state_dict()`` save and restore its position (JSON-able values and
  tensors, e.g. a ``torch.Generator`` state). It must be synchronous and deterministic: after
  ``load_state_dict(s)`` it returns exactly the batches it returned after ``s`` was taken.
  :class:`IndexedBatches` turns a function ``index -> batch`` into one;
- ``loss_fn(model, batch) -> TokenLoss | Tensor``: called with the (possibly
  DistributedDataParallel-wrapped) model, so it must *call* the model (its ``forward``). Returning
  a :class:`~attnlab.training.losses.TokenLoss` (mean + number of positions) weights
  micro-batches and ranks by token count, so gradient accumulation and N processes give the
  gradient of the whole global batch; a plain tensor counts as one unit;
- a :class:`TrainConfig`, a run folder, the run's configuration (written to ``config.json``),
  optional task files (the tokenizer) and an optional ``evaluate(model) -> {name: value}``.

Each optimizer step: ``grad_accum`` micro-batches (each rank keeps its slice of every global
batch), forward and loss in bf16 or fp16 autocast when asked, gradients scaled to the
token-weighted mean, clipped to ``clip``, optimizer and scheduler step. Every step appends a line
to ``metrics.jsonl`` in the run folder (``{"kind": "train", "step", "loss", "lr", "grad_norm",
"tokens", "tokens_per_s", "elapsed"}``, plus ``"loss_scale"`` and ``"skipped"`` in fp16 runs),
evaluation lines (``{"kind": "eval", "step", ...}``) every ``eval_every`` steps and
at the end, and a checkpoint every ``save_every`` steps and at the end (see
:mod:`attnlab.training.checkpoint`). Evaluation runs under ``torch.no_grad`` in eval mode with the
random states saved and restored around it, so evaluating never changes the training trajectory.
A step's checkpoint is written *before* its evaluation, and an evaluation that raises first saves
the step it evaluated: an evaluation error never costs the training. Non-finite numbers are
logged as ``null`` (``metrics.jsonl`` is strict JSON).

Divergence. A non-finite loss or gradient norm stops the run before the optimizer step: the step
is not taken, the data position and random states go back to before it, that last finite state
is saved (the checkpoint ``latest`` names) and :meth:`Trainer.fit` raises
:class:`~attnlab.training.divergence.DivergenceError` naming the step. Weights that are not finite
are never saved (see :mod:`attnlab.training.divergence`).

SIGINT (Ctrl-C) and SIGTERM during :meth:`Trainer.fit` finish the current step, save a
checkpoint and return a :class:`TrainResult` with ``interrupted=True``; a second Ctrl-C aborts at
once. :meth:`Trainer.resume` restores a run — model, optimizer, scheduler, step, RNG states and
data position — so that on the CPU the continued run is bit-identical to one that never stopped;
it refuses (``ValueError``, nothing written) when the run configuration differs from the saved one,
or when a data file (``data_files``) changed since the checkpoint (its size and SHA-256 are kept
in ``config.json``; see :mod:`attnlab.training.data_files`), unless ``allow_data_change=True``.

Mixed precision (bf16, and fp16 with a gradient scaler) and the step's mechanics are in
:mod:`attnlab.training.step`.

Processes. Under ``torchrun`` (see :mod:`attnlab.training.processes`) a
:class:`~attnlab.training.processes.ParallelStrategy` spreads the model over the ranks:
:class:`~attnlab.training.processes.DDPStrategy` (the default) keeps a replica per rank and
rank 0 writes single-folder checkpoints; :class:`attnlab.distributed.fsdp.FSDPStrategy` shards
parameters, gradients and optimizer state (FSDP2), every rank writes its shards of each
checkpoint (:func:`~attnlab.training.checkpoint.save_sharded_checkpoint`), such a checkpoint
resumes on any number of processes, and evaluation runs on rank 0 with the weights gathered into
a whole copy (:meth:`Trainer.gathered_model`); :class:`attnlab.distributed.mesh.MeshStrategy`
spreads the batch's rows, its sequences (ring attention) and the layers' heads over a
``(dp, cp, tp)`` device mesh and writes single-folder checkpoints gathered whole. The strategy
decides which part of each global batch a rank computes
(:meth:`~attnlab.training.processes.ParallelStrategy.local_batch`), over which ranks the totals
are summed and the gradients averaged. Whatever the strategy, the global batch, the token
weighting, the global gradient norm and clipping, and the divergence checks are those of one
process.
A rank that dies stops the others at their next collective with a one-line
:class:`~attnlab.training.processes.PeerLostError` naming the checkpoint to resume from.

Progress display is a callback (:class:`TrainerCallback`); the command line uses
:class:`attnlab.training.progress.RichProgress`. The trainer's parts live beside it:
:class:`~attnlab.training.metrics_log.MetricsLog` (``metrics.jsonl``),
:class:`~attnlab.training.stop.GracefulStop` (the signals) and
:mod:`attnlab.training.checkpoint` (saving, resolving and reading checkpoints).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.training.batches import BatchSource, IndexedBatches
from attnlab.training.checkpoint import (
    SHARDED,
    CheckpointError,
    config_as_saved,
    is_sharded,
    read_config,
    read_manifest,
    read_training_state,
    resolve_checkpoint,
    save_checkpoint,
    save_sharded_checkpoint,
    verify_checkpoint,
)
from attnlab.training.data_files import DATA_FILES_KEY, data_change, fingerprint_files
from attnlab.training.divergence import DivergenceError, all_finite
from attnlab.training.losses import TokenLoss
from attnlab.training.metrics_log import METRICS_FILE, MetricsLog
from attnlab.training.processes import (
    DDPStrategy,
    DistInfo,
    ParallelStrategy,
    all_reduce_sum,
    barrier,
    is_initialized,
    local_tensor,
    peer_lost_error,
)
from attnlab.training.rng import get_rng_state, set_rng_state
from attnlab.training.run_types import (
    StepMetrics,
    TrainConfig,
    TrainerCallback,
    TrainResult,
    canonical_run_config,
    config_difference,
)
from attnlab.training.step import train_step
from attnlab.training.stop import GracefulStop

__all__ = [
    "METRICS_FILE",
    "BatchSource",
    "DivergenceError",
    "IndexedBatches",
    "StepMetrics",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainerCallback",
    "config_difference",
]

logger = logging.getLogger(__name__)


def _any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (a collective when distributed)."""
    return float(all_reduce_sum(torch.tensor([float(flag)], dtype=torch.float64)).item()) > 0


class Trainer:
    """The training loop (see the module docstring for the protocol of its arguments).

    Args:
        model: the model (moved to ``dist.device`` and prepared by ``strategy``: wrapped in DDP
            when distributed, or sharded in place by FSDP). :attr:`model` is this module;
            with a sharded strategy each rank holds only its shards (see
            :meth:`gathered_model`).
        make_optimizer: ``model -> optimizer`` or ``model -> (optimizer, scheduler | None)``.
        batches: a :class:`BatchSource` of global batches.
        loss_fn: ``(model, batch) -> TokenLoss | Tensor``.
        config: a :class:`TrainConfig`.
        run_dir: the run folder (checkpoints, ``metrics.jsonl``).
        run_config: the run's configuration, a JSON-able mapping (e.g. ``{"task": ..., "args":
            ..., "model": ...}``); ``config.json`` holds it plus ``"train":
            config.trajectory()``. Resuming with a different one is an error.
        files: task files stored in every checkpoint (name -> str / bytes / path).
        evaluate: ``model -> {name: float}``, run on rank 0 with the unwrapped model.
        callbacks: :class:`TrainerCallback` objects (rank 0 only).
        dist: the process's :class:`DistInfo` (default: one CPU process).
        data_files: the files the run's data came from, by the name messages give them (e.g.
            ``{"--data": "input.txt"}``); their size and SHA-256 go into ``config.json`` and
            :meth:`resume` refuses when they changed.
        strategy: how the model is spread over the processes (default
            :class:`~attnlab.training.processes.DDPStrategy`; see also
            :class:`attnlab.distributed.fsdp.FSDPStrategy` and
            :class:`attnlab.distributed.mesh.MeshStrategy`). A checkpoint resumes only with a
            strategy of its kind (sharded or single-folder).

    Shape:
        ``loss_fn`` returns a scalar ``()`` loss (or a :class:`TokenLoss` of one).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        make_optimizer: Callable[[nn.Module], Any],
        batches: BatchSource,
        loss_fn: Callable[[nn.Module, Any], TokenLoss | torch.Tensor],
        config: TrainConfig,
        run_dir: str | os.PathLike[str],
        run_config: Mapping[str, Any] | None = None,
        files: Mapping[str, str | bytes | os.PathLike[str]] | None = None,
        evaluate: Callable[[nn.Module], Mapping[str, float]] | None = None,
        callbacks: Sequence[TrainerCallback] = (),
        dist: DistInfo | None = None,
        data_files: Mapping[str, str | os.PathLike[str]] | None = None,
        strategy: ParallelStrategy | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(config, TrainConfig):
            raise ArgumentTypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        for name in ("next_batch", "state_dict", "load_state_dict"):
            if not callable(getattr(batches, name, None)):
                raise ArgumentTypeError(
                    f"batches must provide next_batch/state_dict/load_state_dict, "
                    f"got {type(batches).__name__} without {name}"
                )
        if strategy is not None and not isinstance(strategy, ParallelStrategy):
            raise ArgumentTypeError(
                f"strategy must be a ParallelStrategy (DDPStrategy, FSDPStrategy), "
                f"got {type(strategy).__name__}"
            )
        self.dist = dist or DistInfo()
        self.strategy: ParallelStrategy = strategy if strategy is not None else DDPStrategy()
        self.model = model.to(self.dist.device)
        # before the optimizer is made: FSDP replaces the parameters by their shards
        self.forward_model: nn.Module = self.strategy.wrap(self.model, self.dist)
        self.batches = batches
        self.loss_fn = loss_fn
        self.config = config
        self.run_dir = Path(run_dir)
        self.files = dict(files or {})
        self.evaluate = evaluate
        self.callbacks = list(callbacks) if self.dist.is_main else []
        # as config.json will hold it (tuples as lists…), so that it compares equal on resume
        self.run_config = config_as_saved({**dict(run_config or {}), "train": config.trajectory()})
        # what the data files are now: saved beside the configuration, compared on resume
        self.data_fingerprints = fingerprint_files(data_files or {})
        made = make_optimizer(self.model)
        if isinstance(made, tuple):
            self.optimizer, self.scheduler = made
        else:
            self.optimizer, self.scheduler = made, None
        if not isinstance(self.optimizer, Optimizer):
            raise ArgumentTypeError(
                f"make_optimizer must return an Optimizer (or (Optimizer, scheduler)), "
                f"got {type(self.optimizer).__name__}"
            )
        if self.scheduler is not None and not isinstance(self.scheduler, LRScheduler):
            raise ArgumentTypeError(
                f"the scheduler must be a torch LRScheduler, got {type(self.scheduler).__name__}"
            )
        # fp16: scale the loss so small gradients survive in fp16 (see the module docstring)
        self.scaler: torch.amp.GradScaler | None = (
            self.strategy.grad_scaler(self.dist) if config.fp16 else None
        )
        self.step = 0
        self._gathered: tuple[int, nn.Module | None] | None = None  # (step, gathered model)
        self.last_checkpoint: Path | None = None
        self._saved_step: int | None = None
        self._evaluated_step: int | None = None
        self.metrics_log = MetricsLog(self.run_dir / METRICS_FILE)
        self._graceful_stop = GracefulStop()  # a fresh one for each fit()

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """The training state that a checkpoint stores (besides the model).

        Returns:
            The optimizer, scheduler, step, RNG states, data position and the rest of the
            loop's state, as a tree of JSON-able values and tensors. With a sharded strategy
            ``"optimizer"`` is ``None``: every rank saves its shards of it with the model's
            (:meth:`~attnlab.training.processes.ParallelStrategy.save_state`).
        """
        return self._training_state(None if self.strategy.sharded else self.optimizer.state_dict())

    def _training_state(self, optimizer_state: Any) -> dict[str, Any]:
        """:meth:`state_dict` with the optimizer state given (gathered whole, or ``None``)."""
        return {
            "step": self.step,
            "optimizer": optimizer_state,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "data": self.batches.state_dict(),
            "rng": get_rng_state(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def saved_config(self) -> dict[str, Any]:
        """What ``config.json`` holds.

        Returns:
            The run configuration with ``"train"`` (the trajectory) and the data files'
            fingerprints added.
        """
        if not self.data_fingerprints:
            return dict(self.run_config)
        return {**self.run_config, DATA_FILES_KEY: self.data_fingerprints}

    def save(self) -> Path | None:
        """Write a checkpoint of the current step (every rank must call it).

        Single-folder checkpoints are written by rank 0 while the other ranks wait; with a
        sharded strategy every rank writes its shards
        (:func:`~attnlab.training.checkpoint.save_sharded_checkpoint`).

        Returns:
            The checkpoint directory on rank 0, ``None`` on the other ranks.

        Raises:
            DivergenceError: the weights are not finite (nothing is written).
        """
        if not self._weights_finite():
            raise DivergenceError(
                f"training diverged at step {self.step}: the weights hold NaN or infinite values "
                f"after it, so no checkpoint was written; {self._latest_text()}; lower the "
                f"learning rate or clip the gradients",
                self.step,
            )
        if self.strategy.sharded:
            path: Path | None = self._write_sharded_checkpoint()
        else:
            # whole tensors, written by rank 0: the model evaluation sees (gathered once a step,
            # by every rank under tensor parallelism) and the optimizer state, gathered alike
            model = self.gathered_model()
            optimizer_state = self.strategy.whole_optimizer_state(
                self.model, self.optimizer, self.dist
            )
            path = None
            if model is not None:
                path = self._write_checkpoint(model, optimizer_state)
        self._saved_step = self.step
        barrier()
        return path if self.dist.is_main else None

    def _weights_finite(self) -> bool:
        """Whether every weight is finite, on every rank (each rank checks what it holds: its
        shards under FSDP or tensor parallelism), the same verdict on every rank."""
        local = all_finite(local_tensor(p) for p in self.model.parameters())
        if not is_initialized():
            return local
        return not _any_rank(not local)

    def _write_sharded_checkpoint(self) -> Path:
        """Every rank's part of :meth:`save` with a sharded strategy."""

        def write_shards(folder: Path) -> dict[str, Any]:
            return {"optimizer": self.strategy.save_state(folder, self.model, self.optimizer)}

        path = save_sharded_checkpoint(
            self.run_dir,
            step=self.step,
            write_shards=write_shards,
            config=self.saved_config(),
            training_state=self.state_dict(),
            files=self.files,
            keep_last=self.config.keep_last,
        )
        self.last_checkpoint = path
        self._saved_step = self.step
        for cb in self.callbacks:
            cb.on_save(self.step, path)
        return path

    def gathered_model(self) -> nn.Module | None:
        """The whole model with the current weights, on rank 0 (every rank must call it).

        With DDP or in one process this is :attr:`model` itself; with a sharded strategy the
        shards are all-gathered into rank 0's whole copy (what evaluation and reports use).

        Returns:
            The model on rank 0, ``None`` on the other ranks. Asked again at the same step (the
            final evaluation, then the report), the model gathered then is returned as it is.
        """
        if self._gathered is None or self._gathered[0] != self.step:
            self._gathered = (self.step, self.strategy.gathered_model(self.model, self.dist))
        return self._gathered[1]

    def close(self) -> None:
        """Drop the strategy's wrapper of the model (DDP's) before the process group is destroyed.

        DDP's C++ reducer holds the process group; were it the last holder, destroying it would
        wait for gloo's worker threads while holding the GIL, which those threads may need to
        free a finished collective's tensors: a deadlock PyTorch does not guard against. Call
        this before :func:`~attnlab.training.processes.cleanup_distributed` (``attnlab train``
        does); the trainer must not train afterwards.
        """
        self.forward_model = self.model

    def _write_checkpoint(self, model: nn.Module, optimizer_state: Any) -> Path:
        """Rank 0's part of :meth:`save`: the checkpoint of the current step, written now."""
        path = save_checkpoint(
            self.run_dir,
            step=self.step,
            model=model,
            config=self.saved_config(),
            training_state=self._training_state(optimizer_state),
            files=self.files,
            keep_last=self.config.keep_last,
        )
        self.last_checkpoint = path
        self._saved_step = self.step
        for cb in self.callbacks:
            cb.on_save(self.step, path)
        return path

    def _complete_checkpoint(self) -> Path | None:
        """The run's latest complete checkpoint as any rank sees it (rank 0 wrote it), or ``None``."""
        try:
            return resolve_checkpoint(self.run_dir)
        except CheckpointError:
            return None

    def _latest_text(self) -> str:
        """Where the last finite checkpoint is, for the divergence message."""
        if self.last_checkpoint is None:
            return "no checkpoint was saved before"
        return f"the latest checkpoint stays {self.last_checkpoint}"

    def resume(
        self, path: str | os.PathLike[str] | None = None, *, allow_data_change: bool = False
    ) -> int:
        """Restore the run from a checkpoint (default: the latest one of ``run_dir``).

        Args:
            path: a run folder, its ``checkpoints`` folder (both: the checkpoint ``latest``
                names) or one ``step-*`` checkpoint (see
                :func:`~attnlab.training.checkpoint.resolve_checkpoint`). It is resolved and
                verified once; the configuration, training state and weights are all read from
                that one directory.
            allow_data_change: resume even when a data file changed since the checkpoint (a
                warning is logged; the new fingerprints are saved from then on).

        Returns:
            The step reached by the checkpoint.

        Raises:
            CheckpointError: no valid checkpoint, or a training state that does not fit this run
                (one line; the trainer may then be half restored: build a new one).
            ValueError: the checkpoint's configuration differs from this run's, a data file
                changed, the checkpoint has done more than ``config.steps`` steps, or it is
                sharded and the strategy is not (or the reverse). Nothing is changed then.
        """
        # resolved once: all below reads ckpt
        ckpt = verify_checkpoint(path or self.run_dir, allow_sharded=True)
        sharded = is_sharded(ckpt)
        if sharded != self.strategy.sharded:
            saved_by = (
                "a sharded (--parallel fsdp)" if sharded else "a single-folder (--parallel ddp)"
            )
            raise ArgumentError(
                f"cannot resume {ckpt} with the {self.strategy.name} strategy: it is {saved_by} "
                f"checkpoint; resume it with --parallel {'fsdp' if sharded else 'ddp'} (any "
                f"number of processes). Nothing was changed"
            )
        saved = read_config(ckpt)
        saved_data = saved.pop(DATA_FILES_KEY, None)
        # an earlier release's forms read as today's (attention specs)
        diff = config_difference(canonical_run_config(saved), canonical_run_config(self.run_config))
        if diff:
            raise ArgumentError(
                f"cannot resume {ckpt} with a different configuration ({diff}); nothing was changed"
            )
        change = data_change(saved_data, self.data_fingerprints)
        if change and not allow_data_change:
            raise ArgumentError(
                f"cannot resume {ckpt}: {change}; its tokens would not be the ones the model "
                f"learned. Nothing was changed; restore the file, or allow the change explicitly "
                f"(--allow-data-change)"
            )
        if change:
            logger.warning("resuming on changed data: %s", change)
        state = read_training_state(ckpt)
        step = _checkpoint_step(state, ckpt)
        if step > self.config.steps:
            raise ArgumentError(
                f"steps must be at least the {step} steps the checkpoint has done, "
                f"got {self.config.steps}"
            )
        if not sharded:
            self.strategy.load_weights(ckpt, self.model)
        try:
            if sharded:
                self.strategy.load_state(
                    ckpt / SHARDED, self.model, self.optimizer, state["optimizer"]
                )
            else:
                self.strategy.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
            if self.scheduler is not None and state["scheduler"] is not None:
                self.scheduler.load_state_dict(state["scheduler"])
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
            self.batches.load_state_dict(state["data"])
            set_rng_state(state["rng"])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CheckpointError(
                f"checkpoint {ckpt}: its training state does not fit this run "
                f"({type(exc).__name__}: {first})"
            ) from None
        self.step = step
        self._gathered = None
        self._saved_step = self.step
        self.last_checkpoint = ckpt
        if self.dist.is_main:
            self.metrics_log.truncate_after(self.step)
        barrier()
        return self.step

    # ------------------------------------------------------------------ metrics

    @property
    def metrics_path(self) -> Path:
        """The run's ``metrics.jsonl``."""
        return self.metrics_log.path

    def _log(self, record: Mapping[str, Any]) -> None:
        if self.dist.is_main:
            self.metrics_log.append(record)

    # ------------------------------------------------------------------ stopping

    def request_stop(self) -> None:
        """Stop after the current step (saving a checkpoint), as Ctrl-C does."""
        self._graceful_stop.request()

    # ------------------------------------------------------------------ loop

    def run_evaluation(self) -> dict[str, float] | None:
        """Evaluate on rank 0 (eval mode, no grad, RNG states restored afterwards).

        Every rank must call it: with a sharded strategy the weights are first gathered into
        rank 0's whole copy (:meth:`gathered_model`), and every rank learns whether the
        evaluation failed.

        Returns:
            What ``evaluate`` returned, ``{name: value}``; ``None`` without ``evaluate`` and on
            the other ranks.

        Raises:
            Exception: what ``evaluate`` raised (rank 0); ``RuntimeError`` on the other ranks
                when it failed on rank 0.
        """
        if self.evaluate is None:
            return None
        model = self.gathered_model()
        metrics: dict[str, float] | None = None
        error: Exception | None = None
        if self.dist.is_main and model is not None:
            rng = get_rng_state()
            was_training = model.training
            model.eval()
            try:
                with torch.no_grad():
                    metrics = {k: float(v) for k, v in dict(self.evaluate(model)).items()}
            except Exception as exc:
                error = exc
            finally:
                model.train(was_training)
                set_rng_state(rng)
            if metrics is not None:
                self._log({"kind": "eval", "step": self.step, **metrics})
                for cb in self.callbacks:
                    cb.on_eval(self.step, metrics)
        failed = _any_rank(error is not None)  # every rank waits for rank 0 here
        if error is not None:
            raise error
        if failed:
            raise RuntimeError(f"the evaluation of step {self.step} failed on rank 0")
        self._evaluated_step = self.step
        return metrics

    def _evaluate_or_save(self) -> dict[str, float] | None:
        """:meth:`run_evaluation`; when it raises, the step is saved first if it is not."""
        try:
            return self.run_evaluation()
        except Exception:
            # every rank is here (run_evaluation raises on all): the save may be collective
            if self._saved_step != self.step and self._weights_finite():
                self.save()
                if self.dist.is_main:
                    logger.warning(
                        "the evaluation of step %d failed; the step is saved in %s",
                        self.step,
                        self.last_checkpoint,
                    )
            raise

    def _diverged(self, step: int, loss: float, norm: float, lr: float, position: Any) -> None:
        """Stop a run whose step ``step`` gave a non-finite loss or gradient norm (not taken).

        The data position and random states go back to before the step, the last finite state
        is saved (if not yet), and :class:`DivergenceError` is raised.
        """
        data, rng = position
        self.batches.load_state_dict(data)
        set_rng_state(rng)
        self._log({"kind": "diverged", "step": step, "loss": loss, "grad_norm": norm, "lr": lr})
        what = "loss" if not math.isfinite(loss) else "gradient norm"
        value = loss if not math.isfinite(loss) else norm
        where = self._latest_text()
        if self._saved_step != self.step and self._weights_finite():
            self.save()
            where = f"the last finite state, step {self.step}, is saved as the latest checkpoint"
            if self.last_checkpoint is not None:
                where += f" ({self.last_checkpoint})"
        elif self._saved_step == self.step and self.last_checkpoint is not None:
            where = f"the last finite state is the latest checkpoint ({self.last_checkpoint})"
        raise DivergenceError(
            f"training diverged at step {step}: the {what} is {value}, so the step was not "
            f"taken; {where}; lower the learning rate or clip the gradients",
            step,
        )

    def fit(self) -> TrainResult:
        """Train up to ``config.steps`` (from the current step; see :meth:`resume`).

        Returns:
            A :class:`TrainResult`.

        Raises:
            DivergenceError: a step's loss or gradient norm, or the weights, were not finite
                (see the module docstring); the callbacks' ``on_end`` has run.
            PeerLostError: another rank ended or stopped answering in the middle of a
                collective (:func:`~attnlab.training.processes.peer_lost_error`); the callbacks'
                ``on_end`` has run.
        """
        cfg = self.config
        self._graceful_stop = GracefulStop()
        losses: list[float] = []
        eval_metrics: dict[str, float] | None = None
        start = time.perf_counter()
        self.model.train()
        for cb in self.callbacks:
            cb.on_start(self)
        stopped = False

        def result() -> TrainResult:
            return TrainResult(
                step=self.step,
                interrupted=stopped,
                losses=losses,
                checkpoint=self.last_checkpoint if self.dist.is_main else None,
                eval_metrics=eval_metrics,
                elapsed=time.perf_counter() - start,
            )

        try:
            with self._graceful_stop:
                while self.step < cfg.steps:
                    lr = float(self.optimizer.param_groups[0]["lr"])
                    loss_scale = self.scaler.get_scale() if self.scaler is not None else None
                    position = (self.batches.state_dict(), get_rng_state())  # before the step
                    t0 = time.perf_counter()
                    loss, norm, tokens, stop, skipped, diverged = train_step(self)
                    if diverged:
                        self._diverged(self.step + 1, loss, norm, lr, position)
                    self.step += 1
                    dt = max(time.perf_counter() - t0, 1e-9)
                    losses.append(loss)
                    if skipped and self.scaler is not None:
                        logger.warning(
                            "step %d: fp16 gradients overflowed at loss scale %g; the optimizer "
                            "step was skipped and the scale lowered to %g",
                            self.step,
                            loss_scale,
                            self.scaler.get_scale(),
                        )
                    m = StepMetrics(
                        step=self.step,
                        total_steps=cfg.steps,
                        loss=loss,
                        lr=lr,
                        grad_norm=norm,
                        tokens=tokens,
                        tokens_per_s=tokens / dt,
                        elapsed=time.perf_counter() - start,
                        loss_scale=loss_scale,
                        skipped=skipped,
                    )
                    if self.step % cfg.log_every == 0 or self.step == cfg.steps:
                        record = dataclasses.asdict(m)
                        if not cfg.fp16:  # the lines of fp32/bf16 runs stay as they were
                            del record["loss_scale"], record["skipped"]
                        self._log({"kind": "train", **record})
                    for cb in self.callbacks:
                        cb.on_step(m)
                    # one process stops at once; several stop together at the next all-reduce
                    if stop or (self._graceful_stop.requested and not self.dist.distributed):
                        stopped = True
                        break
                    # saved before evaluated: an evaluation error never costs the step
                    if cfg.save_every and self.step % cfg.save_every == 0:
                        self.save()
                    if cfg.eval_every and self.step % cfg.eval_every == 0:
                        eval_metrics = self._evaluate_or_save() or eval_metrics
                if self._saved_step != self.step or self.last_checkpoint is None:
                    self.save()
                if not stopped and cfg.eval_at_end and self._evaluated_step != self.step:
                    eval_metrics = self.run_evaluation() or eval_metrics
        except DivergenceError:
            for cb in self.callbacks:
                cb.on_end(result())
            raise
        except RuntimeError as exc:  # another rank lost: one line saying so, not a bug
            lost = peer_lost_error(exc, self.dist, self._complete_checkpoint())
            if lost is None:
                raise
            for cb in self.callbacks:
                cb.on_end(result())
            raise lost from exc
        done = result()
        for cb in self.callbacks:
            cb.on_end(done)
        return done


def _checkpoint_step(state: Any, ckpt: Path) -> int:
    """The step of a training state, checked: a non-negative int, the manifest's own step.

    Raises:
        CheckpointError: a crafted or inconsistent step (negative, not an int, or not the step
            the manifest records).
    """
    step = state.get("step") if isinstance(state, dict) else None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(
            f"checkpoint {ckpt}: the training state's step must be a non-negative int, got {step!r}"
        )
    recorded = read_manifest(ckpt).step
    if step != recorded:
        raise CheckpointError(
            f"checkpoint {ckpt}: the training state's step {step} is not the step "
            f"{recorded} its manifest records"
        )
    return step
