"""The packaged prompt sets (attnlab.data.prompt_sets) and prompts files of one's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlab.data import prompt_sets
from attnlab.errors import ArgumentError


def test_each_packaged_set_has_eight_complete_prompts() -> None:
    assert prompt_sets.names() == ("factual", "ioi")
    for name in prompt_sets.names():
        prompts = prompt_sets.load(name)
        assert len(prompts) == 8
        for p in prompts:
            assert p.answer and p.foil and p.corrupted and p.answer != p.foil
            assert p.answer.startswith(" ") and p.corrupted != p.prompt
    ioi = prompt_sets.load("ioi")[0]
    assert ioi.prompt == "When Mary and John went to the store, John gave a drink to"
    assert (ioi.answer, ioi.foil) == (" Mary", " John")
    with pytest.raises(ArgumentError, match="prompt set must be one of factual, ioi, got 'x'"):
        prompt_sets.load("x")


def test_a_prompts_file_is_json_or_one_prompt_a_line(tmp_path: Path) -> None:
    text = tmp_path / "p.txt"
    text.write_text("The capital of France is\n\nWhen Mary and John\n", encoding="utf-8")
    assert [p.prompt for p in prompt_sets.load_prompts(text)] == [
        "The capital of France is",
        "When Mary and John",
    ]
    listed = tmp_path / "p.json"
    listed.write_text(json.dumps({"prompts": ["a b", {"prompt": "c", "answer": " d"}]}))
    assert prompt_sets.load_prompts(listed) == [
        prompt_sets.Prompt("a b"),
        prompt_sets.Prompt("c", " d"),
    ]
    bad = {
        "[]": "non-empty list of prompts",
        "{": "is not valid JSON",
        '[{"answer": " x"}]': 'prompt 0 must be a string or an object with a non-empty "prompt"',
        '[{"prompt": "a", "foil": 3}]': "prompt 0 must be",
    }
    for content, message in bad.items():
        listed.write_text(content, encoding="utf-8")
        with pytest.raises(ArgumentError, match=message):
            prompt_sets.load_prompts(listed)
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", encoding="utf-8")
    with pytest.raises(ArgumentError, match="holds no prompt"):
        prompt_sets.load_prompts(empty)
