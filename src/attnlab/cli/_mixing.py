"""``attnlab inspect RUN --text … --mixing METHOD`` and ``--faithfulness``: what each token
really takes from the others, and how far each way of looking can be trusted.

``--faithfulness --prompt-set ioi|factual`` (or ``--prompts FILE``) averages the table over a
set of prompts (:func:`attnlab.inspect.faithfulness_over_prompts`), with the agreement with exact
per-token patching where the prompts have corrupted versions; ``--plausibility`` scores each
alignment of a copy/reverse/sort run against the known sources on held-out strings
(:func:`attnlab.inspect.plausibility_of_batches`). Both print the library's own table, the one
notebook 19 shows."""

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
from attnlab.cli.options import positive_int
from attnlab.data import prompt_sets
from attnlab.inspect.faithfulness import BINS, faithfulness_over_prompts, faithfulness_table
from attnlab.inspect.mixing import METHODS, mixing
from attnlab.inspect.plausibility import (
    ALIGNMENT_METHODS,
    plausibility_of_batches,
    plausibility_table,
)
from attnlab.tasks.base import ModelInputs
from attnlab.tasks.registry import get_task
from attnlab.tasks.run import Run

#: the tasks whose every output token is a copy of a known source token
ALIGNED_TASKS = ("copy", "reverse", "sort")

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
    prompts = p.add_mutually_exclusive_group()
    prompts.add_argument(
        "--prompt-set",
        choices=prompt_sets.names(),
        help="--faithfulness over a packaged prompt set instead of --text, mean ± std: ioi "
        "('When Mary and John went to the store, John gave a drink to') or factual ('The "
        "capital of France is'), each with a corrupted prompt for the agreement with exact "
        "per-token patching (τ-patch)",
    )
    prompts.add_argument(
        "--prompts",
        metavar="FILE",
        help="--faithfulness over the prompts of FILE: one a line, or JSON as the packaged "
        "sets (prompt, answer, foil, corrupted)",
    )
    p.add_argument(
        "--methods",
        type=_methods,
        default=None,
        help="--faithfulness/--plausibility: the methods compared, comma-separated (default: "
        f"{','.join(FAITHFULNESS_METHODS)} / {','.join(ALIGNMENT_METHODS)})",
    )
    p.add_argument(
        "--ig-steps",
        type=positive_int,
        default=32,
        help="--faithfulness: integrated gradients' interpolation steps (default 32)",
    )
    p.add_argument(
        "--plausibility",
        action="store_true",
        help="instead of a text: on a copy/reverse/sort run, the top-1 accuracy and token F1 of "
        "each method's source alignment against the known source of every output token, on "
        "held-out strings (--examples), with a random row",
    )


def _methods(text: str) -> tuple[str, ...]:
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in names if m not in METHODS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"must be methods among {', '.join(METHODS)}, comma-separated, got {text!r}"
        )
    return names


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
    if inputs.kind == "seq2seq" or loaded.is_encoder:
        kind = "an encoder" if loaded.is_encoder else "an encoder-decoder"
        raise CLIError(f"--faithfulness explains a language model's next token; this run is "
                       f"{kind} (use --mixing)")  # fmt: skip
    blank = _blank(loaded, args)
    rows = faithfulness_table(
        loaded.model, ids, args.methods or FAITHFULNESS_METHODS, blank_id=blank, steps=args.ig_steps
    )
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


def _blank(loaded: Run, args: Any) -> int:
    """``--blank-id``, else the model's end token, else 0."""
    blank = args.blank_id
    if blank is None:
        blank = getattr(loaded.io, "eos_id", None) or 0
    return int(blank)


