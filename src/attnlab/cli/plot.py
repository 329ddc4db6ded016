"""``attnlab plot KIND -o FILE`` — the figures of :mod:`attnlab.viz` as PNG or SVG.

Lesson figures: ``noam`` (learning-rate schedule), ``positional`` (sinusoidal encodings),
``masks`` (padding and look-ahead masks for ``--text``), ``steps`` (one head step by step:
x → Q, K, V → scores → weights → output = weights · V). ``steps`` without ``--model`` computes one
head by hand (:func:`attnlab.viz.steps_by_hand.step_panel_by_hand`) on the tokens of ``--text``
with exactly the masks ``plot masks`` draws (padding keys hidden, the look-ahead rule; none with
``--no-mask``), from random ``x`` of width ``--d-model`` (default 8) and random weights, or from
your own ``x`` and ``W_q``/``W_k``/``W_v`` in ``--inputs FILE`` (JSON, .pt, .npz or .safetensors;
see :mod:`attnlab.viz.steps_by_hand`). With ``--model RUN`` it draws the model's own layer
``--layer`` among its ``--kind`` layers (default the first), with the masks the model applied, on
the text's real tokens. Figures of a trained model (``--model RUN --text TEXT``, through the run's task, so
the tokens are exactly what the model read): ``heatmap`` (one head), ``heads`` (every head of one
layer; in these two, keys the layer masked are light grey too), ``layers`` (layers × heads; ``--layer 0,15,29`` draws those layers only; keys a layer
masked, e.g. a causal model's future, are light grey, not weight 0), each for
``--kind self|cross|all`` layers. ``training RUN``:
how the heads changed from step 0 to the end (the run must have been trained with ``--probe``),
with the heads' entropy per step in ``FILE_entropy.png``. ``roles --model MODEL``: the
previous-token, duplicate-token, induction and copying scores of every head as one layers × heads
heatmap each (:func:`attnlab.viz.head_roles_figure`), measured on random tokens repeated once
(no ``--text``; ``--roles-seq-len``, ``--roles-batch``, ``--roles-seed``); ``roles --from FILE``
draws the scores ``attnlab inspect MODEL --roles --json > FILE`` wrote, without loading a model. ``spectrum --model
MODEL``: every head as a low-rank relation, from the weights alone
(:func:`attnlab.viz.head_spectrum_figure` of :func:`attnlab.inspect.qk_spectrum`): the singular
values of each head's QK circuit ``W_Q W_Kᵀ/√d_head`` for 1 to 4 layers (``--layer 0,15,29``,
indices among all the model's attention layers; default the first, middle and last), and the
effective rank of every head of every layer.

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
from attnlab.cli._help import KindHelp
from attnlab.cli._inputs import add_input_arguments, model_inputs
from attnlab.cli._lens import add_lens_argument
from attnlab.cli._outputs import checked_figure
from attnlab.cli._roles import add_roles_arguments, measure_roles, read_roles
from attnlab.cli.options import add_cache_argument, seed
from attnlab.inspect.mixing import METHODS as MIXING_METHODS

if TYPE_CHECKING:
    from attnlab.inspect.capture import ActivationCache
    from attnlab.tasks.run import Run
    from attnlab.viz import Plot

__all__ = ["register", "run"]

KINDS = (
    "noam", "positional", "masks", "steps", "heatmap", "heads", "layers", "training", "roles",
    "spectrum", "mixing", "lens",
)  # fmt: skip
_MODEL_KINDS = ("heatmap", "heads", "layers")

_INPUTS = ("--text", "--ids", "--target", "--beams", "--generate", "--max-new-tokens")
_OF_A_MODEL = ("--model", "--no-cache", *_INPUTS, "--kind", "--layer", "--max-tokens", "--device")
# `attnlab plot KIND --help`: what KIND draws, and the options it reads (see cli/_help.py)
_KIND_TEXT = {
    "noam": "The Noam learning-rate schedule (Vaswani et al. 2017): a linear warm-up over "
    "--warmup steps, then a decay ∝ 1/√step, for a model of width --d-model.",
    "positional": "The sinusoidal position encodings of Vaswani et al. (2017): the table of "
    "--max-len positions × --d-model dimensions, and a few of its dimensions as curves.",
    "masks": "The padding mask, the look-ahead mask and both combined for the words of --text "
    "(default 'the cat sat on the mat <pad> <pad>'; <pad> marks a padding token).",
    "steps": "One head of attention step by step: x → Q, K, V → scores S = QKᵀ/√d → weights "
    "A = softmax(S) → output Z = A V. Without --model: computed by hand on the words of --text "
    "with the masks of plot masks (none with --no-mask), from random x of width --d-model "
    "(default 8) and random weights (--seed), or from your own x and W_q/W_k/W_v in --inputs "
    "FILE. With --model RUN: the model's own layer --layer of --kind (default the first) and "
    "head --head, with the masks it applied, on the text's tokens.",
    "heatmap": "One head's attention weights (--layer of --kind, default the last; --head) of "
    "--model on the tokens of --text: rows are queries, columns keys; keys the layer masked are "
    "light grey. --effective: a Linformer layer's effective weights A·F over the key tokens.",
    "heads": "Every head of one layer (--layer of --kind, default the last) of --model on the "
    "tokens of --text, one heatmap each; keys the layer masked are light grey. --effective: a "
    "Linformer layer's effective weights A·F.",
    "layers": "Layers × heads: every head of every --kind layer of --model on the tokens of "
    "--text (--layer 0,15,29: those layers only); keys a layer masked (a causal model's future) "
    "are light grey, not weight 0. A long side is block-averaged past --max-tokens.",
    "training": "How the heads of run RUN changed while it trained (attnlab plot training RUN; "
    "the run must have been trained with --probe), and the heads' entropy per step in "
    "FILE_entropy.png.",
    "roles": "The previous-token, duplicate-token, induction and copying scores of every head "
    "of --model, as one layers × heads heatmap each, measured on random tokens repeated once "
    "(no --text), or read --from the file attnlab inspect MODEL --roles --json wrote.",
    "spectrum": "Every head of --model as a low-rank relation, from the weights alone: the "
    "singular values of each head's QK circuit W_Q W_Kᵀ/√d_head for 1 to 4 layers (--layer "
    "0,15,29: indices among all attention layers; default the first, middle and last), and the "
    "effective rank of every head of every layer.",
    "mixing": "What each position of --model takes from each token of --text by one context-"
    "mixing method (--method: weights, rollout, flow, norm, norm_residual, alti, value_zeroing, "
    "grad_weights, integrated_gradients; default alti): the matrix through every layer (or the "
    "last layer's) and each layer's; an encoder-decoder's encoder (ALTI+ of the decoder: "
    "attnlab inspect --mixing alti --json).",
    "lens": "What each layer of --model would predict at each position of --text: layers × "
    "positions, each cell the most probable next token and its probability, read through the "
    "model's final norm and unembedding (--lens logit, the default) or a tuned lens first "
    "(--lens tuned:PATH, from attnlab inspect MODEL --train-tuned-lens PATH); the top row is "
    "the model's output. An encoder-decoder: its decoder's positions.",
}
_KIND_OPTIONS = {
    "noam": ("--d-model", "--warmup", "--steps"),
    "positional": ("--d-model", "--max-len"),
    "masks": ("--text",),
    "steps": (
        "--model",
        "--no-cache",
        *_INPUTS,
        "--kind",
        "--layer",
        "--head",
        "--device",
        "--d-model",
        "--no-mask",
        "--inputs",
        "--seed",
    ),
    "heatmap": (*_OF_A_MODEL, "--head", "--effective"),
    "heads": (*_OF_A_MODEL, "--effective"),
    "layers": _OF_A_MODEL,
    "training": ("--max-tokens",),
    "roles": (
        "--model",
        "--no-cache",
        "--from",
        "--roles-seq-len",
        "--roles-batch",
        "--roles-seed",
        "--roles-bos",
        "--device",
    ),
    "spectrum": ("--model", "--no-cache", "--layer", "--device"),
    "mixing": ("--model", "--no-cache", *_INPUTS, "--method", "--device"),
    "lens": ("--model", "--no-cache", *_INPUTS, "--lens", "--device"),
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="draw a figure (PNG or SVG): " + ", ".join(KINDS),
        description="Draw a figure as PNG or SVG. attnlab plot KIND --help: what KIND draws "
        "and the options it reads.",
        add_help=False,
    )
    p.add_argument(
        "-h", "--help", action=KindHelp, texts=_KIND_TEXT, options=_KIND_OPTIONS,
        help="show this help and exit (after KIND: that figure's help)",
    )  # fmt: skip
    p.add_argument("kind", choices=KINDS, metavar="KIND", help=" | ".join(KINDS))
    p.add_argument("run", nargs="?", default=None, metavar="RUN", help="the run folder (training)")
    p.add_argument(
        "-o", "--output", default=None, help="file to write (.png or .svg; default KIND.png)"
    )
    add_input_arguments(p, text_required=False)
    p.add_argument(
        "--model",
        help="RUN_OR_CHECKPOINT (or a pretrained model) for steps / heatmap / heads / "
        "layers / roles / spectrum / mixing / lens",
    )
    p.add_argument(
        "--kind",
        dest="attention",
        choices=("self", "cross", "all"),
        default="all",
        help="which attention layers (default all)",
    )
    p.add_argument(
        "--layer",
        type=_layer_list,
        default=None,
        help="layer index among --kind's layers; layers: the layers to draw, comma-separated "
        "(default all); spectrum: 1 to 4 indices among all attention layers, comma-separated "
        "(e.g. 0,15,29)",
    )
    p.add_argument("--head", type=int, default=0, help="head index (heatmap, steps)")
    p.add_argument(
        "--effective",
        action="store_true",
        help="heatmap / heads of a Linformer layer: the effective weights A·F over the key "
        "tokens (signed) instead of the T × k weights over the projected E·K rows",
    )
    add_roles_arguments(p)
    p.add_argument(
        "--method",
        choices=MIXING_METHODS,
        default="alti",
        help="mixing: the context-mixing method (default alti)",
    )
    add_lens_argument(p)
    p.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        default=None,
        help="roles: draw the scores that attnlab inspect MODEL --roles --json wrote to FILE, "
        "instead of measuring them again (no model is loaded)",
    )
    p.add_argument(
        "--d-model",
        type=int,
        default=None,
        help="noam / positional width (default 512); steps without --model: the width of the "
        "random token vectors (default 8)",
    )
    p.add_argument(
        "--no-mask",
        action="store_true",
        help="steps without --model: no mask (every token sees every token), as in the "
        "hands-on; default: the padding and look-ahead masks of plot masks",
    )
    p.add_argument(
        "--inputs",
        metavar="FILE",
        default=None,
        help="steps without --model: your own x (T × d_model) and optionally W_q, W_k "
        "(d_model × d_k) and W_v (d_model × d_v), by those names, in a .json file "
        '({"x": [[...], ...], "W_q": ...}), a .pt dict of tensors, a .npz or a .safetensors; '
        "missing weights are random (--seed); --text, if given, labels the rows",
    )
    p.add_argument("--warmup", type=int, default=4000, help="noam warm-up steps")
    p.add_argument("--steps", type=int, default=20000, help="noam steps to draw")
    p.add_argument("--max-len", type=int, default=100, help="positional: positions")
    p.add_argument("--max-tokens", type=int, default=64, help="longer sides are block-averaged")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--device", type=device, default="cpu")
    add_cache_argument(p)
    p.set_defaults(func=run)


def _layer_list(text: str) -> tuple[int, ...]:
    """``--layer``: one index, or several comma-separated (``plot spectrum``)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an int or comma-separated ints (e.g. 0,15,29), got {text!r}"
        ) from None


