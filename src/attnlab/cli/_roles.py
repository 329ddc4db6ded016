"""Head-role scores of a loaded model, shared by ``attnlab inspect --roles`` and
``attnlab plot roles``: the random tokens avoid the tokenizer's special ids, and a ``bos`` is put
first when the model's tokenizer asks for one (``add_bos``)."""

from __future__ import annotations

import argparse
from typing import Any

from attnlab._budget import check_at_most
from attnlab.cli.errors import CLIError
from attnlab.cli.options import positive_int, seed
from attnlab.inspect.roles import MAX_BATCH, HeadRoles, head_roles, ordinary_token_range
from attnlab.models.gpt import GPT
from attnlab.tasks.run import Run

__all__ = ["add_roles_arguments", "measure_roles", "special_ids"]


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


def special_ids(tokenizer: Any) -> list[int]:
    """The ids of a tokenizer's special tokens: bos/eos/pad/unk and added special tokens."""
    if tokenizer is None:
        return []
    ids = [getattr(tokenizer, name, None) for name in ("bos_id", "eos_id", "pad_id", "unk_id")]
    backend = getattr(tokenizer, "tokenizer", None)
    added = getattr(backend, "get_added_tokens_decoder", None)
    if callable(added):
        ids += [i for i, token in added().items() if getattr(token, "special", True)]
    return sorted({int(i) for i in ids if isinstance(i, int)})


def measure_roles(loaded: Run, args: argparse.Namespace) -> HeadRoles:
    """:func:`~attnlab.inspect.roles.head_roles` of a loaded run with the command's options."""
    if not isinstance(loaded.model, GPT):
        raise CLIError(
            f"role scores need a decoder-only language model; {loaded.path} is an encoder-decoder"
        )
    check_at_most("--roles-batch", args.roles_batch, MAX_BATCH, "the scores settle long before")
    tokenizer = getattr(loaded.io, "tokenizer", None)
    vocab = loaded.model.config.vocab_size
    bos = getattr(tokenizer, "bos_id", None) if getattr(tokenizer, "add_bos", False) else None
    return head_roles(
        loaded.model,
        seq_len=args.roles_seq_len,
        batch=args.roles_batch,
        seed=args.roles_seed,
        token_range=ordinary_token_range(vocab, special_ids(tokenizer)),
        bos=bos,
    )