def run_prompt_set(loaded: Run, args: argparse.Namespace) -> int:
    """``--faithfulness --prompt-set NAME | --prompts FILE``: the table over every prompt.

    Args:
        loaded: the run (a language model).
        args: the parsed arguments.

    Returns:
        The exit status (0).
    """
    if not args.faithfulness:
        raise CLIError("--prompt-set/--prompts name the prompts of --faithfulness; add it")
    if args.text is not None or args.ids is not None:
        raise CLIError("--faithfulness takes one of --text, --ids, --prompt-set, --prompts")
    if loaded.is_seq2seq:
        raise CLIError("--faithfulness explains a language model's next token; this run is an "
                       "encoder-decoder (use --plausibility on copy/reverse/sort)")  # fmt: skip
    if args.prompt_set is not None:
        prompts = prompt_sets.load(args.prompt_set)
    else:  # its errors name the file ("prompts file '…' holds no prompt")
        prompts = prompt_sets.load_prompts(args.prompts)
    tokenizer = getattr(loaded.io, "tokenizer", None)
    if tokenizer is None:
        raise CLIError(f"{loaded.path} was saved without a tokenizer: it cannot read prompts")
    loaded.model.eval()
    result = faithfulness_over_prompts(
        loaded.model,
        prompts,
        loaded.io.encode,  # type: ignore[attr-defined]
        args.methods or FAITHFULNESS_METHODS,
        blank_id=_blank(loaded, args),
        decode=tokenizer.decode,
        steps=args.ig_steps,
    )
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), ensure_ascii=False) + "\n")
        return 0
    sys.stdout.write(
        "faithfulness of each explanation of the next token: AOPC comprehensiveness (higher: "
        "its top tokens matter), AOPC sufficiency (lower: they suffice), Kendall τ and Spearman "
        "ρ with leave-one-out, Kendall τ with exact per-token patching at layer 0\n"
        + result.table()
        + "\n"
    )
    return 0


def run_plausibility(loaded: Run, args: argparse.Namespace) -> int:
    """``--plausibility``: each alignment of a copy/reverse/sort run against the known sources.

    Args:
        loaded: the run (an encoder-decoder trained on copy, reverse or sort).
        args: the parsed arguments (``--examples``, ``--methods``, ``--json``).

    Returns:
        The exit status (0).
    """
    if args.text is not None or args.ids is not None or args.faithfulness or args.mixing:
        raise CLIError("--plausibility scores held-out strings of the run's task; it takes no "
                       "--text/--ids/--faithfulness/--mixing")  # fmt: skip
    if loaded.task not in ALIGNED_TASKS:
        raise CLIError(
            f"--plausibility needs a run of {'/'.join(ALIGNED_TASKS)}, where every output "
            f"token's source is known; {loaded.path} is a {loaded.task or 'task-less'} run"
        )
    methods = args.methods or ALIGNMENT_METHODS
    unknown = [m for m in methods if m not in ALIGNMENT_METHODS]
    if unknown:
        raise CLIError(
            f"--methods: {unknown[0]} gives no source alignment; --plausibility compares "
            f"{', '.join(ALIGNMENT_METHODS)}"
        )
    task = get_task(loaded.task)
    data = task.evaluation_set(loaded.args, loaded.io, args.examples)  # type: ignore[union-attr]
    cfg = loaded.config  # the encoder-decoder's: its special ids are copied from nowhere
    special = [getattr(cfg, k, None) for k in ("pad_id", "bos_id", "eos_id")]
    loaded.model.eval()
    rows = plausibility_of_batches(
        loaded.model, data.batches, methods, ignore_ids=[i for i in special if i is not None]
    )
    if args.json:
        out = [{"method": r.method, "top1": r.top1, "f1": r.f1} for r in rows]
        positions = rows[0].positions
        sys.stdout.write(json.dumps({"positions": positions, "methods": out}) + "\n")
        return 0
    sys.stdout.write(
        f"plausibility of each source alignment of {loaded.task} on held-out strings: top-1 "
        "accuracy and token F1 against the source positions holding each output token\n"
        + plausibility_table(rows)
        + "\n"
    )
    return 0
