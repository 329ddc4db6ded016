"""``attnlab demo`` — the main job: train a Transformer to reverse strings, on the CPU.

It trains the ``reverse`` task of ``attnlab train`` (an encoder-decoder, 2 + 2 layers,
``d_model = 128``) for about two minutes on an idle 2-core CPU (87 s measured; longer when
other work shares the cores) with a progress bar (plain lines, e.g.
``reverse step 120/1200  loss …``, when standard error is not a terminal), then prints
``exact-match accuracy: NN.N%`` on held-out strings with a few decoded examples, and leaves a
run folder (``--out``) with the checkpoint, ``metrics.jsonl``, ``attention.png`` (where the
decoder looked while writing one reversed string), ``attention.html`` (every layer and head in
the interactive viewer) and the attention of the probe string ``abcdefghij`` recorded while it
trained: ``training.png`` (the heads from step 0 to the end), ``training_entropy.png`` and
``training.html`` (the viewer with a step slider). Nothing is downloaded; no data file is read.

``attnlab demo --walkthrough`` instead prints the steps of attention for four token vectors:
x → Q, K, V → scaled scores → weights → output = weights · V.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from attnlab.cli._help import plain
from attnlab.cli.errors import CLIError
from attnlab.cli.options import seed
from attnlab.nn.attention import scaled_dot_product_attention

# the demo's length: about two minutes on an idle 2-core CPU (see benchmarks/reverse.py)
DEMO_STEPS = 1200
# the string whose attention is recorded while the demo trains (ten distinct letters)
DEMO_PROBE = "abcdefghij"


def demo_train_argv(out: str, steps: int, seed: int) -> list[str]:
    """The ``attnlab train reverse`` command line the demo runs.

    The task's defaults (2 + 2 layers, ``d_model`` 128, batch 64, Noam with factor 0.5 and
    200 warm-up steps) plus a linear cool-down of the rate to 0 over the last third of the run:
    without it the Noam rate is still high at the end and greedy exact-match hovers near 95%.
    The attention of :data:`DEMO_PROBE` is recorded every 1/24 of the run.
    """
    cooldown = max(1, steps // 3)
    return [
        "train", "reverse", "--out", out, "--steps", str(steps), "--seed", str(seed),
        "--cooldown", str(cooldown), "--cooldown-end", str(steps), "--eval-every", "0",
        "--probe", DEMO_PROBE, "--probe-every", str(max(1, steps // 24)),
    ]  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="the main job: train a Transformer to reverse strings (about 2 minutes on an idle "
        "2-core CPU)",
        description=plain(__doc__),
    )
    p.add_argument(
        "--out",
        default=None,
        help="run folder to create (default: runs/demo-YYYYMMDD-HHMMSS)",
    )
    p.add_argument(
        "--steps", type=int, default=DEMO_STEPS, help=f"optimizer steps (default {DEMO_STEPS})"
    )
    p.add_argument("--seed", type=seed, default=0, help="random seed (default 0)")
    p.add_argument(
        "--walkthrough",
        action="store_true",
        help="print attention step by step for four token vectors instead of training",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.walkthrough:
        return walkthrough(args.seed)
    if args.steps < 1:
        raise CLIError(f"--steps must be a positive int, got {args.steps}")
    out = Path(args.out) if args.out else Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    if out.exists() and any(out.iterdir()):
        raise CLIError(f"--out {out} already exists and is not empty; choose another folder")
    # the demo is `attnlab train reverse` (see demo_train_argv)
    from attnlab.cli import build_parser
    from attnlab.cli.train import run as train_run

    train_args = build_parser().parse_args(demo_train_argv(str(out), args.steps, args.seed))
    console = Console(stderr=True)
    console.print(
        "[bold]attnlab demo[/bold]: an encoder-decoder Transformer learns to reverse strings "
        f"({args.steps} steps on the {'GPU' if torch.cuda.is_available() else 'CPU'})",
        soft_wrap=True,
    )
    code = train_run(train_args)
    if code == 0:
        from attnlab.tasks.probe import write_training_figures

        stdout = Console()
        png, entropy, html = write_training_figures(out)
        stdout.print(
            f"attention during training ({DEMO_PROBE!r}): {png}, {entropy}", soft_wrap=True
        )
        stdout.print(f"training viewer (step slider): {html}", soft_wrap=True)
        stdout.print(f"run folder: {out}", soft_wrap=True)
    return code


# ---------------------------------------------------------------- the attention walkthrough


def _table(title: str, rows: torch.Tensor, row_names: list[str], col_names: list[str]) -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column("")
    for c in col_names:
        t.add_column(c, justify="right")
    for name, row in zip(row_names, rows.tolist()):
        t.add_row(name, *(f"{x:.3f}" for x in row))
    return t


def walkthrough(seed: int = 0) -> int:
    """Print x → Q, K, V → scores → weights → output for four token vectors."""
    console = Console()
    gen = torch.Generator().manual_seed(seed)
    tokens = ["the", "cat", "sat", "down"]
    d = 4
    x = torch.randn(len(tokens), d, generator=gen)
    w_q, w_k, w_v = (torch.randn(d, d, generator=gen) / d**0.5 for _ in range(3))
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    scores = q @ k.T / d**0.5
    causal = torch.ones(len(tokens), len(tokens), dtype=torch.bool).tril()
    weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    out = weights @ v
    check = scaled_dot_product_attention(
        q[None, None], k[None, None], v[None, None], is_causal=True
    )
    dims = [f"d{i}" for i in range(d)]
    console.print(_table("x: token vectors", x, tokens, dims))
    console.print(_table("Q = x W_Q", q, tokens, dims))
    console.print(_table("K = x W_K", k, tokens, dims))
    console.print(_table("V = x W_V", v, tokens, dims))
    console.print(_table("scores = Q Kᵀ / √d", scores, tokens, tokens))
    console.print(_table("weights = softmax(scores + causal mask)", weights, tokens, tokens))
    console.print(_table("output = weights · V", out, tokens, dims))
    err = float((check[0, 0] - out).abs().max())
    console.print(f"attnlab.scaled_dot_product_attention agrees: max |difference| = {err:.1e}")
    return 0
