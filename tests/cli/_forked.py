"""``python -m attnlab ARGS`` in a process of its own, many times, for the price of one start-up.

A test that must run the command line in a child process (to cap its address space, to kill it
after a deadline, to read its exit code and its stderr as a user would) paid for a fresh
interpreter each time: importing torch and every command's module, ~5 s of CPU on the 2-core test
machine. :class:`ForkedCLI` starts one server process that imports the command line once (what
``attnlab``'s own start-up imports: ``build_parser()``); each :meth:`ForkedCLI.run` forks a child
of it that caps its address space, points its stdin at ``/dev/null`` and its stdout and stderr at
files, and runs ``attnlab/__main__.py`` as ``python -m attnlab`` does (``runpy``) — the same entry
point, a process of its own, its real exit code; a child past its deadline is killed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["ForkedCLI"]

_SERVER = r"""
import json, os, resource, runpy, signal, sys, time, traceback

from attnlab.cli import build_parser

build_parser()  # imports every command's module, as the command line's start-up does
sys.stdout.flush()
reply = os.fdopen(os.dup(1), "w")  # the replies' pipe; what else is printed goes to stderr
os.dup2(2, 1)
print("ready", file=reply, flush=True)


def child(req):
    code = 1
    try:
        if req["address_space"]:
            resource.setrlimit(resource.RLIMIT_AS, (req["address_space"], req["address_space"]))
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
        os.dup2(os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        sys.argv = ["attnlab", *req["args"]]  # argv[0] becomes __main__.py's path, as under -m
        try:
            runpy.run_module("attnlab", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:  # what the interpreter makes of sys.exit(...)
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(req)
    deadline = time.monotonic() + req["timeout"]
    status = None
    while status is None:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(raw)
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        else:
            time.sleep(0.01)
    print(json.dumps({"returncode": status}), file=reply, flush=True)
"""


class ForkedCLI:
    """A server that forks a ``python -m attnlab`` child per :meth:`run` (close it when done)."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="attnlab-forked-cli-")
        self._log = open(Path(self._dir.name) / "server.err", "w+")
        self._server = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
        )  # fmt: skip
        if self._read() != "ready":
            raise RuntimeError(f"the attnlab fork server did not start:\n{self._tail()}")

    def _read(self) -> str:
        assert self._server.stdout is not None
        return self._server.stdout.readline().strip()

    def _tail(self) -> str:
        self._log.seek(0)
        return self._log.read()[-4000:]

    def run(
        self, *args: str, timeout: float, address_space: int | None = None
    ) -> tuple[int | None, str, str]:
        """Run ``python -m attnlab ARGS`` in a child; returns ``(exit code, stdout, stderr)``,
        the exit code ``None`` when the child ran past ``timeout`` seconds and was killed (a
        signal's death is ``-signal``, as :mod:`subprocess` reports it)."""
        out, err = Path(self._dir.name) / "stdout", Path(self._dir.name) / "stderr"
        request = {
            "args": list(args), "timeout": timeout, "address_space": address_space,
            "stdout": str(out), "stderr": str(err),
        }  # fmt: skip
        assert self._server.stdin is not None
        self._server.stdin.write(json.dumps(request) + "\n")
        self._server.stdin.flush()
        line = self._read()
        if not line:
            raise RuntimeError(f"the attnlab fork server died:\n{self._tail()}")
        code = json.loads(line)["returncode"]
        read = lambda p: p.read_text(encoding="utf-8", errors="replace")  # noqa: E731
        return code, read(out), read(err)

    def close(self) -> None:
        """Stop the server (it holds nothing to save: killed at once)."""
        self._server.kill()
        self._server.wait()
        for pipe in (self._server.stdin, self._server.stdout):
            if pipe is not None:
                pipe.close()
        self._log.close()
        self._dir.cleanup()
