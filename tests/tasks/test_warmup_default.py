"""The default ``--warmup`` fits the run's length (issue 24).

``attnlab train lm --steps 10`` used to refuse its own default (``--warmup 100`` must be below
the cosine decay's 10 steps). Every task's default warm-up is now its old value when the run is
longer than that, and a tenth of the run otherwise; an explicit ``--warmup`` is kept as given.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.tasks.train_options import (
    AlgorithmicOptions,
    LMOptions,
    TranslateOptions,
    warmup_steps,
)

TEXT = "to be, or not to be, that is the question:\nwhether 'tis nobler in the mind\n" * 12
LM = ["--block-size", "8", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
      "--batch-size", "4", "--eval-iters", "1"]  # fmt: skip
SEQ = ["--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff", "32", "--max-len", "4",
       "--num-heldout", "5", "--batch-size", "4", "--eval-every", "0"]  # fmt: skip


def _saved_warmup(run: Path) -> int:
    latest = sorted((run / "checkpoints").glob("step-*"))[-1]
    return int(json.loads((latest / "config.json").read_text())["args"]["warmup"])


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (AlgorithmicOptions(out="r", steps=1200), 200),  # `attnlab demo`: unchanged
        (AlgorithmicOptions(out="r", steps=200), 20),
        (AlgorithmicOptions(out="r", steps=3), 1),
        (TranslateOptions(out="r", steps=5000), 400),
        (TranslateOptions(out="r", steps=100), 10),
        (LMOptions(data="d", out="r", steps=5000), 100),
        (LMOptions(data="d", out="r", steps=10), 1),
        (LMOptions(data="d", out="r", steps=5), 0),  # the cosine takes no warm-up
        (LMOptions(data="d", out="r", steps=5000, lr_decay_steps=50), 5),
        (LMOptions(data="d", out="r", steps=10, warmup=3), 3),  # given: kept
        (AlgorithmicOptions(out="r", steps=10, warmup=500), 500),  # Noam: accepted
    ],
)
def test_warmup_steps(options, expected: int) -> None:
    assert warmup_steps(options) == expected


def test_train_lm_with_few_steps_and_the_default_warmup(tmp_path, capsys) -> None:
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    run = tmp_path / "run"
    argv = ["train", "lm", "--data", str(data), "--out", str(run), "--steps", "10", *LM]
    assert main(argv) == 0, capsys.readouterr().err
    assert _saved_warmup(run) == 1


def test_an_explicit_warmup_longer_than_the_lm_run_is_one_line(tmp_path, capsys) -> None:
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    argv = ["train", "lm", "--data", str(data), "--out", str(tmp_path / "run"), "--steps", "10",
            "--warmup", "20", *LM]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--warmup must be < the cosine decay's length (--steps = 10" in err and "got 20" in err


def test_a_resumed_run_keeps_its_default_warmup(tmp_path, capsys) -> None:
    """The default depends on --steps; resuming with more steps continues the same schedule."""
    run = tmp_path / "run"
    assert main(["train", "reverse", "--out", str(run), "--steps", "2", *SEQ]) == 0
    assert _saved_warmup(run) == 1
    assert main(["train", "reverse", "--out", str(run), "--steps", "30", "--resume", *SEQ]) == 0
    assert _saved_warmup(run) == 1
