"""``attnlab view RUN_OR_CHECKPOINT --text TEXT -o view.html`` — the self-contained HTML viewer.

Loads a run folder (its latest checkpoint), a checkpoint folder or a GPT-2 directory, turns the
text into exactly what the model read (through the run's task, special tokens included), runs it
while capturing every attention layer, and writes one HTML file (no network needed to open it).
For an encoder-decoder the text is the source and the target is the model's own decoded output
(as ``attnlab translate`` prints it), or ``--target``. A Linformer encoder (``--attention
linformer``) is shown as it computes: its ``T × k`` weights over the projected ``E·K`` rows, and
the effective weights ``A · F`` over the source tokens (see :mod:`attnlab.viz.viewer`).
The page opens on the most informative head (:func:`attnlab.viz.most_informative_head`).

``--mixing norm,alti,…`` (or ``all``) adds a method switch: the grid and the matrix show what
:func:`attnlab.inspect.mixing` computed by each method instead of the weights, the colour bar
labelled by what the number means (:mod:`attnlab.viz.viewer_mixing`). A per-head method (norm)
adds as many numbers as the weights, a per-layer one (rollout, norm_residual, alti,
value_zeroing, grad_weights) ``1/H`` of them; the size check counts them. An encoder-decoder's
methods read its encoder (one stack over the same tokens).

``--lens logit`` (or ``tuned:PATH``: the tuned lens saved there, beside the logit lens) adds the
lens panel (:mod:`attnlab.viz.viewer_lens`): layers × positions, each cell the token that layer
would predict next and its probability, from :func:`attnlab.inspect.logit_lens`; an
encoder-decoder's decoder positions. A text over
:data:`~attnlab.viz.viewer_lens.MAX_LENS_POSITIONS` tokens is refused before anything runs.

The page's size is known before anything runs: every captured layer's ``H × T × T`` weights, as
base64 float32 (:data:`PAGE_BYTES_PER_WEIGHT`). A page over :data:`MAX_PAGE_BYTES` (a browser
cannot open a 1.2 GB page, and building it takes several times its size in memory) is refused
in one line that says how to reduce it: ``--layer`` keeps the layers whose path contains it, or a
shorter text; ``attnlab inspect --long`` measures a long text without its ``T × T`` weights.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from attnlab._budget import check_fits, format_bytes
from attnlab.cli import CLIError
from attnlab.cli._device import device
from attnlab.cli._inputs import add_input_arguments, model_inputs
from attnlab.cli._lens import lens_of, lens_spec, token_decoder
from attnlab.cli._mixing import _ids
from attnlab.cli.options import add_cache_argument
from attnlab.inspect import ActivationCache
from attnlab.tasks.base import ModelInputs
from attnlab.tasks.figures import attention_size, capture_inputs, viewer_for
from attnlab.tasks.run import Run, load_run
from attnlab.viz.files import check_output_path
from attnlab.viz.viewer import ViewerData, write_viewer
from attnlab.viz.viewer_lens import MAX_LENS_POSITIONS, add_lens
from attnlab.viz.viewer_mixing import METHODS, add_mixing, page_factor

__all__ = ["MAX_PAGE_BYTES", "PAGE_BYTES_PER_WEIGHT", "register", "run"]

#: the largest page ``view`` writes (Chromium does not open a 1.2 GB one; at 200 MB it takes
#: seconds): a page over it is refused, naming ``--layer`` and the longest text that fits
MAX_PAGE_BYTES = 200 * 10**6
#: a weight's bytes on the page: float32 as base64 (4 bytes → 16/3 characters)
PAGE_BYTES_PER_WEIGHT = 16 / 3
#: the memory building the page takes per weight: the captured float32 tensor, its numpy copy,
#: its base64 text, the JSON and the page around it (about 4 + 4 + 3 · 16/3 bytes)
BUILD_BYTES_PER_WEIGHT = 24


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "view",
        help="write a self-contained HTML attention viewer for a text",
        description="Run a model (a run folder, a checkpoint, a GPT-2 directory or a pretrained "
        "model such as smollm2-135m) on --text, capture every attention layer, and write one HTML "
        "file (no network needed to open it) with the attention weights of every layer and head: "
        "as a matrix, as token-to-token lines, or as a layers × heads grid, with a colour scale "
        "and exact values on hover. The page opens on the most informative head: for an "
        "encoder-decoder the cross-attention head with the lowest entropy, otherwise the "
        "lowest-entropy head that does not just attend to the first token (a sink). --training "
        "shows the attention recorded while a run trained (--probe), with a step slider.",
    )
    p.add_argument(
        "path", metavar="RUN_OR_CHECKPOINT", help="run folder, checkpoint folder or GPT-2 directory"
    )
    add_input_arguments(p, text_required=False)
    p.add_argument(
        "--layer",
        action="append",
        metavar="PATH",
        help="only the attention layers whose module path contains this (repeatable, e.g. "
        "h.3.); a long text's page holds fewer weights",
    )
    p.add_argument(
        "--training",
        action="store_true",
        help="the attention recorded while the run trained (--probe), with a step slider",
    )
    p.add_argument(
        "--mixing",
        metavar="METHODS",
        help="add a method switch: comma-separated context-mixing methods of attnlab.inspect."
        f"mixing ({', '.join(m for m in METHODS if m != 'weights')}) or 'all'; the grid and "
        "the matrix then show each method's scores, the colour bar saying what they mean. "
        "Page size: norm adds as much as the weights, each other method 1/H of it (SmolLM2, 9 "
        "heads: 'all' makes the page about 2.6× the weights-only page); value_zeroing runs a "
        "forward per layer, grad_weights a backward per token. Default: weights only",
    )
    p.add_argument(
        "--lens",
        type=lens_spec,
        default=None,
        metavar="logit|tuned:PATH",
        help="add a lens panel: layers × positions, each cell the token that layer would predict "
        "next and its probability (hover: the top 5; colour: the probability or the KL to the "
        "output), from attnlab.inspect.logit_lens; tuned:PATH adds the tuned lens saved in the "
        f"folder PATH (inspect --train-tuned-lens) beside the logit lens; at most "
        f"{MAX_LENS_POSITIONS} tokens",
    )
    p.add_argument("-o", "--output", default="view.html", help="the HTML file to write")
    p.add_argument("--device", type=device, default="cpu")
    add_cache_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_output_path(args.output, "-o/--output")  # before any work
    if args.training:
        return _training_view(args)
    if args.text is None and args.ids is None:
        raise CLIError("view needs --text TEXT (or --ids), or --training")
    methods = _methods(args.mixing)
    loaded = load_run(args.path, device=args.device, cache=not args.no_cache)
    inputs = model_inputs(loaded, args)
    if args.lens is not None:
        if loaded.is_encoder:
            raise CLIError(
                "--lens shows the token each layer would predict; an encoder predicts none"
            )
        _check_lens_size(inputs)
    names = None
    if args.layer:
        names = lambda path: any(s in path for s in args.layer)  # noqa: E731
    if (inputs.kind == "seq2seq" or loaded.is_encoder) and "grad_weights" in methods:
        if args.mixing.strip() != "all":
            why = (
                "an encoder predicts no token"
                if loaded.is_encoder
                else "an encoder-decoder's methods read its encoder"
            )
            raise CLIError(
                "--mixing grad_weights explains output positions through layers over the same "
                f"tokens; {why}: choose others"
            )
        methods.remove("grad_weights")
    _check_page_size(loaded, inputs, names, args.device, methods)
    cache = capture_inputs(loaded.model, inputs, names=names)
    title = f"attnlab · {Path(args.path).name} · {inputs.output}"
    data = viewer_for(inputs, cache, title)
    if methods:
        data = _with_mixing(data, loaded, inputs, cache, methods)
    if args.lens is not None:
        data = _with_lens(data, loaded, inputs, args.lens)
    out = write_viewer(data, args.output)
    Console(stderr=True).print(f"wrote [bold]{out}[/bold] ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


def _methods(text: str | None) -> list[str]:
    """The methods of ``--mixing`` (``all``: every one), checked before anything is loaded."""
    if text is None:
        return []
    known = [m for m in METHODS if m != "weights"]
    if text.strip() == "all":
        return known
    chosen = [m.strip() for m in text.split(",") if m.strip()]
    for m in chosen:
        if m in ("flow", "integrated_gradients"):
            raise CLIError(
                f"--mixing {m} gives only a total through every layer, no matrix per layer to "
                f"show on the grid (attnlab plot mixing --method {m} draws it); choose from "
                f"{', '.join(known)} or all"
            )
        if m not in METHODS:
            raise CLIError(f"--mixing: unknown method {m!r}; choose from {', '.join(known)} or all")
    if not chosen:
        raise CLIError(
            f"--mixing needs methods, e.g. norm,alti; choose from {', '.join(known)} or all"
        )
    return [m for m in dict.fromkeys(chosen) if m != "weights"]


def _with_mixing(
    data: ViewerData,
    loaded: Run,
    inputs: ModelInputs,
    cache: ActivationCache,
    methods: list[str],
) -> ViewerData:
    """The page with the method switch (one stack: an encoder-decoder's encoder)."""
    if cache.projected:
        raise CLIError(
            "--mixing reads T × T matrices over the tokens; this model's Linformer layers attend "
            "over k projected rows (their effective weights A·F are on the page without it)"
        )
    ids, kwargs, layers = _ids(loaded, inputs)
    loaded.model.eval()
    return add_mixing(data, loaded.model, ids, methods, layers=layers, **kwargs)


def _lens_positions(inputs: ModelInputs) -> int:
    """The positions a lens reads: a language model's tokens, an encoder-decoder's decoder's."""
    if inputs.kind == "seq2seq":
        return len(inputs.decoder_input_ids)
    return len(inputs.source_ids) + len(inputs.target_ids)


def _check_lens_size(inputs: ModelInputs) -> None:
    """Refuse ``--lens`` over more than :data:`MAX_LENS_POSITIONS` tokens, before any work."""
    t = _lens_positions(inputs)
    if t > MAX_LENS_POSITIONS:
        raise CLIError(
            f"--lens shows at most {MAX_LENS_POSITIONS} positions (each layer's logits over the "
            f"vocabulary are computed, its top 5 kept), the text has {t} tokens: shorten it"
        )


def _with_lens(data: ViewerData, loaded: Run, inputs: ModelInputs, spec: str) -> ViewerData:
    """The page with the lens panel: the logit lens, and the tuned lens of ``tuned:PATH``."""
    decode = token_decoder(loaded)
    loaded.model.eval()
    for which in dict.fromkeys(["logit", spec]):
        lens, labels = lens_of(loaded, inputs, which)
        data = add_lens(data, lens, labels, decode)
    return data


def _check_page_size(
    loaded: Run,
    inputs: ModelInputs,
    names: Callable[[str], bool] | None,
    device: object,
    methods: list[str] | None = None,
) -> None:
    """Refuse a page a browser could not open (:data:`MAX_PAGE_BYTES`), or whose weights would
    not fit the memory, in one line saying how to reduce it, before anything is captured; the
    methods of ``--mixing`` count (:func:`~attnlab.viz.viewer_mixing.page_factor`)."""
    layers, heads, t = attention_size(loaded.model, inputs, names)
    if not layers:
        return  # the capture says that --layer selects nothing
    factor = page_factor(methods or [], max(1, heads // layers))
    weights = int(heads * t * t * factor)
    page = int(weights * PAGE_BYTES_PER_WEIGHT)
    if page > MAX_PAGE_BYTES:
        longest = math.isqrt(int(MAX_PAGE_BYTES / PAGE_BYTES_PER_WEIGHT * t * t / weights))
        one = f"one layer: about {format_bytes(page // layers)}; " if layers > 1 else ""
        raise CLIError(
            f"the page would hold {layers} attention layers, {heads} heads of {t} × {t} "
            f"weights{f' and --mixing ({factor:.1f}× the weights)' if methods else ''}: about "
            f"{format_bytes(page)}, more than the {format_bytes(MAX_PAGE_BYTES)} "
            f"a browser opens; choose layers with --layer PATH ({one}these layers take at most "
            f"{longest} tokens) or shorten the text (inspect --long measures a long text)"
        )
    text = f"the text ({t} tokens)"
    check_fits(text, weights * BUILD_BYTES_PER_WEIGHT, what="the attention weights and the page")
    if str(device) != "cpu":
        check_fits(text, weights * 4, what="the captured attention weights", device=device)


def _training_view(args: argparse.Namespace) -> int:
    from attnlab.tasks.probe import load_probe_history
    from attnlab.viz.evolution_viewer import viewer_data_from_history

    if args.text is not None or args.ids is not None or args.layer or args.lens or args.mixing:
        raise CLIError(
            "--training shows the recorded probe; it takes no --text, --ids, --layer, --lens or "
            "--mixing"
        )
    history = load_probe_history(args.path)
    title = f"attnlab · {Path(args.path).name} · attention during training"
    out = write_viewer(viewer_data_from_history(history, title=title), args.output)
    Console(stderr=True).print(f"wrote [bold]{out}[/bold] ({len(history.steps)} steps)")
    return 0
