"""Readers race checkpoint rotation (hardening 5): ``load_run`` and ``attnlab translate`` on a
run that a real ``attnlab train`` process is checkpointing at every step (``--keep-last 2``)
always get a complete checkpoint, even a reader that holds a step while two more are saved."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import attnlab.tasks.run as run_module
from attnlab.cli import main
from attnlab.tasks.run import load_run
from attnlab.training.checkpoint import CHECKPOINTS, LATEST, list_checkpoints

REPO = Path(__file__).resolve().parents[2]
TINY = ["--d-model", "8", "--layers", "1", "--heads", "1", "--d-ff", "8", "--batch-size", "2",
        "--max-len", "4", "--num-heldout", "2", "--eval-every", "0", "--device", "cpu"]  # fmt: skip
START_TIMEOUT = 90.0  # seconds to the writer's first checkpoint (imports on a busy machine)


def _latest_step(run: Path) -> int:
    try:
        return int((run / CHECKPOINTS / LATEST).read_text().strip().split("-")[1])
    except (OSError, IndexError, ValueError):  # not written yet
        return -1


def _wait_for_step(run: Path, step: int, writer: subprocess.Popen[bytes], timeout: float) -> int:
    """Wait (bounded) until ``latest`` names ``step`` or later; the step it names."""
    deadline = time.monotonic() + timeout
    while _latest_step(run) < step:
        if writer.poll() is not None:
            pytest.fail(f"the writer ended early: {writer.returncode}")
        if time.monotonic() > deadline:
            pytest.fail(f"the writer did not reach step {step} within {timeout:g} s")
        time.sleep(0.02)
    return _latest_step(run)


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """``attnlab train reverse --save-every 1 --keep-last 2`` running in its own process."""
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "attnlab", "train", "reverse", "--out", str(run),
           "--steps", "100000", "--save-every", "1", "--keep-last", "2", *TINY]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True
    )
    try:
        _wait_for_step(run, 1, proc, START_TIMEOUT)
        yield run, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_readers_always_get_a_complete_checkpoint_while_the_writer_rotates(
    writer: tuple[Path, subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run, proc = writer
    first = _latest_step(run)
    failures: list[str] = []

    def read(reader: Any) -> None:
        try:
            reader()
        except Exception as exc:  # every failure is collected, then reported at once
            failures.append(f"{type(exc).__name__}: {exc}")

    for _ in range(30):  # quick readers
        read(lambda: load_run(run))
    for _ in range(3):
        if main(["translate", str(run), "abc"]) != 0:
            failures.append(capsys.readouterr().err.strip())
    capsys.readouterr()

    # slow readers: each holds the step it resolved while the writer saves two more, so that
    # --keep-last 2 rotates that very step out while it is being read
    real_read_config = run_module.read_config

    def slow_read_config(ckpt: Path) -> dict[str, Any]:
        held = int(ckpt.name.split("-")[1])
        _wait_for_step(run, held + 2, proc, 30.0)
        return real_read_config(ckpt)

    monkeypatch.setattr(run_module, "read_config", slow_read_config)
    for _ in range(3):
        read(lambda: load_run(run))
    monkeypatch.undo()

    assert not failures, f"{len(failures)} reads failed:\n" + "\n".join(failures[:5])
    assert _latest_step(run) >= first + 6, "the writer must have rotated during the reads"
    # a step held by a reader is pruned by a later save: the rotation keeps --keep-last 2
    last = _wait_for_step(run, _latest_step(run) + 2, proc, 30.0)
    kept = [step for step, _ in list_checkpoints(run)]
    assert len(kept) <= 3 and last in kept, kept  # 2, or 3 while a save is between its steps
