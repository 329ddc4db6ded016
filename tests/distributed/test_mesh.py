"""``attnlab train lm --context-parallel C --tensor-parallel N`` in several processes (issue 13).

A GPT trained with its sequences spread over 2 processes (ring attention) has the loss curve,
gradient norms and evaluation of one process on the same global batch; a checkpoint of the one
process resumes on 4 processes as a 2 × 2 (context × tensor) mesh and continues the same curve,
and the checkpoint those 4 write holds the whole weights of the one-process run.

The processes run the command line as ``torchrun``'s workers do (:func:`tests.distributed._launch.
command_line`: forked from the tests' fork server instead of each importing torch anew; what
``torchrun`` itself does is tested where it matters: ``test_multinode.py``, ``test_peer_lost.py``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.cli import main
from attnlab.training.checkpoint import resolve_checkpoint
from tests.distributed._launch import command_line, launch

TEXT = "to be or not to be, that is the question: whether 'tis nobler in the mind to suffer\n"


def _lm(data: Path) -> list[str]:
    args = ["train", "lm", "--data", str(data), "--block-size", "16", "--n-layer", "2"]
    args += ["--n-head", "4", "--n-embd", "16", "--batch-size", "4", "--warmup", "1"]
    args += ["--dropout", "0", "--seed", "3", "--lr-decay-steps", "4", "--grad-accum", "2"]
    return [*args, "--eval-every", "2", "--eval-iters", "2", "--clip", "0.5"]


def _lines(run: Path, kind: str) -> list[dict]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if x["kind"] == kind]


def _train(run: Path, key: str) -> list[float]:
    return [x[key] for x in _lines(run, "train")]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(resolve_checkpoint(run) / "model.safetensors"))


@pytest.mark.distributed
def test_context_and_tensor_parallel_training_follows_one_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "input.txt"
    data.write_text(TEXT * 30)
    lm = _lm(data)
    one = tmp_path / "one"
    assert main([*lm, "--steps", "4", "--save-every", "2", "--out", str(one)]) == 0
    capsys.readouterr()
    ref = _train(one, "loss")
    assert len(ref) == 4 and ref[-1] < ref[0]
    assert min(_train(one, "grad_norm")) > 0.5  # clipped at every step: by the global norm

    # the sequences over 2 processes (zigzag): the same curve, norms and evaluations
    two = tmp_path / "two"
    procs = launch(command_line, 2, main, [*lm, "--steps", "4", "--context-parallel", "2",
                   "--out", str(two)], timeout=240.0)  # fmt: skip
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert _train(two, "loss") == pytest.approx(ref, rel=1e-5)
    assert _train(two, "grad_norm") == pytest.approx(_train(one, "grad_norm"), rel=1e-5)
    assert _train(two, "tokens") == _train(one, "tokens")  # every token counted once
    for got, want in zip(_lines(two, "eval"), _lines(one, "eval"), strict=True):
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-5)
    assert procs[0].stdout.count("checkpoint:") == 1 and "sample:" in procs[0].stdout
    assert "checkpoint:" not in procs[1].stdout and "sample:" not in procs[1].stdout  # rank 0 alone
    for name, w in _weights(one).items():
        torch.testing.assert_close(_weights(two)[name], w, rtol=1e-4, atol=1e-5)

    # one process's step 2 resumed by 4 processes, context 2 × tensor 2 (contiguous layout)
    four = tmp_path / "four"
    shutil.copytree(one, four)
    shutil.rmtree(four / "checkpoints" / "step-00000004")
    (four / "checkpoints" / "latest").write_text("step-00000002\n")
    procs = launch(command_line, 4, main, [*lm, "--steps", "4", "--resume", "--context-parallel",
                   "2", "--tensor-parallel", "2", "--context-layout", "contiguous",
                   "--out", str(four)], timeout=240.0)  # fmt: skip
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert _train(four, "loss") == pytest.approx(ref, rel=1e-5)
    assert _train(four, "grad_norm") == pytest.approx(_train(one, "grad_norm"), rel=1e-5)
    # written by rank 0 from the gathered shards: the single-process layout (QKV rows as one
    # process orders them), loadable by every command
    saved = _weights(four)
    assert saved.keys() == _weights(one).keys()
    for name, w in _weights(one).items():
        torch.testing.assert_close(saved[name], w, rtol=1e-4, atol=1e-5)
    assert main(["generate", str(four), "--prompt", "to be", "--max-new-tokens", "4"]) == 0
