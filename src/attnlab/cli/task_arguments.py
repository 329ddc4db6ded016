"""The options of ``attnlab train TASK`` for the built-in tasks: argparse, over the tasks' typed
options (:mod:`attnlab.tasks.train_options`: a field a flag, ``--block-size`` is ``block_size``,
with the same defaults; ``tests/tasks/test_train_api.py`` keeps the two equal).

A task registered from outside (:func:`attnlab.tasks.register_task`) brings its own
``add_arguments(parser)``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from attnlab.cli.options import (
    add_attention_arguments,
    add_transformer_arguments,
    beams,
    non_negative_float,
    positive_float,
    positive_int,
    probability,
)
from attnlab.data import corpora
from attnlab.models.families import PRESETS
from attnlab.tasks.train_options import BLEU_TOKENIZERS

__all__ = ["add_task_arguments"]


def add_lm_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the data (``--data``, ``--bpe``, ``--block-size``, ...), model and optimiser options.

    Args:
        parser: the sub-command parser of ``attnlab train lm``.
    """
    g = parser.add_argument_group("data")
    g.add_argument(
        "--data",
        required=True,
        help=f"a packaged dataset ({', '.join(corpora.names('text'))}) or a UTF-8 text file",
    )
    g.add_argument("--bpe", action="store_true", help="byte-level BPE tokens instead of characters")
    g.add_argument(
        "--bpe-vocab",
        type=positive_int,
        default=1024,
        help="BPE vocabulary size (default 1024)",
    )
    m = parser.add_argument_group("model")
    m.add_argument(
        "--block-size", type=positive_int, default=64, help="context length (default 64)"
    )
    m.add_argument("--n-layer", type=positive_int, default=4, help="default 4")
    m.add_argument("--n-head", type=positive_int, default=4, help="default 4")
    m.add_argument("--n-embd", type=positive_int, default=128, help="default 128")
    m.add_argument(
        "--family", choices=PRESETS, default="gpt2",
        help="the model's parts: gpt2 (LayerNorm, GELU, learned positions; the default), llama "
        "(RMSNorm, SwiGLU, RoPE, no biases; with --attention sliding it is Mistral) or neox "
        "(parallel residual, partial RoPE, exact GELU)",
    )  # fmt: skip
    m.add_argument("--dropout", type=probability, default=0.0, help="default 0.0")
    m.add_argument(
        "--bias",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="biases in linear layers and LayerNorms (default: the family's, yes for gpt2 and "
        "neox, no for llama; nanoGPT trains with --no-bias)",
    )
    add_attention_arguments(parser, what="causal self-attention (sliding, performer or bigbird)")
    o = parser.add_argument_group("optimisation")
    o.add_argument("--batch-size", type=positive_int, default=12, help="default 12")
    o.add_argument(
        "--lr", type=positive_float, default=1e-3, help="peak learning rate (default 1e-3)"
    )
    o.add_argument(
        "--min-lr", type=positive_float, default=1e-4, help="final learning rate (default 1e-4)"
    )
    o.add_argument(
        "--warmup", type=positive_int, default=None,
        help="warm-up steps (default 100, or a tenth of the decay when it is not above 100)",
    )  # fmt: skip
    o.add_argument(
        "--lr-decay-steps", type=positive_int, default=None,
        help="step at which the cosine decay reaches --min-lr (default --steps)",
    )  # fmt: skip
    o.add_argument("--weight-decay", type=non_negative_float, default=0.1, help="default 0.1")
    o.add_argument(
        "--eval-iters", type=positive_int, default=20,
        help="batches per loss estimate (default 20)",
    )  # fmt: skip
    parser.set_defaults(eval_every=250, clip=1.0)


