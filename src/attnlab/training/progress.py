"""A rich progress bar for the trainer: step, loss, learning rate, tokens/s.

Used by ``attnlab train`` and ``attnlab demo``, and in notebooks::

    with RichProgress(console) as progress:
        trainer = Trainer(..., callbacks=[progress])
        trainer.fit()

On a terminal the bar is rich's live display. Anywhere else (a pipe, a file, a CI log) a live
display would show nothing until the end, so the progress is written as plain lines instead, e.g.
``reverse step 120/1200  loss 1.2345  lr 1.20e-03  5,432 tok/s``: the first step, every tenth of
the run, at least every ``every_s`` seconds (10 by default), and the last step. In Jupyter it is
one HTML output (rich's rendering of the same columns) replaced in place as training goes: it
needs no widget library, and an executed notebook keeps the final bar, so a rendered notebook
shows it too.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from attnlab.training.trainer import StepMetrics, Trainer, TrainerCallback, TrainResult

__all__ = ["RichProgress"]

_PRE = (
    '<pre style="white-space: pre; overflow-x: auto; line-height: normal; '
    "font-family: Menlo, 'DejaVu Sans Mono', consolas, monospace\">{code}</pre>"
)


class _NotebookBar:
    """The progress table as HTML in one notebook output, updated through its display id."""

    def __init__(self, progress: Progress, min_interval: float = 0.25) -> None:
        from IPython.display import HTML, display

        self._html = HTML
        self._progress = progress
        self._min_interval = min_interval
        self._last = -float("inf")
        self._handle = display(HTML(""), display_id=True)

    def refresh(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self._min_interval:
            return
        self._last = now
        record = Console(
            record=True,
            file=io.StringIO(),
            width=90,
            force_terminal=True,
            force_jupyter=False,
            color_system="truecolor",
        )
        record.print(self._progress.make_tasks_table(self._progress.tasks))
        self._handle.update(self._html(record.export_html(inline_styles=True, code_format=_PRE)))


class RichProgress(TrainerCallback):
    """A :class:`TrainerCallback` drawing a rich progress bar; evaluations print a line.

    Args:
        console: where to draw (default: a new stderr console). In Jupyter the bar is an HTML
            output of the notebook, updated in place at most four times a second.
        description: the bar's label. Default: ``"train"``.
        every_s: when the console is not a terminal (nor Jupyter), the longest time in seconds
            between two progress lines; a line is also written at every tenth of the run.
            Default 10.
    """

    def __init__(
        self, console: Console | None = None, description: str = "train", *, every_s: float = 10.0
    ) -> None:
        self.console = console or Console(stderr=True)
        self.description = description
        notebook = self.console.is_jupyter
        #: plain lines instead of the bar: a live display off a terminal shows only the end
        self.lines = not notebook and not self.console.is_terminal
        self.every_s = every_s
        self._last_line = -math.inf
        self._last_tenth = -1
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("lr {task.fields[lr]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            TimeRemainingColumn(),
            # in a notebook rich's live display stays silent: _NotebookBar draws the table
            console=Console(file=io.StringIO(), force_jupyter=False) if notebook else self.console,
            auto_refresh=not notebook,
            transient=False,
        )
        self._task: Any = None
        self._notebook: _NotebookBar | None = None

    def __enter__(self) -> RichProgress:
        self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _start(self) -> None:
        if self.lines:
            return
        if not self.console.is_jupyter:
            self.progress.start()
        elif self._notebook is None:
            self._notebook = _NotebookBar(self.progress)

    def _stop(self) -> None:
        if self.lines:
            return
        if self._notebook is not None:
            self._notebook.refresh(force=True)
        self.progress.stop()

    def on_start(self, trainer: Trainer) -> None:
        """Add the bar (once: a resumed run continues it) at the trainer's current step.

        Args:
            trainer: the trainer that starts.
        """
        if self._task is None:
            self._task = self.progress.add_task(
                self.description,
                total=trainer.config.steps,
                completed=trainer.step,
                loss="-",
                lr="-",
                tps="-",
            )
        self._start()

    def on_step(self, metrics: StepMetrics) -> None:
        """Move the bar to the step and show its loss, learning rate and tokens per second.

        Args:
            metrics: the step's metrics.
        """
        if self.lines:
            self._line(metrics)
            return
        self.progress.update(
            self._task,
            completed=metrics.step,
            loss=f"{metrics.loss:.4f}",
            lr=f"{metrics.lr:.2e}",
            tps=f"{metrics.tokens_per_s:,.0f}",
        )
        if self._notebook is not None:
            self._notebook.refresh()

    def _line(self, metrics: StepMetrics) -> None:
        """A plain progress line at the first step, each tenth of the run, every ``every_s``
        seconds and the last step."""
        total = max(1, metrics.total_steps)
        tenth = metrics.step * 10 // total
        now = time.monotonic()
        if (
            metrics.step < total
            and tenth <= self._last_tenth
            and now - self._last_line < self.every_s
        ):
            return
        self._last_tenth, self._last_line = tenth, now
        self.console.print(
            f"{self.description} step {metrics.step}/{metrics.total_steps}  "
            f"loss {metrics.loss:.4f}  lr {metrics.lr:.2e}  {metrics.tokens_per_s:,.0f} tok/s",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    def on_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        """Print one line with the evaluation's metrics.

        Args:
            step: the step evaluated.
            metrics: metric name → value.
        """
        text = "  ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        self.console.print(f"step {step}: {text}")

    def on_save(self, step: int, path: Path) -> None:
        """Nothing: saving shows no line.

        Args:
            step: the step saved.
            path: the checkpoint folder.
        """

    def on_end(self, result: TrainResult) -> None:
        """Draw the final bar and stop.

        Args:
            result: the run's result.
        """
        self._stop()
