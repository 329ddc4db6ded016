"""What each efficient attention loses: language modelling at an equal CPU budget, and a long-range
retrieval task that a sliding window cannot solve.

**lm** — the same small GPT (4 layers, 4 heads, ``n_embd`` 128, characters) trained on
tinyshakespeare with context 1024, once per attention, each for the same CPU time. Every run is
``attnlab train lm`` in a subprocess with one thread; its CPU seconds per step are measured first
(two short runs, their difference, so start-up and evaluation cancel out), and the number of steps
is the budget divided by that (the cosine schedule ends at the last step, so each run completes
its schedule). Reported: steps, CPU and wall seconds of the run, and the validation loss (the last
10% of the characters, ``--eval-iters`` batches of 1024-character windows). Linformer is not in
this table: it cannot be causal (every projected key mixes future positions).

**copy** — selective copy at a distance (Gu & Dao 2023, "Mamba", §4.1.1, moved far from the answer):
the first ``2N`` positions hold ``N = 8`` symbols (of 16; ``--symbols N``) at random places among
noise tokens, then noise up to a marker, then the model must write the ``N`` symbols in order. The
answer is ``T − 2N ≫ window × layers`` positions from the symbols, so a 2-layer sliding-window model
(``w = 16``, receptive field 32) cannot see them, while BigBird's global block (positions 0…15, seen
by every query) holds them. Reported: accuracy per symbol on 512 held-out sequences (``--held-out``) for full,
sliding, BigBird (1 global block, a band of 3 blocks, 1 random block; blocks of 16), the same
BigBird *without* its global block (band and random blocks only), and Performer.

Usage::

    python benchmarks/long_quality.py                      # both: about 35 CPU minutes
    python benchmarks/long_quality.py copy                 # about 9 CPU minutes
    python benchmarks/long_quality.py lm --budget 300      # 300 CPU seconds per attention
    python benchmarks/long_quality.py copy --quick         # seconds, to check the script
    attnlab bench long_quality --args "copy"

Prints a table and one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from attnlab import GPT, GPTConfig
from attnlab.data import corpora

DATA = "tinyshakespeare"  # packaged with attnlab (attnlab.data.corpora)

# ------------------------------------------------------------------------------------ copy task

N_SYMBOLS, SYMBOLS, NOISE = 8, 16, 8
MARK = SYMBOLS + NOISE  # token ids: symbols 0…15, noise 16…23, the marker 24
COPY_ATTENTIONS: dict[str, dict[str, object]] = {
    "full": {},
    "sliding (w=16)": {"attention": "sliding", "window": 16},
    "bigbird (b=16, 1 global)": {
        "attention": "bigbird", "block_size": 16, "global_blocks": 1, "window_blocks": 3,
        "num_random_blocks": 1,
    },
    "bigbird, no global block": {
        "attention": "bigbird", "block_size": 16, "global_blocks": 0, "window_blocks": 3,
        "num_random_blocks": 1,
    },
    "performer": {"attention": "performer"},
}  # fmt: skip


def selective_copy(
    n: int, length: int, gen: torch.Generator, symbols: int = N_SYMBOLS
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences: ``N = symbols`` symbols at random places of the first ``2N`` positions
    among noise, noise, the marker, the symbols again; labels are the tokens of the answer
    (``-100`` elsewhere).

    Shape:
        tokens and labels ``(n, length)``.
    """
    x = SYMBOLS + torch.randint(NOISE, (n, length), generator=gen)
    data = torch.randint(SYMBOLS, (n, symbols), generator=gen)
    places = torch.stack(
        [torch.randperm(2 * symbols, generator=gen)[:symbols].sort().values for _ in range(n)]
    )
    x.scatter_(1, places, data)
    x[:, length - symbols - 1] = MARK
    x[:, length - symbols :] = data
    labels = torch.full_like(x, -100)
    labels[:, length - symbols :] = data  # GPT predicts labels[t + 1] from position t
    return x, labels


