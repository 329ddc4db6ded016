"""Checkpoints: one directory per saved step, written atomically, validated when loaded.

Layout of a run folder::

    RUN/
      metrics.jsonl                 (the trainer's log)
      checkpoints/
        latest                      text file naming the newest checkpoint, e.g. "step-00000040"
        step-00000020/
        step-00000040/
          config.json               the run's configuration (any JSON object; see below)
          model.safetensors         the model's parameters and buffers
          training_state.json       step, scheduler, optimizer hyper-parameters, RNG states,
                                    data position … (everything that is not a tensor)
          training_state.safetensors   the tensors of the training state (optimizer moments, …)
          <files>                   opaque files of the task, e.g. tokenizer.json
          manifest.json             size and SHA-256 of every file above, written last

A *sharded* checkpoint (written by a sharded strategy such as
:class:`attnlab.distributed.fsdp.FSDPStrategy`, :func:`save_sharded_checkpoint`) holds
``sharded/`` instead of ``model.safetensors``: the model and optimizer tensors as every rank
wrote its part of them with ``torch.distributed.checkpoint``, one safetensors file per rank
(``sharded/shard-0000R-model-00001-of-00001.safetensors``, each tensor's offset in the whole
tensor in the file's metadata; nothing is pickled). The optimizer's hyper-parameters live in
``training_state.json`` with the rest of the training state; the manifest covers every file. Only
a training resumes such a checkpoint (on any number of processes); every other reader refuses it
in one line and names the conversion into a single folder
(``attnlab checkpoint convert``, :func:`attnlab.distributed.checkpoint.consolidate`).

Saving writes everything into a temporary sibling (``checkpoints/.tmp-…``), fsyncs every file
and the directory, renames it into place and only then replaces the ``latest`` pointer (written
to ``latest.tmp``, fsynced, ``os.replace``d). A process killed at any moment therefore leaves the
previous checkpoint and a ``latest`` that names a complete directory. Old checkpoints beyond
``keep_last`` are deleted after the pointer moved, except a folder a reader holds
(:mod:`attnlab.training.checkpoint_hold`), which a later save deletes.

Loading goes through :func:`resolve_checkpoint` (a run folder, its ``checkpoints`` folder or one
checkpoint directory are all accepted), and :func:`verify_checkpoint` checks every file against
the manifest, so a truncated or corrupted checkpoint gives one :class:`CheckpointError` line.
The manifest itself is validated first (:mod:`attnlab.training.manifest`: its schema, and names
confined to the checkpoint folder), JSON files nested deeper than
:data:`~attnlab.training.jsonio.MAX_DEPTH` levels are refused, and tensors are read only with
``safetensors`` (never pickle). Every JSON file written here is strict JSON: a non-finite float of
the training state is stored as ``{"__float__": "nan"}`` (and read back as it was), and a
configuration holding one is refused.

The ``load_*`` functions take any such ``path`` and resolve (and verify) it themselves. A caller
that reads several parts of one checkpoint resolves it once —
``ckpt = verify_checkpoint(path)`` — and reads that very directory with :func:`read_config`,
:func:`read_training_state` and :func:`read_model_weights`, which never resolve again (so a
``latest`` pointer moving meanwhile cannot mix two checkpoints).

The training state is a nested tree of dicts (any hashable JSON-able keys), lists, tuples,
numbers, strings, ``None``, numpy arrays and tensors; :func:`save_checkpoint` stores the tensors
in ``training_state.safetensors`` and the rest in JSON, and :func:`load_training_state` rebuilds
the same tree.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.training.files import (
    fsync_dir,
    fsync_file,
    replace_file,
    safetensors_bytes,
    write_synced,
)
from attnlab.training.jsonio import dumps_strict, read_json
from attnlab.training.manifest import (
    FORMAT,
    MANIFEST,
    CheckpointError,
    confined_path,
    file_entry,
    read_manifest,
    remove_unless_held,
    verify_files,
)
from attnlab.training.processes import all_reduce_sum, broadcast_text

__all__ = [
    "CheckpointError",
    "config_as_saved",
    "is_sharded",
    "list_checkpoints",
    "load_config",
    "load_model_weights",
    "load_training_state",
    "read_checkpoint_file",
    "read_config",
    "read_manifest",
    "read_model_weights",
    "read_training_state",
    "resolve_checkpoint",
    "save_checkpoint",
    "save_sharded_checkpoint",
    "verify_checkpoint",
]

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
LATEST = "latest"
CONFIG = "config.json"
MODEL = "model.safetensors"
STATE_JSON = "training_state.json"
STATE_TENSORS = "training_state.safetensors"
SHARDED = "sharded"
_RESERVED = {CONFIG, MODEL, STATE_JSON, STATE_TENSORS, MANIFEST, SHARDED}
_STEP_DIR = re.compile(r"^step-(\d+)$")


# --------------------------------------------------------------------------- tree <-> JSON


def _encode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """A JSON-able tree; tensors are moved into ``tensors`` and referenced by key."""
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().to("cpu").contiguous().clone()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return _encode(obj.item(), tensors)
    if isinstance(obj, float) and not math.isfinite(obj):
        return {"__float__": str(obj)}  # "nan", "inf", "-inf": strict JSON has no NaN
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, tensors) for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise ArgumentTypeError(
        f"training state must hold dicts, lists, tuples, numbers, strings, arrays or tensors, "
        f"got {type(obj).__name__}"
    )


def _decode(obj: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__float__" in obj:
            return float(obj["__float__"])
        if "__ndarray__" in obj:
            dtype = np.dtype(obj["dtype"])
            if dtype.kind not in "biufc":  # numbers only: no object arrays, no giant void items
                raise ArgumentError(f"an array of dtype {dtype} is not a training state's")
            return np.asarray(obj["__ndarray__"], dtype=dtype)
        if "__tuple__" in obj:
            return tuple(_decode(v, tensors) for v in obj["__tuple__"])
        if "__items__" in obj:
            return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__items__"]}
        return {k: _decode(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    return obj


def _config_text(config: Mapping[str, Any]) -> str:
    """The text of ``config.json`` (strict JSON: a non-finite number is refused, naming its key)."""
    return dumps_strict(dict(config), what="config", indent=2, sort_keys=True)


def config_as_saved(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as :func:`load_config` will return it once :func:`save_checkpoint` wrote it.

    JSON knows no tuples and only string keys, so ``(1, 2)`` comes back as ``[1, 2]`` and
    ``{1: x}`` as ``{"1": x}``. A run's configuration is compared with a saved one in this form.

    Args:
        config: a JSON-able configuration mapping.

    Returns:
        The configuration after a round trip through JSON.

    Raises:
        TypeError: ``config`` holds a value JSON cannot represent.
        ValueError: ``config`` holds a NaN or an infinity (the message names where).
    """
    return json.loads(_config_text(config))


