"""``--data NAME`` / ``--corpus NAME``: the packaged datasets by name, the user's files by path."""

from __future__ import annotations

import json

import pytest

from attnlab.cli import main

LM = ["--block-size", "16", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
      "--batch-size", "4", "--eval-iters", "1", "--warmup", "1", "--lr-decay-steps", "4"]  # fmt: skip
MT = ["--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff", "32", "--warmup", "2",
      "--tokenizer", "word", "--src-vocab", "200", "--tgt-vocab", "200", "--beams", "1",
      "--max-tokens", "256"]  # fmt: skip


def _saved(run) -> dict:
    ckpt = sorted((run / "checkpoints").glob("step-*"))[-1]
    return json.loads((ckpt / "config.json").read_text())


def test_lm_trains_on_the_packaged_tinyshakespeare_and_resumes(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    argv = ["train", "lm", "--data", "tinyshakespeare", "--out", str(run), *LM]
    assert main([*argv, "--steps", "1"]) == 0
    saved = _saved(run)
    assert saved["args"]["data"] == "tinyshakespeare"
    assert saved["data_files"]["--data"]["path"].endswith("input.txt.xz")
    assert main([*argv, "--steps", "2", "--resume"]) == 0
    assert "checkpoint:" in capsys.readouterr().out


def test_a_path_is_the_users_file_even_when_named_like_a_dataset(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tinyshakespeare").write_text("abcdefgh " * 40, encoding="utf-8")
    run = tmp_path / "run"
    assert main(["train", "lm", "--data", "./tinyshakespeare", "--out", str(run), "--steps", "1",
                 *LM]) == 0  # fmt: skip
    assert _saved(run)["model"]["vocab_size"] == 9  # the file's characters, not Shakespeare's


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            "tinyshakespear",
            "--data must be a text file or a packaged text dataset (tinyshakespeare)",
        ),
        ("small_parallel_enja", "got 'small_parallel_enja': --data file not found"),
        ("no/such/file.txt", "--data file not found: no/such/file.txt"),
    ],
)
def test_an_unknown_name_or_missing_file_is_one_line(data, message, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", "lm", "--data", data, "--out", str(run), "--steps", "1", *LM]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not run.exists()


def test_translate_trains_on_the_packaged_corpus(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    argv = ["train", "translate", "--corpus", "small_parallel_enja", "--out", str(run), *MT]
    assert main([*argv, "--steps", "1"]) == 0
    assert "test BLEU (1 beams)" in capsys.readouterr().out
    saved = _saved(run)
    assert saved["args"]["corpus"] == "small_parallel_enja"
    assert {"--corpus train.en.xz", "--corpus test.ja.xz"} <= set(saved["data_files"])
    assert json.loads((run / "bleu.json").read_text())["sentences"] == 500


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--corpus", "small_parallel_enja", "--dev-src", "a"], "--dev-src does not combine"),
        ([], "must be --src and --tgt files or --corpus NAME (small_parallel_enja), got none"),
        (["--src", "a"], "or --corpus NAME (small_parallel_enja), got --src"),
    ],
)
def test_translate_data_options_that_do_not_fit_are_one_line(options, message, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "translate", "--out", str(run), "--steps", "1", *MT, *options]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