def _one_layer(args: argparse.Namespace) -> int | None:
    """``--layer`` of a kind that draws one layer: its index, or ``None`` when not given."""
    if args.layer is None:
        return None
    if len(args.layer) != 1:
        raise CLIError(f"--layer takes one index for plot {args.kind}, got {len(args.layer)}")
    return int(args.layer[0])


def _lesson_tokens(args: argparse.Namespace) -> list[str]:
    return (args.text or "the cat sat on the mat <pad> <pad>").split()


def _steps_by_hand(args: argparse.Namespace) -> Plot:
    """``plot steps`` without ``--model``: one head by hand on ``--inputs`` or random ``x``."""
    from attnlab.viz.steps_by_hand import load_step_inputs, step_panel_by_hand

    if args.head != 0:
        raise CLIError("--head: plot steps without --model computes one head; it takes no --head")
    mask = "none" if args.no_mask else "causal"
    if args.inputs is not None:
        inputs = load_step_inputs(args.inputs)  # its errors name the file or the key
        t, d = inputs["x"].shape
        if args.d_model is not None and args.d_model != d:
            raise CLIError(
                f"--d-model {args.d_model} differs from the width of x in --inputs ({d})"
            )
        tokens = None if args.text is None else args.text.split()
        if tokens is not None and len(tokens) != t:
            raise CLIError(
                f"--text must have one word per row of x in --inputs ({t}), got {len(tokens)}"
            )
        return step_panel_by_hand(
            inputs["x"], w_q=inputs.get("W_q"), w_k=inputs.get("W_k"), w_v=inputs.get("W_v"),
            tokens=tokens, mask=mask, seed=args.seed,
        )  # fmt: skip
    d = 8 if args.d_model is None else args.d_model
    if d < 1:
        raise CLIError(f"--d-model must be a positive int, got {d}")
    tokens = _lesson_tokens(args)
    x = torch.randn(len(tokens), d, generator=torch.Generator().manual_seed(args.seed))
    return step_panel_by_hand(x, tokens=tokens, mask=mask, seed=args.seed + 1)


