"""FSDP2 training (``--parallel fsdp``, issue 13) with real processes on the CPU (gloo), started as
``torchrun`` starts its workers (:func:`tests.distributed._launch.command_line`: forked from the
tests' fork server instead of each importing torch anew; ``test_families_torchrun.py`` trains
FSDP under a real ``torchrun``).

- 2 processes give the losses, evaluation and report of 1 process on the same global batch;
- a checkpoint saved by 2 processes resumes in 1 and one saved by 1 resumes in 2: the parameters
  and the optimizer state right after the resume are the saved ones exactly, and the continued
  losses are those of a run that never stopped;
- a sharded checkpoint is refused by the readers of single folders in one line that names
  ``attnlab checkpoint convert``, which makes the folder every command reads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from attnlab.cli import main
from attnlab.distributed.checkpoint import consolidate, read_sharded_tensors
from attnlab.distributed.fsdp import FSDPStrategy, shard_model, transformer_blocks
from attnlab.models.config import GPTConfig, TransformerConfig
from attnlab.models.gpt import GPT
from attnlab.models.transformer import Transformer
from attnlab.tasks.registry import register_task
from attnlab.tasks.run import load_run
from attnlab.training.checkpoint import (
    CheckpointError,
    list_checkpoints,
    resolve_checkpoint,
    verify_checkpoint,
)
from attnlab.training.manifest import file_entry
from attnlab.training.processes import DistInfo
from tests.distributed import _fsdp_task
from tests.distributed._launch import command_line, launch
from tests.training._tiny_task import TASK as DDP_TASK

ARGS = ["train", "fsdp_tiny", "--parallel", "fsdp", "--grad-accum", "2", "--seed", "4"]
ARGS += ["--eval-every", "2", "--clip", "0.3"]  # every step clipped: by the global norm


def _lines(run: Path, kind: str) -> list[dict]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if x["kind"] == kind]


def _losses(run: Path) -> list[float]:
    return [x["loss"] for x in _lines(run, "train")]


def _shards(ckpt: Path) -> list[str]:
    return sorted(p.name for p in (ckpt / "sharded").iterdir())


def _report(text: str) -> float:
    return float(next(x for x in text.splitlines() if x.startswith("report:")).split()[-1])


@pytest.mark.distributed
def test_two_processes_match_one_and_resume_on_any_number_of_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register_task(_fsdp_task.TASK)
    # the reference: one process, 4 steps without a stop, a checkpoint every 2
    one = tmp_path / "one"
    assert main([*ARGS, "--steps", "4", "--save-every", "2", "--out", str(one)]) == 0
    capsys.readouterr()
    ref = _losses(one)
    assert len(ref) == 4
    assert _shards(one / "checkpoints" / "step-00000002") == [
        "shard-00001-model-00001-of-00001.safetensors"
    ]

    # two processes, 2 steps: same losses, evaluation and report; each rank wrote its shards
    two = tmp_path / "two"
    procs = launch(
        command_line, 2, _fsdp_task.main, [*ARGS, "--steps", "2", "--out", str(two)], timeout=240.0
    )
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert _losses(two) == pytest.approx(ref[:2], rel=1e-5)
    norms = [x["grad_norm"] for x in _lines(one, "train")]
    assert min(norms) > 0.3  # clipped at every step
    assert [x["grad_norm"] for x in _lines(two, "train")] == pytest.approx(norms[:2], rel=1e-5)
    assert [x["step"] for x in _lines(two, "eval")] == [2]
    assert _lines(two, "eval")[0]["accuracy"] == _lines(one, "eval")[0]["accuracy"]
    saved2 = two / "checkpoints" / "step-00000002"
    assert _shards(saved2) == [
        "shard-00001-model-00001-of-00001.safetensors",
        "shard-00002-model-00001-of-00001.safetensors",
    ]
    whole_two = read_sharded_tensors(saved2)
    whole_one = read_sharded_tensors(one / "checkpoints" / "step-00000002")
    assert whole_two.keys() == whole_one.keys() and "head.weight" not in whole_two  # tied: once
    for k in whole_one:
        torch.testing.assert_close(whole_two[k], whole_one[k], rtol=1e-5, atol=1e-6)
    # rank 0's report ran on the gathered weights
    total = sum(float(v.double().sum()) for v in whole_one.values())
    assert _report(procs[0].stdout) == pytest.approx(total, rel=1e-5, abs=1e-5)
    assert "report:" not in procs[1].stdout  # rank 0 alone

    # 2 → 1: resumed here, in one process, exactly as saved; then the same losses as `one`
    result = _fsdp_task.resume_check(two, 4)
    assert result["model_equal"] and result["optim_equal"] and result["step"] == 2
    assert result["tensors"] > 10
    assert _losses(two) == pytest.approx(ref, rel=1e-5)
    # a NaN loss stopped step 5 before it was taken; NaN weights were not saved
    assert result["diverged"] == {"step": [5], "ranks_refused_to_save": 1}
    assert result["latest"] == "step-00000004"

    # 1 → 2: `one` as it was at step 2, resumed by two processes
    back = tmp_path / "back"
    shutil.copytree(one, back)
    shutil.rmtree(back / "checkpoints" / "step-00000004")
    (back / "checkpoints" / "latest").write_text("step-00000002\n")
    check = tmp_path / "check.json"
    argv = ["resume-check", str(back), "4", str(check)]
    for proc in launch(command_line, 2, _fsdp_task.main, argv, timeout=240.0):
        assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(check.read_text())
    assert result["model_equal"] and result["optim_equal"] and result["step"] == 2
    assert _losses(back) == pytest.approx(ref, rel=1e-5)
    # the last rank's NaN loss, then its NaN shard, stopped both ranks alike
    assert result["diverged"] == {"step": [5], "ranks_refused_to_save": 2}
    assert result["latest"] == "step-00000004"
    assert _shards(back / "checkpoints" / "step-00000004") == _shards(saved2)


def test_convert_makes_the_folder_every_command_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "input.txt"
    data.write_text("to be or not to be, that is the question.\n" * 20)
    run = tmp_path / "run"
    lm = ["train", "lm", "--data", str(data), "--block-size", "16", "--n-layer", "2"]
    lm += ["--n-head", "2", "--n-embd", "16", "--batch-size", "4", "--warmup", "1"]
    assert main([*lm, "--steps", "2", "--parallel", "fsdp", "--out", str(run)]) == 0
    capsys.readouterr()

    # a reader of single folders refuses it in one line, naming the conversion
    assert main(["generate", str(run), "--prompt", "to", "--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "attnlab checkpoint convert" in err, err

    out = tmp_path / "single"
    assert main(["checkpoint", "convert", str(run), "--out", str(out)]) == 0
    printed = "".join(capsys.readouterr().out.split())  # (a narrow console wraps the path)
    assert printed == f"checkpoint:{out / 'checkpoints' / 'step-00000002'}"
    ckpt = verify_checkpoint(out)
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "config.json",
        "manifest.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    loaded = load_run(out)
    want = read_sharded_tensors(run)
    state = loaded.model.state_dict()
    for k, v in want.items():
        assert torch.equal(state[k], v), k
    assert "transformer.wte.weight" not in want  # tied: stored once, under its first name
    assert torch.equal(state["transformer.wte.weight"], want["lm_head.weight"])
    assert main(["generate", str(out), "--prompt", "to", "--max-new-tokens", "3"]) == 0
    capsys.readouterr()

    # one line each: a folder that holds files, a checkpoint that is not sharded
    assert main(["checkpoint", "convert", str(run), "--out", str(out)]) == 2
    assert "--out must be a new or empty folder" in capsys.readouterr().err
    assert main(["checkpoint", "convert", str(out), "--out", str(tmp_path / "x")]) == 2
    assert "is not sharded" in capsys.readouterr().err
    with pytest.raises(ValueError, match="out must be a new or empty folder"):
        consolidate(run, out)


def test_a_checkpoint_resumes_only_with_its_kind_of_strategy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register_task(DDP_TASK)
    tiny = ["train", "tiny", "--dropout", "0"]
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    assert main([*tiny, "--steps", "1", "--out", str(ddp)]) == 0
    assert main([*tiny, "--steps", "1", "--parallel", "fsdp", "--out", str(fsdp)]) == 0
    capsys.readouterr()
    assert main([*tiny, "--steps", "2", "--resume", "--parallel", "fsdp", "--out", str(ddp)]) == 2
    err = capsys.readouterr().err.strip()
    assert "it is a single-folder (--parallel ddp) checkpoint" in err and len(err.splitlines()) == 1
    assert main([*tiny, "--steps", "2", "--resume", "--out", str(fsdp)]) == 2
    assert "resume it with --parallel fsdp" in capsys.readouterr().err
    # nothing was changed: both resume with their own kind
    assert main([*tiny, "--steps", "2", "--resume", "--out", str(ddp)]) == 0
    assert main([*tiny, "--steps", "2", "--resume", "--parallel", "fsdp", "--out", str(fsdp)]) == 0
    assert [s for s, _ in list_checkpoints(fsdp)] == [1, 2]


def test_a_tampered_sharded_checkpoint_is_refused_in_one_line(tmp_path: Path) -> None:
    register_task(DDP_TASK)
    run = tmp_path / "run"
    assert main(["train", "tiny", "--steps", "1", "--parallel", "fsdp", "--out", str(run)]) == 0
    ckpt = resolve_checkpoint(run)
    # a file the manifest does not cover would be read by DCP's reader: refused
    extra = ckpt / "sharded" / "shard-00009-model-00001-of-00001.safetensors"
    save_file({"model.emb.weight": torch.zeros(1)}, str(extra))
    with pytest.raises(CheckpointError, match=r"is not listed in manifest\.json"):
        read_sharded_tensors(run)
    extra.unlink()
    # a header whose pieces claim a huge tensor (re-hashed in the manifest): no giant allocation
    shard = next((ckpt / "sharded").iterdir())
    with safe_open(str(shard), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = dict(f.metadata())
    info = json.loads(meta["DCP_SHARDING_INFO"])
    info["model.emb.weight"]["saved_offsets"] = [10**12, 0]
    save_file(tensors, str(shard), metadata={**meta, "DCP_SHARDING_INFO": json.dumps(info)})
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"][f"sharded/{shard.name}"] = file_entry(shard)
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"the pieces of 'model\.emb\.weight' hold"):
        read_sharded_tensors(run)


def test_transformer_blocks_are_the_repeated_layers() -> None:
    gpt = GPT(GPTConfig(vocab_size=11, n_positions=8, n_layer=3, n_head=2, n_embd=8))
    assert transformer_blocks(gpt) == list(gpt.transformer.h)
    cfg = TransformerConfig(
        src_vocab_size=11,
        tgt_vocab_size=11,
        d_model=8,
        num_heads=2,
        num_encoder_layers=2,
        num_decoder_layers=1,
        d_ff=16,
    )
    seq2seq = Transformer(cfg)
    blocks = transformer_blocks(seq2seq)
    assert blocks == [*seq2seq.encoder.layers, *seq2seq.decoder.layers] and len(blocks) == 3
    assert transformer_blocks(torch.nn.Linear(2, 2)) == []


def test_fsdp_strategy_in_one_process_trains_the_model_as_it_is() -> None:
    model = _fsdp_task.TinyBlocks()
    strategy = FSDPStrategy()
    assert strategy.wrap(model, DistInfo()) is model and strategy.sharded
    assert strategy.gathered_model(model, DistInfo()) is model
    assert not any(type(p).__name__ == "DTensor" for p in model.parameters())
    with pytest.raises(
        RuntimeError, match="needs a process group: start the processes with torchrun"
    ):
        shard_model(model, world_size=1)
    with pytest.raises(TypeError, match="blocks must be callable"):
        FSDPStrategy(blocks=3)  # type: ignore[arg-type]
