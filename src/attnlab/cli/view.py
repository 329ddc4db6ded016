"""``attnlab view RUN_OR_CHECKPOINT --text TEXT -o view.html`` — the self-contained HTML viewer.

Loads a run folder (its latest checkpoint), a checkpoint folder or a GPT-2 directory, turns the
text into exactly what the model read (through the run's task, special tokens included), runs it
while capturing every attention layer, and writes one HTML file (no network needed to open it).
For an encoder-decoder the text is the source and the target is the model's own decoded output
(as ``attnlab translate`` prints it), or ``--target``. A Linformer encoder (``--attention
linformer``) is shown as it computes: its ``T × k`` weights over the projected ``E·K`` rows, and
the effective weights ``A · F`` over the source tokens (see :mod:`attnlab.viz.viewer`).
The page opens on the most informative head (:func:`attnlab.viz.most_informative_head`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from attnlab.cli import CLIError
from attnlab.cli._device import device
from attnlab.cli._inputs import add_input_arguments, model_inputs
from attnlab.cli.options import add_cache_argument
from attnlab.tasks.figures import capture_inputs, viewer_for
from attnlab.tasks.run import load_run
from attnlab.viz.files import check_output_path
from attnlab.viz.viewer import write_viewer

__all__ = ["register", "run"]


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
        "--training",
        action="store_true",
        help="the attention recorded while the run trained (--probe), with a step slider",
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
    loaded = load_run(args.path, device=args.device, cache=not args.no_cache)
    inputs = model_inputs(loaded, args)
    cache = capture_inputs(loaded.model, inputs)
    title = f"attnlab · {Path(args.path).name} · {inputs.output}"
    out = write_viewer(viewer_for(inputs, cache, title), args.output)
    Console(stderr=True).print(f"wrote [bold]{out}[/bold] ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


def _training_view(args: argparse.Namespace) -> int:
    from attnlab.tasks.probe import load_probe_history
    from attnlab.viz.evolution_viewer import viewer_data_from_history

    if args.text is not None or args.ids is not None:
        raise CLIError("--training shows the recorded probe; it takes no --text or --ids")
    history = load_probe_history(args.path)
    title = f"attnlab · {Path(args.path).name} · attention during training"
    out = write_viewer(viewer_data_from_history(history, title=title), args.output)
    Console(stderr=True).print(f"wrote [bold]{out}[/bold] ({len(history.steps)} steps)")
    return 0
