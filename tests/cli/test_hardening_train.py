"""``attnlab train`` never loses a run (hardening 1, 2, 3, 4, 10): options checked before the first
step, changed data noticed on resume, one training per folder, divergence stopped, a user's folder
never overwritten by surprise; ``generate`` on non-finite weights is one line."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.cli import main
from attnlab.tasks.registry import register_task
from attnlab.training.checkpoint import (
    list_checkpoints,
    load_config,
    load_model_weights,
    read_checkpoint_file,
    resolve_checkpoint,
    save_checkpoint,
)
from attnlab.training.run_lock import LOCK_FILE
from tests.training._tiny_task import TASK

REPO = Path(__file__).resolve().parents[2]
TINY_TASK_SCRIPT = REPO / "tests" / "training" / "_tiny_task.py"
TEXT = "to be, or not to be, that is the question:\nwhether 'tis nobler in the mind\n" * 12
LM = ["--block-size", "8", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
      "--batch-size", "4", "--eval-iters", "1", "--warmup", "1", "--lr-decay-steps", "20"]  # fmt: skip
SEQ = ["--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff", "32", "--warmup", "2",
       "--max-len", "4", "--num-heldout", "5", "--batch-size", "4"]  # fmt: skip


def _run(argv: list[str]) -> int:
    """``main(argv)``, with argparse's exit turned into its code."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def _one_error_line(capsys: pytest.CaptureFixture[str], progress: bool = False) -> str:
    """The one error line on stderr (after the progress bar's lines when ``progress``)."""
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert "Traceback" not in err, err
    if progress:
        lines = [x for x in lines if x.startswith("attnlab")]
    assert len(lines) == 1, err
    return lines[0]


def _strict_json_lines(path: Path) -> list[dict[str, Any]]:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{path.name} holds a bare {constant}, which is not JSON")

    return [json.loads(x, parse_constant=refuse) for x in path.read_text().splitlines()]


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


# ---------------------------------------------------------------- 1. options checked first


def _parallel(tmp_path: Path) -> list[str]:
    en = ["the cat sat .", "a dog ran .", "the dog sat .", "a cat ran ."] * 4
    fr = ["le chat assis .", "un chien courut .", "le chien assis .", "un chat courut ."] * 4
    files = {}
    for name, lines in (("train.en", en), ("train.fr", fr), ("dev.en", en[:4]), ("dev.fr", fr[:4])):
        (tmp_path / name).write_text("".join(x + "\n" for x in lines))
        files[name] = str(tmp_path / name)
    return ["--src", files["train.en"], "--tgt", files["train.fr"], "--dev-src", files["dev.en"],
            "--dev-tgt", files["dev.fr"], "--tokenizer", "word", "--src-vocab", "40",
            "--tgt-vocab", "40", "--max-tokens", "64", "--d-model", "16", "--layers", "1",
            "--heads", "2", "--d-ff", "32", "--warmup", "2"]  # fmt: skip


def test_a_bad_bleu_tokenizer_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    argv = ["train", "translate", "--out", str(run), "--steps", "2", *_parallel(tmp_path)]
    assert _run([*argv, "--bleu-tokenize", "13A"]) == 2
    line = _one_error_line(capsys)
    assert "--bleu-tokenize: invalid choice: '13A'" in line
    assert not run.exists()  # no step was trained, nothing was written
    # a valid tokenizer that cannot run here (an extra package missing) is refused up front too
    import sacrebleu

    try:
        sacrebleu.corpus_bleu(["a"], [["a"]], tokenize="ja-mecab")
    except Exception:
        assert _run([*argv, "--bleu-tokenize", "ja-mecab"]) == 2
        assert "--bleu-tokenize ja-mecab cannot run here" in _one_error_line(capsys)
        assert not run.exists()


# ---------------------------------------------------------------- 2. changed data on resume


