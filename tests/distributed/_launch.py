"""Start a small process group for a test: fresh processes on 127.0.0.1, gloo on the CPU.

:func:`launch` runs ``fn(rank, world_size, *args)`` in ``world_size`` processes
(``OMP_NUM_THREADS=1``) joined in a gloo process group on a free port, and returns what each rank
returned, in rank order (through a file per rank). The processes are forked from a server process
(the ``forkserver`` start method) that imported torch and attnlab once, when this process
launched its first group: a rank starts in a fraction of a second instead of importing them anew
(seconds each, ``world_size`` at once on two cores), and nothing of the caller's state (threads,
an initialised group, pytest's) is inherited; their environment is the server's, the caller's
when it launched its first group. A rank that raises fails the caller with that rank's
traceback; a group that runs past ``timeout`` is killed and fails the caller, so a test never
hangs. ``fn`` must be a module-level function of an importable module (the processes import it
by name) and return something picklable.

:func:`command_line` is such a function: it runs a command line's ``main(argv)`` (``attnlab``'s, or
a test script's that registers a task first) on each rank as ``torchrun`` starts a worker
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` set; the group already joined, which
:func:`attnlab.training.processes.init_distributed` takes), and returns its exit code and output.
A test of what several processes compute uses it instead of a real ``torchrun``, whose agent and
workers each import torch anew (seconds each); what only the launcher does (its agent, a
rendezvous of nodes, a lost worker) keeps a real one (:mod:`tests.distributed._torchrun`).

Launches take turns across pytest-xdist workers (a lock file in the temporary folder), so that at
most one group's processes (the caller keeps ``world_size <= 4``) run at a time on a small machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import multiprocessing as mp
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from attnlab.cli import COMMANDS

__all__ = ["Finished", "command_line", "free_port", "launch"]

MAX_PROCESSES = 4
# what the fork server imports once, before it forks any rank (what every rank needs first; the
# command line's modules, which a rank of :func:`command_line` imports all of to build its parser:
# seconds of CPU a rank, once here)
_PRELOAD = ["torch", "torch.distributed", "attnlab", "attnlab.distributed", "pytest"]
_PRELOAD += ["attnlab.cli", *(f"attnlab.cli.{name}" for name in COMMANDS)]
# and what the ranks import lazily (~600 modules, about a second of CPU a rank, once here): the
# first ``torch.autograd.grad`` with ``grad_outputs`` imports the symbolic shapes (and sympy),
# the tensor- and context-parallel models DTensor, a sharded optimizer FSDP
_PRELOAD += ["torch.fx.experimental.symbolic_shapes", "torch.distributed.tensor"]
_PRELOAD += ["torch.distributed.tensor.parallel", "torch.distributed.fsdp"]
_PRELOAD += [f"attnlab.distributed.{name}" for name in ("tensor_parallel", "context_parallel")]
_PRELOAD += ["attnlab.distributed.mesh", "attnlab.tasks.algorithmic", "attnlab.tasks.translate"]
_LOCK = Path(tempfile.gettempdir()) / "attnlab-tests-distributed.lock"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _one_launch_at_a_time() -> Iterator[None]:
    with open(_LOCK, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _entry(
    rank: int,
    world_size: int,
    port: int,
    out: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    """One rank: join the group, run ``fn``, write ``("ok", result)`` or ``("error", traceback)``."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    result: tuple[str, Any]
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=60),
        )
        result = ("ok", fn(rank, world_size, *args))
    except BaseException:
        result = ("error", traceback.format_exc())
    tmp = Path(out) / f"{rank}.tmp"
    tmp.write_bytes(pickle.dumps(result))
    tmp.rename(Path(out) / f"{rank}.pkl")
    if result[0] == "ok" and dist.is_initialized():  # (a command line leaves it itself)
        dist.destroy_process_group()


@dataclasses.dataclass
class Finished:
    """How a command ended: its exit code and what it wrote (a command line on a launched rank,
    or a ``torchrun`` agent: :mod:`tests.distributed._torchrun`)."""

    returncode: int
    stdout: str
    stderr: str


def command_line(
    rank: int, world_size: int, main: Callable[[list[str]], int], argv: list[str]
) -> Finished:
    """Run ``main(argv)`` as rank ``rank`` of ``world_size`` workers that ``torchrun`` started.

    For :func:`launch`: the environment of a torchrun worker on one node (``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``), whose process group is the launched
    one; file descriptors 1 and 2 (whatever writes to them: ``print``, rich, logging) go to
    files, returned as the rank's output with its exit code (``SystemExit``'s too).
    """
    for name, value in (("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", world_size)):
        os.environ[name] = str(value)
    os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / "stdout", Path(tmp) / "stderr"]
        saved = [os.dup(1), os.dup(2)]
        try:
            for fd, path in zip((1, 2), paths):
                with open(path, "wb") as f:
                    os.dup2(f.fileno(), fd)
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
        out, err = (p.read_text(errors="replace") for p in paths)
    return Finished(int(code), out, err)


def launch(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120.0
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks of a fresh gloo group.

    Returns the ranks' results in rank order; raises ``AssertionError`` with the first failing
    rank's traceback, or when the group does not finish within ``timeout`` seconds.
    """
    if not 1 <= world_size <= MAX_PROCESSES:
        raise ValueError(f"world_size must be in [1, {MAX_PROCESSES}], got {world_size}")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # read when the server starts: the first launch
    with _one_launch_at_a_time(), tempfile.TemporaryDirectory() as out:
        old = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # read by the children when they import torch
        try:
            port = free_port()
            procs = [
                ctx.Process(target=_entry, args=(r, world_size, port, out, fn, args), daemon=True)
                for r in range(world_size)
            ]
            for p in procs:
                p.start()
        finally:
            if old is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = old
        files = [Path(out) / f"{r}.pkl" for r in range(world_size)]
        deadline = time.monotonic() + timeout
        failed_at: float | None = None
        try:
            while True:
                done = [f.exists() for f in files]
                loaded = {r: pickle.loads(f.read_bytes()) for r, f in enumerate(files) if done[r]}
                errors = [(r, text) for r, (kind, text) in loaded.items() if kind == "error"]
                if all(done) or (errors and failed_at is not None and time.monotonic() > failed_at):
                    break
                if errors and failed_at is None:
                    failed_at = time.monotonic() + 5.0  # give the others a moment to finish
                dead = [r for r, p in enumerate(procs) if not done[r] and p.exitcode is not None]
                if dead and not files[dead[0]].exists():
                    raise AssertionError(
                        f"rank {dead[0]} of {world_size} died (exit code "
                        f"{procs[dead[0]].exitcode}) without a result"
                    )
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"the group of {world_size} processes did not finish within {timeout:g} s "
                        f"(ranks done: {[r for r, d in enumerate(done) if d]})"
                    )
                time.sleep(0.05)
            if errors:
                rank, text = errors[0]
                raise AssertionError(f"rank {rank} of {world_size} raised:\n{text}")
            results = [loaded[r][1] for r in range(world_size)]
        finally:
            for p in procs:
                p.join(timeout=10)
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
    return results
