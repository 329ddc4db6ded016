"""The trainer: bit-identical resume, Ctrl-C, gradient accumulation, metrics, the CLI driver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.cli import main
from attnlab.tasks.registry import register_task
from attnlab.training import IndexedBatches, TrainConfig, Trainer, TrainerCallback
from attnlab.training import checkpoint as ck
from attnlab.training.checkpoint import load_training_state, resolve_checkpoint
from attnlab.training.rng import seed_everything
from attnlab.training.run_lock import LOCK_FILE
from tests.training._tiny_task import (
    TASK,
    TinyBatches,
    TinyModel,
    evaluate,
    make_optimizer,
    tiny_loss,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _trainer(run_dir: Path, steps: int, **cfg: object) -> Trainer:
    seed_everything(3)
    model = TinyModel(dropout=0.2)
    config = TrainConfig(steps=steps, **{"grad_accum": 2, "eval_every": 2, "keep_last": 3, **cfg})
    return Trainer(
        model,
        make_optimizer=make_optimizer,
        batches=TinyBatches(7),
        loss_fn=tiny_loss,
        config=config,
        run_dir=run_dir,
        run_config={"task": "tiny", "model": {"dim": 16}},
        evaluate=evaluate,
    )


def _assert_same(a: Trainer, b: Trainer) -> None:
    for (name, p), q in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(p, q), name
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for k in sa["state"]:
        for name, v in sa["state"][k].items():
            assert torch.equal(v, sb["state"][k][name]), (k, name)
    assert a.scheduler.get_last_lr() == b.scheduler.get_last_lr()


def _train_losses(run_dir: Path) -> list[float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if x["kind"] == "train"]


def test_resumed_run_is_bit_identical(tmp_path: Path) -> None:
    full = _trainer(tmp_path / "full", 6)
    res_full = full.fit()
    rng_full = torch.get_rng_state()
    assert not res_full.interrupted and res_full.step == 6

    first = _trainer(tmp_path / "split", 3)
    first.fit()
    second = _trainer(tmp_path / "split", 6)  # fresh objects, as a new process would have
    assert second.resume() == 3
    res_second = second.fit()
    assert torch.equal(torch.get_rng_state(), rng_full)
    _assert_same(full, second)
    assert res_second.losses == res_full.losses[3:]
    assert _train_losses(tmp_path / "split") == _train_losses(tmp_path / "full")
    state = load_training_state(tmp_path / "split")
    assert state["step"] == 6 and state["data"]["count"] == 12  # 6 steps × 2 micro-batches


def test_request_stop_saves_and_resumes_identically(tmp_path: Path) -> None:
    full = _trainer(tmp_path / "full", 5, eval_every=0)
    full.fit()

    class StopAt(TrainerCallback):
        def __init__(self, trainer: Trainer) -> None:
            self.trainer = trainer

        def on_step(self, metrics: object) -> None:
            if self.trainer.step == 2:
                self.trainer.request_stop()

    stopped = _trainer(tmp_path / "stop", 5, eval_every=0)
    stopped.callbacks.append(StopAt(stopped))
    result = stopped.fit()
    assert result.interrupted and result.step == 2
    assert resolve_checkpoint(tmp_path / "stop").name == "step-00000002"
    again = _trainer(tmp_path / "stop", 5, eval_every=0)
    again.resume()
    again.fit()
    _assert_same(full, again)


def test_resume_resolves_the_checkpoint_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Config, state and weights all come from the one checkpoint resolved first."""
    _trainer(tmp_path, 4, save_every=2).fit()  # step-2 and step-4 are kept
    ckpts = tmp_path / "checkpoints"
    real = ck.resolve_checkpoint
    calls: list[Path] = []

    def moving(path: str | os.PathLike[str]) -> Path:
        calls.append(Path(path))
        # the true answer first; any later one as if `latest` had moved meanwhile
        return real(path) if len(calls) == 1 else ckpts / "step-00000002"

    monkeypatch.setattr(ck, "resolve_checkpoint", moving)
    trainer = _trainer(tmp_path, 6)
    assert trainer.resume() == 4
    assert calls == [tmp_path]
    assert trainer.last_checkpoint == ckpts / "step-00000004"
    saved = load_file(ckpts / "step-00000004" / "model.safetensors")
    assert all(torch.equal(v, saved[k]) for k, v in trainer.model.state_dict().items())