@pytest.mark.parametrize("tokens", [[], ["--bpe", "--bpe-vocab", "280"]], ids=["char", "bpe"])
def test_resume_refuses_changed_data_unless_allowed(
    text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], tokens: list[str]
) -> None:
    run = tmp_path / "run"
    argv = ["train", "lm", "--data", str(text_file), "--out", str(run), *LM, *tokens]
    assert _run([*argv, "--steps", "1"]) == 0
    capsys.readouterr()
    # the same characters, the same size: only the order of two words changed
    text_file.write_text(TEXT.replace("to be, or not", "or be, to not"), encoding="utf-8")
    assert _run([*argv, "--steps", "2", "--resume"]) == 2
    line = _one_error_line(capsys)
    assert f"the --data file {text_file} changed since the checkpoint" in line
    assert "--allow-data-change" in line
    assert resolve_checkpoint(run).name == "step-00000001"  # nothing was changed
    assert _run([*argv, "--steps", "2", "--resume", "--allow-data-change"]) == 0
    assert resolve_checkpoint(run).name == "step-00000002"


# ---------------------------------------------------------------- 3. one run per folder


def _tiny_process(out: Path, steps: int, sleep: float) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(TINY_TASK_SCRIPT), "train", "tiny", "--out", str(out),
           "--steps", str(steps), "--sleep", str(sleep)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO
    )


def test_two_trainings_on_one_folder_the_second_exits_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two real processes: a training in a child process, a second one in this process."""
    out = tmp_path / "run"
    first = _tiny_process(out, 1000, 0.05)
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and first.poll() is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        assert first.poll() is None, first.communicate()
        register_task(TASK)
        assert _run(["train", "tiny", "--out", str(out), "--steps", "2"]) == 2
        line = _one_error_line(capsys)
        assert f"run folder {out} is in use by another training (process {first.pid}" in line
        first.send_signal(signal.SIGINT)  # the first stops at once, saving its checkpoint
        _, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 130, err
    # the folder holds the first run alone: its checkpoint, its metrics, in order
    done = [s for s, _ in list_checkpoints(out)]
    assert len(done) == 1 and 2 <= done[0] < 1000
    steps = [x["step"] for x in _strict_json_lines(out / "metrics.jsonl") if x["kind"] == "train"]
    assert steps == list(range(1, done[0] + 1))
    assert (out / LOCK_FILE).read_text() == ""  # released


def test_a_stale_lock_is_taken_over_with_a_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text(f"{dead.pid}\n")  # left by a training that was killed
    register_task(TASK)
    with caplog.at_level(logging.WARNING):
        assert _run(["train", "tiny", "--out", str(out), "--steps", "2"]) == 0
    assert any(f"stale lock {out / LOCK_FILE} of process {dead.pid}" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert resolve_checkpoint(out).name == "step-00000002"


# ---------------------------------------------------------------- 4. divergence


def test_divergence_stops_the_run_with_one_line(
    text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    argv = ["train", "lm", "--data", str(text_file), "--out", str(run), "--steps", "8",
            "--save-every", "1", *LM, "--lr", "1e6", "--eval-every", "0"]  # fmt: skip
    assert _run(argv) == 2
    line = _one_error_line(capsys, progress=True)
    assert line.startswith("attnlab: error: training diverged at step ")
    step = int(line.split("diverged at step ")[1].split(":")[0])
    assert 2 <= step <= 8
    # the latest checkpoint is the last finite state; no checkpoint holds NaN
    assert resolve_checkpoint(run).name == f"step-{step - 1:08d}"
    config = load_config(run)["model"]
    from attnlab.models.config import GPTConfig, config_from_dict
    from attnlab.models.gpt import GPT

    for _, ckpt in list_checkpoints(run):
        model = GPT(config_from_dict(GPTConfig, config))
        load_model_weights(ckpt, model)
        assert all(torch.isfinite(p).all() for p in model.parameters()), ckpt
    lines = _strict_json_lines(run / "metrics.jsonl")  # strict JSON: null, never NaN
    assert lines[-1]["kind"] == "diverged" and lines[-1]["step"] == step


@pytest.mark.parametrize("value", ["nan", "inf", "-0.1"])
def test_weight_decay_must_be_finite_and_non_negative(
    text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    run = tmp_path / "run"
    argv = ["train", "lm", "--data", str(text_file), "--out", str(run), "--steps", "1", *LM]
    assert _run([*argv, "--weight-decay", value]) == 2
    assert "argument --weight-decay: expected a finite non-negative float" in _one_error_line(
        capsys
    )
    assert not run.exists()


@pytest.mark.parametrize("option", ["--lr", "--min-lr"])
def test_learning_rates_must_be_finite(
    text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    argv = ["train", "lm", "--data", str(text_file), "--out", str(tmp_path / "r"), "--steps", "1"]
    assert _run([*argv, option, "inf"]) == 2
    assert f"argument {option}: expected a finite positive float" in _one_error_line(capsys)


def _non_finite_copy(run: Path, dest: Path, model: torch.nn.Module) -> Path:
    """``run``'s latest checkpoint with one weight set to NaN (as a diverged run used to keep)."""
    ckpt = resolve_checkpoint(run)
    load_model_weights(ckpt, model)
    with torch.no_grad():
        p = next(model.parameters())
        p[(0,) * p.dim()] = float("nan")
    names = [n for n in ("tokenizer.json",) if (ckpt / n).exists()]
    save_checkpoint(dest, step=1, model=model, config=load_config(ckpt),
                    files={n: read_checkpoint_file(ckpt, n) for n in names})  # fmt: skip
    return dest


