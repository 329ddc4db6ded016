"""tinyshakespeare with nanoGPT's CPU recipe: validation loss and wall time.

nanoGPT (README, "I only have a macbook"): 4 layers, 4 heads, n_embd 128, context 64, batch 12,
2000 iterations, no dropout, lr 1e-3 → 1e-4 (cosine, 100 warm-up), first 90% of the characters
train and the last 10% validate; it reports a validation loss of about 1.88.

    python benchmarks/shakespeare.py           # the full recipe (target: val loss <= 1.88)
    python benchmarks/shakespeare.py --quick   # 50 iterations, to check the script works

Reads tinyshakespeare, packaged with attnlab (``--data FILE`` reads another text). Prints one JSON
line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from attnlab import tasks
from attnlab.errors import AttnlabError

DATA = "tinyshakespeare"  # packaged with attnlab (attnlab.data.corpora)
TARGET = 1.88


def main_(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="50 iterations, to check the script")
    p.add_argument(
        "--data", default=DATA, help=f"a packaged dataset or a text file (default {DATA})"
    )
    p.add_argument("--steps", type=int, default=None, help="default 2000 (the recipe)")
    p.add_argument("--eval-iters", type=int, default=200, help="validation batches (default 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-bias", action="store_true", help="no biases (nanoGPT's own default)")
    p.add_argument("--out", default=None, help="run folder (default: a temporary one)")
    args = p.parse_args(argv)
    steps = args.steps or (50 if args.quick else 2000)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(args.out) if args.out else Path(tmp) / "shakespeare"
        start = time.perf_counter()
        # nanoGPT's CPU recipe (also the task's defaults, spelled out here)
        try:
            tasks.train(
                "lm", data=args.data, out=run, steps=steps, seed=args.seed,
                eval_iters=args.eval_iters, eval_every=0, n_layer=4, n_head=4, n_embd=128,
                block_size=64, batch_size=12, dropout=0.0, lr=1e-3, min_lr=1e-4, warmup=100,
                lr_decay_steps=2000, bias=not args.no_bias, report=Console(),
            )  # fmt: skip
        except AttnlabError as exc:
            print(f"shakespeare: {exc}", file=sys.stderr)
            return 2
        wall = time.perf_counter() - start
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        final = [x for x in lines if x["kind"] == "eval"][-1]
    result = {
        "benchmark": "shakespeare_char",
        "steps": steps,
        "wall_s": round(wall, 1),
        "val_loss": round(final["val_loss"], 4),
        "train_loss": round(final["train_loss"], 4),
        "nanogpt_val_loss": TARGET,
        "ratio_to_nanogpt": round(final["val_loss"] / TARGET, 4),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main_())