def test_resume_from_a_step_folder_drops_the_later_metrics(tmp_path: Path) -> None:
    _trainer(tmp_path, 4, save_every=2).fit()
    losses = _train_losses(tmp_path)
    trainer = _trainer(tmp_path, 4)
    assert trainer.resume(tmp_path / "checkpoints" / "step-00000002") == 2
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(x["kind"], x["step"]) for x in lines] == [("train", 1), ("train", 2), ("eval", 2)]
    trainer.fit()
    assert _train_losses(tmp_path) == losses


def test_sigterm_during_fit_stops_and_the_handlers_come_back(tmp_path: Path) -> None:
    def previous(signum: int, frame: object) -> None:
        raise AssertionError("the handler from before fit() ran")

    class TermAt(TrainerCallback):
        def on_step(self, metrics: object) -> None:
            if trainer.step == 2:
                signal.raise_signal(signal.SIGTERM)

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for s in saved:
            signal.signal(s, previous)
        trainer = _trainer(tmp_path, 5, eval_every=0)
        trainer.callbacks.append(TermAt())
        result = trainer.fit()
        assert result.interrupted and result.step == 2
        assert resolve_checkpoint(tmp_path).name == "step-00000002"
        assert all(signal.getsignal(s) is previous for s in saved)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def test_resume_with_a_different_config_changes_nothing(tmp_path: Path) -> None:
    _trainer(tmp_path, 2).fit()
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    other = _trainer(tmp_path, 4, clip=0.5)
    with pytest.raises(
        ValueError,
        match=r"different configuration \(train.clip: 1.0 in the checkpoint vs 0.5 now\)",
    ):
        other.resume()
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


def test_gradient_accumulation_equals_one_big_batch(tmp_path: Path) -> None:
    """Token-weighted: 2 micro-batches of 4 rows give the step of one batch of 8 rows."""

    def run(grad_accum: int, rows: int, out: Path) -> torch.nn.Module:
        seed_everything(0)
        model = TinyModel(dropout=0.0)
        src = TinyBatches(5, batch_size=8)
        batches = [src.next_batch() for _ in range(3)]

        def make(i: int) -> dict:
            b = batches[i // grad_accum]
            j = i % grad_accum
            return {k: v[j * rows : (j + 1) * rows] for k, v in b.items()}

        trainer = Trainer(
            model,
            make_optimizer=make_optimizer,
            batches=IndexedBatches(make),
            loss_fn=tiny_loss,
            config=TrainConfig(steps=3, grad_accum=grad_accum, clip=None),
            run_dir=out,
        )
        trainer.fit()
        return model

    a = run(1, 8, tmp_path / "a")
    b = run(2, 4, tmp_path / "b")
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_metrics_and_bf16(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, 4, bf16=True, eval_every=2, save_every=2)
    result = trainer.fit()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if x["kind"] == "train"]
    evals = [x for x in lines if x["kind"] == "eval"]
    assert [x["step"] for x in train] == [1, 2, 3, 4]
    assert {"loss", "lr", "grad_norm", "tokens", "tokens_per_s", "elapsed"} <= set(train[0])
    assert [x["step"] for x in evals] == [2, 4] and "accuracy" in evals[0]
    assert all(torch.isfinite(torch.tensor(x["loss"])) for x in train)
    assert result.eval_metrics is not None and result.checkpoint is not None
    assert train[0]["lr"] == pytest.approx(trainer.scheduler.rate(1))


def test_train_config_validation() -> None:
    with pytest.raises(ValueError, match="grad_accum must be a positive int, got 0"):
        TrainConfig(steps=1, grad_accum=0)
    with pytest.raises(ValueError, match="clip must be a positive float or None, got -1"):
        TrainConfig(steps=1, clip=-1)
    with pytest.raises(TypeError, match="batches must provide next_batch"):
        Trainer(
            TinyModel(),
            make_optimizer=make_optimizer,
            batches=[1, 2],
            loss_fn=tiny_loss,
            config=TrainConfig(steps=1),
            run_dir="x",
        )


