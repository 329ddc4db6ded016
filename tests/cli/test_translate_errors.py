"""``attnlab translate``: a text longer than the model was trained on is refused, and one bad
sentence does not refuse the others (issue 24).

A copy/reverse/sort model has at least 64 positions but learns strings of ``--max-len`` symbols
only; a longer string used to be decoded into a wrong answer without a word. Several sentences at
once used to fail all together when one of them was bad. A translation run takes far longer
sentences than it was trained on: those are translated with a warning.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.errors import UntrainedLengthWarning
from attnlab.tasks.run import load_run

TINY = ["--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff", "32", "--warmup", "5"]
LONG = "abcdefghij"  # 10 symbols; the run learns at most 6


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory) -> str:
    run = tmp_path_factory.mktemp("translate-errors") / "copy"
    args = ["train", "copy", "--out", str(run), "--steps", "2", *TINY, "--max-len", "6",
            "--num-heldout", "20", "--batch-size", "8"]  # fmt: skip
    assert main(args) == 0
    return str(run)


def test_a_text_longer_than_trained_is_one_line_and_exit_2(copy_run, capsys) -> None:
    capsys.readouterr()
    assert main(["translate", copy_run, LONG]) == 2
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("attnlab: error: sentence 1: text must have at most 6 tokens")
    assert "got 10" in err[0]
    assert captured.out == "\n"  # its line is empty: no answer printed for it


def test_one_bad_sentence_leaves_the_others_translated(copy_run, capsys) -> None:
    capsys.readouterr()
    assert main(["translate", copy_run, "abc", "cab"]) == 0
    alone = capsys.readouterr().out.splitlines()
    assert main(["translate", copy_run, "abc", LONG, "cab", "ab!"]) == 2
    captured = capsys.readouterr()
    out = captured.out.split("\n")[:-1]
    assert out == [alone[0], "", alone[1], ""]  # line i answers sentence i
    err = captured.err.splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("attnlab: error: sentence 2: text must have at most 6 tokens")
    assert err[1].startswith("attnlab: error: sentence 4: the text holds characters outside")


def test_library_translate_each_and_translate(copy_run) -> None:
    loaded = load_run(copy_run)
    io, model = loaded.io, loaded.model
    results = io.translate_each(model, ["abc", LONG, "", "cab"])
    assert [r.ok for r in results] == [True, False, False, True]
    assert [r.output for r in results[::3]] == io.translate(model, ["abc", "cab"])
    assert isinstance(results[1].error, ValueError)
    assert "at most 6 tokens" in str(results[1].error) and "got 10" in str(results[1].error)
    assert "encodes to no tokens" in str(results[2].error)
    with pytest.raises(ValueError, match=r"texts\[1\]: text must have at most 6 tokens.*got 10"):
        io.translate(model, ["abc", LONG])
    # corpus evaluation (lenient) cuts to the trained length instead
    assert len(io.encode_source(LONG, lenient=True)) == 6 + 1  # with <eos>


# A translation run's positions take 254 tokens, far more than its training sentences: a longer
# sentence is translated, with a warning naming its length and the longest trained one.
EN = ["the cat sat .", "a dog ran .", "the dog sat .", "a cat ran ."] * 4  # 4 tokens each
FR = ["le chat assis .", "un chien courut .", "le chien assis .", "un chat courut ."] * 4
LONG_EN = "the cat sat . a dog ran ."  # 8 words


@pytest.fixture(scope="module")
def mt_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("translate-lengths")
    src, tgt = root / "train.en", root / "train.fr"
    src.write_text("".join(x + "\n" for x in EN), encoding="utf-8")
    tgt.write_text("".join(x + "\n" for x in FR), encoding="utf-8")
    run = root / "mt"
    args = ["train", "translate", "--out", str(run), "--steps", "1", *TINY, "--src", str(src),
            "--tgt", str(tgt), "--tokenizer", "word", "--src-vocab", "30", "--tgt-vocab", "30",
            "--max-tokens", "64", "--beams", "1"]  # fmt: skip
    assert main(args) == 0
    return run


def test_a_sentence_longer_than_trained_is_translated_with_a_warning(mt_run, capsys) -> None:
    capsys.readouterr()
    assert main(["translate", str(mt_run), "the cat sat .", LONG_EN]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2  # both translated
    err = captured.err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("attnlab: warning: sentence 2: 8 tokens, longer than the longest")
    assert "(4 tokens)" in err[0]


def test_library_warns_for_a_long_sentence_only(mt_run) -> None:
    loaded = load_run(mt_run)
    io, model = loaded.io, loaded.model
    assert io.longest_trained == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a short sentence: no warning at all
        short = io.translate_each(model, ["the cat sat .", "a dog ran ."])
    assert [r.warning for r in short] == [None, None]
    with pytest.warns(UntrainedLengthWarning, match=r"texts\[1\] has 8 tokens.*\(4 tokens\)"):
        results = io.translate_each(model, ["a dog ran .", LONG_EN])
    assert results[1].ok and results[1].output is not None and "8 tokens" in str(results[1].warning)
    with pytest.warns(UntrainedLengthWarning, match=r"texts\[0\] has 8 tokens"):
        io.translate(model, [LONG_EN])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # corpus evaluation (lenient) does not warn
        io.translate(model, [LONG_EN], lenient=True)


def test_a_run_saved_before_the_lengths_gives_no_warning(mt_run, tmp_path, capsys) -> None:
    old = tmp_path / "old"
    shutil.copytree(mt_run, old)
    ckpt = old / "checkpoints" / "step-00000001"
    (ckpt / "train_lengths.json").unlink()
    manifest = json.loads((ckpt / "manifest.json").read_text())
    del manifest["files"]["train_lengths.json"]
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    assert load_run(old).io.longest_trained is None
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["translate", str(old), LONG_EN]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and len(captured.out.splitlines()) == 1
