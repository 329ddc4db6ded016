"""Algorithmic sequence-to-sequence tasks: copy, reverse and sort.

A source is a random string over a small alphabet (``a``, ``b``, ``c``…) of a random length in
``[min_len, max_len]``; the target is the same string (copy), reversed (reverse) or sorted
(sort). A model that solves these must learn to attend to the right source position, which makes
them the standard first check of an encoder-decoder (The Annotated Transformer, §"A First
Example").

The held-out split is decided by a hash of the source string: a string is held out when
``crc32(string) mod heldout_modulus == 0``. Training batches skip held-out strings, so no
evaluation sequence is ever trained on, whatever the seed or the number of steps.
"""

from __future__ import annotations

import string
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnlab.data.batching import Seq2SeqBatch, make_seq2seq_batch
from attnlab.data.text import step_generator
from attnlab.data.tokenizers import DEFAULT_SPECIALS, CharTokenizer
from attnlab.errors import ArgumentError

__all__ = ["TASK_NAMES", "SequenceTask", "SequenceTaskConfig", "task_target"]

TASK_NAMES = ("copy", "reverse", "sort")
_ALPHABET = string.ascii_lowercase + string.ascii_uppercase + string.digits

_TRAIN_STREAM, _HELDOUT_STREAM = 10, 11


def task_target(name: str, src: Sequence[int]) -> list[int]:
    """The correct output for ``src``: itself, reversed, or sorted.

    Args:
        name: ``"copy"``, ``"reverse"`` or ``"sort"``.
        src: the source token ids.

    Returns:
        The target token ids.
    """
    if name == "copy":
        return list(src)
    if name == "reverse":
        return list(reversed(src))
    if name == "sort":
        return sorted(src)
    raise ArgumentError(f"name must be one of {', '.join(TASK_NAMES)}, got {name!r}")


@dataclass(frozen=True)
class SequenceTaskConfig:
    """What strings a task draws.

    Args:
        name: ``"copy"``, ``"reverse"`` or ``"sort"``.
        num_symbols: alphabet size (2 … 62): ``a``–``z``, ``A``–``Z``, ``0``–``9``.
        min_len: shortest source string (>= 1).
        max_len: longest source string.
        heldout_modulus: one string in about this many is held out (>= 2).
        num_heldout: size of the held-out evaluation set.
    """

    name: str = "reverse"
    num_symbols: int = 10
    min_len: int = 1
    max_len: int = 16
    heldout_modulus: int = 10
    num_heldout: int = 500

    def __post_init__(self) -> None:
        if self.name not in TASK_NAMES:
            raise ArgumentError(f"name must be one of {', '.join(TASK_NAMES)}, got {self.name!r}")
        if not 2 <= self.num_symbols <= len(_ALPHABET):
            raise ArgumentError(
                f"num_symbols must be in [2, {len(_ALPHABET)}], got {self.num_symbols}"
            )
        if self.min_len < 1:
            raise ArgumentError(f"min_len must be >= 1, got {self.min_len}")
        if self.max_len < self.min_len:
            raise ArgumentError(f"max_len must be >= min_len ({self.min_len}), got {self.max_len}")
        if self.heldout_modulus < 2:
            raise ArgumentError(f"heldout_modulus must be >= 2, got {self.heldout_modulus}")
        if self.num_heldout < 1:
            raise ArgumentError(f"num_heldout must be >= 1, got {self.num_heldout}")
        space = sum(self.num_symbols**n for n in range(self.min_len, self.max_len + 1))
        if space < 4 * self.heldout_modulus * self.num_heldout:
            raise ArgumentError(
                f"num_heldout must leave most strings for training: {space} distinct strings, "
                f"about {space // self.heldout_modulus} held out, got num_heldout={self.num_heldout}"
            )


