"""One training per run folder (hardening 3) and no silent overwrite of a user's folder
(hardening 10): the run lock and the claim of a folder. The command line, with two real
processes, is in tests/cli/test_hardening_train.py."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.training.checkpoint import CheckpointError
from attnlab.training.run_dir import NotARunFolderError, claim_run_dir, is_run_dir
from attnlab.training.run_lock import LOCK_FILE, RunFolderBusyError, RunLock


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_second_lock_on_the_same_folder_is_refused(tmp_path: Path) -> None:
    with RunLock(tmp_path / "run") as first:
        assert first.held
        assert (tmp_path / "run" / LOCK_FILE).read_text().strip() == str(os.getpid())
        with pytest.raises(RunFolderBusyError, match=rf"is in use .*process {os.getpid()}") as info:
            RunLock(tmp_path / "run").acquire()
        assert "\n" not in str(info.value)
    assert not first.held
    assert (tmp_path / "run" / LOCK_FILE).read_text() == ""  # released: emptied, kept
    with RunLock(tmp_path / "run") as again:  # and it can be taken again
        assert again.held and again.previous is None


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead = _dead_pid()
    (tmp_path / LOCK_FILE).write_text(f"{dead}\n")
    with caplog.at_level(logging.WARNING, logger="attnlab.training.run_lock"):
        with RunLock(tmp_path) as lock:
            assert lock.previous == dead
    assert any(f"stale lock {tmp_path / LOCK_FILE} of process {dead}" in r.getMessage()
               for r in caplog.records)  # fmt: skip


def test_a_folder_that_is_not_a_run_is_refused_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "metrics.jsonl").write_text("my own numbers\n")
    (out / "attention.html").write_text("<p>my page</p>")
    with pytest.raises(NotARunFolderError, match="is not empty and is not an attnlab run") as info:
        claim_run_dir(out)
    assert "attention.html, metrics.jsonl" in str(info.value) and "--force" in str(info.value)
    assert sorted(p.name for p in out.iterdir()) == ["attention.html", "metrics.jsonl"]
    claim_run_dir(out, force=True).release()
    assert is_run_dir(out)  # it is one now: the next run needs no --force
    claim_run_dir(out).release()


def test_claims_of_fresh_and_resumed_runs(tmp_path: Path) -> None:
    claim_run_dir(tmp_path / "new").release()  # a missing folder is created
    claim_run_dir(tmp_path / "new").release()  # an empty one (but the lock) is fine
    with pytest.raises(CheckpointError, match="no checkpoint"):
        claim_run_dir(tmp_path / "new", resume=True)
    (tmp_path / "new" / "checkpoints" / "step-00000001").mkdir(parents=True)
    with pytest.raises(NotARunFolderError, match="already holds a checkpoint"):
        claim_run_dir(tmp_path / "new")
    assert not RunLock(tmp_path / "new").acquire().release()  # every refusal released the lock
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotARunFolderError, match="--out must be a folder"):
        claim_run_dir(tmp_path / "file")