def _model_figure(args: argparse.Namespace) -> Plot:
    from attnlab import viz as F
    from attnlab.tasks.figures import capture_inputs, layer_labels
    from attnlab.tasks.run import load_run

    if args.text is None and args.ids is None:
        raise CLIError(f"plot {args.kind} --model needs --text TEXT (or --ids)")
    index = None if args.kind == "layers" else _one_layer(args)
    loaded = load_run(args.model, device=args.device, cache=not args.no_cache)
    inputs = model_inputs(loaded, args)
    if args.kind == "steps":
        # --layer indexes the layers of --kind (self / cross / all), in execution order
        cache = capture_inputs(loaded.model, inputs)
        names = cache.names(None if args.attention == "all" else args.attention)
        if not names:
            raise CLIError(f"--kind {args.attention}: the model has no such attention layer")
        layer = names[0] if index is None else _pick(names, index, "--layer", args.attention)
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
        which = ""
        if args.layer is not None:  # the layers the user chose, in their order
            which = f" (--layer {','.join(str(i) for i in args.layer)})"
            names = [_pick(names, i, "--layer", args.attention) for i in args.layer]
        return F.layer_head_grid(
            {n: cache.attentions[n] for n in names},
            query_tokens={n: labels[n][0] for n in names},
            key_tokens={n: labels[n][1] for n in names},
            masks={n: _unseen(cache.attentions[n][0]) for n in names},
            max_tokens=args.max_tokens,
            title=f"{_literal(repr(inputs.output))}: {args.attention} attention, layers × heads"
            f"{which}",
        )
    name = _pick(names, -1 if index is None else index, "--layer", args.attention)
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
            key_tokens=cols, value_label=value, mask=None if args.effective else _unseen(w),
        )  # fmt: skip
    _check_head(args.head, w.shape[0])
    return F.attention_heatmap(
        w[args.head], max_tokens=args.max_tokens, title=f"{name} head {args.head}{what}",
        query_tokens=rows, key_tokens=cols, value_label=value,
        mask=None if args.effective else _unseen(w),
    )  # fmt: skip


