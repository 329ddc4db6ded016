"""Start real ``torchrun`` agents for a test, on 127.0.0.1, so that a test can never hang.

:func:`torchrun` runs one agent with ``N`` worker processes (one "node");
:func:`torchrun_nodes` runs several agents that meet through a c10d rendezvous on one endpoint,
each standing for a node of its own (``--nnodes K --nproc-per-node 1``), as a multi-machine
launch does. Every agent runs in its own process group (session) with its output in a file;
when one fails the others get a few seconds, and on the deadline (or any failure of the caller)
the whole process group of every agent — the agent and its workers — is killed with SIGKILL.

Launches take turns with the other process-group tests (:mod:`tests.distributed._launch`'s lock),
so that at most one group of processes runs at a time on a small machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests.distributed._launch import Finished, _one_launch_at_a_time, free_port

__all__ = ["Finished", "torchrun", "torchrun_nodes"]

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
    }


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the agent's whole session (the agent and its workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


def _run(commands: list[list[str]], timeout: float, grace: float = 15.0) -> list[Finished]:
    """Start the agents, wait for all of them (killing all of them on the deadline)."""
    with _one_launch_at_a_time(), tempfile.TemporaryDirectory() as logs:
        procs: list[subprocess.Popen[bytes]] = []
        outs = []
        try:
            for i, cmd in enumerate(commands):
                out = open(Path(logs) / f"{i}.out", "wb")
                err = open(Path(logs) / f"{i}.err", "wb")
                outs.append((out, err))
                procs.append(
                    subprocess.Popen(
                        cmd, stdout=out, stderr=err, env=_env(), cwd=REPO, start_new_session=True
                    )
                )
            deadline = time.monotonic() + timeout
            while any(p.poll() is None for p in procs):
                failed = any(p.returncode not in (None, 0) for p in procs)
                if failed:  # the others cannot finish without it: a few seconds, then kill
                    deadline = min(deadline, time.monotonic() + grace)
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            late = [i for i, p in enumerate(procs) if p.poll() is None]
        finally:
            for p in procs:
                if p.poll() is None:
                    _kill(p)
            for out, err in outs:
                out.close()
                err.close()
        finished = [
            Finished(
                p.returncode,
                (Path(logs) / f"{i}.out").read_text(errors="replace"),
                (Path(logs) / f"{i}.err").read_text(errors="replace"),
            )
            for i, p in enumerate(procs)
        ]
    if late:
        tails = "\n".join(f"--- agent {i}:\n{finished[i].stderr[-2000:]}" for i in late)
        raise AssertionError(f"torchrun agents {late} did not finish within {timeout:g} s\n{tails}")
    return finished


def torchrun(script: list[str], *, nproc: int = 2, timeout: float = 240.0) -> Finished:
    """Run ``torchrun --nproc_per_node NPROC SCRIPT...`` (one node) and return how it ended.

    Args:
        script: the script and its arguments (``["path/to/file.py", ...]`` or ``["-m", "attnlab",
            ...]``).
        nproc: worker processes (at most 4).
        timeout: seconds before the agent and its workers are killed (the test then fails).
    """
    if not 1 <= nproc <= 4:
        raise ValueError(f"nproc must be in [1, 4], got {nproc}")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        *script,
    ]
    return _run([cmd], timeout)[0]


def torchrun_nodes(
    script: list[str], *, nodes: int = 2, nproc_per_node: int = 1, timeout: float = 240.0
) -> list[Finished]:
    """Run ``nodes`` torchrun agents as separate nodes meeting at one c10d rendezvous endpoint.

    Each agent runs ``torchrun --nnodes NODES --nproc-per-node NPROC_PER_NODE --rdzv-backend
    c10d --rdzv-endpoint 127.0.0.1:PORT --rdzv-id ID --local-addr 127.0.0.1 SCRIPT...``, as one
    would on each machine (the first agent to reach the endpoint hosts the rendezvous store).

    Returns:
        How each agent ended, in start order.
    """
    if not 1 <= nodes * nproc_per_node <= 4:
        raise ValueError(f"at most 4 processes, got {nodes} nodes x {nproc_per_node}")
    endpoint = f"127.0.0.1:{free_port()}"
    run_id = f"attnlab-test-{uuid.uuid4().hex[:8]}"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        str(nproc_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        run_id,
        "--local-addr",
        "127.0.0.1",
        *script,
    ]
    return _run([cmd] * nodes, timeout)
