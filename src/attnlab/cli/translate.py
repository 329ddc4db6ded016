"""``attnlab translate RUN "a sentence" [--beams K]``: decode with a trained encoder-decoder.

RUN is a run folder of ``attnlab train translate`` (or of copy / reverse / sort, where the
"sentence" is a string such as ``abcd``). Each sentence is decoded with beam search (greedy with
``--beams 1``) and printed on its own line; ``-`` reads sentences from standard input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console

from attnlab.cli import CLIError
from attnlab.data.tokenizers import tokenizer_from_json
from attnlab.data.train_tasks.seq2seq_eval import decode_sources
from attnlab.data.train_tasks.translate import SRC_TOKENIZER, TGT_TOKENIZER
from attnlab.inspect.loading import LoadedModel, load_model
from attnlab.training.checkpoint import CheckpointError, load_config, read_checkpoint_file

# tasks whose encoder reads the string followed by <eos> (see attnlab.data.tasks)
_ALGORITHMIC = ("copy", "reverse", "sort")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "translate",
        help="translate sentences with a trained encoder-decoder (beam search)",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("run", metavar="RUN", help="run folder or checkpoint")
    p.add_argument(
        "sentences", metavar="SENTENCE", nargs="+", help="text to translate ('-': stdin)"
    )
    p.add_argument("--beams", type=int, default=4, help="beam size; 1 is greedy (default 4)")
    p.add_argument("--device", default="cpu", help="default cpu")
    p.set_defaults(func=run)


def translate_text(loaded: LoadedModel, sentences: Sequence[str], *, beams: int = 4) -> list[str]:
    """Decode ``sentences`` with a loaded encoder-decoder run.

    Args:
        loaded: from :func:`attnlab.inspect.loading.load_model` (an encoder-decoder).
        sentences: source texts.
        beams: beam size (1: greedy).

    Returns:
        One decoded text per sentence.
    """
    if not loaded.is_seq2seq:
        raise CLIError(
            f"{loaded.path} holds a language model, not an encoder-decoder; use generate"
        )
    if beams < 1:
        raise ValueError(f"--beams must be a positive int, got {beams}")
    try:
        src_tok = tokenizer_from_json(read_checkpoint_file(loaded.path, SRC_TOKENIZER).decode())
        tgt_tok = tokenizer_from_json(read_checkpoint_file(loaded.path, TGT_TOKENIZER).decode())
    except CheckpointError:
        if loaded.tokenizer is None:
            raise CLIError(f"{loaded.path} holds no tokenizer: cannot encode the text") from None
        src_tok = tgt_tok = loaded.tokenizer
    task = str(load_config(loaded.path, verify=False).get("task", ""))
    cfg = loaded.config
    sources = []
    for text in sentences:
        ids = src_tok.encode(text)[: cfg.max_len - 2]  # type: ignore[union-attr]
        if task in _ALGORITHMIC:
            ids = [*ids, cfg.eos_id]  # type: ignore[union-attr]
        if not ids:
            raise ValueError(f"the sentence {text!r} encodes to no tokens")
        sources.append(ids)
    max_new = min(cfg.max_len - 1, 2 * max(len(s) for s in sources) + 10)  # type: ignore[union-attr]
    outputs = decode_sources(
        loaded.model,
        sources,
        max_new_tokens=max_new,
        strategy="beam" if beams > 1 else "greedy",
        num_beams=beams,
    )
    return [tgt_tok.decode(o) for o in outputs]


def run(args: argparse.Namespace) -> int:
    sentences = (
        [line.rstrip("\n") for line in sys.stdin] if args.sentences == ["-"] else args.sentences
    )
    loaded = load_model(args.run, device=args.device)
    console = Console()
    for line in translate_text(loaded, sentences, beams=args.beams):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return 0
