"""``attnlab train copy|reverse|sort|translate`` then ``attnlab translate RUN``."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from attnlab.cli import main

TINY = ["--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff", "32", "--warmup", "5"]
TINY_TASK = [*TINY, "--max-len", "6", "--num-heldout", "20", "--batch-size", "8"]


@pytest.mark.parametrize("task", ["copy", "sort"])
def test_algorithmic_task_trains_and_translates(task: str, tmp_path, capsys) -> None:
    run = tmp_path / task
    assert main(["train", task, "--out", str(run), "--steps", "2", *TINY_TASK]) == 0
    assert "exact-match accuracy:" in capsys.readouterr().out
    assert main(["translate", str(run), "abc", "cab", "--beams", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(set(x) <= set("abcdefghij") for x in lines)


def test_reverse_resume_is_bit_identical(tmp_path) -> None:
    once, twice = tmp_path / "once", tmp_path / "twice"
    assert main(["train", "reverse", "--out", str(once), "--steps", "4", *TINY_TASK]) == 0
    assert main(["train", "reverse", "--out", str(twice), "--steps", "2", *TINY_TASK]) == 0
    assert (
        main(["train", "reverse", "--out", str(twice), "--steps", "4", "--resume", *TINY_TASK]) == 0
    )
    a = load_file(str(once / "checkpoints" / "step-00000004" / "model.safetensors"))
    b = load_file(str(twice / "checkpoints" / "step-00000004" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].equal(b[k]), k
    loss = lambda run: [  # noqa: E731
        json.loads(x)["loss"]
        for x in (run / "metrics.jsonl").read_text().splitlines()
        if json.loads(x)["kind"] == "train"
    ]
    assert loss(once) == loss(twice)


def _write(path, lines) -> str:
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return str(path)


@pytest.fixture
def parallel(tmp_path):
    en = ["the cat sat .", "a dog ran .", "the dog sat .", "a cat ran ."] * 6
    fr = ["le chat assis .", "un chien courut .", "le chien assis .", "un chat courut ."] * 6
    return {
        "src": _write(tmp_path / "train.en", en),
        "tgt": _write(tmp_path / "train.fr", fr),
        "dev_src": _write(tmp_path / "dev.en", en[:4]),
        "dev_tgt": _write(tmp_path / "dev.fr", fr[:4]),
    }


@pytest.mark.parametrize("tokenizer", ["word", "bpe"])
def test_translate_task_writes_bleu_and_translates(tokenizer, parallel, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    args = ["train", "translate", "--out", str(run), "--steps", "2", *TINY,
            "--src", parallel["src"], "--tgt", parallel["tgt"],
            "--dev-src", parallel["dev_src"], "--dev-tgt", parallel["dev_tgt"],
            "--test-src", parallel["dev_src"], "--test-tgt", parallel["dev_tgt"],
            "--tokenizer", tokenizer, "--src-vocab", "60", "--tgt-vocab", "60",
            "--max-tokens", "64", "--beams", "2"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "test BLEU (2 beams):" in out
    bleu = json.loads((run / "bleu.json").read_text())
    assert bleu["split"] == "test" and 0.0 <= bleu["bleu"] <= 100.0 and bleu["sentences"] == 4
    assert len((run / "test.hyp").read_text().splitlines()) == 4
    ckpt = run / "checkpoints" / "step-00000002"
    assert (ckpt / "src_tokenizer.json").is_file() and (ckpt / "tgt_tokenizer.json").is_file()
    assert main(["translate", str(run), "the cat ran .", "--beams", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_parallel_files_with_different_line_counts(parallel, tmp_path, capsys) -> None:
    short = _write(tmp_path / "short.fr", ["x"] * 3)
    run = tmp_path / "run"
    code = main(["train", "translate", "--out", str(run), "--steps", "1",
                 "--src", parallel["src"], "--tgt", short])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{parallel['src']} has 24 lines" in err and f"{short} has 3" in err
    assert not run.exists()


def test_translate_on_a_missing_run(tmp_path, capsys) -> None:
    assert main(["translate", str(tmp_path / "none"), "x"]) == 2
    assert capsys.readouterr().err.startswith("attnlab: error: no such run")
