"""Execute the learning-path notebooks: jupytext sources in, executed ``.ipynb`` out.

Each notebook is a plain-text jupytext "percent" file (``notebooks/NN_name.py``) whose first code
cell holds ``FULL = False``. This script runs it in a fresh Jupyter kernel and writes the executed
notebook, outputs included, to ``build/notebooks/NN_name.ipynb``: the documentation site renders
those, and the test suite runs every notebook through :func:`execute` at the small size.

An executed notebook records a key, the SHA-256 of its source, the size it ran at and every file of
``src/attnlab``; a notebook whose key is unchanged is not run again (``--force`` runs it anyway)::

    python notebooks/run.py                 # every notebook, small size, two at a time
    python notebooks/run.py 03 05 --full    # notebooks 03 and 05 at full size
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jupytext
import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SOURCE = REPO / "src" / "attnlab"
BUILD = REPO / "build" / "notebooks"
SWITCH = re.compile(r"^FULL = False\b", re.MULTILINE)
# what every notebook imports (and the kernel itself), what constructing an optimizer imports
# (torch._dynamo, 2 CPU-s) and what the eight notebooks that train through attnlab.tasks import
# (0.4 CPU-s): the kernel server imports them once
PRELOAD = [
    "torch", "numpy", "matplotlib", "matplotlib.figure", "attnlab", "attnlab.inspect", "attnlab.viz",
    "torch._dynamo", "attnlab.tasks", "ipykernel.kernelapp", "ipykernel.ipkernel",
]  # fmt: skip


@dataclass(frozen=True)
class Executed:
    """One notebook run: its executed form, where it was written and how long the kernel took."""

    name: str
    notebook: nbformat.NotebookNode
    path: Path
    seconds: float
    reused: bool


def sources() -> list[Path]:
    """The notebooks of the learning path, in order (``NN_name.py``)."""
    return sorted(HERE.glob("[0-9][0-9]_*.py"))


def _library_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(SOURCE.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(SOURCE)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def cache_key(source: Path, *, full: bool, library: str | None = None) -> str:
    """What an executed notebook depends on: its text, its size and the library's code."""
    h = hashlib.sha256()
    h.update(source.read_bytes())
    h.update(b"full" if full else b"small")
    h.update((library or _library_digest()).encode())
    return h.hexdigest()


def load(source: Path, *, full: bool) -> nbformat.NotebookNode:
    """Read a jupytext source; with ``full`` its ``FULL = False`` switch is turned on."""
    nb = jupytext.read(source)
    code = [c for c in nb.cells if c.cell_type == "code"]
    if not code or not SWITCH.search(code[0].source):
        raise ValueError(f"{source.name}: the first code cell must hold the line 'FULL = False'")
    if full:
        code[0].source = SWITCH.sub("FULL = True", code[0].source)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def execute(
    source: Path,
    *,
    full: bool = False,
    out_dir: Path = BUILD,
    force: bool = False,
    threads: int | None = None,
    timeout: int = 600,
    library: str | None = None,
    fork: bool = True,
) -> Executed:
    """Run one notebook in a fresh kernel (working folder: ``notebooks/``) and write it executed.

    Args:
        source: the jupytext file.
        full: run at full size (``FULL = True``).
        out_dir: where the executed ``.ipynb`` goes.
        force: run even when the stored key matches.
        threads: ``OMP_NUM_THREADS`` for the kernel (the tests give each of their two workers one).
        timeout: seconds one cell may take.
        library: the digest of ``src/attnlab`` when the caller has it already.
        fork: start the kernel as a fork of a kernel server that imported :data:`PRELOAD`
            (:class:`ForkingKernelManager`) rather than as a new interpreter.

    Returns:
        The :class:`Executed` run. A failing cell raises ``nbclient``'s ``CellExecutionError``
        naming the cell and the error; nothing is written then.
    """
    key = cache_key(source, full=full, library=library)
    out = out_dir / (source.stem + ".ipynb")
    if not force and out.exists():
        old = nbformat.read(out, as_version=4)
        meta = old.metadata.get("attnlab", {})
        if meta.get("key") == key:
            return Executed(source.stem, old, out, float(meta.get("seconds", 0.0)), True)
    nb = load(source, full=full)
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        kernel_manager_class=ForkingKernelManager if fork else AsyncKernelManager,
        resources={"metadata": {"path": str(HERE)}},
    )
    start = time.perf_counter()
    client.execute(env=env)
    seconds = time.perf_counter() - start
    nb.metadata["attnlab"] = {"key": key, "seconds": round(seconds, 1), "full": full}
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    nbformat.write(nb, tmp)
    tmp.replace(out)
    return Executed(source.stem, nb, out, seconds, False)


