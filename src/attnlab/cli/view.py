"""``attnlab view RUN_OR_CHECKPOINT --text TEXT -o view.html`` — the self-contained HTML viewer.

Loads a run folder (its latest checkpoint), a checkpoint folder or a GPT-2 directory, runs the text
through the model while capturing every attention layer, and writes one HTML file (no network
needed to open it). For the encoder-decoder the text is the source; the target is ``--target`` or
the model's greedy output.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from rich.console import Console

from attnlab.cli import CLIError

__all__ = ["register", "run", "write_view"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("view", help="write a self-contained HTML attention viewer for a text")
    p.add_argument(
        "path", metavar="RUN_OR_CHECKPOINT", help="run folder, checkpoint folder or GPT-2 directory"
    )
    p.add_argument(
        "--text", required=True, help="the input text (the source for an encoder-decoder)"
    )
    p.add_argument("--target", help="encoder-decoder: the target text (default: greedy output)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="encoder-decoder greedy length")
    p.add_argument("-o", "--output", default="view.html", help="the HTML file to write")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=run)


def _labels(tokenizer: object, ids: list[int]) -> list[str]:
    if tokenizer is None or not hasattr(tokenizer, "id_to_token"):
        return [str(i) for i in ids]
    return [str(tokenizer.id_to_token(i)) for i in ids]  # type: ignore[attr-defined]


def _encode(tokenizer: object, text: str, what: str) -> list[int]:
    if tokenizer is None:
        raise CLIError("the checkpoint has no tokenizer.json, so --text cannot be encoded")
    ids = list(tokenizer.encode(text))  # type: ignore[attr-defined]
    if not ids:
        raise CLIError(f"the {what} is empty after tokenization")
    return ids


def run(args: argparse.Namespace) -> int:
    out = write_view(
        args.path,
        args.text,
        args.output,
        target=args.target,
        max_new_tokens=args.max_new_tokens,
        device=args.device,
    )
    Console(stderr=True).print(f"wrote [bold]{out}[/bold] ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


def write_view(
    path: str | Path,
    text: str,
    output: str | Path,
    *,
    target: str | None = None,
    max_new_tokens: int = 64,
    device: str = "cpu",
) -> Path:
    """Load a run/checkpoint, capture its attention on ``text`` and write the HTML viewer.

    Args:
        path: run folder, checkpoint folder or GPT-2 directory.
        text: the input (the source for an encoder-decoder).
        output: the HTML file to write.
        target: encoder-decoder target text (default: the model's greedy output).
        max_new_tokens: greedy length for the encoder-decoder.
        device: where to run.

    Returns:
        The path written.
    """
    from attnlab.inspect.capture import capture
    from attnlab.inspect.loading import load_model
    from attnlab.models.config import TransformerConfig
    from attnlab.viz.viewer import viewer_data, write_viewer

    if not Path(path).exists():
        raise CLIError(f"RUN_OR_CHECKPOINT {str(path)!r} does not exist")
    loaded = load_model(path, device=device)
    model, cfg, tok = loaded.model, loaded.config, loaded.tokenizer
    ids = _encode(tok, text, "text")
    x = torch.tensor([ids], device=device)
    with torch.no_grad():
        if isinstance(cfg, TransformerConfig):
            if len(ids) > cfg.max_len:
                raise CLIError(
                    f"the text has {len(ids)} tokens, more than the model's max_len {cfg.max_len}"
                )
            if target is not None:
                tgt = [cfg.bos_id, *_encode(tok, target, "target")][: cfg.max_len]
                y = torch.tensor([tgt], device=device)
            else:
                from attnlab.decoding.generate import generate

                steps = max(1, min(max_new_tokens, cfg.max_len - 1))
                y = generate(model, x, max_new_tokens=steps, eos_token_id=cfg.eos_id)
            with capture(model) as cache:
                model(x, y)
            data = viewer_data(
                cache.attentions,
                source=_labels(tok, ids),
                target=_labels(tok, y[0].tolist()),
                kinds=cache.kinds,
                title=f"attnlab · {Path(path).name}",
            )
        else:
            if len(ids) > cfg.n_positions:
                raise CLIError(
                    f"the text has {len(ids)} tokens, more than the model's n_positions {cfg.n_positions}"
                )
            with capture(model) as cache:
                model(x)
            data = viewer_data(
                cache.attentions,
                tokens=_labels(tok, ids),
                kinds=cache.kinds,
                title=f"attnlab · {Path(path).name}",
            )
    return write_viewer(data, output)
