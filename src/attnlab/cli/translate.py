"""``attnlab translate RUN "a sentence" [--beams K]``: decode with a trained encoder-decoder.

RUN is a run folder of ``attnlab train translate`` (or of copy / reverse / sort, where the
"sentence" is a string such as ``abcd``). The sentence goes through the task's own text path
(:mod:`attnlab.tasks`), so the encoder reads exactly what it read in training (the copy, reverse
and sort tasks end the source with ``<eos>``). Each sentence is decoded with the run's own
evaluation decoding (greedy for copy/reverse/sort, its final beam size for translate) unless
``--beams`` says otherwise, and printed on its own line; ``-`` reads sentences from standard input.
A sentence the model cannot take (longer than it was trained on, no tokens, characters outside a
task's alphabet) does not stop the others: they are translated, the bad one gets an empty output
line (line i of the output answers sentence i) and one ``attnlab: error: sentence i: …`` line on
standard error, and the exit code is 2. A sentence longer than any the run was trained on is
translated all the same, with one ``attnlab: warning: sentence i: …`` line on standard error
(the exit code stays 0).
On a terminal, control characters of the output are shown escaped (e.g. ``\\x1b``); ``--raw``
writes them as they are (so does a pipe or a file).
"""

from __future__ import annotations

import argparse
import sys
import warnings

from attnlab.cli import CLIError
from attnlab.cli._device import device
from attnlab.cli._help import plain
from attnlab.cli._terminal import TextConsole
from attnlab.cli.errors import report
from attnlab.cli.options import add_cache_argument, beams
from attnlab.errors import ArgumentError, UntrainedLengthWarning
from attnlab.tasks.run import load_run
from attnlab.tasks.seq2seq import Seq2SeqIO


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "translate",
        help="translate sentences with a trained encoder-decoder (beam search)",
        description=plain(__doc__),
    )
    p.add_argument("run", metavar="RUN", help="run folder or checkpoint")
    p.add_argument(
        "sentences", metavar="SENTENCE", nargs="+", help="text to translate ('-': stdin)"
    )
    p.add_argument(
        "--beams",
        type=beams,
        default=None,
        help="beam size; 1 is greedy (default: the run's own evaluation)",
    )
    p.add_argument("--device", type=device, default="cpu", help="default cpu")
    add_cache_argument(p)
    p.add_argument(
        "--raw",
        action="store_true",
        help="print control characters as they are (default: shown escaped on a terminal)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sentences = (
        [line.rstrip("\n") for line in sys.stdin] if args.sentences == ["-"] else args.sentences
    )
    loaded = load_run(args.run, device=args.device, cache=not args.no_cache)
    if not isinstance(loaded.io, Seq2SeqIO):
        what = "an encoder" if loaded.is_encoder else "a language model"
        other = "view or inspect" if loaded.is_encoder else "generate"
        raise CLIError(f"{loaded.path} holds {what}, not an encoder-decoder; use {other}")
    console = TextConsole(raw=args.raw)
    code = 0
    with warnings.catch_warnings():  # printed below, one line each, in the sentences' order
        warnings.simplefilter("ignore", UntrainedLengthWarning)
        results = loaded.io.translate_each(loaded.model, sentences, beams=args.beams)
    for i, result in enumerate(results):
        if result.warning is not None:
            console.file.flush()
            print(f"attnlab: warning: sentence {i + 1}: {result.warning}", file=sys.stderr)
        if result.error is not None:  # the others are translated all the same
            console.print_text("")  # line i of the output still answers sentence i
            console.file.flush()
            code = report(ArgumentError(f"sentence {i + 1}: {result.error}"))
            continue
        console.print_text(result.output or "")
    return code
