"""``attnlab inspect RUN --text TEXT`` — a health table of every attention head.

Loads a run folder (its latest checkpoint), a checkpoint directory or a Hugging Face GPT-2
directory, turns the text into exactly what the model read (through the run's task, special
tokens included), runs it while capturing the attention weights, and prints per
layer and head (query heads, also for grouped-query models): ``entropy_mean`` (nats, mean over
the query rows), ``max_weight_mean`` (mean of each row's largest weight), ``first_token_share``
(mean weight on key 0), row-sum error, fully masked rows and non-finite weights, with the first
NaN/inf located to layer, head and position. A long text (when every layer's ``T × T`` weights
together would pass :data:`STREAM_BYTES`), or ``--long``, is measured from blockwise row
statistics of each layer's rotated queries and keys instead, without ever forming the ``T × T``
weights (no row-sum or uniformity check then); ``"streamed"`` in the JSON says which. For the encoder-decoder the text is
the source; the target is the model's own decoded output (what ``attnlab translate`` prints) or
``--target``. ``--json`` prints one JSON object instead: ``source_tokens``, ``target_tokens``
(what the decoder wrote, the labels of the figures), ``output`` and the per-head report.

Each head gets a status (:func:`attnlab.inspect.diagnose` defines them): ``ok``; ``SINK``
(every row ≥ 0.99 on the first token — an attention sink, normal in pretrained models),
``one token`` (on another key) and ``uniform`` — patterns, reported, not failures — or
``FAIL``. Exit status (:data:`EXIT_STATUS`): 0 when nothing is broken, 1 when something is — a
non-finite weight or module output, a row that does not sum to 1 within ``--atol``, or a
collapsed model (every head uniform or a sink) — and 2 for a usage error.

``--roles`` instead scores every head's role on random tokens repeated once (Olsson et al. 2022;
:mod:`attnlab.inspect.roles`): previous-token, duplicate-token, induction (prefix matching) and
the copying score of its OV circuit; a table of the best heads per score, or with ``--json`` the
full ``layers × heads`` matrices. The tokens avoid the tokenizer's special ids
(``--roles-seq-len``, ``--roles-batch``, ``--roles-seed`` set the input).

``--mixing METHOD`` instead shows what each position takes from each token by one of
:func:`attnlab.inspect.mixing`'s methods (rollout, norm, ALTI, value zeroing, …; the last
position's row, ``--json`` every matrix), and ``--faithfulness`` how far each method's
explanation of the last prediction can be trusted (:mod:`attnlab.inspect.faithfulness`);
``--faithfulness --prompt-set ioi|factual`` (or ``--prompts FILE``) the same table averaged over
a set of prompts (mean ± std), with the agreement with exact per-token patching, and
``--plausibility`` how often each alignment of a copy/reverse/sort run points at the source
token each output token came from (held-out strings, ``--examples``).

``--qk-spectrum`` instead reads every head as a low-rank bilinear relation
(:mod:`attnlab.inspect.qk_circuits`): the effective rank of its QK circuit
``W_Q^hᵀ W_K^h / √d_head`` and OV circuit ``W_V^hᵀ W_O^hᵀ`` per layer and head, and the
numerical ranks (never above ``d_head``); ``--json`` gives every singular value. Only the
weights are read: no text, no forward pass (``--layer`` keeps the layers whose path contains it).

``--lens logit|tuned:PATH`` instead shows what each layer would predict at each position: the
residual stream after each layer through the model's final norm and unembedding (the logit lens)
or through a tuned lens first (:mod:`attnlab.cli._lens`); ``--train-tuned-lens OUT --data TEXT``
trains one (Belrose et al. 2023) and prints per-layer KL and bits per token, logit vs tuned.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnlab.cli import CLIError
from attnlab.cli._device import device
from attnlab.cli._inputs import add_input_arguments, model_inputs
from attnlab.cli._lens import add_lens_arguments, run_lens, wants_lens
from attnlab.cli._mixing import (
    add_mixing_arguments,
    run_mixing,
    run_plausibility,
    run_prompt_set,
)
from attnlab.cli._outputs import checked_figure
from attnlab.cli._roles import add_roles_arguments, measure_roles
from attnlab.cli._terminal import TextConsole
from attnlab.cli.options import add_cache_argument, non_negative_float, positive_int
from attnlab.inspect.ablation import (
    HeadImportance,
    head_importance,
    pruning_curve,
    pruning_order,
)
from attnlab.inspect.capture import attention_modules
from attnlab.inspect.diagnostics import HealthReport, diagnose
from attnlab.inspect.nonfinite import watch_nonfinite
from attnlab.inspect.qk_circuits import CircuitSpectrum, qk_spectrum
from attnlab.inspect.roles import ROLES, HeadRoles
from attnlab.tasks.base import ModelInputs
from attnlab.tasks.figures import attention_size, capture_inputs
from attnlab.tasks.registry import get_task
from attnlab.tasks.run import Run, load_run

#: the bytes of captured weights (all layers, fp32) above which ``inspect`` streams statistics
STREAM_BYTES = 256 * 2**20

#: what the exit status of the health check means (printed by ``--help``)
EXIT_STATUS = (
    "exit status: 0 nothing broken (sink, one-token and uniform heads are reported, not "
    "failures); 1 broken — a NaN/inf weight or module output, a row that does not sum to 1 "
    "within --atol, or a collapsed model (every head uniform or a sink: the weights depend on "
    "no token); 2 a usage error. --roles, --qk-spectrum, --ablate, --lens and "
    "--train-tuned-lens exit 0 when they ran."
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="health of every attention head of a model on a text; --roles: what each head "
        "does, --qk-spectrum: heads as low-rank relations, --ablate: head importance, pruning, "
        "--lens: what each layer predicts",
        description="Run TEXT through a run's latest checkpoint (or a checkpoint / GPT-2 folder) "
        "and print entropy, max weight, row sums, masked rows and NaN/inf per layer and head, "
        "and each head's status: ok, SINK (every row ≥ 0.99 on the first token: an attention "
        "sink), one token, uniform, or FAIL.",
        epilog=EXIT_STATUS,
    )
    p.add_argument("run", metavar="RUN", help="run folder, checkpoint folder or GPT-2 directory")
    add_input_arguments(p, text_required=False)
    p.add_argument(
        "--ablate",
        action="store_true",
        help="instead of a text: the loss (and the task's score) when each head alone is "
        "removed, the Michel et al. (2019) gradient importance, and a figure of loss against "
        "heads pruned in importance order (--figure)",
    )
    p.add_argument(
        "--by",
        choices=("ablation", "gradient"),
        default="ablation",
        help="--ablate: the importance that orders the pruning (default ablation)",
    )
    p.add_argument(
        "--examples",
        type=positive_int,
        default=200,
        help="--ablate/--plausibility: held-out examples to measure on (default 200)",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="--ablate: order the pruning by one estimate on the full model, instead of "
        "estimating again after each head removed (Michel et al.'s and run_bertology's way)",
    )
    p.add_argument(
        "--roles",
        action="store_true",
        help="instead of a text: previous-token, duplicate-token, induction and copying scores "
        "of every head on random tokens repeated once (Olsson et al. 2022)",
    )
    add_roles_arguments(p)
    add_mixing_arguments(p)
    add_lens_arguments(p)
    p.add_argument(
        "--qk-spectrum",
        action="store_true",
        help="instead of a text: every head as a low-rank relation — the effective and "
        "numerical rank of its QK circuit W_Q W_Kᵀ/√d_head and OV circuit W_Vᵀ W_Oᵀ, from the "
        "weights alone (--json: every singular value)",
    )
    p.add_argument("--figure", default="pruning.png", help="--ablate: the figure to write")
    p.add_argument("--layer", action="append", help="only layers whose path contains this")
    p.add_argument(
        "--atol",
        type=non_negative_float,
        default=None,
        help="row-sum tolerance, a finite float >= 0 (default 1e-4; 2e-2 for fp16/bf16)",
    )
    p.add_argument(
        "--long",
        action="store_true",
        help="blockwise row statistics, never the T×T weights (no row-sum check); automatic "
        "when all layers' weights would pass 256 MiB",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--device", type=device, default="cpu", help="torch device (default cpu)")
    add_cache_argument(p)
    p.set_defaults(func=run)


def _fmt(v: float, spec: str) -> str:
    return "—" if isinstance(v, float) and math.isnan(v) else format(v, spec)


#: how the table shows each :attr:`~attnlab.inspect.diagnostics.HeadHealth.status`
_STATUS = {
    "ok": "[green]ok[/]",
    "sink": "[yellow]SINK[/]",
    "one_token": "[yellow]one token[/]",
    "uniform": "[yellow]uniform[/]",
    "fail": "[bold red]FAIL[/]",
}


def _table(report: HealthReport) -> Table:
    t = Table(
        title="attention health per query head — entropy_mean (nats): mean \\[min, max] over "
        "rows; max_weight_mean: mean largest weight; first_token_share: mean weight on key 0; "
        "sum err: max |row sum − 1|; masked: rows that see no key; status: ok, SINK (every row "
        "≥ 0.99 on the first token), one token, uniform — reported, not failures — or FAIL",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    t.add_column("layer", no_wrap=True)
    t.add_column("head", justify="right")
    t.add_column("entropy_mean [min, max]", justify="right", no_wrap=True)
    t.add_column("max_weight_mean", justify="right")
    t.add_column("first_token_share", justify="right")
    t.add_column("sum err", justify="right", no_wrap=True)
    t.add_column("masked", justify="right")
    t.add_column("NaN/inf", justify="right")
    t.add_column("status", no_wrap=True)
    previous = None
    for h in report.heads:
        t.add_row(
            h.layer if h.layer != previous else "",
            str(h.head),
            f"{_fmt(h.entropy_mean, '.2f')} [{_fmt(h.entropy_min, '.2f')}, {_fmt(h.entropy_max, '.2f')}]",
            _fmt(h.max_weight_mean, ".2f"),
            _fmt(h.first_token_share, ".2f"),
            _fmt(h.row_sum_error, ".0e"),
            f"{h.masked_rows}/{h.rows}",
            str(h.nonfinite),
            _STATUS[h.status],
        )
        previous = h.layer
    return t


def run(args: argparse.Namespace) -> int:
    if wants_lens(args):
        other = [f for f, on in (("--roles", args.roles), ("--ablate", args.ablate),
                 ("--qk-spectrum", args.qk_spectrum), ("--mixing", args.mixing),
                 ("--faithfulness", args.faithfulness), ("--plausibility", args.plausibility)) if on]  # fmt: skip
        if other:
            raise CLIError(
                f"--lens/--train-tuned-lens is a view of its own; it takes no {other[0]}"
            )
    if args.ablate:
        checked_figure(args.figure, "--figure")  # before any work
    if args.roles and (args.ablate or args.text is not None or args.ids is not None):
        raise CLIError("--roles measures heads on random repeated tokens; it takes no "
                       "--text/--ids/--ablate")  # fmt: skip
    if args.qk_spectrum and (
        args.roles or args.ablate or args.text is not None or args.ids is not None
    ):
        raise CLIError("--qk-spectrum reads the weights only; it takes no "
                       "--text/--ids/--roles/--ablate")  # fmt: skip
    loaded = load_run(args.run, device=args.device, cache=not args.no_cache)
    if args.qk_spectrum:
        return _spectrum(loaded, args)
    if args.roles:
        return _roles(loaded, args)
    if args.ablate:
        return _ablate(loaded, args)
    if wants_lens(args):
        given = args.text is not None or args.ids is not None
        return run_lens(loaded, model_inputs(loaded, args) if given else None, args)
    if args.plausibility:
        return run_plausibility(loaded, args)
    if args.prompt_set is not None or args.prompts is not None:
        return run_prompt_set(loaded, args)
    if args.text is None and args.ids is None:
        raise CLIError("inspect needs --text TEXT (or --ids), or --ablate")
    inputs = model_inputs(loaded, args)
    if args.mixing or args.faithfulness:
        return run_mixing(loaded, inputs, args)
    names = None
    if args.layer:
        names = lambda path: any(s in path for s in args.layer)  # noqa: E731
    streamed = args.long or _weight_bytes(loaded, inputs) > STREAM_BYTES
    # the first module (any module) whose output holds a NaN/inf is named, not only attention
    with watch_nonfinite(loaded.model) as watch:
        cache = capture_inputs(
            loaded.model,
            inputs,
            names=names,
            weights=not streamed,
            stats=streamed,
            attention_only=streamed,  # no T × vocab logits either
        )
    report = diagnose(cache, atol=args.atol, origin=watch.origin)
    if args.json:
        out: dict[str, Any] = {
            "source_tokens": list(inputs.source_tokens),
            "target_tokens": list(inputs.target_tokens),
            "output": inputs.output,
            "streamed": streamed,
            **report.to_dict(),
        }
        sys.stdout.write(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
        return 0 if report.ok else 1
    # a pipe or a file gets a table wide enough for module paths (rich would assume 80 columns)
    console = TextConsole(width=None if sys.stdout.isatty() else 120)
    kind = "encoder-decoder" if loaded.is_seq2seq else "GPT"
    console.print(f"[bold]{loaded.path}[/] ({kind}, {len(report.layers())} attention layers)")
    console.print(f"input:  {' '.join(inputs.source_tokens)}", markup=False, highlight=False)
    if inputs.kind == "seq2seq":
        console.print(f"output: {' '.join(inputs.target_tokens)}", markup=False, highlight=False)
    if streamed:
        console.print("(blockwise statistics: no T×T weights formed, no row-sum check)")
    console.print(_table(report))
    for line in report.notes():
        console.print(line, style="yellow", markup=False, highlight=False)
    for line in report.problems():
        console.print(line, style="red", markup=False, highlight=False)
    console.print(_summary(report))
    return 0 if report.ok else 1


def _summary(report: HealthReport) -> str:
    """The last line: healthy or not, and how many heads have each status."""
    c = report.counts()
    parts = [f"{c[k]} {word}" for k, word in (("ok", "ok"), ("sink", "sinks"),
             ("one_token", "one-token"), ("uniform", "uniform"), ("fail", "FAIL")) if c[k]]  # fmt: skip
    counts = ", ".join(parts)
    if report.ok:
        patterns = f" ({counts})" if c["ok"] < len(report.heads) else ""
        return f"[green]all {len(report.heads)} heads healthy[/]{patterns}"
    return f"[bold red]broken[/]: {len(report.problems())} problems ({counts})"


def _weight_bytes(loaded: Run, inputs: ModelInputs) -> int:
    """The bytes every attention layer's fp32 weights ``(H, T_q, T_k)`` would take together."""
    _, heads, t = attention_size(loaded.model, inputs)
    return 4 * heads * t * t


