"""Tokenizers: round trips, special ids, saving and loading."""

from __future__ import annotations

import json

import pytest

from attnlab.data.tokenizers import (
    DEFAULT_SPECIALS,
    CharTokenizer,
    load_tokenizer,
    tokenizer_from_json,
    train_bpe,
    train_word_level,
)

TEXT = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog"]


def test_char_round_trip_and_ids() -> None:
    tok = CharTokenizer.train("hello world")
    assert tok.vocab_size == len(set("hello world"))
    assert tok.decode(tok.encode("low hell")) == "low hell"
    assert tok.pad_id is None and tok.bos_id is None
    assert tok.encode(" ") == [0]  # sorted alphabet: the space first


def test_char_specials_come_first_and_are_skipped() -> None:
    tok = CharTokenizer(list("abc"), DEFAULT_SPECIALS)
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert tok.encode("cab") == [6, 4, 5]
    assert tok.decode([2, 6, 4, 3, 0]) == "ca"
    assert tok.decode([2, 6], skip_special=False) == "<bos>c"
    assert tok.encode("az") == [4, 1]  # unknown character -> <unk>


def test_char_unknown_character_without_unk_names_it() -> None:
    tok = CharTokenizer.train("abc")
    with pytest.raises(ValueError, match="outside the vocabulary: 'z'"):
        tok.encode("abz")


def test_char_bad_id_and_bad_alphabet() -> None:
    tok = CharTokenizer.train("ab")
    with pytest.raises(ValueError, match=r"ids must be in \[0, 2\), got 5"):
        tok.decode([5])
    with pytest.raises(ValueError, match="must not repeat"):
        CharTokenizer(list("aa"))
    with pytest.raises(ValueError, match="text must hold"):
        CharTokenizer.train("")


def test_word_level_round_trip_and_unknown() -> None:
    tok = train_word_level(TEXT, vocab_size=100)
    assert tok.pad_id == 0 and tok.eos_id == 3
    ids = tok.encode("the cat sat")
    assert tok.decode(ids) == "the cat sat"
    assert tok.encode("the zebra")[1] == tok.unk_id


def test_bpe_round_trip_metaspace_and_byte_level() -> None:
    tok = train_bpe(TEXT * 5, vocab_size=60)
    assert tok.decode(tok.encode("the cat sat on the log")) == "the cat sat on the log"
    byte_tok = train_bpe(TEXT * 5, vocab_size=300, byte_level=True, specials=())
    text = "naïve text\nwith newlines — ✓"
    assert byte_tok.decode(byte_tok.encode(text)) == text


@pytest.mark.parametrize("make", ["char", "bpe", "word"])
def test_save_and_load_give_the_same_ids(tmp_path, make: str) -> None:
    if make == "char":
        tok = CharTokenizer.train("".join(TEXT), DEFAULT_SPECIALS)
    elif make == "bpe":
        tok = train_bpe(TEXT, vocab_size=50)
    else:
        tok = train_word_level(TEXT, vocab_size=50)
    tok.save(tmp_path / "tokenizer.json")
    back = load_tokenizer(tmp_path / "tokenizer.json")
    assert type(back) is type(tok)
    assert back.vocab_size == tok.vocab_size
    assert back.encode("the cat sat") == tok.encode("the cat sat")
    assert back.eos_id == tok.eos_id


def test_load_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer file not found"):
        load_tokenizer(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_tokenizer(bad)
    with pytest.raises(ValueError, match="neither kind='char'"):
        tokenizer_from_json("{}")


def test_training_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="vocab_size must be a positive int, got 0"):
        train_bpe(TEXT, vocab_size=0)
    with pytest.raises(ValueError, match="must include '<unk>'"):
        train_word_level(TEXT, vocab_size=10, specials=("<pad>",))


@pytest.mark.parametrize("index", [2, 3, 100, -1, -2])
def test_char_id_to_token_refuses_ids_outside_the_vocabulary(index: int) -> None:
    # a negative id used to count from the end (a wrong token), one past the end an IndexError
    tok = CharTokenizer.train("ab")
    with pytest.raises(ValueError, match=rf"index must be in \[0, 2\), got {index}$"):
        tok.id_to_token(index)
    with pytest.raises(TypeError, match="index must be an int, got float"):
        tok.id_to_token(1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="index must be an int, got bool"):
        tok.id_to_token(True)
    assert [tok.id_to_token(i) for i in range(2)] == ["a", "b"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"kind": "char"}, "tokenizer JSON of kind 'char' must hold 'chars', a list of single"),
        ({"kind": "char", "chars": 5}, "'chars' must be a list of single characters, got int"),
        ({"kind": "char", "chars": {"a": 1}}, "'chars' must be a list of single .*, got dict"),
        ({"kind": "char", "chars": ["ab"]}, "'chars' must be a list of single .*, holds 'ab'"),
        ({"kind": "char", "chars": [1]}, "'chars' must be a list of single characters, holds 1"),
        ({"kind": "char", "chars": ["a"], "specials": 3}, "'specials' must be a list of strings"),
        ({"kind": "char", "chars": ["a"], "specials": [0]}, "'specials' .* strings, holds 0"),
    ],
)
def test_crafted_char_tokenizer_json_names_the_entry(content: dict, message: str) -> None:
    # these were a KeyError or "'int' object is not iterable" from deep inside
    with pytest.raises(ValueError, match=message):
        tokenizer_from_json(json.dumps(content))
