"""``--attention bigbird`` on ``attnlab train lm|translate`` and ``attnlab flops`` (issue 12):
BigBird's block is ``--bigbird-block`` (``--block-size`` is the LM's context length)."""

from __future__ import annotations

import json

import pytest

from attnlab import GPTConfig, TransformerConfig
from attnlab.cli import main
from attnlab.inspect import flops
from attnlab.tasks.run import load_run
from attnlab.training.checkpoint import resolve_checkpoint
from tests.cli.test_attention_cli import TEXT, TINY, _one_error_line, _write

BIGBIRD = ["--attention", "bigbird", "--bigbird-block", "4", "--random-blocks", "1"]


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_lm_trains_resumes_and_generates(text_file, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    argv = ["train", "lm", "--data", str(text_file), "--out", str(run), *TINY, *BIGBIRD]
    assert main([*argv, "--steps", "2", "--bigbird-seed", "7"]) == 0
    saved = json.loads((resolve_checkpoint(run) / "config.json").read_text())
    model = saved["model"]
    assert model["n_positions"] == 16  # --block-size
    assert model["attention"] == {  # the defaults are written: the layout is drawn from them
        "kind": "bigbird", "block_size": 4, "global_blocks": 1, "window_blocks": 3,
        "num_random_blocks": 1, "seed": 7,
    }  # fmt: skip
    assert saved["args"]["bigbird_block"] == 4 and saved["args"]["global_blocks"] == 1
    loaded = load_run(run)
    assert loaded.config.attention.block_size == 4 and loaded.config.attention.seed == 7
    capsys.readouterr()
    assert main([*argv, "--steps", "3", "--resume", "--bigbird-seed", "7"]) == 0
    capsys.readouterr()
    # another seed draws other random blocks: another model, refused
    assert main([*argv, "--steps", "4", "--resume", "--bigbird-seed", "8"]) == 2
    assert "seed" in _one_error_line(capsys)
    assert main(["generate", str(run), "--prompt", "to be", "--max-new-tokens", "20",
                 "--strategy", "greedy"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith("to be") and len(out.rstrip("\n")) == len("to be") + 20


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--attention", "bigbird"], "--attention bigbird needs --bigbird-block"),
        (["--bigbird-block", "4"], "--bigbird-block applies to --attention bigbird, got "
         "--attention full"),
        (["--attention", "sliding", "--window", "4", "--random-blocks", "1"],
         "--random-blocks applies to --attention bigbird, got --attention sliding"),
        ([*BIGBIRD, "--window", "4"], "--window applies to --attention sliding"),
        ([*BIGBIRD, "--window-blocks", "2"], "--window-blocks must be 0 or odd"),
        (["--attention", "bigbird", "--bigbird-block", "4", "--global-blocks", "0",
          "--window-blocks", "0", "--random-blocks", "0"], "needs some visible blocks"),
    ],
)  # fmt: skip
def test_lm_bad_combinations(text_file, tmp_path, capsys, options, message) -> None:
    run = tmp_path / "run"
    argv = ["train", "lm", "--data", str(text_file), "--out", str(run), *TINY, "--steps", "1"]
    assert main([*argv, *options]) == 2
    assert message in _one_error_line(capsys)
    assert not run.exists()


def test_a_bad_value_is_a_usage_error(text_file, tmp_path, capsys) -> None:
    argv = ["train", "lm", "--data", str(text_file), "--out", str(tmp_path / "run"), *TINY]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--steps", "1", *BIGBIRD, "--global-blocks", "-1"])
    assert exit_info.value.code == 2
    assert "--global-blocks" in capsys.readouterr().err


def test_translate_trains_and_translates(tmp_path, capsys) -> None:
    en = ["the cat sat .", "a dog ran .", "the dog sat .", "a cat ran ."] * 6
    fr = ["le chat assis .", "un chien courut .", "le chien assis .", "un chat courut ."] * 6
    src, tgt = _write(tmp_path / "train.en", en), _write(tmp_path / "train.fr", fr)
    run = tmp_path / "run"
    argv = ["train", "translate", "--out", str(run), "--steps", "2", "--src", src, "--tgt", tgt,
            "--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff", "32", "--warmup", "5",
            "--tokenizer", "word", "--max-tokens", "64", "--beams", "1",
            "--attention", "bigbird", "--bigbird-block", "2"]  # fmt: skip
    assert main(argv) == 0
    saved = json.loads((resolve_checkpoint(run) / "config.json").read_text())
    assert saved["model"]["attention"]["kind"] == "bigbird"
    assert saved["model"]["attention"]["block_size"] == 2
    capsys.readouterr()
    assert main(["translate", str(run), "the cat ran .", "--beams", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_flops_with_bigbird(capsys) -> None:
    assert main(["flops", "--preset", "gpt2", "--attention", "bigbird", "--bigbird-block", "64",
                 "--json"]) == 0  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    cfg = GPTConfig(attention="bigbird", block_size=64)
    assert data["forward_total"] == flops(cfg, 1024).forward_total
    assert data["forward_total"] < flops(GPTConfig(), 1024).forward_total
    options = ["--preset", "transformer-base", "--seq-len", "512", "--attention", "bigbird",
               "--bigbird-block", "32", "--global-blocks", "2", "--random-blocks", "3"]  # fmt: skip
    assert main(["flops", *options]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the table may wrap the header
    assert "bigbird block 32 global 2 window 3 random 3 seed 0" in out
    assert main(["flops", *options, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    tc = TransformerConfig(attention="bigbird", block_size=32, global_blocks=2,
                           num_random_blocks=3)  # fmt: skip
    assert data["forward_total"] == flops(tc, 512).forward_total
    assert data["forward_total"] < flops(TransformerConfig(), 512).forward_total
    assert main(["flops", "--random-blocks", "2"]) == 2
    assert "--random-blocks applies to --attention bigbird" in _one_error_line(capsys)
