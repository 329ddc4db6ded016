"""Small prompt sets that ship with attnlab, for scoring explanations of a language model's next
token (:func:`attnlab.inspect.faithfulness_over_prompts`, ``attnlab inspect MODEL --faithfulness
--prompt-set NAME``).

Each set is one JSON file in this package: ``{"name", "description", "prompts": [...]}``, every
prompt an object with

* ``prompt``: the text whose next token is explained;
* ``answer``: the expected next token (with its leading space), ``foil``: a wrong one — the
  patching metric is ``logit[answer] − logit[foil]`` (their first tokens);
* ``corrupted``: the same prompt with the evidence for the answer changed (other names, another
  country), as many tokens long, for exact per-token patching.

The sets:

* ``ioi`` — 8 indirect-object identification prompts (Wang et al. 2023, "Interpretability in the
  Wild"), "When Mary and John went to the store, John gave a drink to" → " Mary"; each corrupted
  prompt names two other people.
* ``factual`` — 8 factual-recall prompts (Meng et al. 2022), "The capital of France is" →
  " Paris"; each corrupted prompt names another subject.

A file of one's own (:func:`load_prompts`) is either JSON in this form (a list of prompt objects,
or an object with ``"prompts"``; only ``prompt`` is required) or plain text, one prompt a line.

Examples:
    >>> from attnlab.data import prompt_sets
    >>> prompt_sets.names()
    ('factual', 'ioi')
    >>> prompt_sets.load("factual")[0].answer
    ' Paris'
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from attnlab.errors import ArgumentError

__all__ = ["Prompt", "load", "load_prompts", "names"]


@dataclass(frozen=True)
class Prompt:
    """One prompt of a set.

    Attributes:
        prompt: the text whose next token is explained.
        answer: the expected next token, or ``None`` (not known).
        foil: a wrong next token (the patching metric's other side), or ``None``.
        corrupted: the prompt with the answer's evidence changed, as many tokens long, or ``None``.
    """

    prompt: str
    answer: str | None = None
    foil: str | None = None
    corrupted: str | None = None


def names() -> tuple[str, ...]:
    """The packaged prompt sets' names.

    Returns:
        The names, sorted.
    """
    here = resources.files(__package__)
    return tuple(sorted(p.name[:-5] for p in here.iterdir() if p.name.endswith(".json")))


def load(name: str) -> list[Prompt]:
    """A packaged prompt set.

    Args:
        name: one of :func:`names`.

    Returns:
        Its prompts, in order.

    Raises:
        ValueError: an unknown name (the known ones listed).
    """
    if name not in names():
        raise ArgumentError(f"prompt set must be one of {', '.join(names())}, got {name!r}")
    text = resources.files(__package__).joinpath(f"{name}.json").read_text(encoding="utf-8")
    return _parse(json.loads(text), f"prompt set {name!r}")


def load_prompts(path: str | Path) -> list[Prompt]:
    """The prompts of a file: JSON (a list of prompt objects, or ``{"prompts": [...]}``) when it
    ends in ``.json``, else one prompt a line (blank lines skipped).

    Args:
        path: the file.

    Returns:
        Its prompts, in order.

    Raises:
        ValueError: no such file, not UTF-8 or not valid JSON, a prompt without its text, or no
            prompt at all.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ArgumentError(f"prompts file {str(path)!r} cannot be read: {e}") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ArgumentError(f"prompts file {str(path)!r} is not valid JSON: {e}") from None
        return _parse(data, f"prompts file {str(path)!r}")
    prompts = [Prompt(line) for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ArgumentError(f"prompts file {str(path)!r} holds no prompt (one per line)")
    return prompts


def _parse(data: Any, where: str) -> list[Prompt]:
    items = data.get("prompts") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise ArgumentError(
            f'{where} must hold a non-empty list of prompts ([{{"prompt": ...}}, ...] or '
            f'{{"prompts": [...]}}), got {type(items).__name__ if items else "none"}'
        )
    prompts = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            item = {"prompt": item}
        fields = ("prompt", "answer", "foil", "corrupted")
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("prompt"), str)
            or not item["prompt"].strip()
            or any(item.get(k) is not None and not isinstance(item[k], str) for k in fields)
        ):
            raise ArgumentError(
                f'{where}: prompt {i} must be a string or an object with a non-empty "prompt" '
                f'(and optionally "answer", "foil", "corrupted" strings), got {item!r:.80}'
            )
        prompts.append(
            Prompt(item["prompt"], item.get("answer"), item.get("foil"), item.get("corrupted"))
        )
    return prompts
