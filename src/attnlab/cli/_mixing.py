"""``attnlab inspect RUN --text … --mixing METHOD`` and ``--faithfulness``: what each token
really takes from the others, and how far each way of looking can be trusted."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch
from rich import box
from rich.markup import escape
from rich.table import Table

from attnlab.cli import CLIError
from attnlab.cli._terminal import TextConsole
from attnlab.inspect.faithfulness import BINS, faithfulness_table
from attnlab.inspect.mixing import METHODS, mixing
from attnlab.tasks.base import ModelInputs
from attnlab.tasks.run import Run

#: the methods ``--faithfulness`` compares (integrated gradients and flow are slow: ask for them
#: with ``--mixing``)
FAITHFULNESS_METHODS = ("weights", "rollout", "norm", "norm_residual", "alti", "value_zeroing",
                        "grad_weights")  # fmt: skip


def add_mixing_arguments(p: argparse.ArgumentParser) -> None:
    """``--mixing``, ``--faithfulness`` and ``--blank-id``.

    Args:
        p: the ``inspect`` parser.
    """
    p.add_argument(
        "--mixing",
        choices=METHODS,
        help="with --text: what each position takes from each token by this method "
        "(raw weights, rollout, flow, norm, norm_residual, alti, value_zeroing, grad_weights, "
        "integrated_gradients); the table shows the last position's row",
    )
    p.add_argument(
        "--faithfulness",
        action="store_true",
        help="with --text: each method's explanation of the last prediction against "
        "deleting its top tokens (ERASER comprehensiveness, sufficiency) and against "
        "leave-one-out (Kendall τ, Spearman ρ), with a random row",
    )
    p.add_argument(
        "--blank-id",
        type=int,
        default=None,
        help="--faithfulness: the token that replaces a removed one (default the model's end "
        "token, else 0)",
    )


def _ids(loaded: Run, inputs: ModelInputs) -> tuple[torch.Tensor, dict[str, Any], str | None]:
    """The model's input ids, further forward arguments, and the layers to read."""
    device = next(loaded.model.parameters()).device
    if inputs.kind == "seq2seq":
        src = torch.tensor([inputs.source_ids], device=device)
        tgt = torch.tensor([inputs.decoder_input_ids], device=device)
        return src, {"tgt_in": tgt}, "encoder."
    ids = torch.tensor([inputs.source_ids + inputs.target_ids], device=device)
    return ids, {}, None


def run_mixing(loaded: Run, inputs: ModelInputs, args: argparse.Namespace) -> int:
    """Print one method's matrices (``--mixing``) or the faithfulness table.

    Args:
        loaded: the run.
        inputs: what the model read.
        args: the parsed arguments.

    Returns:
        The exit status (0).
    """
    ids, kwargs, layers = _ids(loaded, inputs)
    tokens = list(inputs.source_tokens if inputs.kind == "seq2seq" else inputs.tokens)
    loaded.model.eval()
    if args.faithfulness:
        return _faithfulness(loaded, ids, inputs, args)
    # the table shows the last position's row: only that row is computed (a long text fits)
    rows = None if args.json else -1
    mix = mixing(loaded.model, ids, args.mixing, layers=layers, rows=rows, **kwargs)
    final = mix.total if mix.total is not None else mix.per_layer[-1]  # type: ignore[index]
    if args.json:
        out = {
            "method": mix.method,
            "meaning": mix.meaning,
            "tokens": tokens,
            "layers": mix.layers,
            "per_layer": None if mix.per_layer is None else mix.per_layer[:, 0].tolist(),
            "total": None if mix.total is None else mix.total[0].tolist(),
        }
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
        return 0
    console = TextConsole(width=None if sys.stdout.isatty() else 120)
    where = "through every layer" if mix.total is not None else f"in {mix.layers[-1]}"
    console.print(
        f"{mix.method}: {mix.meaning} — the last position ({tokens[-1]!r}), {where}",
        markup=False,
        highlight=False,
    )
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("position", justify="right")
    table.add_column("token")
    table.add_column("score", justify="right")
    row = final[0, -1].detach().double().cpu()
    for j, (tok, score) in enumerate(zip(tokens, row.tolist())):
        table.add_row(str(j), escape(tok), f"{score:.4f}")
    console.print(table)
    return 0


def _faithfulness(loaded: Run, ids: torch.Tensor, inputs: ModelInputs, args: Any) -> int:
    if inputs.kind == "seq2seq":
        raise CLIError("--faithfulness explains a language model's next token; this run is an "
                       "encoder-decoder (use --mixing)")  # fmt: skip
    blank = args.blank_id
    if blank is None:
        blank = getattr(loaded.io, "eos_id", None) or 0
    rows = faithfulness_table(loaded.model, ids, FAITHFULNESS_METHODS, blank_id=blank)
    if args.json:
        out = [
            {
                "method": r.method,
                "comprehensiveness": r.comprehensiveness,
                "sufficiency": r.sufficiency,
                "kendall_tau": r.kendall_tau,
                "spearman": r.spearman,
            }
            for r in rows
        ]
        sys.stdout.write(json.dumps({"blank_id": blank, "bins": BINS, "methods": out}) + "\n")
        return 0
    console = TextConsole(width=None if sys.stdout.isatty() else 120)
    console.print(
        f"faithfulness of each explanation of the last prediction (blank token {blank}): AOPC "
        "comprehensiveness (higher: its top tokens matter), AOPC sufficiency (lower: they "
        "suffice), Kendall τ and Spearman ρ with leave-one-out",
        markup=False,
        highlight=False,
    )
    table = Table(box=box.SIMPLE_HEAD)
    for name in ("method", "AOPC comp.", "AOPC suff.", "τ-LOO", "ρ-LOO"):
        table.add_column(name, justify="left" if name == "method" else "right")
    for r in rows:
        table.add_row(
            r.method,
            f"{r.comprehensiveness:.3f}",
            f"{r.sufficiency:.3f}",
            f"{r.kendall_tau:.3f}",
            f"{r.spearman:.3f}",
        )
    console.print(table)
    return 0
