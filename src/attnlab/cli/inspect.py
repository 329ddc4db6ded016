"""``attnlab inspect RUN --text TEXT`` — a health table of every attention head.

Loads a run folder (its latest checkpoint), a checkpoint directory or a Hugging Face GPT-2
directory, runs the text through the model while capturing the attention weights, and prints per
layer and head: entropy, maximum weight, row-sum error, fully masked rows and non-finite weights,
with the first NaN/inf located to layer, head and position (``--long``: from blockwise row
statistics, without ever forming the ``T × T`` weights). For the encoder-decoder the text is
the source; the target is ``--target`` or the model's own greedy output. ``--json`` prints the
report as JSON instead. Exit code 0 when every head is healthy, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import torch
from rich import box
from rich.console import Console
from rich.table import Table

from attnlab.cli import CLIError
from attnlab.inspect.capture import ActivationCache, capture
from attnlab.inspect.diagnostics import HealthReport, diagnose
from attnlab.inspect.loading import LoadedModel, load_model
from attnlab.models.config import TransformerConfig


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="health of every attention head of a trained model on a text",
        description="Run TEXT through a run's latest checkpoint (or a checkpoint / GPT-2 folder) "
        "and print entropy, max weight, row sums, masked rows and NaN/inf per layer and head.",
    )
    p.add_argument("run", metavar="RUN", help="run folder, checkpoint folder or GPT-2 directory")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the input text (the source for an encoder-decoder)")
    src.add_argument("--ids", help="token ids instead of text, e.g. '5 9 12'")
    p.add_argument("--target", help="encoder-decoder: the target text (default: greedy output)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="greedy target length limit")
    p.add_argument("--layer", action="append", help="only layers whose path contains this")
    p.add_argument("--atol", type=float, default=None, help="row-sum tolerance")
    p.add_argument(
        "--long",
        action="store_true",
        help="for long texts: blockwise row statistics, never the T×T weights (no row-sum check)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.set_defaults(func=run)


def _encode(loaded: LoadedModel, text: str | None, ids: str | None, what: str) -> list[int]:
    if ids is not None:
        try:
            out = [int(t) for t in ids.replace(",", " ").split()]
        except ValueError:
            raise CLIError(f"--ids must be integers separated by spaces, got {ids!r}") from None
    else:
        if loaded.tokenizer is None:
            raise CLIError(f"{loaded.path} has no tokenizer.json; pass token ids with --ids")
        out = list(loaded.tokenizer.encode(text or ""))
    if not out:
        raise CLIError(f"the {what} is empty after tokenization")
    return out


def _run_model(loaded: LoadedModel, args: argparse.Namespace) -> ActivationCache:
    """Run the model on the input under capture."""
    model, device = loaded.model, torch.device(args.device)
    names = None
    if args.layer:
        names = lambda path: any(s in path for s in args.layer)  # noqa: E731
    options: dict[str, Any] = {"names": names, "weights": not args.long, "stats": args.long}
    ids = _encode(loaded, args.text, args.ids, "input")
    x = torch.tensor([ids], device=device)
    cfg = loaded.config
    limit = cfg.max_len if isinstance(cfg, TransformerConfig) else cfg.n_positions
    if len(ids) > limit:
        raise CLIError(f"the input has {len(ids)} tokens, more than the model's limit of {limit}")
    with torch.no_grad():
        if isinstance(cfg, TransformerConfig):
            if args.target is not None:
                tgt = [cfg.bos_id, *_encode(loaded, args.target, None, "target")]
                y = torch.tensor([tgt[: cfg.max_len]], device=device)
            else:
                from attnlab.decoding.generate import generate

                steps = max(1, min(args.max_new_tokens, cfg.max_len - 1))
                y = generate(model, x, max_new_tokens=steps, eos_token_id=cfg.eos_id)
            with capture(model, **options) as cache:
                model(x, y)
        else:
            with capture(model, **options) as cache:
                model(x)
    return cache


def _fmt(v: float, spec: str) -> str:
    return "—" if isinstance(v, float) and math.isnan(v) else format(v, spec)


def _table(report: HealthReport) -> Table:
    t = Table(
        title="attention health per head — entropy (nats): mean \\[min, max] over rows; max w: mean "
        "largest weight; sum err: max |row sum − 1|; masked: rows that see no key",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    t.add_column("layer", no_wrap=True)
    t.add_column("head", justify="right")
    t.add_column("entropy", justify="right", no_wrap=True)
    t.add_column("max w", justify="right")
    t.add_column("sum err", justify="right", no_wrap=True)
    t.add_column("masked", justify="right")
    t.add_column("NaN/inf", justify="right")
    t.add_column("", no_wrap=True)
    previous = None
    for h in report.heads:
        t.add_row(
            h.layer if h.layer != previous else "",
            str(h.head),
            f"{_fmt(h.entropy_mean, '.2f')} [{_fmt(h.entropy_min, '.2f')}, {_fmt(h.entropy_max, '.2f')}]",
            _fmt(h.max_weight_mean, ".2f"),
            _fmt(h.row_sum_error, ".0e"),
            f"{h.masked_rows}/{h.rows}",
            str(h.nonfinite),
            "[green]ok[/]" if h.ok else "[bold red]FAIL[/]",
        )
        previous = h.layer
    return t


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise CLIError(f"--max-new-tokens must be a positive int, got {args.max_new_tokens}")
    loaded = load_model(args.run, device=args.device)
    cache = _run_model(loaded, args)
    report = diagnose(cache, atol=args.atol)
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
        return 0 if report.ok else 1
    # a pipe or a file gets a table wide enough for module paths (rich would assume 80 columns)
    console = Console(width=None if sys.stdout.isatty() else 120)
    kind = "encoder-decoder" if loaded.is_seq2seq else "GPT"
    console.print(f"[bold]{loaded.path}[/] ({kind}, {len(report.layers())} attention layers)")
    console.print(_table(report))
    if report.ok:
        console.print(f"[green]all {len(report.heads)} heads healthy[/]")
    else:
        for line in report.problems():
            console.print(f"[red]{line}[/]")
    return 0 if report.ok else 1
