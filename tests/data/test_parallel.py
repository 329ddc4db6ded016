"""Parallel corpora."""

from __future__ import annotations

import pytest

from attnlab.data.parallel import read_parallel


def test_reads_aligned_pairs_and_drops_blank_pairs(tmp_path) -> None:
    (tmp_path / "a.en").write_text("hello .\n\nthe cat .\n", encoding="utf-8")
    (tmp_path / "a.ja").write_text("こんにちは 。\nx\n猫 。\n", encoding="utf-8")
    corpus = read_parallel(tmp_path / "a.en", tmp_path / "a.ja")
    assert corpus.src == ["hello .", "the cat ."]
    assert corpus.tgt == ["こんにちは 。", "猫 。"]
    assert len(corpus) == 2


def test_different_line_counts_name_both_files_and_counts(tmp_path) -> None:
    src, tgt = tmp_path / "s.txt", tmp_path / "t.txt"
    src.write_text("a\nb\nc\n")
    tgt.write_text("x\ny\n")
    with pytest.raises(ValueError) as info:
        read_parallel(src, tgt, what="train")
    message = str(info.value)
    assert f"{src} has 3 lines" in message and f"{tgt} has 2" in message
    assert message.startswith("train files have different line counts")


def test_missing_and_non_utf8_files(tmp_path) -> None:
    src = tmp_path / "s.txt"
    src.write_text("a\n")
    with pytest.raises(ValueError, match="train target file not found"):
        read_parallel(src, tmp_path / "none.txt", what="train")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\x00a\n")
    with pytest.raises(ValueError, match="source file is not UTF-8"):
        read_parallel(bad, src)
