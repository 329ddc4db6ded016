"""``--attention`` on ``attnlab train lm|translate`` and ``attnlab flops`` (issue 12)."""

from __future__ import annotations

import json

import pytest

from attnlab import GPTConfig
from attnlab.cli import main
from attnlab.inspect import flops
from attnlab.nn.kinds import FullSpec, PerformerSpec, SlidingSpec
from attnlab.tasks.run import load_run
from attnlab.training.checkpoint import resolve_checkpoint

TEXT = (
    "to be, or not to be, that is the question:\nwhether 'tis nobler in the mind to suffer\n" * 20
)
TINY = ["--block-size", "16", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
        "--batch-size", "4", "--eval-iters", "2", "--warmup", "2", "--lr-decay-steps", "10"]  # fmt: skip


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("options", "spec"),
    [
        (["--attention", "sliding", "--window", "8"], SlidingSpec(window=8)),
        (["--attention", "performer", "--num-features", "12"], PerformerSpec(num_features=12)),
    ],
    ids=["sliding", "performer"],
)  # fmt: skip
def test_lm_trains_resumes_and_generates(text_file, tmp_path, capsys, options, spec) -> None:
    run = tmp_path / "run"
    argv = ["train", "lm", "--data", str(text_file), "--out", str(run), *TINY, *options]
    assert main([*argv, "--steps", "3"]) == 0
    saved = json.loads((resolve_checkpoint(run) / "config.json").read_text())
    assert saved["model"]["attention"] == spec.to_dict()
    assert load_run(run).config.attention == spec
    capsys.readouterr()
    # the same options resume the run; different ones are refused
    assert main([*argv, "--steps", "4", "--resume"]) == 0
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "to be", "--max-new-tokens", "20",
                 "--strategy", "greedy"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith("to be") and len(out.rstrip("\n")) == len("to be") + 20


def test_resume_with_other_attention_is_refused(text_file, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    argv = ["train", "lm", "--data", str(text_file), "--out", str(run), *TINY]
    assert main([*argv, "--steps", "1", "--attention", "sliding", "--window", "8"]) == 0
    capsys.readouterr()
    assert main([*argv, "--steps", "2", "--resume", "--attention", "sliding", "--window", "4"]) == 2
    assert "window" in _one_error_line(capsys)


def test_full_attention_runs_keep_their_config_json(text_file, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    argv = ["train", "lm", "--data", str(text_file), "--out", str(run), *TINY, "--steps", "1"]
    assert main(argv) == 0
    saved = json.loads((resolve_checkpoint(run) / "config.json").read_text())
    # unset attention options are not written: runs saved before they existed still resume
    assert "attention" not in saved["model"] and "attention" not in saved["args"]
    assert load_run(run).config.attention == FullSpec()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--window", "8"], "--window applies to --attention sliding, got --attention full"),
        (["--attention", "sliding"], "--attention sliding needs --window"),
        (["--attention", "linformer", "--linformer-k", "8"], "--attention linformer does not fit"),
        (["--attention", "performer", "--window", "8"], "--window applies to --attention sliding"),
        (["--attention", "sliding", "--window", "8", "--num-features", "4"],
         "--num-features applies to --attention performer"),
    ],
)  # fmt: skip
def test_lm_bad_combinations(text_file, tmp_path, capsys, options, message) -> None:
    run = tmp_path / "run"
    argv = ["train", "lm", "--data", str(text_file), "--out", str(run), *TINY, "--steps", "1"]
    assert main([*argv, *options]) == 2
    assert message in _one_error_line(capsys)
    assert not run.exists()


def _write(path, lines) -> str:
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    "options",
    [["--attention", "linformer", "--linformer-k", "8"], ["--attention", "sliding", "--window", "2"],
     ["--attention", "performer"]],
    ids=["linformer", "sliding", "performer"],
)  # fmt: skip
def test_translate_trains_and_translates(tmp_path, capsys, options) -> None:
    en = ["the cat sat .", "a dog ran .", "the dog sat .", "a cat ran ."] * 6
    fr = ["le chat assis .", "un chien courut .", "le chien assis .", "un chat courut ."] * 6
    src, tgt = _write(tmp_path / "train.en", en), _write(tmp_path / "train.fr", fr)
    run = tmp_path / "run"
    argv = ["train", "translate", "--out", str(run), "--steps", "2", "--src", src, "--tgt", tgt,
            "--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff", "32", "--warmup", "5",
            "--tokenizer", "word", "--max-tokens", "64", "--beams", "1", *options]  # fmt: skip
    assert main(argv) == 0
    saved = json.loads((resolve_checkpoint(run) / "config.json").read_text())
    assert saved["model"]["attention"]["kind"] == options[1]
    capsys.readouterr()
    assert main(["translate", str(run), "the cat ran .", "--beams", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_flops_with_attention(capsys) -> None:
    assert main(["flops", "--preset", "gpt2", "--attention", "sliding", "--window", "256",
                 "--json"]) == 0  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    cfg = GPTConfig(attention="sliding", window=256)
    assert data["forward_total"] == flops(cfg, 1024).forward_total
    assert data["forward_total"] < flops(GPTConfig(), 1024).forward_total
    assert main(["flops", "--preset", "gpt2", "--attention", "performer", "--num-features",
                 "256"]) == 0  # fmt: skip
    assert "performer m 256" in capsys.readouterr().out
    assert main(["flops", "--preset", "transformer-base", "--attention", "linformer",
                 "--linformer-k", "64"]) == 0  # fmt: skip
    assert "linformer k 64" in capsys.readouterr().out
    assert (
        main(["flops", "--preset", "gpt2", "--attention", "linformer", "--linformer-k", "64"]) == 2
    )
    assert "--attention linformer does not fit a GPT" in _one_error_line(capsys)
    assert main(["flops", "--window", "256"]) == 2
    assert "--window applies to --attention sliding" in _one_error_line(capsys)
