"""Reverse task: exact-match accuracy on held-out strings and wall time (the `attnlab demo` run).

    python benchmarks/reverse.py            # the demo's configuration (target: >= 99% in ~2 min)
    python benchmarks/reverse.py --quick    # a few steps, to check the script works

Prints one JSON line: steps, wall seconds, exact-match accuracy, and the ratio to the 99% target.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from attnlab.cli import main
from attnlab.cli.demo import DEMO_STEPS

TARGET = 0.99


def last_eval(run: Path) -> dict:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if x["kind"] == "eval"][-1]


def main_(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="20 steps, to check the script")
    p.add_argument("--steps", type=int, default=None, help=f"default {DEMO_STEPS} (the demo)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="run folder (default: a temporary one)")
    args = p.parse_args(argv)
    steps = args.steps or (20 if args.quick else DEMO_STEPS)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(args.out) if args.out else Path(tmp) / "reverse"
        start = time.perf_counter()
        code = main(["demo", "--out", str(run), "--steps", str(steps), "--seed", str(args.seed)])
        wall = time.perf_counter() - start
        if code != 0:
            return code
        acc = last_eval(run)["exact_match"]
    result = {
        "benchmark": "reverse",
        "steps": steps,
        "wall_s": round(wall, 1),
        "exact_match": acc,
        "target": TARGET,
        "ratio_to_target": round(acc / TARGET, 4),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main_())
