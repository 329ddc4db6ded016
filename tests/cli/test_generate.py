"""``attnlab train lm`` then ``attnlab generate RUN --prompt``; bad data files."""

from __future__ import annotations

import pytest

from attnlab.cli import main

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


def test_lm_trains_and_generates_past_the_context(text_file, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert (
        main(["train", "lm", "--data", str(text_file), "--out", str(run), "--steps", "3", *TINY])
        == 0
    )
    assert "val_loss" in capsys.readouterr().err
    # 40 new characters > the 16-token context: the window slides
    assert (
        main(["generate", str(run), "--prompt", "to be", "--max-new-tokens", "40", "--seed", "1"])
        == 0
    )
    first = capsys.readouterr().out
    assert first.startswith("to be") and len(first.rstrip("\n")) == len("to be") + 40
    assert (
        main(["generate", str(run), "--prompt", "to be", "--max-new-tokens", "40", "--seed", "1"])
        == 0
    )
    assert capsys.readouterr().out == first  # seeded
    assert main(["generate", str(run), "--prompt", "to be", "--max-new-tokens", "5",
                 "--strategy", "greedy"]) == 0  # fmt: skip


def test_lm_bpe(text_file, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    args = ["train", "lm", "--data", str(text_file), "--bpe", "--bpe-vocab", "300",
            "--out", str(run), "--steps", "2", *TINY]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "whether", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("whether")


def test_prompt_outside_the_vocabulary(text_file, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert (
        main(["train", "lm", "--data", str(text_file), "--out", str(run), "--steps", "1", *TINY])
        == 0
    )
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "€"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "outside the vocabulary" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "--data file not found"),
        (b"", "--data file is empty"),
        ("café".encode("latin-1") + b" au lait", "--data file is not UTF-8 text"),
    ],
)
def test_bad_data_files_are_one_line_and_create_nothing(content, message, tmp_path, capsys) -> None:
    data = tmp_path / "data.txt"
    if content is not None:
        data.write_bytes(content)
    run = tmp_path / "run"
    # TINY: options that are valid with --steps 1 (the default --warmup 100 is not)
    assert main(["train", "lm", "--data", str(data), "--out", str(run), "--steps", "1", *TINY]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(data) in err
    assert not run.exists()


def test_unknown_task_is_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", "rot13", "--out", "x", "--steps", "1"])
    assert info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
