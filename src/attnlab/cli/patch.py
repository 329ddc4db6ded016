"""``attnlab patch MODEL --clean TEXT --corrupted TEXT --answer TOKEN --wrong TOKEN`` —
activation patching and direct logit attribution on two prompts.

Loads a run (its latest checkpoint), a checkpoint folder or a pretrained model (``smollm2-135m``,
a ``.gguf`` file, a Hugging Face folder), tokenizes both prompts as the model reads them, and
measures the logit difference ``logit[answer] − logit[wrong]`` at the last position. Then, for
every layer and head (``--by heads``, the default) or every layer and position
(``--by positions``), it puts the clean run's head output (residual stream) into the corrupted
run and prints the sites that restore the most of the clean difference, normalised
``(m_patched − m_corrupted) / (m_clean − m_corrupted)``, and the heads with the largest direct
logit attribution on the clean prompt. ``--json`` prints everything as one JSON object;
``-o FIGURE`` writes the heatmap and ``--dla-figure FIGURE`` the attribution's bar chart.

``--method`` chooses how: ``exact`` (the default) runs the corrupted prompt once per site;
``attribution`` estimates every site from one forward of each prompt and one backward
(:func:`~attnlab.inspect.attribution_patching.attribution_patch`; the JSON adds every head's
q/k/v estimates); ``path`` patches every earlier head's output through the ``--receivers``'
queries, keys or values only (``--via``), or one ``--sender`` (Wang et al. 2022).

Both prompts must tokenize to the same number of tokens, and each answer to one token; when not,
the error says how they tokenize.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich import box
from rich.table import Table

from attnlab.cli import CLIError
from attnlab.cli._device import device
from attnlab.cli._outputs import checked_figure
from attnlab.cli._terminal import TextConsole
from attnlab.cli.options import add_cache_argument, positive_int
from attnlab.inspect.attribution import direct_logit_attribution
from attnlab.inspect.attribution_patching import attribution_patch
from attnlab.inspect.patching import (
    PatchResult,
    _number,
    logit_difference,
    patch_heads,
    patch_residual,
)
from attnlab.inspect.path_patching import PathPatch, path_patch, path_patch_heads
from attnlab.tasks.base import token_labels
from attnlab.tasks.run import Run, load_run
from attnlab.viz.patching import attribution_figure, patching_figure


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "patch",
        help="activation patching and direct logit attribution on a clean and a corrupted prompt",
        description="Put each head's output (--by heads) or the residual stream at each position "
        "(--by positions) of the clean run into the corrupted run, and report how much of the "
        "clean logit difference logit[answer] − logit[wrong] at the last position comes back; "
        "with each head's direct logit attribution on the clean prompt.",
    )
    p.add_argument("model", metavar="MODEL", help="run folder, checkpoint or pretrained model")
    p.add_argument("--clean", required=True, metavar="TEXT", help="the clean prompt")
    p.add_argument(
        "--corrupted", required=True, metavar="TEXT", help="the corrupted prompt, same length"
    )
    p.add_argument("--answer", required=True, metavar="TOKEN", help="the clean answer, one token")
    p.add_argument(
        "--wrong", required=True, metavar="TOKEN", help="the corrupted answer, one token"
    )
    p.add_argument(
        "--by",
        choices=("heads", "positions"),
        default="heads",
        help="patch head outputs (layers × heads, default) or the residual stream "
        "(layers × positions)",
    )
    p.add_argument(
        "--position",
        type=int,
        default=None,
        help="--by heads: patch the heads at this position only (default every position)",
    )
    p.add_argument(
        "--method",
        choices=("exact", "attribution", "path"),
        default="exact",
        help="exact: one patched run per site (default); attribution: every site from one "
        "forward of each prompt and one backward (gradient × activation difference); path: "
        "each earlier head through the --receivers' query, key or value only",
    )
    p.add_argument(
        "--receivers",
        type=_heads,
        default=None,
        metavar="L.H[,L.H…]",
        help="--method path: the receiver heads, e.g. 9.6,9.9",
    )
    p.add_argument(
        "--via",
        choices=("q", "k", "v"),
        default="v",
        help="--method path: the receivers' input the senders reach (default v)",
    )
    p.add_argument(
        "--sender",
        type=_heads,
        default=None,
        metavar="L.H",
        help="--method path: one sender head (default every head before the last receiver)",
    )
    p.add_argument("--top", type=positive_int, default=10, help="rows of each table (default 10)")
    p.add_argument("-o", "--output", default=None, metavar="FIGURE", help="the heatmap (.png/.svg)")
    p.add_argument("--dla-figure", default=None, metavar="FIGURE", help="the DLA bar chart")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--device", type=device, default="cpu", help="torch device (default cpu)")
    add_cache_argument(p)
    p.set_defaults(func=run)


def _heads(text: str) -> list[tuple[int, int]]:
    """``"9.6,9.9"`` → ``[(9, 6), (9, 9)]``."""
    out = []
    for part in text.split(","):
        layer, dot, head = part.strip().partition(".")
        try:
            out.append((int(layer), int(head)))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a head: LAYER.HEAD, e.g. 9.6 (several: 9.6,9.9)"
            ) from None
        if not dot:
            raise argparse.ArgumentTypeError(f"{part!r} is not a head: LAYER.HEAD, e.g. 9.6")
    return out


def _check_method(args: argparse.Namespace) -> None:
    path = args.method == "path"
    for flag, value in (("--receivers", args.receivers), ("--sender", args.sender)):
        if value is not None and not path:
            raise CLIError(f"{flag} is for --method path")
    if args.via != "v" and not path:
        raise CLIError("--via is for --method path")
    if not path:
        return
    if args.receivers is None:
        raise CLIError("--method path needs --receivers L.H[,L.H…] (the heads the senders feed)")
    if args.by != "heads" or args.position is not None:
        raise CLIError("--method path patches head outputs: no --by positions, no --position")
    if args.sender is not None and len(args.sender) != 1:
        raise CLIError(f"--sender is one head, got {len(args.sender)}")
    if args.sender is not None and args.output is not None:
        raise CLIError("-o/--output draws every sender: leave out --sender")


def _tokens(loaded: Run, text: str, flag: str) -> list[int]:
    if not text:
        raise CLIError(f"{flag} is empty")
    # a text of no token, or a run without a tokenizer: the task's own one-line error
    return list(loaded.io.encode(text))  # type: ignore[attr-defined]


def _shown(loaded: Run, ids: list[int]) -> str:
    tokenizer = getattr(loaded.io, "tokenizer", None)
    return " | ".join(repr(t) for t in token_labels(tokenizer, ids))


def _one_token(loaded: Run, text: str, flag: str) -> int:
    ids = _tokens(loaded, text, flag)
    if len(ids) != 1:
        hint = (
            ""
            if text.startswith(" ")
            else f"; a word after a space is often one token: {' ' + text!r}"
        )
        raise CLIError(
            f"{flag} {text!r} must be one token, but it is {len(ids)}: {_shown(loaded, ids)}{hint}"
        )
    return ids[0]


def run(args: argparse.Namespace) -> int:
    figure = None if args.output is None else checked_figure(args.output, "-o/--output")
    dla_figure = (
        None if args.dla_figure is None else checked_figure(args.dla_figure, "--dla-figure")
    )
    if args.position is not None and args.by != "heads":
        raise CLIError("--position is for --by heads (--by positions patches every position)")
    _check_method(args)
    loaded = load_run(args.model, device=args.device, cache=not args.no_cache)
    if loaded.is_seq2seq or loaded.is_encoder:
        kind = "an encoder" if loaded.is_encoder else "an encoder-decoder"
        raise CLIError(f"patch is for language models; this run is {kind}")
    clean = _tokens(loaded, args.clean, "--clean")
    corrupted = _tokens(loaded, args.corrupted, "--corrupted")
    if len(clean) != len(corrupted):
        raise CLIError(
            f"--clean and --corrupted must tokenize to the same length: {len(clean)} tokens "
            f"({_shown(loaded, clean)}) and {len(corrupted)} tokens ({_shown(loaded, corrupted)})"
        )
    n_pos = int(loaded.config.n_positions)  # type: ignore[union-attr]
    if len(clean) > n_pos:
        raise CLIError(f"the prompts are {len(clean)} tokens, the model holds {n_pos}")
    answer = _one_token(loaded, args.answer, "--answer")
    wrong = _one_token(loaded, args.wrong, "--wrong")
    if answer == wrong:
        raise CLIError(f"--answer and --wrong are the same token ({answer})")
    if args.position is not None and not -len(clean) <= args.position < len(clean):
        raise CLIError(f"--position {args.position} is outside the {len(clean)} tokens")

    import torch

    model = loaded.model
    clean_ids = torch.tensor(clean, device=args.device)
    corrupted_ids = torch.tensor(corrupted, device=args.device)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logit_difference(logits, answer, wrong)

    extra: dict[str, Any] = {"method": args.method}
    result: PatchResult | None = None
    single: PathPatch | None = None
    if args.method == "attribution":
        estimate = attribution_patch(model, clean_ids, corrupted_ids, metric)
        by_heads = args.by == "heads"
        result = estimate.heads(args.position) if by_heads else estimate.residual()
        extra["attribution_patching"] = estimate.to_dict()
    elif args.method == "path" and args.sender is not None:
        single = path_patch(
            model, clean_ids, corrupted_ids, args.sender[0], args.receivers, metric, via=args.via
        )
        extra["path"] = single.to_dict()
    elif args.method == "path":
        result = path_patch_heads(
            model, clean_ids, corrupted_ids, args.receivers, metric, via=args.via
        )
        extra["path"] = {"receivers": [list(r) for r in args.receivers], "via": args.via}
    elif args.by == "heads":
        result = patch_heads(model, clean_ids, corrupted_ids, metric, position=args.position)
    else:
        result = patch_residual(model, clean_ids, corrupted_ids, metric)
    dla = direct_logit_attribution(model, clean_ids, answer, against=wrong)
    tokenizer = getattr(loaded.io, "tokenizer", None)
    clean_labels = token_labels(tokenizer, clean)
    if figure is not None and result is not None:
        tokens = clean_labels if args.by == "positions" else None
        patching_figure(result, tokens=tokens, title=_title(args, result)).save(figure)
    if dla_figure is not None:
        title = (
            f"Direct logit attribution, top {args.top} heads\n"
            f"logit[{args.answer!r}] − logit[{args.wrong!r}] = {dla.logit:.3g} (clean prompt)"
        )
        attribution_figure(dla, k=args.top, title=title).save(dla_figure)
    if args.json:
        out: dict[str, Any] = {
            "clean_tokens": clean_labels,
            "corrupted_tokens": token_labels(tokenizer, corrupted),
            "answer": {"text": args.answer, "id": answer},
            "wrong": {"text": args.wrong, "id": wrong},
            **extra,
            "patching": None if result is None else result.to_dict(),
            "top": None if result is None else result.top(args.top),
            "attribution": dla.to_dict(),
            "top_dla": dla.top(args.top),
        }
        sys.stdout.write(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
        return 0
    console = TextConsole(width=None if sys.stdout.isatty() else 120)
    console.print(f"clean:     {' | '.join(clean_labels)}", markup=False, highlight=False)
    console.print(
        f"corrupted: {' | '.join(token_labels(tokenizer, corrupted))}",
        markup=False,
        highlight=False,
    )
    base = result if result is not None else single
    if base is None:  # unreachable: every method makes one or the other
        raise RuntimeError("no patching result")
    console.print(
        f"logit[{args.answer!r}] − logit[{args.wrong!r}]: clean {base.clean:.4f}, "
        f"corrupted {base.corrupted:.4f}",
        markup=False,
        highlight=False,
    )
    if single is not None:
        console.print(
            f"path {single.sender[0]}.{single.sender[1]} → "
            f"{','.join(f'{a}.{b}' for a, b in single.receivers)} via {single.via}: "
            f"{single.patched:.4f}, normalised {_f(_number(single.normalized))}",
            markup=False,
            highlight=False,
        )
    if result is not None:
        _print_top(console, result, args, clean_labels)
    dla_table = Table(box=box.SIMPLE, title=f"direct logit attribution (clean), top {args.top}")
    for name in ("layer", "head", "DLA"):
        dla_table.add_column(name, justify="right")
    for head in dla.top(args.top):
        dla_table.add_row(str(head["layer"]), str(head["head"]), _f(head["dla"]))
    console.print(dla_table)
    console.print(
        f"DLA parts sum to {dla.total:.4f} (the model's logit difference {dla.logit:.4f}); "
        f"embedding {dla.embed:.4f}, MLPs {float(dla.mlp.sum()):.4f}",
        markup=False,
        highlight=False,
    )
    return 0


def _title(args: argparse.Namespace, result: PatchResult) -> str | None:
    """The figure's title: the default for exact patching, else what was estimated or kept."""
    scores = f"m_clean = {result.clean:.3g}, m_corrupted = {result.corrupted:.3g}"
    if args.method == "attribution":
        what = "head outputs" if result.kind == "heads" else "residual stream"
        return f"Attribution patching of {what} (∇m · Δa, one backward)\n{scores}"
    if args.method == "path":
        receivers = ",".join(f"{a}.{b}" for a, b in args.receivers)
        return f"Path patching: each head → {receivers} via {args.via} only\n{scores}"
    return None


def _print_top(
    console: TextConsole, result: PatchResult, args: argparse.Namespace, labels: list[str]
) -> None:
    column = "head" if result.kind == "heads" else "position"
    what = {"exact": "patching", "attribution": "attribution patching (estimate)"}
    name = what.get(args.method, f"path patching via {args.via}: senders")
    table = Table(box=box.SIMPLE, title=f"{name}, top {args.top} by |normalised score|")
    for name in ("layer", column, "patched", "normalised"):
        table.add_column(name, justify="right")
    for site in result.top(args.top):
        c = site[column]
        label = f"{c} {labels[c]!r}" if column == "position" else str(c)
        table.add_row(site["layer"], label, _f(site["patched"]), _f(site["normalized"]))
    console.print(table)


def _f(v: float | None) -> str:
    return "—" if v is None else f"{v:.4f}"
