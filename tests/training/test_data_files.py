"""Resume notices changed data (hardening 2): the data files' size and SHA-256 are kept in
``config.json``; resuming against a changed file is refused, naming it, unless allowed."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from attnlab.training import Trainer
from attnlab.training.checkpoint import load_config, resolve_checkpoint
from attnlab.training.data_files import data_change, fingerprint_files
from tests.training._tiny_task import tiny_trainer


def _trainer(run_dir: Path, steps: int, data: Path | None) -> Trainer:
    return tiny_trainer(
        run_dir,
        steps,
        run_config={"task": "tiny", "args": {"data": str(data)}},
        data_files={"--data": data} if data is not None else None,
    )


def test_the_fingerprint_is_saved_and_checked_on_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "text.txt"
    data.write_text("abcdef" * 10)
    _trainer(tmp_path / "run", 2, data).fit()
    saved = load_config(tmp_path / "run")["data_files"]
    assert saved == fingerprint_files({"--data": data})
    assert saved["--data"]["size"] == 60 and len(saved["--data"]["sha256"]) == 64
    # unchanged data resumes
    assert _trainer(tmp_path / "run", 3, data).resume() == 2
    # the same size, another text: refused, naming the file, and nothing is changed
    data.write_text("abcdeg" * 10)
    before = resolve_checkpoint(tmp_path / "run")
    resumed = _trainer(tmp_path / "run", 4, data)
    with pytest.raises(ValueError, match=r"the --data file .*text\.txt changed since") as info:
        resumed.resume()
    assert "--allow-data-change" in str(info.value) and "\n" not in str(info.value)
    assert resumed.step == 0 and resolve_checkpoint(tmp_path / "run") == before
    # allowed explicitly: it resumes with a warning, and saves the new fingerprint from then on
    with caplog.at_level(logging.WARNING, logger="attnlab.training.trainer"):
        assert resumed.resume(allow_data_change=True) == 2
    assert any("resuming on changed data" in r.getMessage() for r in caplog.records)
    resumed.fit()
    assert load_config(tmp_path / "run")["data_files"] == fingerprint_files({"--data": data})


def test_a_checkpoint_without_fingerprints_resumes(tmp_path: Path) -> None:
    data = tmp_path / "text.txt"
    data.write_text("abc")
    run = _trainer(tmp_path / "run", 1, None)
    run.run_config["args"]["data"] = str(data)  # the same run, saved before fingerprints
    run.fit()
    assert "data_files" not in load_config(tmp_path / "run")
    assert _trainer(tmp_path / "run", 2, data).resume() == 1


def test_data_change_describes_the_first_difference() -> None:
    old = {"--src": {"path": "a", "size": 1, "sha256": "0" * 64}}
    assert data_change(None, old) is None
    assert data_change(old, old) is None
    new = {"--src": {"path": "a", "size": 2, "sha256": "1" * 64}}
    assert "the --src file a changed" in str(data_change(old, new))
    assert "is new" in str(data_change({}, new)) and "is gone" in str(data_change(old, {}))
    assert "not a mapping" in str(data_change(["x"], old))
