"""A run's held-out data read again after training notices changed data (hardening 2, applied
where a run's ``--data`` is read back: ``attnlab inspect --ablate``'s evaluation set)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.tasks.registry import get_task
from attnlab.tasks.run import load_run

TEXT = "to be, or not to be, that is the question:\n" * 10
LM = ["--block-size", "8", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
      "--batch-size", "2", "--eval-iters", "1", "--warmup", "1", "--lr-decay-steps", "4"]  # fmt: skip


def test_the_evaluation_set_refuses_a_changed_data_file(tmp_path: Path) -> None:
    data = tmp_path / "text.txt"
    data.write_text(TEXT)
    run = tmp_path / "run"
    assert main(["train", "lm", "--data", str(data), "--out", str(run), "--steps", "1", *LM]) == 0
    loaded = load_run(run)
    task = get_task("lm")
    assert task.evaluation_set(loaded.args, loaded.io, 4).batches  # unchanged: fine
    data.write_text(TEXT.replace("question", "answer"))  # 'w' is new, 'q' gone: ids move
    with pytest.raises(ValueError, match=rf"the --data file {data} changed since the run"):
        task.evaluation_set(loaded.args, loaded.io, 4)