# --------------------------------------------------------------------------- files


def _check_name(name: str) -> str:
    p = Path(name)
    if (
        p.is_absolute()
        or ".." in p.parts
        or not p.parts
        or name in _RESERVED
        or p.parts[0] == SHARDED
    ):
        raise ArgumentError(
            f"files keys must be relative file names inside the checkpoint other than "
            f"{sorted(_RESERVED)}, got {name!r}"
        )
    return name


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True
    return True


def _remove_stale_temporaries(root: Path) -> None:
    """Delete ``.tmp-*`` folders left by processes that died mid-save."""
    for p in root.glob(".tmp-*"):
        m = re.search(r"-pid(\d+)$", p.name)
        if m is None or not _pid_alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)


def step_dir_name(step: int) -> str:
    """``step-00000040`` — the name of the checkpoint of ``step``."""
    return f"step-{step:08d}"


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """The checkpoint directories of a run folder.

    Args:
        run_dir: the run folder (``<run_dir>/step_<N>`` directories are checkpoints).

    Returns:
        ``(step, path)`` pairs, oldest first; empty when there is none.
    """
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out)


def save_checkpoint(
    run_dir: str | os.PathLike[str],
    *,
    step: int,
    model: torch.nn.Module | Mapping[str, torch.Tensor],
    config: Mapping[str, Any],
    training_state: Mapping[str, Any] | None = None,
    files: Mapping[str, str | bytes | os.PathLike[str]] | None = None,
    keep_last: int | None = None,
) -> Path:
    """Save one checkpoint atomically into ``run_dir/checkpoints/step-NNNNNNNN``.

    Args:
        run_dir: the run folder (created if missing).
        step: the number of optimizer steps done (>= 0).
        model: the model whose ``state_dict`` goes to ``model.safetensors`` (shared/tied tensors
            are stored once, as ``safetensors.torch.save_model`` does), or that state dict
            itself (name → tensor).
        config: a JSON-able mapping written to ``config.json``.
        training_state: a tree of dicts/lists/numbers/strings/tensors (see module docstring), or
            ``None`` for a weights-only checkpoint.
        files: opaque files of the task (e.g. the tokenizer): name -> ``str`` (written as UTF-8),
            ``bytes``, or a path to copy.
        keep_last: keep only this many newest checkpoints (``None`` keeps all).

    Returns:
        The path of the checkpoint directory. If a checkpoint of this step already exists, it is
        kept as it is (a step's state is determined by the run) and its path returned.

    Shape:
        each tensor of ``model`` is stored with its shape.
    """
    root, final, tmp = _begin(run_dir, step, keep_last)
    if tmp is None:
        return final
    try:
        weights = model.state_dict() if isinstance(model, torch.nn.Module) else dict(model)
        write_synced(tmp / MODEL, safetensors_bytes(weights, {"format": "pt"}))
        _write_rest(tmp, config, training_state, files)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _finish(run_dir, root, tmp, final, step, keep_last)
    return final


