"""Crafted checkpoints give one CheckpointError line (hardening 7): the manifest's schema, its names
confined to the checkpoint folder, JSON nested without bound, a negative or inconsistent step,
a training state that does not fit the run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.training import Trainer
from attnlab.training.checkpoint import (
    CheckpointError,
    load_config,
    load_training_state,
    save_checkpoint,
    verify_checkpoint,
)
from attnlab.training.manifest import file_entry
from tests.training._tiny_task import tiny_trainer

DEEP = 100_000  # levels: Python's json gives up with a RecursionError long before


def _checkpoint(tmp_path: Path) -> Path:
    return save_checkpoint(
        tmp_path,
        step=2,
        model=torch.nn.Linear(2, 2),
        config={"task": "x"},
        training_state={"step": 2, "data": {"index": 2}},
        files={"tokenizer.json": "{}"},
    )


def _manifest(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / "manifest.json").read_text())


def _write_manifest(ckpt: Path, manifest: dict[str, Any]) -> None:
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def _replace(ckpt: Path, name: str, data: bytes) -> None:
    """Write a file of the checkpoint and sign it in the manifest, as a crafter would."""
    (ckpt / name).write_bytes(data)
    manifest = _manifest(ckpt)
    manifest["files"][name] = file_entry(ckpt / name)
    _write_manifest(ckpt, manifest)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({}, r"entry 'tokenizer.json' must be \{'size': int >= 0"),
        ({"size": "2", "sha256": "0" * 64}, "entry 'tokenizer.json' must be"),
        ({"size": 2, "sha256": "xyz"}, "entry 'tokenizer.json' must be"),
        ([], "entry 'tokenizer.json' must be"),
    ],
)
def test_a_malformed_manifest_entry_is_one_line(
    tmp_path: Path, entry: object, message: str
) -> None:
    ckpt = _checkpoint(tmp_path)
    manifest = _manifest(ckpt)
    manifest["files"]["tokenizer.json"] = entry
    _write_manifest(ckpt, manifest)
    with pytest.raises(CheckpointError, match=message) as info:
        verify_checkpoint(tmp_path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("step", -1, "has step -1, expected a non-negative int"),
        ("step", True, "has step True"),
        ("files", [], "has no 'files' mapping"),
        ("version", 99, "has version 99, expected 1"),
    ],
)
def test_a_malformed_manifest_is_one_line(
    tmp_path: Path, field: str, value: object, message: str
) -> None:
    ckpt = _checkpoint(tmp_path)
    manifest = _manifest(ckpt)
    manifest[field] = value
    _write_manifest(ckpt, manifest)
    with pytest.raises(CheckpointError, match=message):
        verify_checkpoint(tmp_path)


def test_a_manifest_must_list_what_the_loaders_read(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path)
    manifest = _manifest(ckpt)
    del manifest["files"]["training_state.json"]
    _write_manifest(ckpt, manifest)
    with pytest.raises(CheckpointError, match=r"training_state\.json is not listed in manifest"):
        load_training_state(tmp_path)
    del manifest["files"]["model.safetensors"]
    _write_manifest(ckpt, manifest)
    with pytest.raises(CheckpointError, match=r"does not list model\.safetensors"):
        verify_checkpoint(tmp_path)


def _outside(tmp_path: Path) -> Path:
    secret = tmp_path / "secret.txt"
    secret.write_text("not the checkpoint's\n")
    return secret


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_manifest_names_never_leave_the_checkpoint(tmp_path: Path, how: str) -> None:
    ckpt = _checkpoint(tmp_path / "run")
    secret = _outside(tmp_path)
    if how == "dotdot":
        name = os.path.relpath(secret, ckpt)  # ../../../secret.txt
    elif how == "absolute":
        name = str(secret)
    else:
        name = "linked.json"
        (ckpt / name).symlink_to(secret)
    manifest = _manifest(ckpt)
    manifest["files"][name] = file_entry(secret)  # a correct entry: only the place is wrong
    _write_manifest(ckpt, manifest)
    with pytest.raises(CheckpointError, match=r"names .*, which lies outside the checkpoint"):
        verify_checkpoint(tmp_path / "run")


@pytest.mark.parametrize(
    ("name", "load"),
    [
        ("training_state.json", load_training_state),
        ("config.json", load_config),
        ("manifest.json", verify_checkpoint),
    ],
)
def test_json_nested_without_bound_is_one_line(tmp_path: Path, name: str, load: Any) -> None:
    ckpt = _checkpoint(tmp_path)
    deep = ("[" * DEEP + "]" * DEEP).encode()
    if name == "manifest.json":
        (ckpt / name).write_bytes(deep)
    else:
        _replace(ckpt, name, deep)
    with pytest.raises(CheckpointError, match="nested deeper than 100 levels") as info:
        load(tmp_path)
    assert "\n" not in str(info.value)


def test_an_object_array_in_the_training_state_is_refused(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path)
    tree = {"step": 2, "data": {"__ndarray__": [1], "dtype": "object"}}
    _replace(ckpt, "training_state.json", json.dumps(tree).encode())
    with pytest.raises(CheckpointError, match="an array of dtype object"):
        load_training_state(tmp_path)


def test_non_finite_floats_of_the_training_state_are_strict_json(tmp_path: Path) -> None:
    state = {"step": 1, "best": float("inf"), "worst": float("-inf"), "x": [float("nan")]}
    ckpt = save_checkpoint(tmp_path, step=1, model=torch.nn.Linear(1, 1), config={},
                           training_state=state)  # fmt: skip
    text = (ckpt / "training_state.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in training_state.json"))
    back = load_training_state(tmp_path)
    assert back["best"] == float("inf") and back["worst"] == float("-inf")
    assert back["x"][0] != back["x"][0]  # nan
    with pytest.raises(ValueError, match=r"config must hold finite numbers only .* at args\.lr"):
        save_checkpoint(tmp_path, step=2, model=torch.nn.Linear(1, 1),
                        config={"args": {"lr": float("inf")}})  # fmt: skip


# ---------------------------------------------------------------- the trainer's resume


def _trainer(run_dir: Path, steps: int) -> Trainer:
    return tiny_trainer(run_dir, steps)


def _state_json(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / "training_state.json").read_text())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"step": -3}, "the training state's step must be a non-negative int, got -3"),
        ({"step": "2"}, "the training state's step must be a non-negative int, got '2'"),
        ({"step": 1}, "the training state's step 1 is not the step 2 its manifest records"),
        ({"optimizer": {}}, "its training state does not fit this run"),
        ({"rng": {"python": 5}}, "its training state does not fit this run"),
    ],
)
def test_resume_refuses_a_crafted_training_state(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    ckpt = _trainer(tmp_path, 2).fit().checkpoint
    assert ckpt is not None
    _replace(ckpt, "training_state.json", json.dumps({**_state_json(ckpt), **change}).encode())
    resumed = _trainer(tmp_path, 5)
    with pytest.raises(CheckpointError, match=message) as info:
        resumed.resume()
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_read_json_refuses_a_file_that_is_not_a_regular_file_unread(
    tmp_path: Path, kind: str
) -> None:
    """A FIFO blocks ``open`` forever and ``/dev/zero`` reads until memory runs out: both are
    refused from ``os.stat`` before anything is opened."""
    from attnlab.training.jsonio import read_json

    path = tmp_path / "state.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match=r"state\.json must be a regular file, got a"):
        read_json(path)
