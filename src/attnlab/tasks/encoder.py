"""The one path between a text and a pretrained encoder (BERT, RoBERTa, DistilBERT, ELECTRA, the
bundled ``minilm-l6``): the text's tokens with the special tokens its tokenizer adds (``[CLS] … [SEP]``,
``<s> … </s>``), read once in both directions; nothing is generated.

Its :class:`~attnlab.tasks.base.ModelInputs` are of the ``"lm"`` kind (one sequence, its tokens
× its tokens) with no continuation, so ``view``, ``inspect`` and ``plot`` show an encoder as
they show a language model's prompt — every weight, both directions, since the model hides no
future key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.embedding import encode_texts
from attnlab.tasks.base import ModelInputs, token_labels

__all__ = ["EncoderIO"]


@dataclass(frozen=True)
class EncoderIO:
    """A pretrained encoder's text path (see the module docstring).

    Args:
        tokenizer: the encoder's tokenizer (``None``: ids only).
        n_positions: the tokens the model reads at most.
        kind: always ``"lm"`` (one sequence; the :class:`~attnlab.tasks.base.TaskIO` family).
    """

    tokenizer: Any
    n_positions: int
    kind: Literal["lm"] = "lm"

    def encode(self, text: str) -> list[int]:
        """The text's ids, special tokens included (``[CLS] … [SEP]``).

        Args:
            text: the text.

        Returns:
            Its token ids.
        """
        if not isinstance(text, str):
            raise ArgumentTypeError(f"text must be a str, got {type(text).__name__}")
        if self.tokenizer is None:
            raise ArgumentError("the model has no tokenizer.json, so a text cannot be encoded")
        ids, _ = encode_texts(self.tokenizer, [text], max_length=self.n_positions)
        return [int(i) for i in ids[0]]

    def inputs(
        self,
        model: nn.Module,
        text: str | None,
        *,
        max_new_tokens: int = 0,
        source_ids: Sequence[int] | None = None,
        **options: Any,
    ) -> ModelInputs:
        """What the encoder reads for ``text`` (or ``source_ids``, verbatim).

        Args:
            model: the encoder (unused: nothing is generated).
            text: the text (ignored when ``source_ids`` is given).
            max_new_tokens: must be 0: an encoder generates nothing.
            source_ids: the ids verbatim, instead of ``text``.
            **options: none apply.

        Returns:
            The tokens, with their labels; the output is the text they decode to.
        """
        if max_new_tokens:
            raise ArgumentError(
                f"max_new_tokens must be 0 for an encoder (it generates nothing), got "
                f"{max_new_tokens!r}"
            )
        ids = list(source_ids) if source_ids is not None else self.encode(text or "")
        if len(ids) > self.n_positions:
            raise ArgumentError(
                f"the text has {len(ids)} tokens, more than the model's {self.n_positions}"
            )
        return self.probe_ids(ids)

    def probe_inputs(self, text: str) -> ModelInputs:
        """The text's tokens (the attention probe's input).

        Args:
            text: the text.

        Returns:
            The model's input for ``text``.
        """
        return self.probe_ids(self.encode(text))

    def probe_ids(self, ids: Sequence[int]) -> ModelInputs:
        """The :class:`~attnlab.tasks.base.ModelInputs` of some ids.

        Args:
            ids: token ids, special tokens included.

        Returns:
            One sequence, no continuation.
        """
        output = " ".join(map(str, ids)) if self.tokenizer is None else self.tokenizer.decode(ids)
        return ModelInputs(
            kind="lm",
            source_ids=tuple(int(i) for i in ids),
            target_ids=(),
            source_tokens=tuple(token_labels(self.tokenizer, ids)),
            target_tokens=(),
            output=str(output),
            bidirectional=True,
            special_positions=tuple(i for i, t in enumerate(ids) if int(t) in self.special_ids()),
        )

    def special_ids(self) -> frozenset[int]:
        """The ids of the tokenizer's special tokens (``[CLS]``, ``[SEP]``, ``[PAD]`` …).

        Returns:
            The ids its ``tokenizer.json`` marks ``special`` (none without a tokenizer).
        """
        backend = getattr(self.tokenizer, "tokenizer", None)
        added = getattr(backend, "get_added_tokens_decoder", None)
        if added is None:
            return frozenset()
        return frozenset(int(i) for i, t in added().items() if getattr(t, "special", False))
