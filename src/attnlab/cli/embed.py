"""``attnlab embed MODEL TEXT [TEXT …]`` — sentence embeddings of an encoder and their cosine
similarities.

The texts are read as one padded batch with the tokenizer's special tokens (``[CLS] … [SEP]``);
each embedding is the mean of the last hidden states over the text's tokens, normalised to unit
length (:func:`attnlab.embed`; sentence-transformers' all-MiniLM-L6-v2 pooling), so their dot
products are cosine similarities. ``--json`` prints the texts, the embeddings and the matrix.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich import box
from rich.table import Table

from attnlab.cli._device import device
from attnlab.cli._help import plain
from attnlab.cli._terminal import TextConsole
from attnlab.cli.errors import CLIError

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "embed",
        help="sentence embeddings of an encoder (minilm-l6) and their cosine similarities",
        description=plain(__doc__),
    )
    p.add_argument("model", metavar="MODEL", help="an encoder: minilm-l6 or a BERT-family folder")
    p.add_argument("texts", metavar="TEXT", nargs="+", help="the texts (one batch)")
    p.add_argument("--json", action="store_true", help="print texts, embeddings and similarities")
    p.add_argument("--device", type=device, default="cpu", help="torch device (default cpu)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.models.embedding import embed
    from attnlab.models.encoder import Encoder
    from attnlab.models.pretrained import is_pretrained_source, load_pretrained

    if not is_pretrained_source(args.model):
        raise CLIError(f"MODEL must be a pretrained encoder (e.g. minilm-l6), got {args.model!r}")
    model, tokenizer = load_pretrained(args.model, device=args.device)
    if not isinstance(model, Encoder):
        raise CLIError(f"embed needs an encoder (e.g. minilm-l6); {args.model} is a decoder")
    if tokenizer is None:
        raise CLIError(f"{args.model} has no tokenizer.json, so a text cannot be encoded")
    e = embed(args.texts, model, tokenizer).float().cpu()  # (N, d_model)
    similarity = e @ e.T  # (N, N) cosine similarities: the rows have unit length
    if args.json:
        out = {"model": args.model, "texts": args.texts, "embeddings": e.tolist(),
               "similarity": similarity.tolist()}  # fmt: skip
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
        return 0
    console = TextConsole(width=None if sys.stdout.isatty() else 120)
    table = Table(
        title=f"cosine similarity of {args.model}'s sentence embeddings ({e.shape[1]} numbers "
        "each: mean over the tokens, unit length)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    table.add_column("text")
    for i in range(len(args.texts)):
        table.add_column(str(i), justify="right")
    for i, text in enumerate(args.texts):
        table.add_row(f"{i} {text}", *(f"{float(v):.3f}" for v in similarity[i]))
    console.print(table)
    return 0
