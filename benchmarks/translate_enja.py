"""small_parallel_enja English → Japanese: test BLEU and wall time of a CPU run of <= 30 minutes.

An encoder-decoder Transformer (``attnlab train translate``: BPE vocabularies trained locally on
the training split, Noam schedule, label smoothing 0.1) trains until the time budget is spent
(default 25 minutes, leaving time for beam search), then the 500 test sentences are translated
with beam search (4 beams) and scored with sacrebleu against the (KyTea-tokenized) references.

    python benchmarks/translate_enja.py            # the full run (<= 30 minutes)
    python benchmarks/translate_enja.py --quick    # 2000 training pairs, 30 steps, 50 test pairs

Reads ../shared/data/small_parallel_enja (next to the project). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from attnlab.cli import build_parser
from attnlab.tasks import get_task
from attnlab.training.processes import DistInfo
from attnlab.training.progress import RichProgress
from attnlab.training.rng import seed_everything
from attnlab.training.trainer import StepMetrics, TrainConfig, Trainer, TrainerCallback

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "small_parallel_enja"


class TimeBudget(TrainerCallback):
    """Stop training (after the current step, with a checkpoint) once ``seconds`` have passed."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.trainer: Trainer | None = None

    def on_start(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def on_step(self, metrics: StepMetrics) -> None:
        if metrics.elapsed >= self.seconds and self.trainer is not None:
            self.trainer.request_stop()


def _subset(src: Path, dst: Path, n: int) -> str:
    lines = src.read_text(encoding="utf-8").splitlines()[:n]
    dst.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return str(dst)


def main_(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a small subset, to check the script")
    p.add_argument("--data", default=str(DATA), help=f"default {DATA}")
    p.add_argument("--minutes", type=float, default=25.0, help="training budget (default 25)")
    p.add_argument("--max-steps", type=int, default=100_000, help="stop here if the budget lasts")
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="run folder (default: a temporary one)")
    args = p.parse_args(argv)
    data = Path(args.data)
    if not (data / "train.en").is_file():
        print(f"translate_enja: data not found: {data}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        files = {
            f"{s}.{lang}": str(data / f"{s}.{lang}")
            for s in ("train", "dev", "test")
            for lang in ("en", "ja")
        }
        steps, budget = args.max_steps, args.minutes * 60
        extra: list[str] = []
        if args.quick:
            sizes = {"train": 2000, "dev": 50, "test": 50}
            files = {k: _subset(data / k, Path(tmp) / k, sizes[k.split(".")[0]]) for k in files}
            steps, budget = 30, 600.0
            extra = ["--d-model", "64", "--layers", "1", "--d-ff", "128", "--src-vocab", "1000",
                     "--tgt-vocab", "1000", "--max-tokens", "1024"]  # fmt: skip
        run = Path(args.out) if args.out else Path(tmp) / "enja"
        argv_train = [
            "train", "translate", "--out", str(run), "--steps", str(steps), "--seed", str(args.seed),
            "--src", files["train.en"], "--tgt", files["train.ja"],
            "--dev-src", files["dev.en"], "--dev-tgt", files["dev.ja"],
            "--test-src", files["test.en"], "--test-tgt", files["test.ja"],
            "--beams", str(args.beams), "--eval-every", "0", *extra,
        ]  # fmt: skip
        targs = build_parser().parse_args(argv_train)
        start = time.perf_counter()
        seed_everything(args.seed)
        setup = get_task("translate").build(targs, DistInfo().device)
        console = Console(stderr=True)
        trainer = Trainer(
            setup.model,
            make_optimizer=setup.make_optimizer,
            batches=setup.batches,
            loss_fn=setup.loss_fn,
            config=TrainConfig(steps=steps, eval_at_end=True),
            run_dir=run,
            files=setup.files,
            evaluate=setup.evaluate,
            callbacks=[RichProgress(console, "translate en→ja"), TimeBudget(budget)],
        )
        result = trainer.fit()
        train_wall = time.perf_counter() - start
        assert setup.report is not None
        setup.report(trainer.model, run, Console())
        wall = time.perf_counter() - start
        bleu = json.loads((run / "bleu.json").read_text())
    print(json.dumps({
        "benchmark": "small_parallel_enja en-ja",
        "steps": result.step,
        "train_wall_s": round(train_wall, 1),
        "wall_s": round(wall, 1),
        "test_bleu": round(bleu["bleu"], 2),
        "beams": bleu["beams"],
        "bleu_tokenize": bleu["tokenize"],
        "dev": result.eval_metrics,
        "quick": args.quick,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main_())