def _literal(text: str) -> str:
    """``text`` for a figure title as it reads: its ``$`` drawn, not starting mathtext."""
    return text.replace("$", r"\$")


def _unseen(weights: torch.Tensor) -> torch.Tensor:
    """The keys a layer let its queries see, read from its weights ``(H, T_q, T_k)``: a softmax
    gives every key it saw a weight above 0, so a key of weight exactly 0 in every head is drawn
    as masked (a causal model's future, a window's outside, a padding key); a key it saw reaches
    exactly 0 only with a score about 100 below its row's largest (float32)."""
    return (weights != 0).any(dim=0)


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


def _pick(names: list[str], index: int, flag: str, kind: str = "all") -> str:
    if not -len(names) <= index < len(names):
        which = "attention" if kind == "all" else f"{kind}-attention"
        raise CLIError(
            f"{flag} must be in [0, {len(names)}) (the model's {len(names)} {which} layers, "
            f"{names[0]} … {names[-1]}), got {index}"
        )
    return names[index]


def _check_head(head: int, heads: int) -> None:
    if not 0 <= head < heads:
        raise CLIError(f"--head must be in [0, {heads}), got {head}")


def _weights_model(args: argparse.Namespace) -> Run:
    """The model of ``plot roles`` / ``plot spectrum``, which read no text."""
    from attnlab.tasks.run import load_run

    if args.model is None:
        raise CLIError(f"plot {args.kind} needs --model RUN_OR_PRETRAINED (e.g. smollm2-135m)")
    if args.text is not None or args.ids is not None:
        what = "on random repeated tokens" if args.kind == "roles" else "from the weights alone"
        raise CLIError(f"plot {args.kind} measures heads {what}; it takes no --text/--ids")
    return load_run(args.model, device=args.device, cache=not args.no_cache)


