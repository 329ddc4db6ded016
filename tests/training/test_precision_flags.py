"""``attnlab train … --fp16`` and ``--grad-checkpoint``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from attnlab.cli import main
from attnlab.cli.task_arguments import add_task_arguments
from attnlab.tasks.registry import get_task, register_task
from attnlab.training.checkpoint import load_config, load_training_state, resolve_checkpoint
from tests.training._tiny_task import TASK as TINY

TINY_TASK = ["--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff", "32", "--warmup", "5",
             "--max-len", "6", "--num-heldout", "20", "--batch-size", "8"]  # fmt: skip


def _train(out: Path, *flags: str, steps: int = 2, task: str = "copy") -> int:
    return main(["train", task, "--out", str(out), "--steps", str(steps), *TINY_TASK, *flags])


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(resolve_checkpoint(run) / "model.safetensors"))


def _train_lines(run: Path) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if x["kind"] == "train"]


def _one_line_error(capsys: pytest.CaptureFixture[str], call: Any) -> tuple[int, str]:
    capsys.readouterr()
    try:
        rc = call()
    except SystemExit as exc:  # argparse errors
        rc = exc.code
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return rc, lines[0]


def test_fp16_trains_and_is_saved_in_the_run_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "fp16"
    assert _train(run, "--fp16") == 0
    assert "exact-match accuracy:" in capsys.readouterr().out
    assert load_config(run)["train"]["fp16"] is True
    assert load_training_state(run)["scaler"]["scale"] > 0
    lines = _train_lines(run)
    assert len(lines) == 2 and all("loss_scale" in x and "skipped" in x for x in lines)
    # resuming needs the same precision: one line, nothing changed
    rc, line = _one_line_error(capsys, lambda: _train(run, "--resume", steps=4))
    assert rc == 2 and "train.fp16: True in the checkpoint vs absent now" in line
    assert _train(run, "--fp16", "--resume", steps=3) == 0
    assert load_training_state(run)["step"] == 3
    # a run without the flag saves the configuration it always did
    assert _train(tmp_path / "fp32") == 0
    assert load_config(tmp_path / "fp32")["train"] == {"grad_accum": 1, "clip": 1.0, "bf16": False}


def test_fp16_and_bf16_exclude_each_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, line = _one_line_error(capsys, lambda: _train(tmp_path / "x", "--fp16", "--bf16"))
    assert rc == 2 and "argument --bf16: not allowed with argument --fp16" in line
    assert not (tmp_path / "x").exists()


class _Recording:
    """The copy task, keeping the model it built."""

    name = "copy_recorded"
    help = "the copy task, recording its model"

    def __init__(self) -> None:
        self.inner = get_task("copy")
        self.models: list[torch.nn.Module] = []

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_task_arguments(parser, "copy", self.inner)

    def build(self, args: argparse.Namespace, device: torch.device) -> Any:
        setup = self.inner.build(args, device)
        self.models.append(setup.model)
        return setup


def test_grad_checkpoint_is_switched_on_changes_nothing_and_is_not_saved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task = register_task(_Recording())
    plain, ckpt, mixed = tmp_path / "plain", tmp_path / "ckpt", tmp_path / "mixed"
    assert _train(plain, steps=4, task=task.name) == 0
    assert _train(ckpt, "--grad-checkpoint", steps=4, task=task.name) == 0
    assert [m.gradient_checkpointing for m in task.models] == [False, True]
    a, b = _weights(plain), _weights(ckpt)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [x["loss"] for x in _train_lines(plain)] == [x["loss"] for x in _train_lines(ckpt)]
    assert load_config(ckpt) == load_config(plain)  # not part of the run's configuration
    # so it may change on resume, and the result is the same
    assert _train(mixed, "--grad-checkpoint", steps=2, task=task.name) == 0
    assert _train(mixed, "--resume", steps=4, task=task.name) == 0
    c = _weights(mixed)
    assert all(torch.equal(a[k], c[k]) for k in a)
    capsys.readouterr()


def test_grad_checkpoint_on_a_model_without_it_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register_task(TINY)
    out = tmp_path / "tiny"
    call = lambda: main(["train", "tiny", "--out", str(out), "--steps", "1", "--grad-checkpoint"])  # noqa: E731
    rc, line = _one_line_error(capsys, call)
    assert rc == 2
    assert line == (
        "attnlab: error: --grad-checkpoint: the model of task 'tiny' (TinyModel) has no "
        "gradient checkpointing"
    )
    assert not (out / "checkpoints").exists()
