"""A process that imports what every notebook kernel imports, once, and forks one kernel per request.

``notebooks/run.py`` starts it (``python kernel_server.py MODULE ...``: the modules to import) with
the environment its kernels get, and writes one JSON line per kernel to its stdin::

    {"argv": ["-m", "ipykernel_launcher", "-f", "kernel-….json"], "env": {...}, "cwd": "..."}

The server forks; the child starts a session of its own (``setsid``: the kernel manager signals
its process group), takes ``env`` as its whole environment, ``cwd`` as its working folder and
first ``sys.path`` entry (what ``python -m`` gives), and runs the module as ``__main__``. The server
answers ``{"pid": N}`` once the child has its session, and ``{"exit": N, "code": C}`` when it ends
(``C`` as ``Popen.returncode``: minus the signal that killed it; ``"cpu"``, the seconds of CPU
it and its reaped children used). Each kernel is a fork of the
server as it was after its imports, so no kernel sees what another one did; what a fork skips is
importing torch, matplotlib and IPython anew (about 4 CPU-seconds a kernel). When its stdin
closes (the runner exited), the server terminates the kernels still running and exits.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import select
import signal
import sys


def _child(request: dict, ready: int) -> int:
    """In the forked child: become the kernel the request describes; returns its exit code."""
    os.setsid()
    os.write(ready, b"1")
    os.close(ready)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # what the kernel prints outside a cell goes where the server's stderr goes
    os.close(devnull)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = request["argv"]
    if argv[:1] != ["-m"]:
        raise SystemExit(f"kernel_server: expected ['-m', module, ...], got {argv}")
    sys.path[0] = os.getcwd()
    sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file first
    sys.orig_argv = [sys.executable, *argv]
    # a new interpreter draws its generators' seeds afresh (Python's random does so on fork)
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    try:
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    return 0


def _serve() -> int | None:
    """The server's loop; returns an exit code in a forked child (which then exits), None when
    the runner closed stdin."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: set[int] = set()
    buffer = b""

    def reply(message: dict) -> None:
        os.write(1, (json.dumps(message) + "\n").encode())

    while True:
        try:
            readable, _, _ = select.select([0, wake_r], [], [])
        except InterruptedError:
            readable = [wake_r]
        if wake_r in readable:
            os.read(wake_r, 4096)
            while children:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
                if pid == 0:
                    break
                children.discard(pid)
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                reply({"exit": pid, "code": code, "cpu": usage.ru_utime + usage.ru_stime})
        if 0 not in readable:
            continue
        data = os.read(0, 65536)
        if not data:  # the runner is gone: so are its kernels
            for pid in children:
                try:
                    os.killpg(pid, signal.SIGTERM)
                except OSError:
                    pass
            return None
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            ready_r, ready_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (wake_r, wake_w, ready_r):
                    os.close(fd)
                return _child(request, ready_w)
            os.close(ready_w)
            os.read(ready_r, 1)  # the child has its own session now
            os.close(ready_r)
            children.add(pid)
            reply({"pid": pid})


def main() -> int:
    for name in sys.argv[1:]:
        try:
            importlib.import_module(name)
        except Exception:  # the notebook that imports it shows the error in its cell
            pass
    code = _serve()
    if code is None:
        return 0
    # a kernel that ended: what exiting would run, without tearing down every module (a forked
    # kernel's objects would be copied from the server page by page only to be freed)
    import threading

    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
