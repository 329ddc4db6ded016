"""The options that name a run and a text, shared by ``view``, ``inspect`` and ``plot``.

They only collect what the user asked for; the run's task turns it into the model's inputs
(:meth:`attnlab.tasks.run.Run.inputs`), the same way ``translate`` and ``generate`` do.
"""

from __future__ import annotations

import argparse

from attnlab.cli import CLIError
from attnlab.cli.options import beams, non_negative_int
from attnlab.models.config import TransformerConfig
from attnlab.tasks.base import ModelInputs
from attnlab.tasks.run import Run

__all__ = ["add_input_arguments", "model_inputs"]


def add_input_arguments(p: argparse.ArgumentParser, *, text_required: bool = True) -> None:
    """``--text | --ids``, ``--target``, ``--beams``, ``--generate`` (``--max-new-tokens``)."""
    src = p.add_mutually_exclusive_group(required=text_required)
    src.add_argument("--text", help="the input text (the source for an encoder-decoder)")
    src.add_argument("--ids", help="token ids the model reads verbatim, e.g. '5 9 12'")
    p.add_argument(
        "--target",
        help="encoder-decoder: teacher-force this target instead of the model's own output",
    )
    p.add_argument(
        "--beams",
        type=beams,
        default=None,
        help="encoder-decoder: beam size of the decoded output (default: the run's evaluation)",
    )
    # two options, one value: each names itself in its errors
    p.add_argument(
        "--generate",
        dest="max_new_tokens",
        metavar="N",
        type=non_negative_int,
        default=0,
        help="language model: generate N tokens greedily after the text and show the attention "
        "of the whole sequence, prompt and generated tokens (default 0)",
    )
    p.add_argument(
        "--max-new-tokens",
        dest="max_new_tokens",
        metavar="N",
        type=non_negative_int,
        default=0,
        help="the same as --generate",
    )


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise CLIError(f"--ids must be integers separated by spaces, got {text!r}") from None
    if not ids:
        raise CLIError("--ids must hold at least one token id")
    return ids


def model_inputs(run: Run, args: argparse.Namespace) -> ModelInputs:
    """What the run's model reads for the text (or ids) the options name, as its task says."""
    source_ids = _ids(args.ids) if args.ids is not None else None
    if source_ids is not None:
        cfg = run.config
        vocab = cfg.src_vocab_size if isinstance(cfg, TransformerConfig) else cfg.vocab_size
        bad = [i for i in source_ids if not 0 <= i < vocab]
        if bad:
            raise CLIError(
                f"--ids must be token ids in [0, {vocab}) (the vocabulary), got {bad[0]}"
            )
    if run.is_seq2seq:
        if args.max_new_tokens:
            raise CLIError(
                "--generate/--max-new-tokens is for language models; an encoder-decoder decodes "
                "as its task does (use --beams or --target)"
            )
        return run.inputs(args.text, target=args.target, beams=args.beams, source_ids=source_ids)
    kind = "an encoder" if run.is_encoder else "a language model"
    if args.target is not None or args.beams is not None:
        raise CLIError(f"--target and --beams are for encoder-decoders; this run is {kind}")
    if run.is_encoder and args.max_new_tokens:
        raise CLIError(
            "--generate/--max-new-tokens is for language models; an encoder reads the text in "
            "both directions and generates nothing"
        )
    return run.inputs(args.text, max_new_tokens=args.max_new_tokens, source_ids=source_ids)
