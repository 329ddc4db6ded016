"""``attnlab plot KIND -o FILE`` — the figures of :mod:`attnlab.viz.figures` as PNG or SVG.

Kinds: ``noam`` (learning-rate schedule), ``positional`` (sinusoidal encodings), ``masks``
(padding and look-ahead masks for ``--text``), ``steps`` (one head step by step on a small random
layer), and ``heatmap`` / ``heads`` / ``layers`` (attention of a trained model on ``--text``:
pass RUN_OR_CHECKPOINT with ``--model``).
"""

from __future__ import annotations

import argparse

import torch
from rich.console import Console

from attnlab.cli import CLIError

__all__ = ["register", "run"]

KINDS = ("noam", "positional", "masks", "steps", "heatmap", "heads", "layers")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw a figure (PNG or SVG): " + ", ".join(KINDS))
    p.add_argument("kind", choices=KINDS, metavar="KIND", help=" | ".join(KINDS))
    p.add_argument(
        "-o", "--output", default=None, help="file to write (.png or .svg; default KIND.png)"
    )
    p.add_argument(
        "--text", default="the cat sat on the mat <pad> <pad>", help="tokens (or model input)"
    )
    p.add_argument("--model", help="RUN_OR_CHECKPOINT for heatmap / heads / layers")
    p.add_argument("--layer", type=int, default=0, help="layer index (heatmap, heads)")
    p.add_argument("--head", type=int, default=0, help="head index (heatmap, steps)")
    p.add_argument("--d-model", type=int, default=512, help="noam / positional width")
    p.add_argument("--warmup", type=int, default=4000, help="noam warm-up steps")
    p.add_argument("--steps", type=int, default=20000, help="noam steps to draw")
    p.add_argument("--max-len", type=int, default=100, help="positional: positions")
    p.add_argument("--max-tokens", type=int, default=64, help="longer sides are block-averaged")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def _model_attentions(args: argparse.Namespace) -> tuple[dict[str, torch.Tensor], list[str]]:
    from attnlab.inspect.capture import capture
    from attnlab.inspect.loading import load_model
    from attnlab.models.config import TransformerConfig

    if not args.model:
        raise CLIError(f"plot {args.kind} needs --model RUN_OR_CHECKPOINT")
    loaded = load_model(args.model)
    if loaded.tokenizer is None:
        raise CLIError("the checkpoint has no tokenizer.json, so --text cannot be encoded")
    ids = list(loaded.tokenizer.encode(args.text))
    labels = [str(loaded.tokenizer.id_to_token(i)) for i in ids]
    x = torch.tensor([ids])
    with torch.no_grad(), capture(loaded.model) as cache:
        if isinstance(loaded.config, TransformerConfig):
            loaded.model(x, torch.tensor([[loaded.config.bos_id, *ids]]))
        else:
            loaded.model(x)
    names = [n for n in cache.attentions if cache.kinds.get(n, "self") == "self"]
    return {n: cache.attentions[n] for n in names}, labels


def run(args: argparse.Namespace) -> int:
    from attnlab.viz import figures as F

    out = args.output or f"{args.kind}.png"
    tokens = args.text.split()
    if args.kind == "noam":
        plot = F.noam_curve(((args.d_model, args.warmup),), steps=args.steps)
    elif args.kind == "positional":
        plot = F.positional_encoding_figure(args.max_len, args.d_model)
    elif args.kind == "masks":
        plot = F.mask_panel(tokens)
    elif args.kind == "steps":
        from attnlab.nn.multihead import MultiHeadAttention

        torch.manual_seed(args.seed)
        mha = MultiHeadAttention(8, 2)
        x = torch.randn(1, len(tokens), 8)
        plot = F.step_panel_from_module(
            mha, x, head=min(args.head, 1), is_causal=True, tokens=tokens
        )
    else:
        atts, labels = _model_attentions(args)
        names = list(atts)
        if args.kind == "layers":
            plot = F.layer_head_grid(atts, max_tokens=args.max_tokens)
        else:
            if not 0 <= args.layer < len(names):
                raise CLIError(f"--layer must be in [0, {len(names)}), got {args.layer}")
            w = atts[names[args.layer]][0]
            if args.kind == "heads":
                plot = F.head_grid(
                    w,
                    max_tokens=args.max_tokens,
                    title=names[args.layer],
                    query_tokens=labels if w.shape[1] == len(labels) else None,
                    key_tokens=labels if w.shape[2] == len(labels) else None,
                )
            else:
                if not 0 <= args.head < w.shape[0]:
                    raise CLIError(f"--head must be in [0, {w.shape[0]}), got {args.head}")
                plot = F.attention_heatmap(
                    w[args.head],
                    max_tokens=args.max_tokens,
                    title=f"{names[args.layer]} head {args.head}",
                    query_tokens=labels if w.shape[1] == len(labels) else None,
                    key_tokens=labels if w.shape[2] == len(labels) else None,
                )
    path = plot.save(out)
    Console(stderr=True).print(f"wrote [bold]{path}[/bold]")
    return 0
