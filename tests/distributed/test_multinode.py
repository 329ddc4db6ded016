"""Two torchrun agents as two "nodes" on 127.0.0.1 (c10d rendezvous) train one run together.

Each agent is started as on its own machine — ``torchrun --nnodes 2 --nproc-per-node 1
--rdzv-backend c10d --rdzv-endpoint HOST:PORT`` — and the two meet at the endpoint: the losses and
weights are those of one process on the same global batch, and rank 0 alone writes the run. Every
agent has a deadline and both are killed (with their workers) when one fails, so the test cannot
hang (:mod:`tests.distributed._torchrun`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.cli import main
from attnlab.tasks.registry import register_task
from attnlab.training.checkpoint import resolve_checkpoint
from tests.distributed._torchrun import torchrun_nodes
from tests.training import _tiny_task

ARGS = ["train", "tiny", "--steps", "3", "--dropout", "0", "--batch-size", "8", "--seed", "4"]


def _losses(run: Path) -> list[float]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if x["kind"] == "train"]


@pytest.mark.distributed
def test_two_nodes_train_together_like_one_process(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    agents = torchrun_nodes([_tiny_task.__file__, *ARGS, "--out", str(nodes)], nodes=2)
    for i, agent in enumerate(agents):
        assert agent.returncode == 0, f"agent {i}:\n{agent.stderr[-3000:]}"
    # rank 0 printed the result, on whichever agent the rendezvous gave it
    assert sum("checkpoint:" in a.stdout for a in agents) == 1

    register_task(_tiny_task.TASK)
    one = tmp_path / "one"
    assert main([*ARGS, "--out", str(one)]) == 0

    assert _losses(nodes) == pytest.approx(_losses(one), rel=1e-5)
    assert len(_losses(nodes)) == 3  # one metrics line per step: rank 0 alone writes
    assert sorted(p.name for p in (nodes / "checkpoints").iterdir()) == ["latest", "step-00000003"]
    a = load_file(resolve_checkpoint(one) / "model.safetensors")
    b = load_file(resolve_checkpoint(nodes) / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6)
