"""A tiny task of repeated blocks for the FSDP tests, runnable under ``torchrun``.

``python _fsdp_task.py train fsdp_tiny ...`` is ``attnlab train`` with this task registered.
``python _fsdp_task.py resume-check RUN STEPS RESULT.json`` resumes ``RUN`` through the Python API
(:class:`~attnlab.distributed.fsdp.FSDPStrategy`, any number of processes), compares the
parameters and the optimizer state right after the resume with what the checkpoint holds (exactly),
trains on to ``STEPS``, checks that a divergence on one rank stops every rank, and writes what it
found to ``RESULT.json`` (rank 0).

The model: a tied embedding / output head (11 rows: shards of uneven sizes on 2 ranks), two
residual blocks in an ``nn.ModuleList`` (each one FSDP unit) and a LayerNorm. The batches are the
trainer tests' (random lengths: the ranks' halves hold different token counts).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script under torchrun
    sys.path.insert(0, str(REPO))

from attnlab.distributed.checkpoint import read_sharded_tensors  # noqa: E402
from attnlab.distributed.fsdp import FSDPStrategy  # noqa: E402
from attnlab.tasks import TaskSetup, register_task  # noqa: E402
from attnlab.training.checkpoint import (  # noqa: E402
    read_config,
    resolve_checkpoint,
    verify_checkpoint,
)
from attnlab.training.divergence import DivergenceError  # noqa: E402
from attnlab.training.losses import TokenLoss, token_loss  # noqa: E402
from attnlab.training.processes import (  # noqa: E402
    all_reduce_sum,
    cleanup_distributed,
    init_distributed,
)
from attnlab.training.rng import seed_everything  # noqa: E402
from attnlab.training.trainer import TrainConfig, Trainer  # noqa: E402
from tests.training._tiny_task import PAD, VOCAB, TinyBatches, make_optimizer  # noqa: E402


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.down(torch.tanh(self.up(h)))


class TinyBlocks(nn.Module):
    def __init__(self, dim: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.head.weight = self.emb.weight  # tied: stored once in a checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def tiny_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> TokenLoss:
    return token_loss(model(batch["x"]), batch["y"], smoothing=0.1, ignore_index=PAD)


def evaluate(model: nn.Module) -> dict[str, float]:
    x = torch.arange(VOCAB).repeat(2, 1)
    pred = model(x).argmax(-1)
    return {"accuracy": float((pred == (x + 1) % VOCAB).float().mean())}


def report(model: nn.Module, run_dir: Path, console: Any) -> None:
    total = sum(float(p.detach().double().sum()) for p in model.parameters())
    console.print(f"report: weight sum {total:.10f}")


class FSDPTinyTask:
    name = "fsdp_tiny"
    help = "a tiny task of repeated blocks (tests)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dim", type=int, default=16)
        parser.add_argument("--batch-size", type=int, default=8)

    def build(self, args: argparse.Namespace, device: torch.device) -> TaskSetup:
        return TaskSetup(
            model=TinyBlocks(dim=args.dim),
            make_optimizer=make_optimizer,
            batches=TinyBatches(args.seed + 1, batch_size=args.batch_size),
            loss_fn=tiny_loss,
            model_config={"vocab": VOCAB, "dim": args.dim},
            evaluate=evaluate,
            files={"tokenizer.json": '{"vocab": 11}'},
            report=report,
        )


TASK = FSDPTinyTask()


def resume_check(run: Path, steps: int) -> dict[str, Any]:
    """Resume ``run`` with FSDP here (under torchrun or in one process), compare, train on to
    ``steps``, then make the last rank alone diverge (its loss, then its weights' shard).

    Returns (rank 0; ``{}`` elsewhere) whether the parameters and the optimizer state after the
    resume equal the checkpoint's tensors exactly, how many tensors were compared, the step the
    divergence stopped at, how many ranks refused to save non-finite weights, and the checkpoint
    ``latest`` names at the end.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    dist = init_distributed("cpu")
    ckpt = verify_checkpoint(run, allow_sharded=True)
    saved = read_config(ckpt)
    args = saved["args"]
    seed_everything(int(args["seed"]))
    train = saved["train"]
    trainer = Trainer(
        TinyBlocks(dim=int(args["dim"])),
        make_optimizer=make_optimizer,
        batches=TinyBatches(int(args["seed"]) + 1, batch_size=int(args["batch_size"])),
        loss_fn=tiny_loss,
        config=TrainConfig(steps=steps, grad_accum=train["grad_accum"], clip=train["clip"]),
        run_dir=run,
        run_config={k: v for k, v in saved.items() if k != "train"},
        files={"tokenizer.json": '{"vocab": 11}'},
        evaluate=evaluate,
        dist=dist,
        strategy=FSDPStrategy(),
    )
    trainer.resume(ckpt)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model = get_model_state_dict(trainer.model, options=options)
    optim = get_optimizer_state_dict(trainer.model, trainer.optimizer, options=options)
    result: dict[str, Any] = {}
    if dist.is_main:
        want_model = read_sharded_tensors(ckpt, "model")
        want_optim = read_sharded_tensors(ckpt, "optim")
        # the checkpoint holds the tied head once, as the embedding
        model_equal = (
            set(want_model) == set(model) - {"head.weight"}
            and all(torch.equal(model[k], want_model[k]) for k in want_model)
            and torch.equal(model["head.weight"], want_model["emb.weight"])
        )
        got_optim = {
            f"{name}.{key}": t
            for name, entry in optim["state"].items()
            for key, t in entry.items()
            if isinstance(t, torch.Tensor)
        }
        optim_equal = got_optim.keys() == want_optim.keys() and all(
            torch.equal(got_optim[k], want_optim[k]) for k in want_optim
        )
        result = {
            "model_equal": model_equal,
            "optim_equal": optim_equal,
            "tensors": len(want_model) + len(want_optim),
            "step": trainer.step,
        }
    trainer.fit()
    # divergence, decided alike on every rank: a NaN loss on the last rank alone stops the next
    # step before it is taken; a NaN in the last rank's shard alone stops any save
    last = dist.rank == dist.world_size - 1
    loss_fn = trainer.loss_fn

    def poisoned(m: nn.Module, batch: Mapping[str, torch.Tensor]) -> TokenLoss:
        out = loss_fn(m, batch)
        assert isinstance(out, TokenLoss)
        return TokenLoss(out.loss * float("nan"), out.count) if last else out

    trainer.loss_fn = poisoned
    trainer.config = dataclasses.replace(trainer.config, steps=steps + 1)
    stopped_at = []
    try:
        trainer.fit()
    except DivergenceError as exc:
        stopped_at.append(exc.step)
    trainer.loss_fn = loss_fn
    with torch.no_grad():
        shard = next(trainer.model.parameters())
        local = shard.to_local() if hasattr(shard, "to_local") else shard
        if last and local.numel():
            local.view(-1)[0] = float("nan")
    refused = False
    try:
        trainer.save()
    except DivergenceError:
        refused = True
    ranks_refused = all_reduce_sum(torch.tensor([float(refused and stopped_at == [steps + 1])]))
    if dist.is_main:
        result["diverged"] = {"step": stopped_at, "ranks_refused_to_save": int(ranks_refused)}
        result["latest"] = resolve_checkpoint(run).name
    trainer.close()
    cleanup_distributed()
    return result


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    if argv[:1] == ["resume-check"]:
        run, steps, out = Path(argv[1]), int(argv[2]), Path(argv[3])
        result = resume_check(run, steps)
        if result:
            out.write_text(json.dumps(result))
        return 0
    from attnlab.cli import main as cli_main

    register_task(TASK)
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