def test_loss_fn_must_return_a_loss(tmp_path: Path) -> None:
    trainer = Trainer(
        TinyModel(),
        make_optimizer=make_optimizer,
        batches=TinyBatches(0),
        loss_fn=lambda m, b: 1.0,
        config=TrainConfig(steps=1),
        run_dir=tmp_path,
    )
    with pytest.raises(TypeError, match="loss_fn must return a TokenLoss or a tensor, got float"):
        trainer.fit()


# ---------------------------------------------------------------- the command line


def _cli(*argv: str) -> int:
    register_task(TASK)
    return main(["train", "tiny", *argv])


def test_cli_steps_is_the_total_and_resume_continues(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli("--out", str(tmp_path / "a"), "--steps", "6", "--seed", "1") == 0
    assert _cli("--out", str(tmp_path / "b"), "--steps", "3", "--seed", "1") == 0
    assert _cli("--out", str(tmp_path / "b"), "--steps", "6", "--seed", "1", "--resume") == 0
    a = load_file(resolve_checkpoint(tmp_path / "a") / "model.safetensors")
    b = load_file(resolve_checkpoint(tmp_path / "b") / "model.safetensors")
    assert resolve_checkpoint(tmp_path / "b").name == "step-00000006"
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _train_losses(tmp_path / "a") == _train_losses(tmp_path / "b")
    config = json.loads((resolve_checkpoint(tmp_path / "b") / "config.json").read_text())
    assert config["task"] == "tiny" and config["args"]["seed"] == 1 and config["args"]["dim"] == 16
    assert config["model"]["dim"] == 16 and config["train"]["grad_accum"] == 1
    assert (resolve_checkpoint(tmp_path / "b") / "tokenizer.json").exists()
    capsys.readouterr()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--steps", "8", "--resume", "--dim", "8"],
            "cannot resume .* with a different configuration "
            r"\(args.dim: 16 in the checkpoint vs 8 now\); nothing was changed",
        ),
        (["--steps", "8", "--resume", "--seed", "2"], r"args.seed: 1 in the checkpoint vs 2 now"),
        (["--steps", "8"], "already holds a checkpoint; pass --resume"),
        (
            ["--steps", "1", "--resume"],
            "--steps must be at least the 2 steps the checkpoint has done, got 1",
        ),
        (["--steps", "x"], "argument --steps: expected a non-negative int, got 'x'"),
        (["--steps", "3", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_cli_errors_are_one_line_and_change_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    out = tmp_path / "run"
    assert _cli("--out", str(out), "--steps", "2", "--seed", "1") == 0
    capsys.readouterr()
    before = _snapshot(out)
    args = (
        ["--out", str(out), "--seed", "1", *argv]
        if "--seed" not in argv
        else ["--out", str(out), *argv]
    )
    try:
        rc = _cli(*args)
    except SystemExit as exc:  # argparse errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err
    import re

    assert re.search(message, lines[0]), lines[0]
    assert _snapshot(out) == before
    assert (out / LOCK_FILE).read_text() == ""  # the lock was taken and given back


def _snapshot(out: Path) -> dict[Path, tuple[int, int]]:
    """Every file's mtime and size, but the lock file's (each attempt takes and releases it)."""
    return {
        p: (p.stat().st_mtime_ns, p.stat().st_size) for p in out.rglob("*") if p.name != LOCK_FILE
    }


def test_cli_resume_from_corrupted_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli("--out", str(tmp_path), "--steps", "1") == 0
    f = resolve_checkpoint(tmp_path) / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-4])
    capsys.readouterr()
    assert _cli("--out", str(tmp_path), "--steps", "2", "--resume") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is truncated or corrupted: model.safetensors" in err


def test_unknown_task_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    register_task(TASK)
    with pytest.raises(SystemExit) as info:
        main(["train", "nosuchtask", "--out", "x", "--steps", "1"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "invalid choice: 'nosuchtask'" in err


def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tmp_path: Path) -> None:
    """A real SIGINT to a real ``attnlab train`` process."""
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        str(HERE / "_tiny_task.py"),
        "train",
        "tiny",
        "--out",
        str(out),
        "--steps",
        "500",
        "--sleep",
        "0.05",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted at step" in err
    state = load_training_state(out)
    done = state["step"]
    assert 3 <= done < 500
    assert len(_train_losses(out)) == done
    # and it resumes from there
    assert _cli("--out", str(out), "--steps", str(done + 2), "--resume", "--sleep", "0.05") == 0
    assert load_training_state(out)["step"] == done + 2
