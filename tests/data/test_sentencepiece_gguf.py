"""A SentencePiece GGUF tokenizer (``tokenizer.ggml.model == "llama"``: pieces, scores, token
types, no merges) written here with the ``gguf`` package, against ``transformers``' own GGUF
tokenizer conversion (``AutoTokenizer.from_pretrained(folder, gguf_file=...)``): the same ids,
the same decoded text."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import gguf
import pytest

from attnlab.data.pretrained_tokenizer import PretrainedTokenizer, tokenizer_from_gguf
from attnlab.errors import ArgumentError

TEXTS = [
    "hello world",
    "the cat sat on the mat.",
    "  two leading spaces and a tab\there",
    "line one\nline two\n",
    "café naïve Ωμέγα 日本 🙂",  # outside the pieces: the bytes they fall back to
    "<s>hello</s> world",
    "",
    " ",
]
_WORDS = "hello world the cat sat on mat two leading spaces and a tab here line one".split()
_UNK, _NORMAL, _CONTROL, _BYTE = 2, 1, 3, 6


def _pieces() -> tuple[list[str], list[float], list[int]]:
    """A small SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte pieces, then the
    letters, the words' prefixes and the words after ``▁``, scored (some ties)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [_UNK, _CONTROL, _CONTROL] + [_BYTE] * 256
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    pieces: list[str] = ["\u2581", *sorted(set("".join(_WORDS)))]
    for word in _WORDS:
        for n in range(2, len(word) + 1):
            pieces += [word[:n], "\u2581" + word[:n]]
    rng = random.Random(0)
    for piece in dict.fromkeys(pieces):
        tokens.append(piece)
        types.append(_NORMAL)
        scores.append(
            -float(len(piece)) if len(piece) == 1 else -rng.choice((1.0, 2.0, 3.0)) * len(piece)
        )
    return tokens, scores, types


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sentencepiece") / "sp.gguf"
    tokens, scores, types = _pieces()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def metadata(gguf_file: Path) -> dict[str, Any]:
    reader = gguf.GGUFReader(str(gguf_file))
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


@pytest.fixture(scope="module")
def ours(metadata: dict[str, Any]) -> PretrainedTokenizer:
    return tokenizer_from_gguf(metadata)


@pytest.fixture(scope="module")
def theirs(gguf_file: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)


@pytest.mark.parametrize("text", TEXTS)
def test_ids_and_decoding_equal_transformers(
    text: str, ours: PretrainedTokenizer, theirs: Any
) -> None:
    want = theirs.encode(text, add_special_tokens=False)
    assert ours.encode(text) == want
    assert ours.decode(want) == theirs.decode(want, skip_special_tokens=True)
    assert ours.decode(want, skip_special=False) == theirs.decode(want)


def test_pieces_are_merged_by_score(ours: PretrainedTokenizer) -> None:
    assert ours.tokenizer.encode("hello world").tokens == ["\u2581hello", "\u2581world"]


def test_special_ids_and_bos(ours: PretrainedTokenizer, theirs: Any) -> None:
    assert (ours.bos_id, ours.eos_id, ours.unk_id) == (1, 2, 0)
    assert ours.add_bos is True  # llama.cpp's default for a SentencePiece vocabulary
    assert theirs.encode("hello")[0] == ours.bos_id
    assert ours.vocab_size == len(theirs)


def test_merges_need_scores(metadata: dict[str, Any]) -> None:
    with pytest.raises(ArgumentError, match=r"'tokenizer\.ggml\.scores' must hold one score per"):
        tokenizer_from_gguf({**metadata, "tokenizer.ggml.scores": [0.0]})
