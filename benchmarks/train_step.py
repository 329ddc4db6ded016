"""GPT-2 training step: attnlab.GPT against Hugging Face GPT2LMHeadModel, same weights, same run.

One step = forward with labels (next-token cross-entropy), backward, AdamW update. Both models
start from the same random weights (attnlab's copy comes from ``GPT.from_hf``) and see the same
batches; steps alternate between the two so that a noisy, shared machine slows both alike.
Reported: tokens/s from the median step time, for fp32 and for bf16 autocast, and the ratio
attnlab / Hugging Face (target >= 1.0x in fp32); also the ratio of the fastest steps, which a
machine shared with other work disturbs less.

    python benchmarks/train_step.py            # GPT-2 small (124M), batch 8 x 256
    python benchmarks/train_step.py --quick    # a small config, seconds
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

import attnlab as al


@dataclass(frozen=True)
class Shape:
    """Model and batch sizes of one benchmark setting."""

    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    batch: int
    seq_len: int


FULL = Shape(50257, 1024, 768, 12, 12, batch=8, seq_len=256)  # GPT-2 small
QUICK = Shape(8192, 256, 256, 4, 4, batch=4, seq_len=128)


@dataclass
class Result:
    precision: str
    hf_tokens_per_s: float
    al_tokens_per_s: float
    ratio_best: float  # from the fastest step of each: less sensitive to a loaded machine
    loss_diff: float

    @property
    def ratio(self) -> float:
        return self.al_tokens_per_s / self.hf_tokens_per_s


def build_models(shape: Shape, seed: int = 0) -> tuple[torch.nn.Module, al.GPT]:
    """A random Hugging Face GPT-2 (no dropout, SDPA attention) and attnlab's copy of it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=shape.vocab_size,
        n_positions=shape.n_positions,
        n_embd=shape.n_embd,
        n_layer=shape.n_layer,
        n_head=shape.n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="sdpa",
    )
    hf = GPT2LMHeadModel(config).train()
    ours = al.GPT.from_hf(hf).train()
    return hf, ours


def autocast(precision: str) -> contextlib.AbstractContextManager[object]:
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def step_fn(model: torch.nn.Module, precision: str) -> Callable[[torch.Tensor], float]:
    """One training step of ``model``; returns the loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)

    def step(ids: torch.Tensor) -> float:
        with autocast(precision):
            loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def batches(shape: Shape, seed: int = 1) -> Iterator[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    while True:
        yield torch.randint(0, shape.vocab_size, (shape.batch, shape.seq_len), generator=gen)


def measure(shape: Shape, precision: str, steps: int, warmup: int) -> Result:
    """Median step time of both models, steps interleaved (the first one of each pair alternates)."""
    hf, ours = build_models(shape)
    runners = {"hf": step_fn(hf, precision), "al": step_fn(ours, precision)}
    times: dict[str, list[float]] = {"hf": [], "al": []}
    first_loss: dict[str, float] = {}
    data = batches(shape)
    for i in range(warmup + steps):
        ids = next(data)
        order = ("hf", "al") if i % 2 == 0 else ("al", "hf")
        for name in order:
            start = time.perf_counter()
            loss = runners[name](ids)
            elapsed = time.perf_counter() - start
            first_loss.setdefault(name, loss)
            if i >= warmup:
                times[name].append(elapsed)
    tokens = shape.batch * shape.seq_len
    return Result(
        precision=precision,
        hf_tokens_per_s=tokens / statistics.median(times["hf"]),
        al_tokens_per_s=tokens / statistics.median(times["al"]),
        ratio_best=min(times["hf"]) / min(times["al"]),
        loss_diff=abs(first_loss["hf"] - first_loss["al"]),
    )


def table(shape: Shape, results: list[Result]) -> str:
    lines = [
        f"GPT-2 training step (AdamW), n_layer={shape.n_layer} n_embd={shape.n_embd} "
        f"vocab={shape.vocab_size}, batch {shape.batch} x {shape.seq_len}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}",
        f"{'precision':<10} {'HF tokens/s':>12} {'attnlab tokens/s':>17} {'ratio':>7} "
        f"{'ratio (best step)':>18} {'|Δ loss| step 1':>16}",
    ]
    for r in results:
        lines.append(
            f"{r.precision:<10} {r.hf_tokens_per_s:>12.1f} {r.al_tokens_per_s:>17.1f} "
            f"{r.ratio:>6.2f}x {r.ratio_best:>17.2f}x {r.loss_diff:>16.2e}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small config (seconds, not minutes)")
    parser.add_argument(
        "--steps", type=int, default=None, help="measured steps per model (default 5)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps first (default 1)")
    parser.add_argument(
        "--precision", choices=["fp32", "bf16", "both"], default="both", help="default both"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    shape = QUICK if args.quick else FULL
    steps = args.steps if args.steps is not None else 5
    if steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    precisions = ["fp32", "bf16"] if args.precision == "both" else [args.precision]
    results = [measure(shape, p, steps, args.warmup) for p in precisions]
    print(table(shape, results))
    fp32 = [r for r in results if r.precision == "fp32"]
    if fp32:
        verdict = "meets" if fp32[0].ratio >= 1.0 else "misses"
        print(f"fp32 target >= 1.0x Hugging Face: {verdict} ({fp32[0].ratio:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
