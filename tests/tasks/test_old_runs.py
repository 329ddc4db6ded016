"""Run folders written by the release before attention specs (``tests/fixtures/release_0_1``,
flat attention fields in ``config.json``) still load, decode and resume (issue 20)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.nn.kinds import BigBirdSpec, LinformerSpec
from attnlab.tasks.run import load_run

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "release_0_1"
LM = ["train", "lm", "--data", "text.txt", "--out", "lm_bigbird", "--n-layer", "1", "--n-head",
      "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "4", "--eval-iters", "1",
      "--warmup", "1", "--lr-decay-steps", "4", "--eval-every", "2", "--attention", "bigbird",
      "--bigbird-block", "4", "--random-blocks", "1"]  # fmt: skip
REVERSE = ["train", "reverse", "--out", "rev_linformer", "--num-symbols", "5", "--max-len", "5",
           "--num-heldout", "20", "--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff",
           "32", "--batch-size", "8", "--warmup", "1", "--attention", "linformer",
           "--linformer-k", "4", "--eval-every", "2"]  # fmt: skip


@pytest.fixture
def old_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(FIXTURES, tmp_path / "runs")
    monkeypatch.chdir(tmp_path / "runs")  # the lm run names its data file relative to here
    return tmp_path / "runs"


def test_an_old_lm_run_loads_decodes_and_resumes(
    old_runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = load_run(old_runs / "lm_bigbird")
    assert run.config.attention == BigBirdSpec(block_size=4, num_random_blocks=1)
    assert main(["generate", "lm_bigbird", "--prompt", "to be", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("to be")
    assert main([*LM, "--steps", "3", "--resume"]) == 0  # the same options, written anew
    capsys.readouterr()
    assert main([*LM, "--steps", "4", "--resume", "--bigbird-seed", "5"]) == 2  # another model
    assert "seed" in capsys.readouterr().err


def test_an_old_encoder_decoder_run_loads_translates_and_resumes(
    old_runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = load_run(old_runs / "rev_linformer")
    assert run.config.attention == LinformerSpec(k=4)
    assert main(["translate", "rev_linformer", "abc"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert main([*REVERSE, "--steps", "3", "--resume"]) == 0
