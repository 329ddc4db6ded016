"""``attnlab inspect MODEL --text … --lens logit|tuned:PATH`` and ``--train-tuned-lens OUT``:
what each layer would predict (:mod:`attnlab.inspect.lens`, :mod:`attnlab.inspect.tuned_lens`).

``--lens`` prints a layers × positions table, each cell the lens's top token and its probability
(``--json``: the same, with each cell's KL to the final distribution). ``--train-tuned-lens OUT
--data TEXT`` trains a tuned lens on the text's tokens (a packaged dataset's name such as
``tinyshakespeare``, or a UTF-8 file; its last part held out), saves it to the folder OUT and
prints the per-layer KL and bits per token of the logit and the tuned lens on the held-out
tokens; ``--lens tuned:PATH --data TEXT`` without ``--text`` prints that table for a saved lens.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnlab.cli import CLIError
from attnlab.cli._terminal import TextConsole
from attnlab.cli.options import positive_int
from attnlab.data.text import read_text_file
from attnlab.inspect.lens import LensComparison, LensResult, lens_comparison, logit_lens
from attnlab.inspect.tuned_lens import TunedLens, load_tuned_lens, train_tuned_lens
from attnlab.tasks.base import ModelInputs, token_labels
from attnlab.tasks.run import Run

#: the share of ``--data``'s characters held out for the table (its end)
HELD_OUT = 0.1
#: characters read a token wanted (English BPE is ~4; a margin)
CHARS_PER_TOKEN = 6


def lens_spec(text: str) -> str:
    """``--lens``'s value: ``logit`` or ``tuned:PATH``."""
    if text == "logit" or (text.startswith("tuned:") and len(text) > len("tuned:")):
        return text
    raise argparse.ArgumentTypeError(f"must be logit or tuned:PATH, got {text!r}")


def add_lens_argument(p: argparse.ArgumentParser) -> None:
    """``--lens`` (``inspect`` and ``plot lens``).

    Args:
        p: the parser.
    """
    p.add_argument(
        "--lens",
        type=lens_spec,
        default=None,
        metavar="logit|tuned:PATH",
        help="what each layer would predict: the residual stream after each layer through the "
        "model's final norm and unembedding (logit), or first through the tuned lens saved "
        "in folder PATH (tuned:PATH, from --train-tuned-lens); inspect: a layers × positions "
        "table of top tokens and probabilities (with --data and no --text: per-layer KL and "
        "bits per token, logit vs tuned)",
    )


def add_lens_arguments(p: argparse.ArgumentParser) -> None:
    """``--lens``, ``--train-tuned-lens`` and its options (``inspect``).

    Args:
        p: the ``inspect`` parser.
    """
    add_lens_argument(p)
    p.add_argument(
        "--train-tuned-lens",
        metavar="OUT",
        default=None,
        help="train a tuned lens (one affine translator a layer, Belrose et al. 2023) on "
        "--data's tokens, save it to the folder OUT, and print per-layer KL and bits per "
        "token of the logit and tuned lens on the held-out last 10%% of --data",
    )
    p.add_argument(
        "--data",
        default=None,
        help="--train-tuned-lens / --lens with no --text: a packaged text (tinyshakespeare) or "
        "a UTF-8 text file",
    )
    p.add_argument("--steps", type=positive_int, default=100,
                   help="--train-tuned-lens: optimizer steps (default 100)")  # fmt: skip
    p.add_argument("--seq-len", type=positive_int, default=128,
                   help="--train-tuned-lens: tokens a window (default 128)")  # fmt: skip
    p.add_argument("--batch-size", type=positive_int, default=4,
                   help="--train-tuned-lens: windows a step (default 4)")  # fmt: skip
    p.add_argument("--lr", type=_lr, default=1e-3,
                   help="--train-tuned-lens: Adam's learning rate (default 1e-3)")  # fmt: skip
    p.add_argument("--eval-tokens", type=positive_int, default=2048,
                   help="the held-out tokens of the KL table (default 2048)")  # fmt: skip


