"""Every family trains under ``torchrun``: a Llama (RMSNorm, SwiGLU's ``c_gate``, RoPE, untied
head) and a GPT-NeoX (parallel residual, partial rotary) with 2 processes under DDP, FSDP and
``--tensor-parallel 2`` follow the one-process loss curve and gradient norms on the same global
batch (``rel=1e-5``, as ``test_fsdp.py`` and ``test_mesh.py``), and write the one-process
weights. One launch of 2 processes trains all six (``tests/distributed/_family_runs.py``), run as
``torchrun``'s workers are (:func:`tests.distributed._launch.command_line`: forked from the tests'
fork server instead of an agent and 2 workers each importing torch anew, ~10 s of CPU; what
``torchrun`` itself does is tested in ``test_multinode.py`` and ``test_peer_lost.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.tasks import train
from attnlab.training.checkpoint import resolve_checkpoint
from tests.distributed import _family_runs
from tests.distributed._launch import command_line, launch

TEXT = "to be or not to be, that is the question: whether 'tis nobler in the mind to suffer\n"


def _train_lines(run: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if x["kind"] == "train"]


@pytest.mark.distributed
def test_llama_and_neox_train_under_torchrun_like_one_process(tmp_path: Path) -> None:
    data = tmp_path / "input.txt"
    data.write_text(TEXT * 30)
    out = tmp_path / "two"
    procs = launch(command_line, 2, _family_runs.run, [str(data), str(out)], timeout=180.0)
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    torch.set_num_threads(1)
    for family in _family_runs.FAMILIES:
        one = _family_runs.options(str(data), tmp_path / "one", family)
        train(one, progress=False, report=None)
        ref = _train_lines(one.out)  # type: ignore[arg-type]
        assert len(ref) == 3 and ref[-1]["loss"] < ref[0]["loss"]
        weights = load_file(str(resolve_checkpoint(one.out) / "model.safetensors"))
        assert "lm_head.weight" in weights  # untied
        assert any(".mlp.c_gate." in k for k in weights) == (family == "llama")
        for strategy in _family_runs.STRATEGIES:
            run = out / strategy / family
            got = _train_lines(run)
            where = f"{family} {strategy}"
            assert [x["loss"] for x in got] == pytest.approx([x["loss"] for x in ref], rel=1e-5), (
                where
            )
            assert [x["grad_norm"] for x in got] == pytest.approx(
                [x["grad_norm"] for x in ref], rel=1e-5
            ), where
            if strategy != "fsdp":  # FSDP writes its shards (test_fsdp.py reads them)
                saved = load_file(str(resolve_checkpoint(run) / "model.safetensors"))
                assert saved.keys() == weights.keys(), where
                for name, w in weights.items():
                    torch.testing.assert_close(saved[name], w, rtol=1e-4, atol=1e-5)