def save_sharded_checkpoint(
    run_dir: str | os.PathLike[str],
    *,
    step: int,
    write_shards: Callable[[Path], Mapping[str, Any] | None],
    config: Mapping[str, Any],
    training_state: Mapping[str, Any] | None = None,
    files: Mapping[str, str | bytes | os.PathLike[str]] | None = None,
    keep_last: int | None = None,
) -> Path:
    """Save one sharded checkpoint, every rank writing its part (call it on every rank).

    Rank 0 makes the temporary checkpoint folder and tells the other ranks where it is; every
    rank calls ``write_shards(folder / "sharded")`` (a collective such as
    ``torch.distributed.checkpoint.save``); then rank 0 writes ``config.json``, the training
    state and the files, the manifest of all of them (the shards included), and renames the
    folder into place as :func:`save_checkpoint` does. The ranks must share the file system of
    ``run_dir`` (on several machines: a shared folder); rank 0 refuses to finish a checkpoint
    when another rank sees shard files it does not. Every rank learns whether rank 0
    succeeded: a failure raises on every rank and leaves the previous checkpoint as it was.

    Args:
        run_dir: the run folder (created if missing).
        step: the number of optimizer steps done (>= 0).
        write_shards: ``folder -> extra`` writes this rank's tensors into the existing, empty
            ``folder``; what it returns on rank 0 (a mapping, or ``None``) is added to the
            training state (e.g. the optimizer's hyper-parameters).
        config: a JSON-able mapping written to ``config.json`` (rank 0's is used).
        training_state: the rest of the training state (rank 0's is used), see
            :func:`save_checkpoint`.
        files: the task's files (rank 0's are used), see :func:`save_checkpoint`.
        keep_last: keep only this many newest checkpoints (``None`` keeps all).

    Returns:
        The path of the checkpoint directory (on every rank). An existing checkpoint of this
        step is kept as it is.

    Raises:
        CheckpointError: rank 0 could not finish the checkpoint (on the other ranks; rank 0
            raises its own error).
    """
    is_main = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    where = ""
    final_text = ""
    if is_main:
        root, final, tmp = _begin(run_dir, step, keep_last)
        final_text = str(final)
        where = "" if tmp is None else str(tmp)
        if tmp is not None:
            (tmp / SHARDED).mkdir()
    where = broadcast_text(where)
    final = Path(broadcast_text(final_text))
    if not where:  # the step is saved already
        return final
    tmp = Path(where)
    extra: Mapping[str, Any] | None = None
    error: BaseException | None = None
    try:
        extra = write_shards(tmp / SHARDED)
    except BaseException as exc:  # every rank must learn it before rank 0 goes on
        error = exc
    failed = all_reduce_sum(torch.tensor([float(error is not None)], dtype=torch.float64))
    if error is not None:
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise error
    if float(failed.item()) > 0:
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"checkpoint {final}: another rank failed to write its shards")
    # what each rank sees of the shards: ranks that do not share the file system see different ones
    seen = sorted(p.name for p in (tmp / SHARDED).iterdir()) if (tmp / SHARDED).is_dir() else []
    everyone: list[Any] = [seen]
    if torch.distributed.is_initialized():
        everyone = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(everyone, seen)
    if is_main:
        try:
            unseen = sorted(set().union(*map(set, everyone)) - set(seen))
            if unseen:
                raise CheckpointError(
                    f"checkpoint {final}: rank 0 does not see the shards {unseen[:3]} other ranks "
                    f"wrote; the run folder must be on a file system every machine shares"
                )
            state = None
            if training_state is not None:
                state = {**dict(training_state), **dict(extra or {})}
            _write_rest(tmp, config, state, files)
            _finish(run_dir, root, tmp, final, step, keep_last)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            error = exc
    failed = all_reduce_sum(torch.tensor([float(error is not None)], dtype=torch.float64))
    if error is not None:
        raise error
    if float(failed.item()) > 0:
        raise CheckpointError(f"checkpoint {final}: rank 0 failed to finish it")
    return final


