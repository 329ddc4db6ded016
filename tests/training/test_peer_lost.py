"""A rank of a ``torchrun`` training that dies is reported in one line (hardening 4): the
surviving rank says which rank was lost, that the last checkpoint is intact and how to resume,
exits non-zero within seconds, and the checkpoint resumes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.errors import AttnlabError
from attnlab.training.checkpoint import resolve_checkpoint
from attnlab.training.processes import DistInfo, PeerLostError, peer_lost_error
from tests.distributed._launch import _one_launch_at_a_time, free_port
from tests.distributed._torchrun import _env, _kill

TINY = ["--d-model", "8", "--layers", "1", "--heads", "1", "--d-ff", "8", "--batch-size", "4",
        "--max-len", "4", "--num-heldout", "2", "--eval-every", "0", "--device", "cpu"]  # fmt: skip
START_TIMEOUT = 120.0  # seconds to the first checkpoint (two processes import torch)


def _workers(agent: subprocess.Popen[bytes]) -> dict[int, int]:
    """The agent's worker processes: rank -> pid (read from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) != agent.pid:
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
        for item in env:
            if item.startswith(b"RANK="):
                found[int(item[5:])] = int(entry.name)
    return found


def _ended(pid: int) -> bool:
    """Whether the process ``pid`` ended (gone, or a zombie its parent did not reap yet)."""
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "Z"
    except (OSError, IndexError):
        return True


@pytest.mark.distributed
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_a_killed_rank_is_one_line_naming_it_and_the_checkpoint_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, logs = tmp_path / "run", tmp_path / "logs"
    # --monitor-interval 1: torchrun notices the dead rank within a second (not 0.1 s), then
    # SIGTERMs the others; its signal is then unlikely to land in the few milliseconds between
    # rank 0's training loop (where a SIGTERM only asks to stop) and its one line
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
           "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           "--monitor-interval", "1", "--log-dir", str(logs), "--redirects", "3", "-m", "attnlab", "train", "reverse",
           "--out", str(run), "--steps", "100000", "--save-every", "3", *TINY]  # fmt: skip
    with _one_launch_at_a_time(), tempfile.TemporaryFile() as out:
        agent = subprocess.Popen(
            cmd, stdout=out, stderr=out, env=_env(), cwd=tmp_path, start_new_session=True
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not (run / "checkpoints" / "latest").exists() or len(_workers(agent)) < 2:
                assert agent.poll() is None, "the training ended before its first checkpoint"
                assert time.monotonic() < deadline, "no checkpoint in time"
                time.sleep(0.05)
            ranks = _workers(agent)
            os.kill(ranks[1], signal.SIGKILL)
            killed = time.monotonic()
            while not _ended(ranks[0]):
                assert time.monotonic() - killed < 20, "rank 0 did not stop after rank 1 died"
                time.sleep(0.02)
            agent.wait(timeout=60)
        finally:
            _kill(agent)
        out.seek(0)
        summary = out.read().decode(errors="replace")
    assert agent.returncode != 0
    (err_log,) = logs.glob("*/attempt_0/0/stderr.log")
    err = err_log.read_text(errors="replace")
    assert "Traceback" not in err and "internal error" not in err, err
    lines = [x for x in err.splitlines() if x.startswith("attnlab")]
    assert len(lines) == 1, err
    ckpt = resolve_checkpoint(run)
    assert lines[0].startswith("attnlab: error: rank 1 of 2 was lost"), lines[0]
    assert str(ckpt) in lines[0] and "--resume" in lines[0], lines[0]
    # rank 0 ended non-zero: the error's exit code 2, or the SIGTERM with which torchrun stops the
    # other ranks once one failed, when it comes while rank 0 is exiting (after the line above)
    code = re.search(rf"exitcode\s*:\s*(-?\d+) \(pid: {ranks[0]}\)", summary)
    assert code is not None and int(code.group(1)) in (2, -signal.SIGTERM), summary[-3000:]

    torch.set_num_threads(1)
    step = int(ckpt.name.split("-")[1])
    argv = ["train", "reverse", "--out", str(run), "--steps", str(step + 1), *TINY]
    assert main([*argv, "--save-every", "3", "--resume"]) == 0, capsys.readouterr().err
    assert resolve_checkpoint(run).name == f"step-{step + 1:08d}"


def test_only_a_collective_that_lost_its_peer_is_a_peer_lost_error(tmp_path: Path) -> None:
    two, three = DistInfo(rank=0, world_size=2), DistInfo(rank=2, world_size=3)
    ckpt = tmp_path / "checkpoints" / "step-00000040"
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [::1]:5")
    lost = peer_lost_error(gloo, two, ckpt)
    assert isinstance(lost, PeerLostError) and isinstance(lost, AttnlabError)
    assert str(lost) == (
        f"rank 1 of 2 was lost (its process ended or stopped answering); the last checkpoint, "
        f"{ckpt}, is intact: rerun the same command with --resume"
    )
    nccl = torch.distributed.DistBackendError("NCCL communicator was aborted on rank 2")
    assert str(peer_lost_error(nccl, three, None)).startswith("another rank of 3 was lost")
    assert "no checkpoint was written yet" in str(peer_lost_error(nccl, three, None))
    assert peer_lost_error(RuntimeError("shape mismatch"), two, ckpt) is None  # a bug stays one
    assert peer_lost_error(gloo, DistInfo(), ckpt) is None  # one process has no peer