class _Forked:
    """A kernel the server forked: the part of ``subprocess.Popen`` the kernel manager uses."""

    stdin = stdout = stderr = None

    def __init__(self, server: _KernelServer, pid: int) -> None:
        self.server, self.pid = server, pid

    @property
    def returncode(self) -> int | None:
        return self.server.exits.get(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self.server.changed:
            if not self.server.changed.wait_for(lambda: self.returncode is not None, timeout):
                raise subprocess.TimeoutExpired(f"kernel {self.pid}", timeout or 0)
        return self.server.exits[self.pid]

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:  # its pid may be another process's once it has ended
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class _KernelServer:
    """``kernel_server.py`` running with one environment: it forks the kernels started with it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "kernel_server.py"), *PRELOAD],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=HERE,
            start_new_session=True,
        )  # fmt: skip
        self.lock = threading.Lock()  # one request and its answer at a time
        self.changed = threading.Condition()
        self.exits: dict[int, int] = {}
        self.cpu: dict[int, float] = {}  # CPU-seconds of each kernel that ended
        self.started: list[int] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            with self.changed:
                if "exit" in message:
                    self.exits[message["exit"]] = message["code"]
                    self.cpu[message["exit"]] = message["cpu"]
                else:
                    self.started.append(message["pid"])
                self.changed.notify_all()
        with self.changed:
            self.started.append(-1)  # the server is gone
            self.changed.notify_all()

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str) -> _Forked:
        assert self.process.stdin is not None
        with self.lock:
            request = {"argv": argv, "env": env, "cwd": cwd}
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
            with self.changed:
                self.changed.wait_for(lambda: bool(self.started))
                pid = self.started.pop(0)
        if pid < 0:
            raise RuntimeError(f"the kernel server exited ({self.process.wait()})")
        return _Forked(self, pid)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()  # it terminates its kernels and exits
        self.process.wait(timeout=30)


_SERVERS: dict[tuple[tuple[str, str], ...], _KernelServer] = {}
_SERVERS_LOCK = threading.Lock()


def _server(env: dict[str, str]) -> _KernelServer:
    """The server whose kernels get ``env``: one per environment, a module may read it on import
    (ipykernel reads ``JPY_PARENT_PID``, the runner's pid, torch ``OMP_NUM_THREADS``)."""
    key = tuple(sorted(env.items()))
    with _SERVERS_LOCK:
        if key not in _SERVERS or _SERVERS[key].process.poll() is not None:
            if not _SERVERS:
                atexit.register(lambda: [s.close() for s in _SERVERS.values()])
            _SERVERS[key] = _KernelServer(dict(key))
        return _SERVERS[key]


class ForkingKernelManager(AsyncKernelManager):
    """Starts a Python kernel (``python -m ipykernel_launcher``) as a fork of a kernel server that
    has imported :data:`PRELOAD` already, rather than as a new interpreter; other kernels as usual."""

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        python, *argv = kernel_cmd
        if argv[:2] != ["-m", "ipykernel_launcher"] or (
            os.path.realpath(python) != os.path.realpath(sys.executable)
        ):
            return await super()._async_launch_kernel(kernel_cmd, **kw)
        env = dict(kw.get("env") or os.environ, JPY_PARENT_PID=str(os.getpid()))
        cwd = str(kw.get("cwd") or os.getcwd())
        process = _server(env).spawn(argv, env, cwd)
        provisioner: Any = self.provisioner  # a LocalProvisioner: what its launch_kernel sets
        provisioner.process, provisioner.pid, provisioner.pgid = process, process.pid, process.pid
        provisioner.cwd = cwd
        self._reconcile_connection_info(provisioner.connection_info)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="notebook numbers or names (default: all)")
    p.add_argument("--full", action="store_true", help="full size (FULL = True)")
    p.add_argument("--force", action="store_true", help="run even when the output is current")
    p.add_argument("--jobs", type=int, default=2, help="notebooks run at once (default 2)")
    p.add_argument(
        "--timeout", type=int, default=600, help="seconds one cell may take (default 600)"
    )
    p.add_argument("--out", type=Path, default=BUILD, help=f"default {BUILD.relative_to(REPO)}")
    args = p.parse_args(argv)
    chosen = [
        s for s in sources() if not args.names or any(s.stem.startswith(n) for n in args.names)
    ]
    if not chosen:
        p.error(f"no notebook matches {args.names}")
    library = _library_digest()
    threads = max(1, (os.cpu_count() or 1) // max(1, args.jobs))

    def one(source: Path) -> Executed:
        run = execute(
            source, full=args.full, out_dir=args.out, force=args.force, threads=threads,
            timeout=args.timeout, library=library,
        )  # fmt: skip
        state = "current" if run.reused else f"ran in {run.seconds:.1f} s"
        sys.stderr.write(f"{run.name}: {state} → {run.path}\n")
        return run

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
