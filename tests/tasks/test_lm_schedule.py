"""The lm task's cosine decay ends where the run ends (hardening 14): ``--lr-decay-steps``
defaults to ``--steps``, so a short run finishes at ``--min-lr``, not near the peak rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlab.cli import main

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def _train(tmp_path: Path, *extra: str) -> int:
    data = tmp_path / "data.txt"
    data.write_text(TEXT, encoding="utf-8")
    argv = ["train", "lm", "--data", str(data), "--out", str(tmp_path / "run"), "--n-layer", "1",
            "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "2",
            "--eval-iters", "1", "--lr", "1e-3", "--min-lr", "1e-4", *extra]  # fmt: skip
    return main(argv)


def test_a_short_run_decays_to_min_lr_by_its_last_step(tmp_path: Path) -> None:
    assert _train(tmp_path, "--steps", "12", "--warmup", "2") == 0
    lines = (tmp_path / "run" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    lrs = [r["lr"] for r in map(json.loads, lines) if r.get("kind") == "train"]
    assert len(lrs) == 12
    assert max(lrs) == pytest.approx(1e-3, rel=0.2)
    assert lrs[-1] < 1.5e-4  # the end of the cosine, not ~1e-3 as with a 2000-step decay


def test_warmup_must_fit_the_decay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # an explicit warm-up (the default one fits the run: tests/tasks/test_warmup_default.py)
    assert _train(tmp_path, "--steps", "50", "--warmup", "100") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--warmup must be < the cosine decay's length (--steps = 50" in err
