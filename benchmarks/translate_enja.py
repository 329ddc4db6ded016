"""small_parallel_enja English → Japanese: test BLEU and wall time of a CPU run of <= 30 minutes.

An encoder-decoder Transformer (``attnlab train translate``: BPE vocabularies trained locally on
the training split, Noam schedule, label smoothing 0.1) trains until the time budget is spent
(default 25 minutes, leaving time for beam search), then the 500 test sentences are translated
with beam search (4 beams) and scored with sacrebleu against the (KyTea-tokenized) references.

    python benchmarks/translate_enja.py            # the full run (<= 30 minutes)
    python benchmarks/translate_enja.py --quick    # 2000 training pairs, 30 steps, 50 test pairs

Reads small_parallel_enja, packaged with attnlab (``--data FOLDER`` reads train/dev/test.en/ja
files instead). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from attnlab import tasks
from attnlab.data import corpora
from attnlab.data.parallel import ParallelCorpus, read_parallel
from attnlab.training.trainer import StepMetrics, Trainer, TrainerCallback

DATA = "small_parallel_enja"  # packaged with attnlab (attnlab.data.corpora)


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


def _split(data: str, split: str) -> ParallelCorpus:
    """A split of the packaged corpus ``data``, or of the files ``data/split.{en,ja}``."""
    if corpora.is_dataset(data, kind="parallel"):
        return corpora.load_parallel(data, split)
    return read_parallel(Path(data) / f"{split}.en", Path(data) / f"{split}.ja", what=split)


def _subset(pairs: ParallelCorpus, folder: Path, split: str, n: int | None) -> dict[str, Path]:
    """The options ``{split}_src``, ``{split}_tgt`` (``src``, ``tgt`` for train) of the first
    ``n`` pairs, written to ``folder``."""
    options = {}
    for side, lines in (("src", pairs.src), ("tgt", pairs.tgt)):
        path = folder / f"{split}.{side}"
        path.write_text("".join(x + "\n" for x in lines[:n]), encoding="utf-8")
        options[side if split == "train" else f"{split}_{side}"] = path
    return options


def main_(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a small subset, to check the script")
    p.add_argument(
        "--data",
        default=DATA,
        help=f"a packaged corpus or a folder of train/dev/test.en/ja (default {DATA})",
    )
    p.add_argument("--minutes", type=float, default=25.0, help="training budget (default 25)")
    p.add_argument("--max-steps", type=int, default=100_000, help="stop here if the budget lasts")
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="run folder (default: a temporary one)")
    args = p.parse_args(argv)
    packaged = corpora.is_dataset(args.data, kind="parallel")
    if not packaged and not (Path(args.data) / "train.en").is_file():
        print(f"translate_enja: data not found: {args.data}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        steps, budget = args.max_steps, args.minutes * 60
        sizes = {"train": 2000, "dev": 50, "test": 50} if args.quick else None
        data: dict[str, object] = {}
        if sizes is None and packaged:
            data["corpus"] = args.data
        else:
            for split in ("train", "dev", "test"):
                n = sizes[split] if sizes else None
                data |= _subset(_split(args.data, split), Path(tmp), split, n)
        extra: dict[str, int] = {}
        if args.quick:
            steps, budget = 30, 600.0
            extra = dict(d_model=64, layers=1, d_ff=128, src_vocab=1000, tgt_vocab=1000,
                         max_tokens=1024)  # fmt: skip
        run = Path(args.out) if args.out else Path(tmp) / "enja"
        start = time.perf_counter()
        result = tasks.train(
            "translate", out=run, steps=steps, seed=args.seed, beams=args.beams, eval_every=0,
            callbacks=[TimeBudget(budget)], progress=Console(stderr=True), **data, **extra,
        )  # fmt: skip
        train_wall = time.perf_counter() - start
        assert result.setup.report is not None and result.model is not None
        # the test BLEU, even when the budget stopped the run (tasks.train reports full runs only)
        result.setup.report(result.model, run, Console())
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
