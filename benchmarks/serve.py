"""``attnlab serve``: time to first view and per-token latency, wall and the server's CPU.

Starts ``attnlab serve MODEL`` in a process of its own (loading the model is part of the time to
first view), waits until it answers, asks what the page asks for a first view (``/api/view``,
``/api/next``, ``/api/steps``), the head's card (``/api/card``: its cheap parts, then its mixing
and lens), then ``/api/generate`` of 1 and of 33 tokens (3 times each): the
per-token latency is their difference over 32 tokens. The server's CPU seconds are read from
``/proc`` (user + system), so a busy machine shows in the wall times, not in the CPU ones.

    python benchmarks/serve.py                      # smollm2-135m
    python benchmarks/serve.py --model runs/shk     # a trained run
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

TEXT = "The cat sat on the mat because the cat"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--text", default=TEXT)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, "-m", "attnlab", "serve", args.model, "--port", str(port)]
    )

    def cpu() -> float:
        fields = open(f"/proc/{server.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def post(path: str, body: dict) -> dict:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
            {"content-type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=600) as r:
                return json.loads(r.read())
        # the server's refusal (e.g. past its context) in one line, not a traceback
        except urllib.error.HTTPError as e:
            message = json.loads(e.read() or b"{}").get("error", e.reason)
            raise SystemExit(f"serve.py: {path} answered {e.code}: {message}") from None

    try:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/info", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit("the server exited") from None
                time.sleep(0.2)
        up, up_cpu = time.perf_counter() - start, cpu()
        t, c = time.perf_counter(), cpu()
        post("/api/view", {"text": args.text})
        post("/api/next", {"text": args.text})
        post("/api/steps", {"text": args.text, "layer": 0, "head": 0})
        first, first_cpu = time.perf_counter() - t, cpu() - c
        print(f"server answers: {up:.1f} s wall, {up_cpu:.1f} s CPU (loading the model)")
        print(f"first view (view + next + steps): {first:.2f} s wall, {first_cpu:.2f} s CPU")
        print(f"time to first view: {up + first:.1f} s wall, {up_cpu + first_cpu:.1f} s CPU")
        head = {"text": args.text, "layer": 0, "head": 0}
        for what, parts in (("first card (role scores and spectra: once per model)",
                             ["roles", "health", "spectrum"]),
                            ("its mixing and lens (once per text)", ["mixing", "lens"])):  # fmt: skip
            t, c = time.perf_counter(), cpu()
            post("/api/card", {**head, "parts": parts})
            print(f"{what}: {time.perf_counter() - t:.2f} s wall, {cpu() - c:.2f} s CPU")
        took = {}
        for n in (1, 33):
            t, c = time.perf_counter(), cpu()
            for _ in range(3):
                post("/api/generate", {"text": args.text, "n": n, "seed": 0})
            took[n] = ((time.perf_counter() - t) / 3, (cpu() - c) / 3)
        wall = (took[33][0] - took[1][0]) / 32
        per_cpu = (took[33][1] - took[1][1]) / 32
        print(f"generate 1 token: {took[1][0]:.2f} s wall, {took[1][1]:.2f} s CPU (a request)")
        print(f"per token: {wall * 1000:.0f} ms wall, {per_cpu * 1000:.0f} ms CPU")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