def _begin(
    run_dir: str | os.PathLike[str], step: int, keep_last: int | None
) -> tuple[Path, Path, Path | None]:
    """Check the arguments and make the temporary folder of a new checkpoint.

    Returns:
        ``(checkpoints folder, final path, temporary folder)``; the temporary folder is
        ``None`` when the step's checkpoint exists already (``latest`` then names it).
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ArgumentError(f"step must be a non-negative int, got {step!r}")
    if keep_last is not None and (
        isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
    ):
        raise ArgumentError(f"keep_last must be a positive int or None, got {keep_last!r}")
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(root)
    final = root / step_dir_name(step)
    if final.exists():
        logger.info("checkpoint %s exists; keeping it", final)
        _write_latest(root, final.name)
        return root, final, None
    tmp = root / f".tmp-{final.name}-pid{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return root, final, tmp


def _write_rest(
    tmp: Path,
    config: Mapping[str, Any],
    training_state: Mapping[str, Any] | None,
    files: Mapping[str, str | bytes | os.PathLike[str]] | None,
) -> None:
    """Write ``config.json``, the training state and the task's files into ``tmp``."""
    write_synced(tmp / CONFIG, _config_text(config).encode())
    if training_state is not None:
        tensors: dict[str, torch.Tensor] = {}
        tree = _encode(dict(training_state), tensors)
        write_synced(tmp / STATE_TENSORS, safetensors_bytes(tensors, {"format": "pt"}))
        write_synced(tmp / STATE_JSON, dumps_strict(tree, what="training state").encode())
    for name, content in (files or {}).items():
        target = tmp / _check_name(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            write_synced(target, content.encode("utf-8"))
        elif isinstance(content, bytes):
            write_synced(target, content)
        else:
            shutil.copyfile(content, target)


def _finish(
    run_dir: str | os.PathLike[str],
    root: Path,
    tmp: Path,
    final: Path,
    step: int,
    keep_last: int | None,
) -> None:
    """Write the manifest of ``tmp``, rename it to ``final``, move ``latest``, prune old ones."""
    try:
        entries = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                fsync_file(p)
                entries[p.relative_to(tmp).as_posix()] = file_entry(p)
        manifest = {"format": FORMAT, "version": 1, "step": step, "files": entries}
        write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
        for d in sorted({p.parent for p in tmp.rglob("*")} | {tmp}, reverse=True):
            fsync_dir(d)
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_latest(root, final.name)
    if keep_last is not None:  # a folder a reader holds stays until a later save
        for _, old in list_checkpoints(run_dir)[:-keep_last]:
            if old != final:
                remove_unless_held(old)


def _write_latest(root: Path, name: str) -> None:
    replace_file(root / LATEST, (name + "\n").encode())


def resolve_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The checkpoint directory meant by ``path``.

    Args:
        path: a checkpoint directory, a run folder, or a run's ``checkpoints`` folder (the
            ``latest`` pointer is followed; without it, the newest ``step-*`` directory).

    Returns:
        The checkpoint directory (not yet verified; see :func:`verify_checkpoint`).

    Raises:
        CheckpointError: when no checkpoint is found there.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"no checkpoint at {p}: the path does not exist")
    if (p / MANIFEST).exists() or (p / MODEL).exists():
        return p
    root = p if (p / LATEST).exists() or p.name == CHECKPOINTS else p / CHECKPOINTS
    latest = root / LATEST
    if latest.is_file():
        with open(latest, "rb") as f:  # a step name is short: never read a crafted giant
            name = f.read(256).decode("utf-8", errors="replace").strip()
        if not _STEP_DIR.match(name) or not (root / name).is_dir():
            raise CheckpointError(
                f"checkpoint pointer {latest} names {name!r}, which is not a checkpoint directory"
            )
        return root / name
    found = list_checkpoints(root.parent)
    if found:
        return found[-1][1]
    raise CheckpointError(f"no checkpoint in {p} (expected {CHECKPOINTS}/{LATEST} or a checkpoint)")


