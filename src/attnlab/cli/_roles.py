"""Head-role scores of a loaded model, shared by ``attnlab inspect --roles`` and
``attnlab plot roles``: the random tokens avoid the tokenizer's special ids, and ``--roles-bos``
says what comes before them — ``none`` (default: ``r + r``), ``tokenizer`` (the model
tokenizer's BOS, TransformerLens' default convention) or an id."""

from __future__ import annotations

import argparse
from typing import Any

from attnlab._budget import check_at_most
from attnlab.cli.errors import CLIError
from attnlab.cli.options import positive_int, seed
from attnlab.inspect.roles import MAX_BATCH, HeadRoles, head_roles, ordinary_token_range
from attnlab.models.gpt import GPT
from attnlab.tasks.base import special_ids
from attnlab.tasks.run import Run

__all__ = ["add_roles_arguments", "measure_roles", "read_roles", "roles_bos", "special_ids"]


def add_roles_arguments(p: argparse.ArgumentParser) -> None:
    """The options of the role scores' input."""
    p.add_argument(
        "--roles-seq-len",
        type=positive_int,
        default=50,
        help="role scores: random tokens per copy (the input is twice as long; default 50)",
    )
    p.add_argument(
        "--roles-batch",
        type=positive_int,
        default=8,
        help=f"role scores: random sequences averaged over (default 8, at most {MAX_BATCH})",
    )
    p.add_argument(
        "--roles-seed", type=seed, default=0, help="role scores: seed of the tokens (default 0)"
    )
    p.add_argument(
        "--roles-bos",
        type=roles_bos,
        default="none",
        metavar="{none,tokenizer,ID}",
        help="role scores: what comes before the random tokens — none (default: r + r), "
        "tokenizer (the model tokenizer's BOS: TransformerLens' default, prepend_bos=True) or a "
        "token id; single heads' scores move with it (SmolLM2: by up to 0.07 with its BOS, "
        "0.28 with id 0 first)",
    )


def roles_bos(text: str) -> str | int:
    """argparse type of ``--roles-bos``: ``none``, ``tokenizer`` or a token id (an int >= 0;
    whether it is in the vocabulary is checked once the model is loaded).

    Args:
        text: the command-line value.

    Returns:
        ``"none"``, ``"tokenizer"`` or the id.

    Raises:
        argparse.ArgumentTypeError: anything else; argparse prints it as a one-line usage error.
    """
    if text in ("none", "tokenizer"):
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"expected none, tokenizer or a token id (an int >= 0), got {text!r}"
        )
    return value


def measure_roles(loaded: Run, args: argparse.Namespace) -> HeadRoles:
    """:func:`~attnlab.inspect.roles.head_roles` of a loaded run with the command's options."""
    if not isinstance(loaded.model, GPT):
        kind = "an encoder" if loaded.is_encoder else "an encoder-decoder"
        raise CLIError(f"role scores need a decoder-only language model; {loaded.path} is {kind}")
    check_at_most("--roles-batch", args.roles_batch, MAX_BATCH, "the scores settle long before")
    tokenizer = getattr(loaded.io, "tokenizer", None)
    vocab = loaded.model.config.vocab_size
    bos = _bos(getattr(args, "roles_bos", "none"), tokenizer, vocab, str(loaded.path))
    return head_roles(
        loaded.model,
        seq_len=args.roles_seq_len,
        batch=args.roles_batch,
        seed=args.roles_seed,
        token_range=ordinary_token_range(vocab, special_ids(tokenizer)),
        bos=bos,
    )


def _bos(choice: str | int, tokenizer: Any, vocab: int, name: str) -> int | None:
    """The id ``--roles-bos`` asks for (``None``: none), checked against the model."""
    if choice == "none":
        return None
    if choice == "tokenizer":
        bos = getattr(tokenizer, "bos_id", None)
        if not isinstance(bos, int) or isinstance(bos, bool):
            raise CLIError(
                f"--roles-bos tokenizer: {name} has no tokenizer with a BOS token; "
                "give an id (--roles-bos ID) or none"
            )
        choice = bos
    if not isinstance(choice, int) or not 0 <= choice < vocab:
        raise CLIError(f"--roles-bos must be a token id in [0, {vocab}), got {choice}")
    return choice


def read_roles(path: str) -> tuple[HeadRoles, str | None]:
    """``plot roles --from FILE``: the role scores ``attnlab inspect MODEL --roles --json``
    wrote to ``path`` (:func:`~attnlab.inspect.roles.load_head_roles`), and the model named."""
    from pathlib import Path

    from attnlab.inspect.roles import load_head_roles

    if not Path(path).is_file():
        what = "is a folder" if Path(path).is_dir() else "does not exist"
        raise CLIError(f"--from {path}: the file {what} (write it with attnlab inspect MODEL "
                       "--roles --json > FILE)")  # fmt: skip
    return load_head_roles(path)
