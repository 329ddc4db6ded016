"""``attnlab train lm --data FILE [--bpe]``: a GPT language model on any UTF-8 text file.

Defaults are nanoGPT's ``shakespeare_char`` recipe for a CPU (Karpathy's README): 4 layers,
4 heads, ``n_embd = 128``, context 64, batch 12, no dropout, AdamW (β₂ = 0.99, weight decay 0.1
on matrices), learning rate 1e-3 with 100 warm-up steps and cosine decay to 1e-4 over 2000 steps.
The first 90% of the text trains, the last 10% validates. Characters are the tokens unless
``--bpe`` trains a byte-level BPE vocabulary (on the training part only).
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import nn

from attnlab.data.text import LMBatch, LMBatchSource, read_text_file, split_train_val
from attnlab.data.tokenizers import CharTokenizer, HFTokenizer, train_bpe
from attnlab.data.train_tasks.common import positive_float, positive_int, probability
from attnlab.decoding.generate import generate
from attnlab.models.config import GPTConfig, config_to_dict
from attnlab.models.gpt import GPT
from attnlab.training.losses import TokenLoss, token_loss
from attnlab.training.schedules import WarmupCosineLR
from attnlab.training.tasks_registry import TaskSetup, register_task
from attnlab.training.trainer import IndexedBatches

__all__ = ["LMCorpus", "LanguageModelTask", "lm_loss", "load_corpus"]

logger = logging.getLogger(__name__)

_TRAIN_STREAM, _VAL_STREAM, _TRAIN_EVAL_STREAM = 0, 1, 2


@dataclass(frozen=True)
class LMCorpus:
    """A tokenized text split 90 / 10.

    Attributes:
        tokenizer: characters or BPE.
        train: the 1-D token stream of the first 90% of the text.
        val: the 1-D token stream of the last 10%.
    """

    tokenizer: CharTokenizer | HFTokenizer
    train: torch.Tensor
    val: torch.Tensor


def load_corpus(path: str | Path, *, bpe: bool = False, bpe_vocab: int = 1024) -> LMCorpus:
    """Read, tokenize and split a text file (first 90% train, last 10% validation).

    Args:
        path: a UTF-8 text file.
        bpe: train a byte-level BPE vocabulary on the training text instead of using characters.
        bpe_vocab: its size.

    Returns:
        An :class:`LMCorpus`.

    Raises:
        ValueError: the file is missing, empty, not UTF-8, or too short to split.
    """
    text = read_text_file(path, what="--data file")
    if bpe:
        # split the characters first, so that the vocabulary never sees the validation text
        n = int(0.9 * len(text))
        if n == 0 or n == len(text):
            raise ValueError(f"--data file is too short to split 90% / 10%: {len(text)} characters")
        tokenizer: CharTokenizer | HFTokenizer = train_bpe(
            [text[:n]], bpe_vocab, byte_level=True, specials=()
        )
        train = torch.tensor(tokenizer.encode(text[:n]), dtype=torch.long)
        val = torch.tensor(tokenizer.encode(text[n:]), dtype=torch.long)
        return LMCorpus(tokenizer, train, val)
    # nanoGPT: the vocabulary is every character of the file; the split is on characters
    tokenizer = CharTokenizer.train(text)
    data = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    train, val = split_train_val(data, 0.9)
    return LMCorpus(tokenizer, train, val)


def lm_loss(model: nn.Module, batch: LMBatch) -> TokenLoss:
    """Mean next-token cross-entropy over every position of the batch (nanoGPT's loss).

    loss = −(1 / BT) Σ_{b,t} log softmax(logits[b, t])[targets[b, t]]
    """
    logits = model(batch.input_ids).logits  # (B, T, V)
    return token_loss(logits, batch.targets)


@torch.no_grad()
def estimate_loss(model: nn.Module, source: LMBatchSource, iters: int) -> float:
    """The mean loss over ``iters`` batches of ``source`` (nanoGPT's ``estimate_loss``)."""
    device = next(model.parameters()).device
    total = 0.0
    for i in range(iters):
        b = source.batch(i)
        batch = LMBatch(b.input_ids.to(device), b.targets.to(device))
        total += float(lm_loss(model, batch).loss)
    return total / iters


def adamw_nanogpt(
    lr: float, weight_decay: float, warmup: int, decay_steps: int, min_lr: float
) -> Any:
    """``model -> (AdamW, WarmupCosineLR)``; weight decay on matrices only, as nanoGPT."""

    def make(model: nn.Module) -> tuple[torch.optim.Optimizer, WarmupCosineLR]:
        params = [p for p in model.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99))
        return opt, WarmupCosineLR(opt, warmup, decay_steps, min_ratio=min_lr / lr)

    return make


class LanguageModelTask:
    """``attnlab train lm``."""

    name = "lm"
    help = "a GPT language model on a UTF-8 text file (characters, or BPE with --bpe)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("data")
        g.add_argument("--data", required=True, help="a UTF-8 text file")
        g.add_argument(
            "--bpe", action="store_true", help="byte-level BPE tokens instead of characters"
        )
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
        m.add_argument("--dropout", type=probability, default=0.0, help="default 0.0")
        m.add_argument(
            "--bias",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="biases in linear layers and LayerNorms (GPT-2; nanoGPT trains with --no-bias)",
        )
        o = parser.add_argument_group("optimisation")
        o.add_argument("--batch-size", type=positive_int, default=12, help="default 12")
        o.add_argument(
            "--lr", type=positive_float, default=1e-3, help="peak learning rate (default 1e-3)"
        )
        o.add_argument(
            "--min-lr", type=positive_float, default=1e-4, help="final learning rate (default 1e-4)"
        )
        o.add_argument(
            "--warmup", type=positive_int, default=100, help="warm-up steps (default 100)"
        )
        o.add_argument(
            "--lr-decay-steps", type=positive_int, default=2000,
            help="steps of the cosine decay (default 2000)",
        )  # fmt: skip
        o.add_argument("--weight-decay", type=float, default=0.1, help="default 0.1")
        o.add_argument(
            "--eval-iters", type=positive_int, default=20,
            help="batches per loss estimate (default 20)",
        )  # fmt: skip
        parser.set_defaults(eval_every=250, clip=1.0)

    def build(self, args: argparse.Namespace, device: torch.device) -> TaskSetup:
        corpus = load_corpus(args.data, bpe=args.bpe, bpe_vocab=args.bpe_vocab)
        if args.warmup >= args.lr_decay_steps:
            raise ValueError(
                f"--warmup must be < --lr-decay-steps ({args.lr_decay_steps}), got {args.warmup}"
            )
        config = GPTConfig(
            vocab_size=corpus.tokenizer.vocab_size,
            n_positions=args.block_size,
            n_embd=args.n_embd,
            n_layer=args.n_layer,
            n_head=args.n_head,
            dropout=args.dropout,
            bias=args.bias,
        )
        model = GPT(config)
        train = LMBatchSource(
            corpus.train, args.block_size, args.batch_size, args.seed, _TRAIN_STREAM
        )
        val = LMBatchSource(corpus.val, args.block_size, args.batch_size, args.seed, _VAL_STREAM)
        train_eval = LMBatchSource(
            corpus.train, args.block_size, args.batch_size, args.seed, _TRAIN_EVAL_STREAM
        )
        iters = args.eval_iters

        def evaluate(m: nn.Module) -> dict[str, float]:
            return {
                "train_loss": estimate_loss(m, train_eval, iters),
                "val_loss": estimate_loss(m, val, iters),
            }

        def report(m: nn.Module, run_dir: Path, console: Console) -> None:
            tok = corpus.tokenizer
            dev = next(m.parameters()).device
            start = torch.tensor([corpus.val[:1].tolist()], dtype=torch.long, device=dev)
            ids = generate(
                m, start, max_new_tokens=min(200, config.n_positions - 1), strategy="sample",
                top_k=None, generator=torch.Generator(device=dev).manual_seed(args.seed),
            )  # fmt: skip
            console.print("sample:")
            console.print(
                tok.decode(ids[0].tolist()), markup=False, highlight=False, soft_wrap=True
            )

        return TaskSetup(
            model=model,
            make_optimizer=adamw_nanogpt(
                args.lr, args.weight_decay, args.warmup, args.lr_decay_steps, args.min_lr
            ),
            batches=IndexedBatches(train.batch),
            loss_fn=lm_loss,
            model_config=config_to_dict(config),
            evaluate=evaluate,
            files={"tokenizer.json": corpus.tokenizer.to_json()},
            report=report,
        )


register_task(LanguageModelTask())