def _ablate(loaded: Run, args: argparse.Namespace) -> int:
    from attnlab.viz.pruning import pruning_figure

    if args.text is not None or args.ids is not None or args.layer:
        raise CLIError(
            "--ablate measures every head on held-out data; it takes no --text/--ids/--layer"
        )
    task = get_task(loaded.task) if loaded.task else None
    if task is None or not hasattr(task, "evaluation_set"):
        raise CLIError(f"{loaded.path} names no task with held-out data to measure heads on")
    data = task.evaluation_set(loaded.args, loaded.io, args.examples)
    importance = head_importance(loaded.model, data.batches)
    order = (
        importance.order(args.by)
        if args.once
        else pruning_order(loaded.model, data.batches, by=args.by)
    )
    curve = pruning_curve(loaded.model, data.batches, order, metric=data.metric)
    pruning_figure(
        curve,
        title=f"{loaded.path.parent.parent.name}: heads removed, least important first "
        f"({args.by}, {'one estimate' if args.once else 're-estimated after each'})",
        metric_label=data.metric_name,
    ).save(args.figure)
    if args.json:
        out = {
            "metric": data.metric_name,
            "by": args.by,
            "order": "once" if args.once else "iterative",
            "importance": importance.to_dict(),
            "pruning": curve.to_dict(),
            "figure": str(args.figure),
        }
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return 0
    console = TextConsole(width=None if sys.stdout.isatty() else 120)
    console.print(_importance_table(importance, curve.metric[0] if curve.metric else None, data))
    _print_curve(console, curve, data.metric_name)
    console.print(f"figure: {args.figure}", soft_wrap=True)
    return 0


