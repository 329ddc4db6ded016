"""Run under ``torchrun`` by ``tests/distributed/test_families_torchrun.py``: ``attnlab train lm``
with each family (llama, neox) and each way of spreading it over the processes (DDP, FSDP,
``--tensor-parallel 2``), one after the other in one launch, so that six trainings cost one start
of the processes. Each writes ``OUT/<family>-<strategy>``.

Usage: ``torchrun --nproc_per_node 2 _family_runs.py DATA OUT``; the test runs :func:`run` on
ranks forked from the tests' fork server (:func:`tests.distributed._launch.command_line`), as
``torchrun``'s workers, without their importing torch anew (seconds of CPU each).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from attnlab.tasks import driver, train
from attnlab.tasks.train_options import LMOptions

#: the families and strategies trained (the test reads the same names)
FAMILIES = ("llama", "neox")
STRATEGIES: dict[str, dict[str, Any]] = {
    "ddp": {},
    "fsdp": {"parallel": "fsdp"},
    "tp": {"tensor_parallel": 2},
}


def options(data: str, out: Path, family: str, **kw: Any) -> LMOptions:
    """The tiny run of every test here (2 layers, width 16, 4 heads, 3 steps of 2 micro-batches)."""
    return LMOptions(
        data=data, out=out / family, steps=3, family=family, block_size=16, n_layer=2, n_head=4,
        n_embd=16, batch_size=4, warmup=1, lr_decay_steps=3, grad_accum=2, clip=0.5, seed=3,
        eval_every=3, eval_iters=1, **kw,
    )  # fmt: skip


def main(data: str, out: str) -> None:
    torch.set_num_threads(1)
    # one process group for the six trainings: train() leaves it after each one, and joining
    # gloo again and again in one process is not reliable (a re-join can hang)
    driver.cleanup_distributed = lambda: None  # type: ignore[attr-defined]
    try:
        for family in FAMILIES:
            for name, kw in STRATEGIES.items():
                opts = options(data, Path(out) / name, family, **kw)
                train(opts, progress=False, report=None)
                dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run(argv: list[str]) -> int:
    """:func:`main` as a command line's ``main(argv)``: ``argv`` is ``[DATA, OUT]``; returns 0."""
    main(*argv)
    return 0


if __name__ == "__main__":
    main(*sys.argv[1:])
