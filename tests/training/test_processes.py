"""2 processes on the CPU (gloo) give the result of 1 process on the same global batch.

The 2 processes run ``attnlab train`` as ``torchrun``'s workers do (:func:`tests.distributed._launch.
command_line`: forked from the tests' fork server rather than each importing torch anew; a real
``torchrun`` launch of the same task is ``tests/distributed/test_multinode.py``'s).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from safetensors.torch import load_file

from attnlab.cli import main
from attnlab.tasks.registry import register_task
from attnlab.training.checkpoint import resolve_checkpoint
from attnlab.training.processes import (
    DDPStrategy,
    DistInfo,
    broadcast_text,
    init_distributed,
    shard_batch,
)
from tests.distributed._launch import command_line, launch
from tests.training import _tiny_task
from tests.training._tiny_task import TASK, tiny_trainer


def _losses(run: Path) -> list[float]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if x["kind"] == "train"]


@pytest.mark.distributed
def test_torchrun_two_processes_match_one(tmp_path: Path) -> None:
    # padding varies per row, so the two halves of a batch hold different token counts: only a
    # token-weighted reduction over ranks gives the single-process gradient
    args = [
        "train",
        "tiny",
        "--steps",
        "3",
        "--dropout",
        "0",
        "--batch-size",
        "8",
        "--grad-accum",
        "2",
        "--seed",
        "4",
    ]
    argv = [*args, "--out", str(tmp_path / "two")]
    for proc in launch(command_line, 2, _tiny_task.main, argv, timeout=240.0):
        assert proc.returncode == 0, proc.stderr[-3000:]

    register_task(TASK)
    torch.set_num_threads(1)
    assert main([*args, "--out", str(tmp_path / "one")]) == 0

    one = load_file(resolve_checkpoint(tmp_path / "one") / "model.safetensors")
    two = load_file(resolve_checkpoint(tmp_path / "two") / "model.safetensors")
    assert one.keys() == two.keys()
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-5, atol=1e-6)
    assert _losses(tmp_path / "two") == pytest.approx(_losses(tmp_path / "one"), rel=1e-5)
    # only rank 0 wrote: one metrics line per step, one checkpoint
    assert len(_losses(tmp_path / "two")) == 3
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir()) == [
        "latest",
        "step-00000003",
    ]


class _Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


@dataclasses.dataclass
class _Batch:
    x: torch.Tensor
    name: str


def test_shard_batch() -> None:
    x = torch.arange(12).reshape(6, 2)
    assert torch.equal(shard_batch(x, 1, 3), x[2:4])
    out = shard_batch({"a": x, "b": (x, 5)}, 0, 2)
    assert torch.equal(out["a"], x[:3]) and torch.equal(out["b"][0], x[:3]) and out["b"][1] == 5
    pair = shard_batch(_Pair(x, x + 1), 1, 2)
    assert isinstance(pair, _Pair) and torch.equal(pair.b, x[3:] + 1)
    d = shard_batch(_Batch(x, "n"), 1, 2)
    assert torch.equal(d.x, x[3:]) and d.name == "n"
    assert shard_batch(x, 0, 1) is x
    with pytest.raises(
        ValueError,
        match=r"batch size must be divisible by the number of processes 4, got a tensor of shape \(6, 2\)",
    ):
        shard_batch(x, 0, 4)


def test_single_process_without_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    info = init_distributed("cpu")
    assert info == DistInfo(device=torch.device("cpu"))
    assert info.is_main and not info.distributed


def test_ddp_strategy_in_one_process(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    strategy = DDPStrategy()
    assert strategy.wrap(model, DistInfo()) is model and not strategy.sharded
    assert strategy.gathered_model(model, DistInfo()) is model
    assert strategy.gathered_model(model, DistInfo(rank=1, world_size=2)) is None
    assert broadcast_text("step-00000002") == "step-00000002"
    with pytest.raises(ValueError, match="text must be a str on rank 0, got None"):
        broadcast_text(None)
    with pytest.raises(TypeError, match="strategy must be a ParallelStrategy"):
        tiny_trainer(tmp_path, 1, strategy="fsdp")