def _lr(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return value


def wants_lens(args: argparse.Namespace) -> bool:
    """Whether ``inspect`` runs a lens command.

    Args:
        args: the parsed arguments.

    Returns:
        ``--lens`` or ``--train-tuned-lens`` was given.
    """
    return args.lens is not None or args.train_tuned_lens is not None


def _tuned(loaded: Run, spec: str) -> TunedLens | None:
    return None if spec == "logit" else load_tuned_lens(spec[len("tuned:") :], loaded.model)


def lens_of(loaded: Run, inputs: ModelInputs, spec: str) -> tuple[LensResult, list[str]]:
    """The lens ``spec`` of the model on what it read, and the tokens labelling its positions.

    Args:
        loaded: the run.
        inputs: what it read.
        spec: ``logit`` or ``tuned:PATH``.

    Returns:
        The :class:`~attnlab.inspect.LensResult` and one label a position.
    """
    device = next(loaded.model.parameters()).device
    tuned = _tuned(loaded, spec)
    if inputs.kind == "seq2seq":  # the decoder's positions
        src = torch.tensor([inputs.source_ids], device=device)
        tgt = torch.tensor([inputs.decoder_input_ids], device=device)
        labels = token_labels(_tokenizer(loaded), inputs.decoder_input_ids)
        return logit_lens(loaded.model, src, target_ids=tgt, tuned=tuned), labels
    ids = torch.tensor([inputs.source_ids + inputs.target_ids], device=device)
    return logit_lens(loaded.model, ids, tuned=tuned), list(inputs.tokens)


def token_decoder(loaded: Run) -> Callable[[int], str]:
    """A token id → its label, by the run's (target) tokenizer (the id without one).

    Args:
        loaded: the run.

    Returns:
        The function.
    """
    tok = _tokenizer(loaded)

    def decode(i: int) -> str:
        return token_labels(tok, [i])[0]

    return decode


def _tokenizer(loaded: Run) -> Any:
    io = loaded.io
    return getattr(io, "tgt_tokenizer", None) or getattr(io, "tokenizer", None)


def _data_ids(loaded: Run, data: str, tokens: int, held_out: bool) -> torch.Tensor:
    """The token ids of ``--data``'s training part (its first 90%) or held-out part (its end),
    enough for ``tokens`` tokens."""
    from attnlab.data import corpora

    encode = getattr(loaded.io, "encode", None)
    if encode is None:
        raise CLIError("the tuned lens reads a language model's text; this run has no tokenizer")
    text = corpora.load_text(data) if corpora.is_dataset(data) else read_text_file(data)
    split = int(len(text) * (1 - HELD_OUT))
    part = text[split:] if held_out else text[:split]
    part = part[: tokens * CHARS_PER_TOKEN]
    ids = torch.tensor(encode(part), dtype=torch.long)
    if ids.numel() < 2:
        raise CLIError(f"--data {data}: its {'held-out' if held_out else 'training'} part "
                       f"encodes to {ids.numel()} tokens")  # fmt: skip
    return ids[:tokens]


def _eval_ids(loaded: Run, args: argparse.Namespace) -> torch.Tensor:
    ids = _data_ids(loaded, args.data, args.eval_tokens, held_out=True)
    width = min(args.seq_len, ids.numel())
    rows = ids.numel() // width
    return ids[: rows * width].view(rows, width)


def run_lens(loaded: Run, inputs: ModelInputs | None, args: argparse.Namespace) -> int:
    """``--lens`` (a table of each layer's top tokens, or with ``--data`` the KL table) or
    ``--train-tuned-lens``.

    Args:
        loaded: the run.
        inputs: what the model read for ``--text``, or ``None`` without one.
        args: the parsed arguments.

    Returns:
        The exit status (0).
    """
    loaded.model.eval()
    if args.train_tuned_lens is not None:
        if inputs is not None or args.lens is not None:
            raise CLIError("--train-tuned-lens trains on --data; it takes no --text/--ids/--lens")
        return _train(loaded, args)
    if inputs is None:
        if args.data is None:
            raise CLIError("--lens needs --text TEXT (or --ids), or --data TEXT for the KL table")
        return _print_comparison(
            lens_comparison(loaded.model, _eval_ids(loaded, args), _tuned(loaded, args.lens)),
            f"{loaded.path}: {args.lens} lens on {args.data}",
            args,
        )
    lens, labels = lens_of(loaded, inputs, args.lens)
    decode = token_decoder(loaded)
    if args.json:
        out = {"model": str(loaded.path), "tokens": labels, **lens.to_dict(decode)}
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
        return 0
    console = TextConsole(width=None if sys.stdout.isatty() else 200)
    console.print(_lens_table(lens, labels, decode, f"{loaded.path}: {args.lens} lens"))
    return 0


def _lens_table(lens: LensResult, labels: list[str], decode: Any, name: str) -> Table:
    t = Table(
        title=f"{name} — each layer's most probable next token and its probability, at each "
        "position (embed: the embeddings; n: after block n; the last row is the model's output)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    t.add_column("layer", no_wrap=True)
    for j, label in enumerate(labels):
        t.add_column(f"{j} {escape(label)!s}", no_wrap=True)
    probs, ids = lens.top(1)
    for i, layer in enumerate(lens.layers):
        cells = [
            f"{escape(repr(decode(int(ids[i, 0, j, 0]))))} {float(probs[i, 0, j, 0]):.2f}"
            for j in range(len(labels))
        ]
        t.add_row(layer, *cells)
    return t


def _train(loaded: Run, args: argparse.Namespace) -> int:
    from attnlab.models.transformer import Transformer

    if isinstance(loaded.model, Transformer):
        raise CLIError(
            "--train-tuned-lens trains on a language model's text; an encoder-decoder's decoder "
            "lens trains on (source, target) rows: attnlab.inspect.train_tuned_lens(model, "
            "(source_ids, target_ids)), then --lens tuned:PATH"
        )
    if args.data is None:
        raise CLIError("--train-tuned-lens needs --data TEXT (tinyshakespeare or a text file)")
    wanted = args.steps * args.batch_size * args.seq_len
    ids = _data_ids(loaded, args.data, wanted, held_out=False)
    if ids.numel() < args.seq_len:
        raise CLIError(f"--data {args.data} holds {ids.numel()} tokens, fewer than --seq-len "
                       f"{args.seq_len}")  # fmt: skip
    eval_ids = _eval_ids(loaded, args)
    err = Console(stderr=True)
    every = max(1, args.steps // 10)
    start = time.process_time()

    def progress(step: int, kl: float) -> None:
        if step == 1 or step % every == 0 or step == args.steps:
            err.print(f"step {step}/{args.steps}: mean KL {kl:.4f} nats "
                      f"({time.process_time() - start:.0f} s CPU)")  # fmt: skip

    lens = train_tuned_lens(
        loaded.model, ids, steps=args.steps, seq_len=args.seq_len, batch_size=args.batch_size,
        lr=args.lr, on_step=progress,
    )  # fmt: skip
    lens.config["data"] = args.data
    out = lens.save(args.train_tuned_lens)
    err.print(f"wrote [bold]{out}[/bold]")
    return _print_comparison(
        lens_comparison(loaded.model, eval_ids, lens),
        f"{loaded.path}: logit vs tuned lens on {eval_ids.numel()} held-out tokens of {args.data}",
        args,
    )


def _print_comparison(table: LensComparison, title: str, args: argparse.Namespace) -> int:
    if args.json:
        sys.stdout.write(json.dumps({"title": title, **table.to_dict()}) + "\n")
        return 0
    t = Table(
        title=f"{title} — KL(final ‖ lens) and cross-entropy against the next token, bits per "
        f"token (the model itself: {table.bits_model:.3f} bits)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    tuned = table.kl_tuned is not None
    for col in ("layer", "KL logit", *(("KL tuned",) if tuned else ()), "bits logit",
                *(("bits tuned",) if tuned else ())):  # fmt: skip
        t.add_column(col, justify="right")
    for r in table.rows():
        cells = [f"{r['kl_logit']:.3f}"] + ([f"{r['kl_tuned']:.3f}"] if tuned else [])
        cells += [f"{r['bits_logit']:.3f}"] + ([f"{r['bits_tuned']:.3f}"] if tuned else [])
        t.add_row(r["layer"], *cells)
    TextConsole(width=None if sys.stdout.isatty() else 120).print(t)
    return 0