def verify_checkpoint(path: str | os.PathLike[str], *, allow_sharded: bool = False) -> Path:
    """Check every file of a checkpoint against its manifest (presence, size, SHA-256).

    Args:
        path: anything :func:`resolve_checkpoint` accepts.
        allow_sharded: accept a sharded checkpoint (see the module docstring). Default: False,
            for the readers of ``model.safetensors``: a sharded checkpoint is then refused in one
            line that names the conversion.

    Returns:
        The checkpoint directory.

    Raises:
        CheckpointError: one line naming the first problem (missing, truncated or corrupted file;
            a sharded checkpoint without ``allow_sharded``).
    """
    return _check_manifest(resolve_checkpoint(path), allow_sharded=allow_sharded)


def is_sharded(ckpt: str | os.PathLike[str]) -> bool:
    """Whether the checkpoint directory ``ckpt`` is sharded (its manifest lists ``sharded/`` files).

    Args:
        ckpt: a checkpoint directory (not a run folder).

    Returns:
        ``True`` for a checkpoint written by :func:`save_sharded_checkpoint`.

    Raises:
        CheckpointError: the manifest is missing or invalid.
    """
    return _sharded_files(read_manifest(Path(ckpt))) != []


def _sharded_files(manifest: Any) -> list[str]:
    """The names of a manifest's files under ``sharded/``."""
    return [n for n in manifest.files if n.startswith(SHARDED + "/")]


def _check_manifest(ckpt: Path, *, allow_sharded: bool = False) -> Path:
    """:func:`verify_checkpoint` of a resolved checkpoint directory; returns it."""
    manifest = read_manifest(ckpt)
    shards = _sharded_files(manifest)
    if shards and not allow_sharded:
        raise CheckpointError(
            f"checkpoint {ckpt} is sharded (each process of a --parallel fsdp run wrote its "
            f"part); make a single-folder copy first: attnlab checkpoint convert {ckpt} --out DIR"
        )
    required = (CONFIG,) if shards else (CONFIG, MODEL)
    verify_files(ckpt, manifest, required=required, covered=(STATE_JSON, STATE_TENSORS))
    if shards:
        # the shards' reader opens every file of the folder: none may escape the manifest
        folder = ckpt / SHARDED
        for f in sorted(folder.rglob("*")):
            name = f.relative_to(ckpt).as_posix()
            if not f.is_dir() and name not in manifest.files:
                raise CheckpointError(
                    f"checkpoint {ckpt} is corrupted: {name} is not listed in {MANIFEST}"
                )
    return ckpt


def _locate(path: str | os.PathLike[str], verify: bool) -> Path:
    """The checkpoint directory of ``path``, verified when ``verify``."""
    return verify_checkpoint(path) if verify else resolve_checkpoint(path)


