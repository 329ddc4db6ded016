"""Checkpoints: round trip, atomic replacement, SIGKILL mid-save, corrupted files, no pickle."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.training import checkpoint as ck
from attnlab.training.checkpoint import (
    CheckpointError,
    config_as_saved,
    load_config,
    load_model_weights,
    load_training_state,
    read_checkpoint_file,
    resolve_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)


class Tied(torch.nn.Module):
    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(5, n)
        self.head = torch.nn.Linear(n, 5, bias=False)
        self.head.weight = self.emb.weight  # tied, stored once
        self.register_buffer("scale", torch.tensor(2.0))


def _state() -> dict:
    opt_model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(opt_model.parameters())
    opt_model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return {
        "step": 7,
        "optimizer": opt.state_dict(),  # int keys, 0-dim tensors, tuples (betas)
        "rng": {
            "python": random.getstate(),
            "numpy": np.random.get_state(),  # noqa: NPY002
            "torch": torch.get_rng_state(),
        },
        "data": {"index": 3, "nested": [1.5, None, "x", (1, 2)], "inf": float("inf")},
    }


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_round_trip(tmp_path: Path) -> None:
    model = Tied()
    state = _state()
    path = save_checkpoint(
        tmp_path,
        step=7,
        model=model,
        config={"model": {"d": 4}},
        training_state=state,
        files={"tokenizer.json": '{"a": 1}', "sub/vocab.bin": b"\x00\x01"},
    )
    assert path == tmp_path / "checkpoints" / "step-00000007"
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-00000007"
    assert resolve_checkpoint(tmp_path) == path == resolve_checkpoint(tmp_path / "checkpoints")
    assert load_config(tmp_path) == {"model": {"d": 4}}
    assert _equal(load_training_state(tmp_path), state)
    other = Tied()
    load_model_weights(tmp_path, other)
    assert torch.equal(other.emb.weight, model.emb.weight)
    assert other.head.weight is other.emb.weight
    assert read_checkpoint_file(tmp_path, "sub/vocab.bin") == b"\x00\x01"
    # only safetensors and JSON on disk
    for f in path.rglob("*"):
        if f.is_file() and f.suffix not in (".json", ".bin"):
            assert f.suffix == ".safetensors", f


def test_config_as_saved_is_what_load_config_returns(tmp_path: Path) -> None:
    config = {"model": {"dims": (4, 8)}, "ids": {1: "a"}}
    save_checkpoint(tmp_path, step=0, model=torch.nn.Linear(1, 1), config=config)
    expected = {"model": {"dims": [4, 8]}, "ids": {"1": "a"}}
    assert config_as_saved(config) == load_config(tmp_path) == expected


def test_keep_last_and_latest(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step=step, model=model, config={}, keep_last=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["latest", "step-00000003", "step-00000004"]
    assert resolve_checkpoint(tmp_path).name == "step-00000004"


def test_loading_never_unpickles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_checkpoint(tmp_path, step=1, model=Tied(), config={}, training_state=_state())

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("checkpoints must not be unpickled")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    load_model_weights(tmp_path, Tied())
    load_training_state(tmp_path)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncate", r"is truncated or corrupted: model.safetensors has \d+ bytes, expected \d+"),
        ("flip", "is corrupted: training_state.safetensors does not match its SHA-256 checksum"),
        ("delete", "is incomplete: config.json is missing"),
        ("manifest", "is incomplete: manifest.json is missing"),
        ("garbage", "is corrupted: manifest.json is unreadable"),
        ("pointer", "names 'step-00000099', which is not a checkpoint directory"),
    ],
)
def test_damaged_checkpoint_gives_one_clear_error(
    tmp_path: Path, damage: str, message: str
) -> None:
    path = save_checkpoint(tmp_path, step=1, model=Tied(), config={"a": 1}, training_state=_state())
    if damage == "truncate":
        f = path / "model.safetensors"
        f.write_bytes(f.read_bytes()[:-10])
    elif damage == "flip":
        f = path / "training_state.safetensors"
        data = bytearray(f.read_bytes())
        data[-3] ^= 0xFF
        f.write_bytes(bytes(data))
    elif damage == "delete":
        (path / "config.json").unlink()
    elif damage == "manifest":
        (path / "manifest.json").unlink()
    elif damage == "garbage":
        (path / "manifest.json").write_text("{not json")
    else:
        (tmp_path / "checkpoints" / "latest").write_text("step-00000099\n")
    for load in (
        verify_checkpoint,
        load_config,
        load_training_state,
        lambda p: load_model_weights(p, Tied()),
    ):
        with pytest.raises(CheckpointError, match=message) as info:
            load(tmp_path)
        assert "\n" not in str(info.value)


def test_truncated_tensor_file_without_manifest_check(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, step=1, model=Tied(), config={})
    f = path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:20])
    with pytest.raises(CheckpointError, match=r"cannot load model\.safetensors"):
        load_model_weights(tmp_path, Tied(), verify=False)


def test_wrong_model_is_a_clear_error(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, step=1, model=torch.nn.Linear(2, 3), config={})
    with pytest.raises(CheckpointError, match=r"does not fit the model|cannot load"):
        load_model_weights(tmp_path, torch.nn.Linear(4, 3))


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="step must be a non-negative int, got -1"):
        save_checkpoint(tmp_path, step=-1, model=Tied(), config={})
    with pytest.raises(ValueError, match="files keys must be relative file names"):
        save_checkpoint(tmp_path, step=1, model=Tied(), config={}, files={"../x": "y"})
    with pytest.raises(TypeError, match=r"training state must hold .* got object"):
        save_checkpoint(tmp_path, step=1, model=Tied(), config={}, training_state={"x": object()})
    assert not list((tmp_path / "checkpoints").glob("step-*"))  # nothing half-written
    with pytest.raises(CheckpointError, match="the path does not exist"):
        resolve_checkpoint(tmp_path / "nope")


# ---------------------------------------------------------------- SIGKILL during a save

N = 700  # a 700x700 float32 weight: ~2 MB per checkpoint


def _save_loop(
    run_dir: str, start: int, pause_before_rename: bool, ready: mp.synchronize.Event
) -> None:
    """Child: save checkpoints of increasing step forever; weights are filled with the step."""
    torch.set_num_threads(1)
    if pause_before_rename:
        real_rename = os.rename

        def slow_rename(src: object, dst: object) -> None:
            ready.set()  # every file of the new checkpoint is written, not yet renamed
            time.sleep(60)
            real_rename(src, dst)

        ck.os.rename = slow_rename  # type: ignore[assignment]
    model = torch.nn.Linear(N, N, bias=False)
    step = start
    while True:
        with torch.no_grad():
            model.weight.fill_(float(step))
        save_checkpoint(
            run_dir,
            step=step,
            model=model,
            config={"n": N},
            training_state={"step": step, "m": torch.full((N,), float(step))},
            keep_last=2,
        )
        if not pause_before_rename:
            ready.set()
        step += 1


def _check_latest(run_dir: Path) -> int:
    path = verify_checkpoint(run_dir)
    state = load_training_state(path)
    model = torch.nn.Linear(N, N, bias=False)
    load_model_weights(path, model)
    step = int(state["step"])
    assert path.name == f"step-{step:08d}"
    assert bool((model.weight == step).all()) and bool((state["m"] == step).all())
    return step


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork to start the saving child quickly")
def test_sigkill_mid_save_leaves_previous_checkpoint_loadable(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    rng = random.Random(0)
    # a first checkpoint, then a child that is killed right before renaming the next one into
    # place (deterministically mid-save), then children killed at random moments
    first = torch.nn.Linear(N, N, bias=False)
    torch.nn.init.zeros_(first.weight)
    save_checkpoint(
        tmp_path,
        step=0,
        model=first,
        config={"n": N},
        training_state={"step": 0, "m": torch.zeros(N)},
    )
    last = 0
    for round_ in range(5):
        ready = ctx.Event()
        child = ctx.Process(target=_save_loop, args=(str(tmp_path), last + 1, round_ == 0, ready))
        child.start()
        try:
            assert ready.wait(60), "the saving child did not start"
            if round_:
                time.sleep(rng.uniform(0.0, 0.3))
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.join(30)
        assert child.exitcode == -signal.SIGKILL
        if round_ == 0:
            assert list((tmp_path / "checkpoints").glob(".tmp-*")), "the kill was not mid-save"
            assert _check_latest(tmp_path) == 0
        last = _check_latest(tmp_path)
    assert last >= 1
    # the next save cleans what the killed children left behind
    save_checkpoint(tmp_path, step=last + 1, model=torch.nn.Linear(1, 1), config={})
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    manifest = json.loads((resolve_checkpoint(tmp_path) / "manifest.json").read_text())
    assert manifest["step"] == last + 1


def test_a_held_checkpoint_survives_rotation_until_released(tmp_path: Path) -> None:
    from attnlab.training.checkpoint_hold import hold_checkpoint

    model = torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path, step=1, model=model, config={}, keep_last=1)
    with hold_checkpoint(tmp_path) as held:
        for step in (2, 3):  # --keep-last 1 would delete step 1 at once
            save_checkpoint(tmp_path, step=step, model=model, config={}, keep_last=1)
        assert held.name == "step-00000001" and verify_checkpoint(held) == held
        assert resolve_checkpoint(tmp_path).name == "step-00000003"  # latest moved on
    save_checkpoint(tmp_path, step=4, model=model, config={}, keep_last=1)
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [4]  # pruned by the next save
