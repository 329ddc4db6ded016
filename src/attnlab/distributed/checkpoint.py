"""Sharded checkpoints (``torch.distributed.checkpoint``) and their conversion into one folder.

A run trained with :class:`~attnlab.distributed.fsdp.FSDPStrategy` (``--parallel fsdp``) saves
its model and optimizer state the way they lie in memory: every rank writes its own shards, no
rank ever holds the whole model. The checkpoint folder keeps attnlab's layout (``latest``, the
``step-*`` folders, ``config.json``, the training state, the task's files and the manifest that
covers them all; see :mod:`attnlab.training.checkpoint`) with ``sharded/`` in place of
``model.safetensors``::

    step-00000040/
      config.json  training_state.json  training_state.safetensors  tokenizer.json
      sharded/shard-00001-model-00001-of-00001.safetensors     rank 0's shards
      sharded/shard-00002-model-00001-of-00001.safetensors     rank 1's shards
      manifest.json

Each shard file is a safetensors file written by ``torch.distributed.checkpoint`` (DCP) with its
Hugging Face storage writer: the tensors ``model.<name>`` (a parameter or buffer, tied weights
once) and ``optim.<name>.<key>`` (Adam's ``exp_avg``, ``exp_avg_sq``, ``step`` …), each rank's
piece with its offset in the whole tensor in the file's metadata. DCP's reader puts the pieces
together for any other sharding, so a checkpoint saved by N processes resumes on M — one
process included. Nothing is pickled: the optimizer's hyper-parameters are JSON in the training
state, and DCP's metadata is read from the safetensors headers.

:func:`consolidate` (``attnlab checkpoint convert``) turns a sharded checkpoint into the single
folder every other command reads (``generate``, ``view``, ``inspect``, :func:`attnlab.tasks.run.load_run`),
like PyTorch's ``dcp_to_torch_save``: the whole weights in ``model.safetensors``, in one process,
without a process group.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from attnlab.errors import ArgumentError
from attnlab.training.checkpoint import (
    CONFIG,
    MODEL,
    SHARDED,
    STATE_JSON,
    STATE_TENSORS,
    CheckpointError,
    is_sharded,
    read_config,
    read_manifest,
    save_checkpoint,
)
from attnlab.training.checkpoint_hold import hold_checkpoint
from attnlab.training.manifest import MANIFEST
from attnlab.training.processes import is_initialized

__all__ = [
    "consolidate",
    "load_sharded_state",
    "read_sharded_tensors",
    "save_sharded_state",
    "tied_names",
]

MODEL_KEY = "model"
OPTIM_KEY = "optim"


def tied_names(model: nn.Module) -> dict[str, str]:
    """The names under which a shared (tied) parameter or buffer appears more than once.

    Args:
        model: any module.

    Returns:
        ``{alias: kept name}``: each shared tensor is kept under the first of its names in
        sorted order (as ``model.safetensors`` stores it) and the other names map to it.
    """
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    for name, b in model.named_buffers(remove_duplicate=False):
        groups.setdefault(id(b), []).append(name)
    aliases: dict[str, str] = {}
    for names in groups.values():
        kept, *others = sorted(names)
        aliases.update(dict.fromkeys(others, kept))
    return aliases


def _split_state(state: Any) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """An optimizer's per-parameter state split into tensors (for DCP) and the JSON-able rest."""
    tensors: dict[str, dict[str, Any]] = {}
    rest: dict[str, Any] = {}
    for name, entry in dict(state).items():
        for key, value in dict(entry).items():
            if isinstance(value, torch.Tensor):
                tensors.setdefault(name, {})[key] = value
            else:
                rest.setdefault(name, {})[key] = value
    return tensors, rest


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    """Silence DCP's warning that a call without a process group runs in one process (meant)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        yield


def _packed(t: Any) -> Any:
    """A tensor as safetensors writes it: contiguous (a copy only when it is not)."""
    if isinstance(t, torch.Tensor) and not isinstance(t, DTensor) and not t.is_contiguous():
        return t.contiguous()
    return t


def save_sharded_state(
    directory: str | os.PathLike[str], model: nn.Module, optimizer: Optimizer
) -> dict[str, Any]:
    """Write this rank's shards of the model and optimizer state into ``directory`` (DCP).

    Every rank of the process group calls it with the same folder (a collective); in one
    process without a process group it writes the whole state as one shard. Tied weights are
    written once (:func:`tied_names`).

    Args:
        directory: an existing folder shared by the ranks, empty.
        model: the model (``fully_shard``-ed, or a plain module).
        optimizer: its optimizer.

    Returns:
        ``{"param_groups": ..., "state": ..., "empty": bool}``: the optimizer's hyper-parameters,
        the non-tensor entries of its state and whether it had no state yet (before the first
        step) — JSON-able, to keep with the training state and give to
        :func:`load_sharded_state`.
    """
    empty = not optimizer.state
    model_state = get_model_state_dict(model)
    optim_state = get_optimizer_state_dict(model, optimizer)
    if empty:  # get_optimizer_state_dict initialised it (a step of zeros): take that back
        optimizer.state.clear()
    aliases = tied_names(model)
    tensors, rest = _split_state(optim_state["state"]) if not empty else ({}, {})
    state = {
        MODEL_KEY: {k: _packed(v) for k, v in model_state.items() if k not in aliases},
        OPTIM_KEY: {n: {k: _packed(v) for k, v in e.items()} for n, e in tensors.items()},
    }
    writer = dcp.HuggingFaceStorageWriter(str(directory), save_distributed=True)
    with _quiet_single_process():
        dcp.save(state, storage_writer=writer, no_dist=not is_initialized())
    return {"param_groups": optim_state["param_groups"], "state": rest, "empty": empty}


def load_sharded_state(
    directory: str | os.PathLike[str],
    model: nn.Module,
    optimizer: Optimizer,
    rest: Mapping[str, Any],
) -> None:
    """Read what :func:`save_sharded_state` wrote into ``model`` and ``optimizer`` (in place).

    Every rank of the process group calls it (or one process without one); the number of ranks
    and the sharding may differ from the run that saved it: DCP reads the pieces each rank needs.

    Args:
        directory: the folder :func:`save_sharded_state` wrote.
        model: the model (``fully_shard``-ed or plain), of the saved architecture.
        optimizer: its optimizer, of the saved kind (fresh or not).
        rest: what :func:`save_sharded_state` returned.

    Raises:
        CheckpointError: the shards do not fit the model or the optimizer (one line).
    """
    aliases = tied_names(model)
    try:
        model_state = get_model_state_dict(model)
        empty = bool(rest.get("empty", False))
        optim_state = get_optimizer_state_dict(model, optimizer)  # initialises a fresh one
        tensors, _ = _split_state(optim_state["state"]) if not empty else ({}, {})
        state = {
            MODEL_KEY: {k: v for k, v in model_state.items() if k not in aliases},
            OPTIM_KEY: tensors,
        }
        reader = dcp.HuggingFaceStorageReader(str(directory))
        with _quiet_single_process():
            dcp.load(state, storage_reader=reader, no_dist=not is_initialized())
        for alias, kept in aliases.items():
            if kept in model_state:
                model_state[alias] = model_state[kept]
        set_model_state_dict(model, model_state)
        if empty:
            optimizer.state.clear()
            for group, saved in zip(optimizer.param_groups, rest["param_groups"]):
                group.update({k: v for k, v in saved.items() if k != "params"})
            return
        merged: dict[str, Any] = {name: dict(entry) for name, entry in tensors.items()}
        for name, entry in dict(rest.get("state", {})).items():
            merged.setdefault(name, {}).update(entry)
        set_optimizer_state_dict(
            model, optimizer, {"state": merged, "param_groups": list(rest["param_groups"])}
        )
    except (RuntimeError, ValueError, KeyError, TypeError, AssertionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"sharded checkpoint {directory} does not fit this model and optimizer "
            f"({type(exc).__name__}: {first[:300]})"
        ) from None


def _check_tiling(name: str, md: TensorStorageMetadata, where: Path) -> None:
    """Refuse a tensor whose saved pieces do not tile its whole size (a crafted header)."""
    size = tuple(int(n) for n in md.size)
    numel = math.prod(size)
    pieces = 0
    for chunk in md.chunks:
        offsets = tuple(int(n) for n in chunk.offsets)
        sizes = tuple(int(n) for n in chunk.sizes)
        if len(offsets) != len(size) or any(
            o < 0 or o + s > n for o, s, n in zip(offsets, sizes, size)
        ):
            raise CheckpointError(
                f"sharded checkpoint {where} is corrupted: a piece of {name!r} lies outside its "
                f"size {size}"
            )
        pieces += math.prod(sizes)
    if pieces != numel:
        raise CheckpointError(
            f"sharded checkpoint {where} is corrupted: the pieces of {name!r} hold {pieces} "
            f"elements, its size {size} needs {numel}"
        )


def read_sharded_tensors(
    path: str | os.PathLike[str], prefix: str = MODEL_KEY
) -> dict[str, torch.Tensor]:
    """The whole tensors of a sharded checkpoint, put together in this process (on the CPU).

    Args:
        path: a sharded checkpoint, or a run folder whose latest checkpoint is one (verified
            against its manifest first).
        prefix: ``"model"`` (the weights, by parameter name) or ``"optim"`` (the optimizer's
            tensors, ``"<parameter name>.<key>"``). Default ``"model"``.

    Returns:
        Name → tensor, the names without the prefix, sorted.

    Shape:
        each tensor has its whole shape (the union of the pieces the ranks wrote).

    Raises:
        CheckpointError: not a sharded checkpoint, or a damaged one (one line).
        ValueError: an unknown ``prefix``.
    """
    if prefix not in (MODEL_KEY, OPTIM_KEY):
        raise ArgumentError(f"prefix must be {MODEL_KEY!r} or {OPTIM_KEY!r}, got {prefix!r}")
    with hold_checkpoint(path, allow_sharded=True) as ckpt:  # not rotated away while read
        return _read_tensors(_sharded(ckpt), prefix)


def _sharded(ckpt: Path) -> Path:
    """``ckpt`` (a verified checkpoint directory) when it is sharded."""
    if not is_sharded(ckpt):
        raise CheckpointError(
            f"checkpoint {ckpt} is not sharded: it holds {MODEL} and every command reads it as it is"
        )
    return ckpt


def _read_tensors(ckpt: Path, prefix: str) -> dict[str, torch.Tensor]:
    """:func:`read_sharded_tensors` of a verified sharded checkpoint directory."""
    folder = ckpt / SHARDED
    reader = dcp.HuggingFaceStorageReader(str(folder))
    try:
        metadata = reader.read_metadata()
    except Exception as exc:  # safetensors' own errors: a damaged header
        raise CheckpointError(
            f"sharded checkpoint {ckpt} is unreadable ({type(exc).__name__}: {exc})"
        ) from None
    head = prefix + "."
    state: dict[str, torch.Tensor] = {}
    for key, md in sorted(metadata.state_dict_metadata.items()):
        if not key.startswith(head):
            continue
        if not isinstance(md, TensorStorageMetadata):
            raise CheckpointError(f"sharded checkpoint {ckpt} is corrupted: {key!r} is no tensor")
        _check_tiling(key, md, ckpt)
        state[key] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    if state:
        with _quiet_single_process():
            dcp.load(state, storage_reader=dcp.HuggingFaceStorageReader(str(folder)), no_dist=True)
    return {k[len(head) :]: v for k, v in state.items()}


def consolidate(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Convert a sharded checkpoint into attnlab's single-folder checkpoint (weights only).

    The whole weights are put together in this process (no process group needed) and written
    with ``config.json`` and the task's files as a new run folder ``out`` (``out/checkpoints/``
    with ``latest``), which every command reads: ``attnlab generate out``,
    :func:`attnlab.tasks.run.load_run`, … The optimizer state stays behind: to train on, resume
    the sharded run itself (with any number of processes).

    Args:
        path: a sharded checkpoint, or a run folder whose latest checkpoint is one.
        out: the new run folder (it must not exist, or be empty).

    Returns:
        The written checkpoint directory, ``out/checkpoints/step-NNNNNNNN``.

    Raises:
        CheckpointError: ``path`` holds no valid sharded checkpoint (one line).
        ValueError: ``out`` is a file or a folder that is not empty.

    Example:
        >>> consolidate("runs/fsdp", "runs/fsdp-single")
        PosixPath('runs/fsdp-single/checkpoints/step-00000200')
    """
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ArgumentError(f"out must be a new or empty folder, got {target}, which holds files")
    # resolved once and held while read (a training rotating the run does not delete it)
    with hold_checkpoint(path, allow_sharded=True) as held:
        ckpt = _sharded(held)
        weights = _read_tensors(ckpt, MODEL_KEY)
        manifest = read_manifest(ckpt)
        internal = {CONFIG, MODEL, STATE_JSON, STATE_TENSORS, MANIFEST}
        files = {
            name: ckpt / name
            for name in manifest.files
            if name not in internal and not name.startswith(SHARDED + "/")
        }
        return save_checkpoint(
            target, step=manifest.step, model=weights, config=read_config(ckpt), files=files
        )
