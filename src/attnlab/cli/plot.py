"""``attnlab plot KIND -o FILE`` — the figures of :mod:`attnlab.viz` as PNG or SVG.

Lesson figures: ``noam`` (learning-rate schedule), ``positional`` (sinusoidal encodings),
``masks`` (padding and look-ahead masks for ``--text``), ``steps`` (one head step by step; on a
small random layer, or with ``--model RUN`` the model's own first attention layer on the text's
real tokens). Figures of a trained model (``--model RUN --text TEXT``, through the run's task, so
the tokens are exactly what the model read): ``heatmap`` (one head), ``heads`` (every head of one
layer), ``layers`` (layers × heads), each for ``--kind self|cross|all`` layers. ``training RUN``:
how the heads changed from step 0 to the end (the run must have been trained with ``--probe``),
with the heads' entropy per step in ``FILE_entropy.png``. ``roles --model MODEL``: the
previous-token, duplicate-token, induction and copying scores of every head as one layers × heads
heatmap each (:func:`attnlab.viz.head_roles_figure`), measured on random tokens repeated once
(no ``--text``; ``--roles-seq-len``, ``--roles-batch``, ``--roles-seed``).

A Linformer layer (``--attention linformer``) is drawn as it computes: ``T × k`` weights whose
columns are the projected rows ``E·K row j``, not tokens. ``heatmap``/``heads`` with
``--effective`` draw its effective weights ``A · F`` over the key tokens instead (what each query
took from each token through the value projection; possibly negative, so on a diverging scale,
blue < 0 < red).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import torch
from rich.console import Console

from attnlab.cli import CLIError
from attnlab.cli._device import device
from attnlab.cli._inputs import add_input_arguments, model_inputs
from attnlab.cli._outputs import checked_figure
from attnlab.cli._roles import add_roles_arguments, measure_roles
from attnlab.cli.options import seed

if TYPE_CHECKING:
    from attnlab.inspect.capture import ActivationCache
    from attnlab.viz import Plot

__all__ = ["register", "run"]

KINDS = ("noam", "positional", "masks", "steps", "heatmap", "heads", "layers", "training", "roles")
_MODEL_KINDS = ("heatmap", "heads", "layers")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw a figure (PNG or SVG): " + ", ".join(KINDS))
    p.add_argument("kind", choices=KINDS, metavar="KIND", help=" | ".join(KINDS))
    p.add_argument("run", nargs="?", default=None, metavar="RUN", help="the run folder (training)")
    p.add_argument(
        "-o", "--output", default=None, help="file to write (.png or .svg; default KIND.png)"
    )
    add_input_arguments(p, text_required=False)
    p.add_argument(
        "--model",
        help="RUN_OR_CHECKPOINT (or a pretrained model) for steps / heatmap / heads / "
        "layers / roles",
    )
    p.add_argument(
        "--kind",
        dest="attention",
        choices=("self", "cross", "all"),
        default="all",
        help="which attention layers (default all)",
    )
    p.add_argument("--layer", type=int, default=None, help="layer index among --kind's layers")
    p.add_argument("--head", type=int, default=0, help="head index (heatmap, steps)")
    p.add_argument(
        "--effective",
        action="store_true",
        help="heatmap / heads of a Linformer layer: the effective weights A·F over the key "
        "tokens (signed) instead of the T × k weights over the projected E·K rows",
    )
    add_roles_arguments(p)
    p.add_argument("--d-model", type=int, default=512, help="noam / positional width")
    p.add_argument("--warmup", type=int, default=4000, help="noam warm-up steps")
    p.add_argument("--steps", type=int, default=20000, help="noam steps to draw")
    p.add_argument("--max-len", type=int, default=100, help="positional: positions")
    p.add_argument("--max-tokens", type=int, default=64, help="longer sides are block-averaged")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--device", type=device, default="cpu")
    p.set_defaults(func=run)


def _lesson_tokens(args: argparse.Namespace) -> list[str]:
    return (args.text or "the cat sat on the mat <pad> <pad>").split()


def _model_figure(args: argparse.Namespace) -> Plot:
    from attnlab import viz as F
    from attnlab.tasks.figures import capture_inputs, layer_labels
    from attnlab.tasks.run import load_run

    if args.text is None and args.ids is None:
        raise CLIError(f"plot {args.kind} --model needs --text TEXT (or --ids)")
    loaded = load_run(args.model, device=args.device)
    inputs = model_inputs(loaded, args)
    if args.kind == "steps":
        names = [n for n, m in loaded.model.named_modules() if hasattr(m, "hook_weights")]
        layer = names[0] if args.layer is None else _pick(names, args.layer, "--layer")
        cache = capture_inputs(loaded.model, inputs, names=[layer])
        if layer in cache.projected:  # the panel's softmax(Q Kᵀ/√d) over tokens is not its path
            from attnlab.nn.linformer import LinformerAttention

            modules = dict(loaded.model.named_modules())
            plain = [
                i for i, n in enumerate(names) if not isinstance(modules[n], LinformerAttention)
            ]
            hint = f" (e.g. --layer {plain[0]})" if plain else ""
            raise CLIError(
                f"plot steps: {layer} projects its keys to k rows (Linformer), which the step "
                f"panel does not draw; pick a layer that attends to tokens with --layer{hint}"
            )
        rows, cols = layer_labels(inputs, layer, cache.kinds.get(layer, "self"), cache)
        _check_head(args.head, cache.attentions[layer].shape[1])
        loaded.model.eval()
        with torch.no_grad():
            return F.step_panel_from_model(
                loaded.model, lambda: inputs.forward(loaded.model), layer=layer,
                head=args.head, query_tokens=rows, key_tokens=cols,
            )  # fmt: skip
    cache = capture_inputs(loaded.model, inputs)
    names = cache.names(None if args.attention == "all" else args.attention)
    if not names:
        raise CLIError(f"--kind {args.attention}: the model has no such attention layer")
    # a Linformer layer's columns are its projected rows (E·K row j), not tokens
    labels = {n: layer_labels(inputs, n, cache.kinds.get(n, "self"), cache) for n in names}
    if args.kind == "layers":
        return F.layer_head_grid(
            {n: cache.attentions[n] for n in names},
            query_tokens={n: labels[n][0] for n in names},
            key_tokens={n: labels[n][1] for n in names},
            max_tokens=args.max_tokens,
            title=f"{inputs.output!r}: {args.attention} attention, layers × heads",
        )
    name = _pick(names, -1 if args.layer is None else args.layer, "--layer")
    w = cache.attentions[name][0]
    rows, cols = labels[name]
    value, what = "weight", ""
    if args.effective:
        _check_projected(cache, names, name, args.attention)
        w = cache.effective_weights(name)[0]  # A · F: (H, T_q, T_k) over the key tokens, signed
        rows, cols = layer_labels(inputs, name, cache.kinds.get(name, "self"))
        value, what = "effective weight (A·F)", ": effective weights A·F (output = (A·F)·V)"
    if args.kind == "heads":
        return F.head_grid(
            w, max_tokens=args.max_tokens, title=f"{name}{what}", query_tokens=rows,
            key_tokens=cols, value_label=value,
        )  # fmt: skip
    _check_head(args.head, w.shape[0])
    return F.attention_heatmap(
        w[args.head], max_tokens=args.max_tokens, title=f"{name} head {args.head}{what}",
        query_tokens=rows, key_tokens=cols, value_label=value,
    )  # fmt: skip


def _check_projected(cache: ActivationCache, names: list[str], name: str, kind: str) -> None:
    """A one-line error unless ``name`` has projected keys, naming the layers that have them."""
    if name in cache.projected:
        return
    if not cache.projected:
        raise CLIError(
            "--effective: the model has no layer with projected keys (its weights are already "
            "per token); effective weights A·F are for Linformer layers (--attention linformer)"
        )

    def flags(n: str) -> str:
        if n in names:
            return f"--kind {kind} --layer {names.index(n)}"
        own = cache.kinds.get(n, "self")
        return f"--kind {own} --layer {cache.names(own).index(n)}"

    where = ", ".join(f"{n} ({flags(n)})" for n in cache.projected)
    raise CLIError(
        f"--effective: {name} attends to its key tokens directly (its weights are already per "
        f"token); the layers with projected keys are {where}"
    )


def _pick(names: list[str], index: int, flag: str) -> str:
    if not -len(names) <= index < len(names):
        raise CLIError(f"{flag} must be in [0, {len(names)}), got {index}")
    return names[index]


def _check_head(head: int, heads: int) -> None:
    if not 0 <= head < heads:
        raise CLIError(f"--head must be in [0, {heads}), got {head}")


def run(args: argparse.Namespace) -> int:
    from attnlab import viz as F

    out = checked_figure(args.output or f"{args.kind}.png", "-o/--output")  # before any work
    if args.effective and args.kind not in ("heatmap", "heads"):
        raise CLIError(
            f"--effective draws one layer's effective weights: plot heatmap or heads, "
            f"got plot {args.kind}"
        )
    written = [out]
    if args.kind == "noam":
        plot = F.noam_curve(((args.d_model, args.warmup),), steps=args.steps)
    elif args.kind == "positional":
        plot = F.positional_encoding_figure(args.max_len, args.d_model)
    elif args.kind == "masks":
        plot = F.mask_panel(_lesson_tokens(args))
    elif args.kind == "training":
        from attnlab.tasks.probe import load_probe_history
        from attnlab.viz.evolution import attention_evolution, head_entropy_curves

        if args.run is None:
            raise CLIError("plot training needs the RUN folder: attnlab plot training RUN")
        history = load_probe_history(args.run)
        plot = attention_evolution(history, max_tokens=args.max_tokens)
        entropy = out.with_name(f"{out.stem}_entropy{out.suffix}")
        head_entropy_curves(history).save(entropy)
        written.append(entropy)
    elif args.kind == "roles":
        from attnlab.tasks.run import load_run

        if args.model is None:
            raise CLIError("plot roles needs --model RUN_OR_PRETRAINED (e.g. smollm2-135m)")
        if args.text is not None or args.ids is not None:
            raise CLIError("plot roles measures heads on random repeated tokens; it takes no "
                           "--text/--ids")  # fmt: skip
        loaded = load_run(args.model, device=args.device)
        roles = measure_roles(loaded, args)
        plot = F.head_roles_figure(
            roles,
            title=f"{args.model}: head roles on {roles.seq_len} random tokens repeated once "
            f"(batch {roles.tokens.shape[0]})",
        )
    elif args.kind == "steps" and args.model is None:
        from attnlab.nn.multihead import MultiHeadAttention

        tokens = _lesson_tokens(args)
        torch.manual_seed(args.seed)
        mha = MultiHeadAttention(8, 2)
        x = torch.randn(1, len(tokens), 8)
        plot = F.step_panel_from_module(
            mha, x, head=min(args.head, 1), is_causal=True, tokens=tokens
        )
    else:
        if args.model is None:
            raise CLIError(f"plot {args.kind} needs --model RUN_OR_CHECKPOINT")
        plot = _model_figure(args)
    plot.save(out)
    for path in written:
        Console(stderr=True).print(f"wrote [bold]{path}[/bold]")
    return 0