class SequenceTask:
    """Batches and a held-out set for one algorithmic task.

    Args:
        config: the task.
        seed: the data seed; ``batch(step)`` depends only on ``(seed, step)``.

    Attributes:
        tokenizer: a :class:`CharTokenizer` with ``<pad> <unk> <bos> <eos>`` then the alphabet,
            so ``tokenizer.decode`` shows sequences as strings like ``"cabd"``.

    Examples:
        >>> task = SequenceTask(SequenceTaskConfig("reverse", min_len=3, max_len=3), seed=0)
        >>> b = task.batch(0, batch_size=2)
        >>> b.src.shape, b.tgt_in.shape
        (torch.Size([2, 4]), torch.Size([2, 4]))
    """

    def __init__(self, config: SequenceTaskConfig, seed: int = 0) -> None:
        self.config = config
        self.seed = seed
        self.tokenizer = CharTokenizer(list(_ALPHABET[: config.num_symbols]), DEFAULT_SPECIALS)
        self.first_symbol = len(DEFAULT_SPECIALS)
        self._heldout: list[list[int]] | None = None

    @property
    def max_target_len(self) -> int:
        """Longest decoder sequence: the target plus ``<eos>``."""
        return self.config.max_len + 1

    def is_heldout(self, src: Sequence[int]) -> bool:
        """Whether a string belongs to the held-out split (a hash of its ids, whatever the seed).

        Args:
            src: the string's token ids.

        Returns:
            ``True`` for a held-out string, never drawn for training.
        """
        return zlib.crc32(bytes(int(t) for t in src)) % self.config.heldout_modulus == 0

    def target(self, src: Sequence[int]) -> list[int]:
        """The correct output for a string.

        Args:
            src: the string's token ids.

        Returns:
            The target ids: ``src`` copied, reversed or sorted, as the task says.
        """
        return task_target(self.config.name, src)

    def _draw(
        self, n: int, gen: torch.Generator, heldout: bool, distinct: bool = False
    ) -> list[list[int]]:
        cfg = self.config
        out: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        while len(out) < n:
            remaining = n - len(out)
            want = 2 * remaining * (cfg.heldout_modulus if heldout else 1)
            lengths = torch.randint(cfg.min_len, cfg.max_len + 1, (want,), generator=gen)
            symbols = torch.randint(cfg.num_symbols, (want, cfg.max_len), generator=gen)
            symbols += self.first_symbol
            for length, row in zip(lengths.tolist(), symbols.tolist()):
                seq = row[:length]
                if distinct:
                    if tuple(seq) in seen:
                        continue
                    seen.add(tuple(seq))
                if self.is_heldout(seq) == heldout:
                    out.append(seq)
                    if len(out) == n:
                        break
        return out

    def batch(self, step: int, batch_size: int) -> Seq2SeqBatch:
        """The training batch of optimizer step ``step``; never holds a held-out string.

        Args:
            step: the optimizer step, counted from 0; the batch depends on ``(seed, step)`` only.
            batch_size: strings per batch ``B``.

        Returns:
            The teacher-forcing batch.

        Shape:
            ``src (B, S)``, ``tgt_in``/``targets`` ``(B, T)``, ``S, T <= max_len + 1`` (``<eos>``
            ends the source, ``<bos>`` starts the decoder input and ``<eos>`` ends the targets).
        """
        src = self._draw(batch_size, step_generator(self.seed, step, _TRAIN_STREAM), False)
        return self.make_batch(src)

    def model_input(self, src: Sequence[int]) -> list[int]:
        """What the encoder reads: the string then ``<eos>``.

        The end marker gives every position a landmark to measure its distance from the end,
        which reversing needs (output ``i`` copies input ``n - 1 - i``).

        Args:
            src: the string's token ids.

        Returns:
            ``src`` followed by ``<eos>``.
        """
        return [*src, self.tokenizer.eos_id]  # type: ignore[list-item]

    def make_batch(self, src: Sequence[Sequence[int]]) -> Seq2SeqBatch:
        """A teacher-forcing batch for the given strings and their correct targets.

        Args:
            src: the strings' token ids (without ``<eos>``; :meth:`model_input` adds it).

        Returns:
            The batch, sources and targets padded.
        """
        tok = self.tokenizer
        return make_seq2seq_batch(
            [self.model_input(s) for s in src],
            [self.target(s) for s in src],
            pad_id=tok.pad_id,  # type: ignore[arg-type]
            bos_id=tok.bos_id,  # type: ignore[arg-type]
            eos_id=tok.eos_id,  # type: ignore[arg-type]
        )

    def heldout(self) -> list[list[int]]:
        """The held-out sources, drawn once and kept.

        Returns:
            ``config.num_heldout`` distinct strings (token ids), the same for a seed.
        """
        if self._heldout is None:
            gen = step_generator(self.seed, 0, _HELDOUT_STREAM)
            self._heldout = self._draw(self.config.num_heldout, gen, True, distinct=True)
        return self._heldout