def _roles(args: argparse.Namespace) -> Plot:
    """``plot roles``: the role scores of ``--model``, measured, or read ``--from`` a file."""
    from attnlab.viz import head_roles_figure

    if args.from_file is None:
        roles, name = measure_roles(_weights_model(args), args), args.model
    else:
        if args.model is not None or args.text is not None or args.ids is not None:
            raise CLIError("plot roles --from FILE draws the scores in FILE; it takes no "
                           "--model/--text/--ids")  # fmt: skip
        roles, name = read_roles(args.from_file)
    return head_roles_figure(
        roles,
        title=f"{name or args.from_file}: head roles on {roles.seq_len} random tokens repeated "
        f"once (batch {roles.tokens.shape[0]})",
    )


def _spectrum(args: argparse.Namespace) -> Plot:
    """``plot spectrum``: the QK spectra of ``--layer`` (1 to 4 attention layers) and the
    effective rank of every head."""
    from attnlab.inspect.capture import attention_modules
    from attnlab.inspect.qk_circuits import qk_spectrum
    from attnlab.viz import head_spectrum_figure

    loaded = _weights_model(args)
    paths = list(attention_modules(loaded.model))
    if not paths:
        raise CLIError(f"{args.model} has no attention layer to read")
    shown = None
    if args.layer is not None:
        if not 1 <= len(args.layer) <= 4:
            raise CLIError(f"--layer: plot spectrum draws 1 to 4 layers, got {len(args.layer)}")
        shown = [paths.index(_pick(paths, i, "--layer")) for i in args.layer]
    return head_spectrum_figure(
        qk_spectrum(loaded.model),
        layers=shown,
        title=f"{args.model}: every head's QK circuit W_Q W_Kᵀ/√d_head, of rank ≤ d_head",
    )


