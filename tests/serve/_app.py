"""A tiny random language model behind ``attnlab serve``'s app (in-process, cheap): the GPT of
the ``view --generate`` tests (two layers, grouped heads, rotary positions, sharp heads)."""

from __future__ import annotations

from attnlab.serve import create_app
from tests.cli.test_view_generate import TOKENIZER, _gpt

__all__ = ["MAX_TOKENS", "TOKENIZER", "tiny_app"]

MAX_TOKENS = 24


def tiny_app():
    return create_app(_gpt(), TOKENIZER, title="tiny", max_tokens=MAX_TOKENS)
