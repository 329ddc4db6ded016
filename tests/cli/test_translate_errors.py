"""``attnlab translate``: a text longer than the model was trained on is refused, and one bad
sentence does not refuse the others (issue 24).

A copy/reverse/sort model has at least 64 positions but learns strings of ``--max-len`` symbols
only; a longer string used to be decoded into a wrong answer without a word. Several sentences at
once used to fail all together when one of them was bad.
"""

from __future__ import annotations

import pytest

from attnlab.cli import main
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