@pytest.mark.parametrize("strategy", ["sample", "greedy"])
def test_generate_on_non_finite_weights_is_one_line(
    text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], strategy: str
) -> None:
    from attnlab.models.config import GPTConfig, config_from_dict
    from attnlab.models.gpt import GPT

    run = tmp_path / "run"
    argv = ["train", "lm", "--data", str(text_file), "--out", str(run), "--steps", "1", *LM]
    assert _run(argv) == 0
    model = GPT(config_from_dict(GPTConfig, load_config(run)["model"]))
    bad = _non_finite_copy(run, tmp_path / "nan", model)
    capsys.readouterr()
    assert _run(["generate", str(bad), "--prompt", "to be", "--strategy", strategy]) == 2
    line = _one_error_line(capsys)
    assert "the model's weights are not finite (NaN or infinity in transformer.wte.weight)" in line


def test_translate_on_non_finite_weights_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnlab.models.config import TransformerConfig, config_from_dict
    from attnlab.models.transformer import Transformer

    run = tmp_path / "run"
    assert _run(["train", "reverse", "--out", str(run), "--steps", "1", *SEQ]) == 0
    model = Transformer(config_from_dict(TransformerConfig, load_config(run)["model"]))
    bad = _non_finite_copy(run, tmp_path / "nan", model)
    capsys.readouterr()
    assert _run(["generate", str(bad), "--prompt", "abc"]) == 2
    assert "the model's weights are not finite" in _one_error_line(capsys)


# ---------------------------------------------------------------- 10. overwrites


def test_a_folder_that_is_not_a_run_is_refused_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "metrics.jsonl").write_text("my own numbers\n")
    (out / "attention.html").write_text("<p>my page</p>")
    argv = ["train", "reverse", "--out", str(out), "--steps", "1", *SEQ]
    assert _run(argv) == 2
    line = _one_error_line(capsys)
    assert f"--out {out} is not empty and is not an attnlab run" in line and "--force" in line
    assert (out / "metrics.jsonl").read_text() == "my own numbers\n"
    assert (out / "attention.html").read_text() == "<p>my page</p>"
    assert sorted(p.name for p in out.iterdir()) == ["attention.html", "metrics.jsonl"]
    # refused before any set-up: the missing --data file is not even read
    lm = ["train", "lm", "--data", str(tmp_path / "none.txt"), "--out", str(out), "--steps", "1"]
    assert _run(lm) == 2
    assert "is not empty and is not an attnlab run" in _one_error_line(capsys)
    assert _run([*argv, "--force"]) == 0
    assert resolve_checkpoint(out).name == "step-00000001"
    # a run killed before its first checkpoint is still a run: trained again without --force
    shutil.rmtree(out / "checkpoints")
    assert _run(argv) == 0