def copy_accuracy(model: GPT, tokens: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of answer symbols predicted right (greedy, teacher-forced)."""
    model.eval()
    with torch.no_grad():
        guess = model(tokens).logits[:, :-1].argmax(-1)
    model.train()
    target = labels[:, 1:]
    seen = target != -100
    return float((guess[seen] == target[seen]).float().mean())


def train_copy(
    name: str, options: dict[str, object], args: argparse.Namespace
) -> dict[str, object]:
    """Train a 2-layer GPT on selective copy with one attention; its held-out accuracy."""
    torch.manual_seed(args.seed)
    config = GPTConfig(
        vocab_size=MARK + 1, n_positions=args.length, n_embd=64, n_layer=2, n_head=4,
        **options,  # type: ignore[arg-type]
    )  # fmt: skip
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed + 1)
    held_out = selective_copy(
        args.held_out, args.length, torch.Generator().manual_seed(10_000), args.symbols
    )
    start, cpu = time.perf_counter(), time.process_time()
    for step in range(1, args.steps + 1):
        # linear warm-up, cosine down to a tenth
        warm = min(1.0, step / 50)
        for group in optimizer.param_groups:
            group["lr"] = (
                args.lr * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * step / args.steps)))
            )
        tokens, labels = selective_copy(args.copy_batch, args.length, gen, args.symbols)
        loss = model(tokens, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return {
        "task": "selective_copy", "attention": name, "length": args.length, "symbols": args.symbols,
        "steps": args.steps, "train_loss": round(loss.item(), 4),
        "accuracy": round(copy_accuracy(model, *held_out), 4),
        "chance": round(1 / SYMBOLS, 4), "cpu_s": round(time.process_time() - cpu, 1),
        "wall_s": round(time.perf_counter() - start, 1),
    }  # fmt: skip


# --------------------------------------------------------------------------------- lm at a budget

LM_ATTENTIONS: dict[str, list[str]] = {
    "full": [],
    "sliding (w=128)": ["--attention", "sliding", "--window", "128"],
    "bigbird (b=32, 1 global, 3 band, 2 random)": [
        "--attention", "bigbird", "--bigbird-block", "32", "--global-blocks", "1",
        "--window-blocks", "3", "--random-blocks", "2",
    ],
    "performer (m=111)": ["--attention", "performer"],
}  # fmt: skip


def _train_lm(extra: list[str], steps: int, out: Path, args: argparse.Namespace) -> dict:
    """One ``attnlab train lm`` run in a subprocess with one thread: its CPU seconds, wall
    seconds and last evaluation."""
    command = [
        sys.executable, "-m", "attnlab", "train", "lm", "--data", args.data, "--out", str(out),
        "--steps", str(steps), "--seed", str(args.seed), "--block-size", str(args.context),
        "--batch-size", str(args.lm_batch), "--n-layer", "4", "--n-head", "4",
        "--n-embd", "128", "--dropout", "0.0", "--lr", "2e-3", "--min-lr", "2e-4",
        "--warmup", str(max(1, min(30, steps // 10))), "--lr-decay-steps", str(steps),
        "--eval-iters", str(args.eval_iters), "--eval-every", "0", "--device", "cpu", *extra,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "wall_s": time.perf_counter() - start,
        "eval": [x for x in lines if x["kind"] == "eval"][-1],
    }


def train_lm(name: str, extra: list[str], args: argparse.Namespace) -> dict[str, object]:
    """Calibrate the CPU seconds per step, then train for the budget; the validation loss."""
    with tempfile.TemporaryDirectory() as tmp:
        short, longer = args.calibrate
        a = _train_lm(extra, short, Path(tmp) / "a", args)
        b = _train_lm(extra, longer, Path(tmp) / "b", args)
        per_step = max((b["cpu_s"] - a["cpu_s"]) / (longer - short), 1e-3)
        steps = longer if args.quick else max(longer, int(args.budget / per_step))
        run = _train_lm(extra, steps, Path(tmp) / "run", args)
    return {
        "task": "tinyshakespeare", "attention": name, "context": args.context,
        "cpu_s_per_step": round(per_step, 3), "steps": steps,
        "train_cpu_s": round(steps * per_step, 1), "run_cpu_s": round(run["cpu_s"], 1),
        "run_wall_s": round(run["wall_s"], 1),
        "val_loss": round(run["eval"]["val_loss"], 4),
        "train_loss": round(run["eval"]["train_loss"], 4),
    }  # fmt: skip


# ----------------------------------------------------------------------------------------- main


@dataclass
class Column:
    key: str
    title: str


def _table(title: str, rows: list[dict[str, object]], columns: list[Column]) -> Table:
    table = Table(title=title)
    for c in columns:
        table.add_column(c.title, justify="left" if c.key == "attention" else "right")
    for row in rows:
        table.add_row(*(str(row[c.key]) for c in columns))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", nargs="?", choices=["copy", "lm", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="tiny runs, to check the script")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="+", help="attentions to run (first word of the names)")
    copy = parser.add_argument_group("copy: selective copy at a distance > window x layers")
    copy.add_argument("--length", type=int, default=128, help="sequence length (default 128)")
    copy.add_argument("--steps", type=int, default=1500, help="training steps (default 1500)")
    copy.add_argument("--copy-batch", type=int, default=32, help="sequences a step (default 32)")
    copy.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    copy.add_argument(
        "--held-out", type=int, default=512, help="sequences of the accuracy (default 512)"
    )
    copy.add_argument(
        "--symbols", type=int, default=N_SYMBOLS, help=f"symbols to copy (default {N_SYMBOLS})"
    )
    lm = parser.add_argument_group("lm: tinyshakespeare at an equal CPU budget")
    lm.add_argument(
        "--data", default=DATA, help=f"a packaged dataset or a text file (default {DATA})"
    )
    lm.add_argument("--budget", type=float, default=300.0, help="CPU seconds of training per run")
    lm.add_argument("--context", type=int, default=1024, help="context length (default 1024)")
    lm.add_argument("--lm-batch", type=int, default=8, help="sequences a step (default 8)")
    lm.add_argument("--eval-iters", type=int, default=20, help="validation batches (default 20)")
    lm.add_argument("--calibrate", type=int, nargs=2, default=(3, 8), metavar=("SHORT", "LONG"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    console = Console()

    def wanted(name: str) -> bool:
        return not args.only or name.split()[0] in args.only or name in args.only

    if args.task in ("copy", "all"):
        if args.quick:
            # the script works; the table says nothing (so a few sequences to train and score)
            args.steps, args.length, args.copy_batch, args.held_out = 4, 64, 8, 32
        rows: list[dict[str, object]] = []
        for name, options in COPY_ATTENTIONS.items():
            if wanted(name):
                rows.append(train_copy(name, options, args))
                print(json.dumps(rows[-1]), flush=True)
        columns = ["attention", "accuracy", "chance", "train_loss", "steps", "cpu_s"]
        n = args.symbols
        title = (
            f"selective copy, T = {args.length}: {n} symbols in positions 0…{2 * n - 1}, "
            "answer at the end"
        )
        console.print(_table(title, rows, [Column(c, c) for c in columns]))
    if args.task in ("lm", "all"):
        if not corpora.is_dataset(args.data, kind="text") and not Path(args.data).is_file():
            print(f"long_quality: data file not found: {args.data}", file=sys.stderr)
            return 2
        if args.quick:
            args.budget, args.context, args.eval_iters, args.calibrate = 3.0, 128, 2, (2, 3)
        rows = []
        for name, extra in LM_ATTENTIONS.items():
            if wanted(name):
                rows.append(train_lm(name, extra, args))
                print(json.dumps(rows[-1]), flush=True)
        columns = ["attention", "val_loss", "train_loss", "steps", "cpu_s_per_step", "run_cpu_s"]
        title = f"tinyshakespeare, context {args.context}: {args.budget:g} CPU s of training each"
        console.print(_table(title, rows, [Column(c, c) for c in columns]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
