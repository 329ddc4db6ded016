"""A rich progress bar for the trainer: step, loss, learning rate, tokens/s.

Used by ``attnlab train`` and ``attnlab demo``::

    with RichProgress(console) as progress:
        trainer = Trainer(..., callbacks=[progress])
        trainer.fit()
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from attnlab.training.trainer import StepMetrics, Trainer, TrainerCallback, TrainResult

__all__ = ["RichProgress"]


class RichProgress(TrainerCallback):
    """A :class:`TrainerCallback` drawing a rich progress bar; evaluations print a line.

    Args:
        console: where to draw (default: a new stderr console).
        description: the bar's label. Default: ``"train"``.
    """

    def __init__(self, console: Console | None = None, description: str = "train") -> None:
        self.console = console or Console(stderr=True)
        self.description = description
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("lr {task.fields[lr]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._task: Any = None

    def __enter__(self) -> RichProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def on_start(self, trainer: Trainer) -> None:
        if self._task is None:
            self._task = self.progress.add_task(
                self.description,
                total=trainer.config.steps,
                completed=trainer.step,
                loss="-",
                lr="-",
                tps="-",
            )
        self.progress.start()

    def on_step(self, metrics: StepMetrics) -> None:
        self.progress.update(
            self._task,
            completed=metrics.step,
            loss=f"{metrics.loss:.4f}",
            lr=f"{metrics.lr:.2e}",
            tps=f"{metrics.tokens_per_s:,.0f}",
        )

    def on_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        text = "  ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        self.progress.console.print(f"step {step}: {text}")

    def on_save(self, step: int, path: Path) -> None:
        pass

    def on_end(self, result: TrainResult) -> None:
        self.progress.stop()
