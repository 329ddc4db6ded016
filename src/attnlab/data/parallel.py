"""Parallel corpora: a source file and a target file, one sentence a line, line ``i`` ↔ line ``i``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnlab.data.text import read_text_file
from attnlab.errors import ArgumentError

__all__ = ["ParallelCorpus", "pair_lines", "read_parallel", "split_lines"]


@dataclass(frozen=True)
class ParallelCorpus:
    """Aligned sentence pairs.

    Attributes:
        src: source sentences.
        tgt: target sentences, ``tgt[i]`` translates ``src[i]``.
    """

    src: list[str]
    tgt: list[str]

    def __len__(self) -> int:
        return len(self.src)


def split_lines(text: str) -> list[str]:
    """The sentences of a text, one a line, stripped; a final newline starts no other sentence.

    Args:
        text: a file's text.

    Returns:
        Its lines, each stripped of surrounding whitespace (blank ones kept, as ``""``).
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r").strip() for line in lines]


def read_parallel(
    src_path: str | Path, tgt_path: str | Path, *, what: str = "parallel"
) -> ParallelCorpus:
    """Read two aligned UTF-8 files.

    Pairs where either side is blank are dropped (both sides, so the alignment stays).

    Args:
        src_path: the source-language file.
        tgt_path: the target-language file.
        what: how error messages name the pair (``"train"``, ``"dev"``…).

    Returns:
        A :class:`ParallelCorpus`.

    Raises:
        ValueError: either file is missing, empty or not UTF-8, or the files have different line
            counts (the message names both files and both counts).
    """
    src_lines = split_lines(read_text_file(src_path, what=f"{what} source file"))
    tgt_lines = split_lines(read_text_file(tgt_path, what=f"{what} target file"))
    if len(src_lines) != len(tgt_lines):
        raise ArgumentError(
            f"{what} files have different line counts: {src_path} has {len(src_lines)} lines, "
            f"{tgt_path} has {len(tgt_lines)}"
        )
    corpus = pair_lines(src_lines, tgt_lines)
    if not corpus.src:
        raise ArgumentError(f"{what} files hold no non-blank sentence pair: {src_path}, {tgt_path}")
    return corpus


def pair_lines(src_lines: list[str], tgt_lines: list[str]) -> ParallelCorpus:
    """Aligned lines as sentence pairs; a pair with a blank side is dropped (both sides).

    Args:
        src_lines: source sentences.
        tgt_lines: target sentences, as many.

    Returns:
        The non-blank pairs (possibly none).
    """
    pairs = [(s, t) for s, t in zip(src_lines, tgt_lines) if s and t]
    return ParallelCorpus(src=[s for s, _ in pairs], tgt=[t for _, t in pairs])