def _importance_table(importance: HeadImportance, base_metric: float | None, data: Any) -> Table:
    t = Table(
        title=f"head importance (Michel et al. 2019) on {len(data.batches)} held-out batches — "
        f"Δloss: loss with the head alone removed minus {importance.base_loss:.4f}; "
        "|∂L/∂ξ|: gradient of the head mask"
        + (" (normalised per layer)" if importance.normalized else ""),
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    t.add_column("layer", no_wrap=True)
    t.add_column("kind")
    for h in range(importance.num_heads):
        t.add_column(f"head {h}", justify="right", no_wrap=True)
    for li, (layer, kind) in enumerate(zip(importance.layers, importance.kinds)):
        cells = [
            f"{importance.ablation[li, h]:+.3f} / {importance.gradient[li, h]:.2f}"
            for h in range(importance.num_heads)
        ]
        t.add_row(layer, kind, *cells)
    return t


def _print_curve(console: Console, curve: Any, metric_name: str) -> None:
    console.print(f"pruning, least important first ({curve.total_heads} heads):")
    marks = sorted({0, len(curve.loss) // 4, len(curve.loss) // 2, 3 * len(curve.loss) // 4,
                    len(curve.loss) - 1})  # fmt: skip
    for n in marks:
        metric = "" if curve.metric is None else f"  {metric_name} {100 * curve.metric[n]:.1f}%"
        console.print(f"  {curve.num_pruned[n]:>3} removed: loss {curve.loss[n]:.4f}{metric}")


def _roles(loaded: Run, args: argparse.Namespace) -> int:
    roles = measure_roles(loaded, args)
    if args.json:
        out = {"model": str(loaded.path), "roles_bos": args.roles_bos, **roles.to_dict()}
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return 0
    console = TextConsole(width=None if sys.stdout.isatty() else 120)
    console.print(_roles_table(roles, str(loaded.path), args.roles_bos))
    return 0


def _roles_table(roles: HeadRoles, name: str, bos: str | int, k: int = 8) -> Table:
    chance = roles.to_dict()["copying_chance"]
    t = Table(
        title=f"{name}: the best heads per role on {roles.seq_len} random tokens repeated once, "
        f"{escape(roles.convention)} (--roles-bos {bos}) (batch {roles.tokens.shape[0]}, seed "
        f"{roles.seed}) — previous: weight on t−1; "
        "duplicate: on the earlier copy of the token; induction: on the token after it; "
        f"copying: fraction of the tokens in their own OV top-{roles.top_k} "
        f"(chance {chance:.3f})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    t.add_column("#", justify="right")
    for role in ROLES:
        t.add_column(role, justify="right", no_wrap=True)
    tops = {role: roles.top(role, k) for role in ROLES}
    for i in range(min(k, len(tops["previous"]))):
        cells = []
        for role in ROLES:
            layer, _, head, value = tops[role][i]
            cells.append(f"L{layer} H{head}  {_fmt(value, '.3f')}")
        t.add_row(str(i + 1), *cells)
    return t


def _spectrum(loaded: Run, args: argparse.Namespace) -> int:
    paths = list(attention_modules(loaded.model))
    chosen = [i for i, p in enumerate(paths) if not args.layer or any(s in p for s in args.layer)]
    if not chosen:
        raise CLIError(f"no attention layer matches --layer {' '.join(args.layer)}")
    spec = qk_spectrum(loaded.model, layer=chosen)
    if args.json:
        sys.stdout.write(json.dumps({"model": str(loaded.path), **spec.to_dict()}) + "\n")
        return 0
    console = TextConsole(width=None if sys.stdout.isatty() else 120)
    console.print(_spectrum_table(spec, str(loaded.path)))
    return 0


def _spectrum_table(spec: CircuitSpectrum, name: str) -> Table:
    heads = spec.qk.shape[1]
    t = Table(
        title=f"{name}: every head as a bilinear relation of rank ≤ d_head = {spec.d_head} "
        f"(d_model = {spec.d_model}) — per head: effective rank exp(entropy of σ/Σσ) of "
        "QK = W_Q W_Kᵀ/√d_head / of OV = W_Vᵀ W_Oᵀ; rank: the largest numerical rank in the "
        "layer, QK/OV",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    t.add_column("layer", no_wrap=True)
    for h in range(heads):
        t.add_column(f"head {h}", justify="right", no_wrap=True)
    t.add_column("rank", justify="right", no_wrap=True)
    qk, ov = spec.effective_rank("qk"), spec.effective_rank("ov")
    for i, layer in enumerate(spec.layers):
        cells = [f"{qk[i, h]:.0f}/{ov[i, h]:.0f}" for h in range(heads)]
        ranks = f"{int(spec.rank('qk')[i].max())}/{int(spec.rank('ov')[i].max())}"
        t.add_row(layer, *cells, ranks)
    return t
