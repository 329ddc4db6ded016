"""A tiny synthetic task for the trainer tests (also runnable as ``python _tiny_task.py train tiny ...``).

Predict ``(x + 1) mod V`` from ``x`` with an embedding, dropout and a linear layer; sequences have
random lengths, padded positions are ignored by the loss. The batch source keeps its position in
a ``torch.Generator`` (a tensor in its state), the model uses the global RNG (dropout), so a
resumed run is only bit-identical when both are restored.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.tasks import TaskSetup, register_task
from attnlab.training.losses import TokenLoss, token_loss
from attnlab.training.rng import seed_everything
from attnlab.training.schedules import NoamLR
from attnlab.training.trainer import TrainConfig, Trainer

VOCAB = 11
PAD = -100


class TinyModel(nn.Module):
    def __init__(self, vocab: int = VOCAB, dim: int = 16, dropout: float = 0.1) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.drop = nn.Dropout(dropout)
        self.hidden = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.tanh(self.hidden(self.emb(x))))
        return self.out(h)


class TinyBatches:
    """Random batches from a private generator; its state is the data position."""

    def __init__(self, seed: int, batch_size: int = 8, seq_len: int = 6) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.count = 0

    def next_batch(self) -> dict[str, torch.Tensor]:
        x = torch.randint(VOCAB, (self.batch_size, self.seq_len), generator=self.gen)
        lengths = torch.randint(1, self.seq_len + 1, (self.batch_size,), generator=self.gen)
        y = (x + 1) % VOCAB
        y[torch.arange(self.seq_len)[None, :] >= lengths[:, None]] = PAD
        self.count += 1
        return {"x": x, "y": y}

    def state_dict(self) -> dict[str, Any]:
        return {"gen": self.gen.get_state(), "count": self.count}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.gen.set_state(state["gen"])
        self.count = int(state["count"])


def tiny_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> TokenLoss:
    return token_loss(model(batch["x"]), batch["y"], smoothing=0.1, ignore_index=PAD)


def make_optimizer(model: nn.Module, factor: float = 2.0) -> tuple[Any, Any]:
    opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    return opt, NoamLR(opt, d_model=16, warmup_steps=4, factor=factor)


def tiny_trainer(run_dir: Path, steps: int, **kwargs: Any) -> Trainer:
    """A seeded Trainer of the tiny task in ``run_dir`` (``kwargs`` go to the Trainer)."""
    seed_everything(3)
    kwargs.setdefault("run_config", {"task": "tiny"})
    return Trainer(
        TinyModel(),
        make_optimizer=make_optimizer,
        batches=TinyBatches(7),
        loss_fn=tiny_loss,
        config=TrainConfig(steps=steps),
        run_dir=run_dir,
        **kwargs,
    )


def evaluate(model: nn.Module) -> dict[str, float]:
    # consumes the global RNG on purpose: the trainer must restore it
    x = torch.randint(VOCAB, (4, 5))
    pred = model(x).argmax(-1)
    return {"accuracy": float((pred == (x + 1) % VOCAB).float().mean())}


class TinyTask:
    name = "tiny"
    help = "a tiny synthetic task for tests"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dim", type=int, default=16)
        parser.add_argument("--dropout", type=float, default=0.1)
        parser.add_argument("--batch-size", type=int, default=8)
        parser.add_argument("--lr-factor", type=float, default=2.0)
        parser.add_argument("--sleep", type=float, default=0.0, help="seconds per loss call")

    def build(self, args: argparse.Namespace, device: torch.device) -> TaskSetup:
        model = TinyModel(dim=args.dim, dropout=args.dropout)
        sleep = args.sleep

        def loss_fn(m: nn.Module, batch: Mapping[str, torch.Tensor]) -> TokenLoss:
            if sleep:
                time.sleep(sleep)
            return tiny_loss(m, batch)

        return TaskSetup(
            model=model,
            make_optimizer=lambda m: make_optimizer(m, args.lr_factor),
            batches=TinyBatches(args.seed + 1, batch_size=args.batch_size),
            loss_fn=loss_fn,
            model_config={"vocab": VOCAB, "dim": args.dim, "dropout": args.dropout},
            evaluate=evaluate,
            files={"tokenizer.json": '{"vocab": 11}'},
        )


TASK = TinyTask()


def main(argv: list[str]) -> int:
    from attnlab.cli import main as cli_main

    torch.set_num_threads(1)
    register_task(TASK)
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
