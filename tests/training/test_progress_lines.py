"""Progress off a terminal (issue 24): plain lines while training, not one bar at the end.

rich's live bar writes nothing to a pipe or a file until it stops, so ``attnlab demo 2>&1 | cat``
and a CI log showed no progress for minutes. :class:`RichProgress` writes plain lines there.
"""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from rich.console import Console

from attnlab.cli import main
from attnlab.training.progress import RichProgress
from attnlab.training.run_types import StepMetrics


def _metrics(step: int, total: int) -> StepMetrics:
    return StepMetrics(
        step=step, total_steps=total, loss=2.5 / step, lr=1e-3, grad_norm=1.0, tokens=64.0,
        tokens_per_s=1234.0, elapsed=0.1 * step,
    )  # fmt: skip


def test_lines_appear_while_training_off_a_terminal() -> None:
    out = io.StringIO()
    progress = RichProgress(Console(file=out), description="reverse", every_s=1e9)
    assert progress.lines
    progress.on_start(SimpleNamespace(config=SimpleNamespace(steps=20), step=0))  # type: ignore[arg-type]
    progress.on_step(_metrics(1, 20))
    assert out.getvalue() == "reverse step 1/20  loss 2.5000  lr 1.00e-03  1,234 tok/s\n"
    for step in range(2, 20):
        progress.on_step(_metrics(step, 20))
    # the first step, then each tenth of the run, before the run ends
    steps = [int(m) for m in re.findall(r"step (\d+)/20", out.getvalue())]
    assert steps == [1, 2, 4, 6, 8, 10, 12, 14, 16, 18]
    progress.on_step(_metrics(20, 20))
    progress.on_end(None)  # type: ignore[arg-type]
    assert out.getvalue().splitlines()[-1].startswith("reverse step 20/20  loss 0.1250")
    assert "━" not in out.getvalue()  # no bar


def test_a_line_every_few_seconds_between_tenths() -> None:
    out = io.StringIO()
    progress = RichProgress(Console(file=out), description="lm", every_s=0.0)
    progress.on_start(SimpleNamespace(config=SimpleNamespace(steps=1000), step=0))  # type: ignore[arg-type]
    for step in range(1, 6):
        progress.on_step(_metrics(step, 1000))
    assert len(out.getvalue().splitlines()) == 5


def test_a_terminal_keeps_the_bar() -> None:
    progress = RichProgress(Console(file=io.StringIO(), force_terminal=True))
    assert not progress.lines


def test_demo_writes_progress_lines_when_not_a_terminal(tmp_path, capsys) -> None:
    assert main(["demo", "--out", str(tmp_path / "demo"), "--steps", "10"]) == 0
    err = capsys.readouterr().err
    steps = [int(m) for m in re.findall(r"^reverse step (\d+)/10  loss \d", err, re.M)]
    assert steps == list(range(1, 11)), err