def _first_line(exc: BaseException) -> str:
    """An exception's first line (its type's name when it has no message), for one-line errors."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def load_config(path: str | os.PathLike[str], *, verify: bool = True) -> dict[str, Any]:
    """The ``config.json`` of a checkpoint.

    Args:
        path: anything :func:`resolve_checkpoint` accepts (a checkpoint or a run folder).
        verify: check the manifest first (sizes and hashes). Default: True.

    Returns:
        The saved configuration.

    Raises:
        CheckpointError: no checkpoint there, a file does not match the manifest, or the
            config is unreadable.
    """
    return read_config(_locate(path, verify))


def read_config(ckpt: Path) -> dict[str, Any]:
    """The ``config.json`` of the checkpoint directory ``ckpt``, as it is (no resolution).

    Args:
        ckpt: a checkpoint directory (not a run folder; not verified here).

    Returns:
        The saved configuration.

    Raises:
        CheckpointError: the file is unreadable, not a JSON object, or nested too deeply.
    """
    try:
        config = read_json(ckpt / CONFIG)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {ckpt}: cannot read {CONFIG} ({exc})") from None
    if not isinstance(config, dict):
        raise CheckpointError(
            f"checkpoint {ckpt}: {CONFIG} must hold a JSON object, got {type(config).__name__}"
        )
    return config


def read_checkpoint_file(path: str | os.PathLike[str], name: str) -> bytes:
    """The bytes of a task file saved with ``files={name: ...}`` (e.g. the tokenizer).

    Args:
        path: anything :func:`resolve_checkpoint` accepts (verified against the manifest).
        name: the file's name inside the checkpoint, as it was saved.

    Returns:
        The file's content.

    Raises:
        CheckpointError: no checkpoint there, no such file, or a name outside the checkpoint.
    """
    ckpt = resolve_checkpoint(path)
    f = confined_path(ckpt, _check_name(name))
    if not f.is_file():
        raise CheckpointError(f"checkpoint {ckpt} has no file {name!r}")
    return f.read_bytes()


def load_model_weights(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    *,
    strict: bool = True,
    verify: bool = True,
) -> Path:
    """Load ``model.safetensors`` into ``model`` (in place).

    Args:
        path: anything :func:`resolve_checkpoint` accepts.
        model: a model built from the checkpoint's config.
        strict: missing or unexpected keys are an error. Default: True.
        verify: check the manifest first. Default: True.

    Returns:
        The checkpoint directory.
    """
    ckpt = _locate(path, verify)
    read_model_weights(ckpt, model, strict=strict)
    return ckpt


def read_model_weights(ckpt: Path, model: torch.nn.Module, *, strict: bool = True) -> None:
    """:func:`load_model_weights` from the checkpoint directory ``ckpt`` as it is (no resolution).

    Args:
        ckpt: a checkpoint directory (not a run folder; not verified here).
        model: a model built from the checkpoint's config; loaded in place.
        strict: missing or unexpected keys are an error. Default: True.
    """
    try:
        missing, unexpected = load_model(model, str(ckpt / MODEL), strict=False)
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise CheckpointError(
            f"checkpoint {ckpt}: cannot load {MODEL} ({_first_line(exc)})"
        ) from None
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"checkpoint {ckpt} does not fit the model: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )


def load_training_state(path: str | os.PathLike[str], *, verify: bool = True) -> dict[str, Any]:
    """The training state tree saved by :func:`save_checkpoint`.

    Args:
        path: anything :func:`resolve_checkpoint` accepts (a checkpoint or a run folder).
        verify: check the manifest first (sizes and hashes). Default: True.

    Returns:
        The state (optimizer, scheduler, step, RNG states, data position), tensors on the CPU.

    Raises:
        CheckpointError: no checkpoint there, a file does not match the manifest, or the state
            is unreadable.
    """
    return read_training_state(_locate(path, verify))


def read_training_state(ckpt: Path) -> dict[str, Any]:
    """:func:`load_training_state` of the checkpoint directory ``ckpt`` as it is (no resolution).

    Args:
        ckpt: a checkpoint directory (not a run folder; not verified here).

    Returns:
        The training state tree, tensors on the CPU.
    """
    if not (ckpt / STATE_JSON).is_file():
        raise CheckpointError(f"checkpoint {ckpt} holds weights only (no {STATE_JSON})")
    try:
        tensors = load_file(str(ckpt / STATE_TENSORS))
        tree = read_json(ckpt / STATE_JSON)
        return _decode(tree, tensors)
    except (SafetensorError, OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"checkpoint {ckpt}: cannot read the training state ({_first_line(exc)})"
        ) from None