def _mixing(args: argparse.Namespace) -> Plot:
    from attnlab.inspect.mixing import mixing
    from attnlab.tasks.run import load_run
    from attnlab.viz.mixing import mixing_figure

    if args.model is None or (args.text is None and args.ids is None):
        raise CLIError("plot mixing needs --model MODEL and --text TEXT (or --ids)")
    loaded = load_run(args.model, device=args.device, cache=not args.no_cache)
    inputs = model_inputs(loaded, args)
    device = next(loaded.model.parameters()).device
    loaded.model.eval()
    if inputs.kind == "seq2seq":  # the encoder's layers, over the source tokens
        src = torch.tensor([inputs.source_ids], device=device)
        tgt = torch.tensor([inputs.decoder_input_ids], device=device)
        mix = mixing(loaded.model, src, args.method, layers="encoder.", tgt_in=tgt)
        tokens, causal = list(inputs.source_tokens), False
    else:
        ids = torch.tensor([inputs.source_ids + inputs.target_ids], device=device)
        mix = mixing(loaded.model, ids, args.method)
        tokens, causal = list(inputs.tokens), not inputs.bidirectional
    return mixing_figure(
        mix, tokens, causal=causal,
        title=f"{_literal(repr(inputs.output))}: {mix.method} — {mix.meaning}",
    )  # fmt: skip


def _lens(args: argparse.Namespace) -> Plot:
    from attnlab.cli._lens import lens_of, token_decoder
    from attnlab.tasks.run import load_run
    from attnlab.viz.lens import lens_figure

    if args.model is None or (args.text is None and args.ids is None):
        raise CLIError("plot lens needs --model MODEL and --text TEXT (or --ids)")
    loaded = load_run(args.model, device=args.device, cache=not args.no_cache)
    loaded.model.eval()
    spec = args.lens or "logit"
    lens, labels = lens_of(loaded, model_inputs(loaded, args), spec)
    return lens_figure(
        lens, labels, token_decoder(loaded),
        title=f"{_literal(args.model)}: {spec} lens — each layer's most probable next token",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from attnlab import viz as F

    out = checked_figure(args.output or f"{args.kind}.png", "-o/--output")  # before any work
    if args.effective and args.kind not in ("heatmap", "heads"):
        raise CLIError(
            f"--effective draws one layer's effective weights: plot heatmap or heads, "
            f"got plot {args.kind}"
        )
    if (args.no_mask or args.inputs is not None) and (args.kind != "steps" or args.model):
        flag = "--no-mask" if args.no_mask else "--inputs"
        raise CLIError(
            f"{flag} is for plot steps without --model (a model's layer is drawn with the "
            f"masks and weights it has), got plot {args.kind}"
            + (" --model" if args.model and args.kind == "steps" else "")
        )
    if args.lens is not None and args.kind != "lens":
        raise CLIError(f"--lens is for plot lens, got plot {args.kind}")
    if args.from_file is not None and args.kind != "roles":
        raise CLIError(f"--from FILE is for plot roles, got plot {args.kind}")
    written = [out]
    if args.kind == "noam":
        plot = F.noam_curve(
            ((512 if args.d_model is None else args.d_model, args.warmup),), steps=args.steps
        )
    elif args.kind == "positional":
        plot = F.positional_encoding_figure(
            args.max_len, 512 if args.d_model is None else args.d_model
        )
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
        plot = _roles(args)
    elif args.kind == "spectrum":
        plot = _spectrum(args)
    elif args.kind == "mixing":
        plot = _mixing(args)
    elif args.kind == "lens":
        plot = _lens(args)
    elif args.kind == "steps" and args.model is None:
        plot = _steps_by_hand(args)
    else:
        if args.model is None:
            raise CLIError(f"plot {args.kind} needs --model RUN_OR_CHECKPOINT")
        plot = _model_figure(args)
    plot.save(out)
    for path in written:
        Console(stderr=True).print(f"wrote [bold]{path}[/bold]")
    return 0
