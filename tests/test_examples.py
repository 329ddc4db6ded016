"""Every tutorial script in examples/ runs (small sizes) and writes its figures."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("0*.py"))


def test_the_tutorial_path_is_complete() -> None:
    names = [p.stem for p in EXAMPLES]
    for step in (
        "01_attention_from_matmul",
        "02_multi_head",
        "03_masks",
        "04_noam_and_label_smoothing",
        "05_train_toy_task",
        "06_look_inside",
    ):
        assert step in names


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(
    script: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "argv", [str(script), "--small", "--out", str(tmp_path)])
    monkeypatch.syspath_prepend(str(script.parent))
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert out.strip(), "an example must print the numbers its step is about"
    for line in out.splitlines():
        if line.startswith("wrote "):
            path = Path(line.split()[1])
            assert path.exists() and path.stat().st_size > 500, path