def add_translate_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the data options (training, dev and test files, tokenizer and vocabulary sizes,
    ``--max-tokens``, ``--beams``, ``--bleu-tokenize``) and the Transformer options.

    Args:
        parser: the sub-command parser of ``attnlab train translate``.
    """
    g = parser.add_argument_group("data")
    g.add_argument(
        "--corpus", choices=corpora.names("parallel"), default=None,
        help="a packaged parallel dataset with its train, dev and test splits, instead of "
        "the files below",
    )  # fmt: skip
    g.add_argument("--src", default=None, help="training source file (one sentence a line)")
    g.add_argument("--tgt", default=None, help="training target file (line i ↔ line i)")
    for split in ("dev", "test"):
        g.add_argument(f"--{split}-src", default=None, help=f"{split} source file")
        g.add_argument(f"--{split}-tgt", default=None, help=f"{split} target file")
    g.add_argument("--tokenizer", choices=("bpe", "word"), default="bpe", help="default bpe")
    g.add_argument("--src-vocab", type=positive_int, default=8000, help="default 8000")
    g.add_argument("--tgt-vocab", type=positive_int, default=8000, help="default 8000")
    g.add_argument(
        "--max-tokens", type=positive_int, default=4096,
        help="padded tokens per batch (default 4096)",
    )  # fmt: skip
    g.add_argument("--beams", type=beams, default=4, help="beam size at the end (default 4)")
    g.add_argument(
        "--bleu-tokenize", default="13a", choices=BLEU_TOKENIZERS,
        help="sacrebleu tokenizer for BLEU (default 13a; 'none' for pre-tokenized text)",
    )  # fmt: skip
    add_transformer_arguments(
        parser, d_model=256, layers=3, heads=4, d_ff=1024, dropout=0.1, warmup=400,
        batch_size=None,
    )  # fmt: skip
    add_attention_arguments(
        parser,
        what="self-attention (sliding: encoder (w, w), decoder (w, 0); linformer: encoder "
        "only; performer, bigbird: both, the decoder's causal; cross-attention stays full)",
    )
    parser.set_defaults(eval_every=1000)


def add_algorithmic_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the data options (``--num-symbols``, ``--min-len``, ``--max-len``,
    ``--num-heldout``), the Transformer options with this task's defaults, and the attention
    options of ``train translate`` (``--attention``, ``--window``, ``--linformer-k``, …;
    default full).

    Args:
        parser: the task's sub-command parser.
    """
    g = parser.add_argument_group("data")
    g.add_argument(
        "--num-symbols", type=positive_int, default=10, help="alphabet size (default 10)"
    )
    g.add_argument("--min-len", type=positive_int, default=1, help="shortest string (default 1)")
    g.add_argument("--max-len", type=positive_int, default=16, help="longest string (default 16)")
    g.add_argument(
        "--num-heldout", type=positive_int, default=500, help="held-out strings (default 500)"
    )
    add_transformer_arguments(
        parser,
        d_model=128,
        layers=2,
        heads=4,
        d_ff=256,
        dropout=0.0,
        warmup=200,
        batch_size=64,
        lr_factor=0.5,
    )
    add_attention_arguments(
        parser,
        what="self-attention (sliding: encoder (w, w), decoder (w, 0); linformer: encoder "
        "only; performer, bigbird: both, the decoder's causal; cross-attention stays full)",
    )
    parser.set_defaults(eval_every=500)


_BUILTIN: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "lm": add_lm_arguments,
    "translate": add_translate_arguments,
    "copy": add_algorithmic_arguments,
    "reverse": add_algorithmic_arguments,
    "sort": add_algorithmic_arguments,
}


def add_task_arguments(parser: argparse.ArgumentParser, name: str, task: Any) -> None:
    """Add a task's own options to its ``attnlab train`` sub-command.

    Args:
        parser: the task's sub-command parser (the common options already there).
        name: the task's name.
        task: the registered task: a built-in one's options are here, another task's come from
            its ``add_arguments(parser)``.
    """
    if type(task).__module__.startswith("attnlab.tasks.") and name in _BUILTIN:
        _BUILTIN[name](parser)
    else:
        task.add_arguments(parser)
