"""Tokenizers: characters, and BPE / word-level vocabularies trained locally.

Every tokenizer maps text to a list of integer ids and back, knows its special ids (``pad_id``,
``bos_id``, ``eos_id``, ``unk_id``; ``None`` when it has none) and serialises to one JSON file,
so that a checkpoint directory can carry it (``tokenizer.json``). :func:`load_tokenizer` reads
either kind back.

* :class:`CharTokenizer` — one id per character (nanoGPT's ``shakespeare_char``), with optional
  special tokens placed first.
* :class:`HFTokenizer` — a Hugging Face ``tokenizers.Tokenizer`` trained here, on the training
  text only (:func:`train_bpe`, :func:`train_word_level`). Nothing is downloaded.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from attnlab._budget import check_bpe_vocab
from attnlab.errors import ArgumentError, ArgumentTypeError

__all__ = [
    "DEFAULT_SPECIALS",
    "CharTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "load_tokenizer",
    "tokenizer_from_json",
    "train_bpe",
    "train_word_level",
]

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
# ids 0..3 in this order whenever a tokenizer has special tokens
DEFAULT_SPECIALS: tuple[str, ...] = (PAD, UNK, BOS, EOS)


@runtime_checkable
class Tokenizer(Protocol):
    """What every attnlab tokenizer provides."""

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        ...

    @property
    def pad_id(self) -> int | None:
        """Id of ``<pad>``, or ``None`` when the vocabulary has none."""
        ...

    @property
    def bos_id(self) -> int | None:
        """Id of ``<bos>``, or ``None`` when the vocabulary has none."""
        ...

    @property
    def eos_id(self) -> int | None:
        """Id of ``<eos>``, or ``None`` when the vocabulary has none."""
        ...

    @property
    def unk_id(self) -> int | None:
        """Id of ``<unk>``, or ``None`` when the vocabulary has none."""
        ...

    def encode(self, text: str) -> list[int]:
        """The ids of a text, without special tokens added.

        Args:
            text: the text.

        Returns:
            Its token ids.
        """
        ...

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """The text of some ids.

        Args:
            ids: token ids.
            skip_special: drop special tokens (default ``True``).

        Returns:
            The text.
        """
        ...

    def id_to_token(self, index: int) -> str:
        """The token of one id.

        Args:
            index: an id in ``[0, vocab_size)``.

        Returns:
            The token's string.
        """
        ...

    def to_json(self) -> str:
        """The tokenizer as JSON text, which :func:`tokenizer_from_json` reads back.

        Returns:
            The JSON text.
        """
        ...

    def save(self, path: str | Path) -> None:
        """Write the tokenizer as one UTF-8 JSON file.

        Args:
            path: the file to write (a ``tokenizer.json``).
        """
        ...


class _SpecialIds:
    """Special-token ids looked up by name, shared by both tokenizers."""

    def token_to_id(self, token: str) -> int | None:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def pad_id(self) -> int | None:
        return self.token_to_id(PAD)

    @property
    def unk_id(self) -> int | None:
        return self.token_to_id(UNK)

    @property
    def bos_id(self) -> int | None:
        return self.token_to_id(BOS)

    @property
    def eos_id(self) -> int | None:
        return self.token_to_id(EOS)

    def save(self, path: str | Path) -> None:
        """Write the tokenizer as one UTF-8 JSON file at ``path``."""
        Path(path).write_text(self.to_json(), encoding="utf-8")  # type: ignore[attr-defined]


class CharTokenizer(_SpecialIds):
    """One id per character.

    Args:
        chars: the alphabet, in id order after the special tokens (no duplicates).
        specials: special tokens given the first ids (e.g. :data:`DEFAULT_SPECIALS`); none by
            default, as in nanoGPT's character-level language model.

    Examples:
        >>> tok = CharTokenizer.train("hello")
        >>> tok.encode("hole"), tok.decode(tok.encode("hole"))
        ([1, 3, 2, 0], 'hole')
    """

    def __init__(self, chars: Sequence[str], specials: Sequence[str] = ()) -> None:
        for c in chars:
            if not isinstance(c, str) or len(c) != 1:
                raise ArgumentError(f"chars must be single characters, got {c!r}")
        if len(set(chars)) != len(chars):
            raise ArgumentError("chars must not repeat a character")
        overlap = set(specials) & set(chars)
        if overlap:
            raise ArgumentError(f"specials must differ from chars, both hold {sorted(overlap)}")
        self.specials = tuple(specials)
        self.chars = tuple(chars)
        self._itos = [*self.specials, *self.chars]
        self._stoi = {s: i for i, s in enumerate(self._itos)}

    @classmethod
    def train(cls, text: str, specials: Sequence[str] = ()) -> CharTokenizer:
        """A tokenizer whose alphabet is the sorted set of characters of ``text``.

        Args:
            text: the training text (at least one character).
            specials: special tokens given the first ids; none by default.

        Returns:
            The new tokenizer.

        Raises:
            ValueError: ``text`` is empty.
        """
        if not text:
            raise ArgumentError("text must hold at least one character to build a vocabulary")
        return cls(sorted(set(text)), specials)

    @property
    def vocab_size(self) -> int:
        """Number of ids: the special tokens, then the characters."""
        return len(self._itos)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token.

        Args:
            token: a special token or a single character.

        Returns:
            Its id, or ``None`` when it is not in the vocabulary.
        """
        return self._stoi.get(token)

    def id_to_token(self, index: int) -> str:
        """The token of id ``index`` (a special token or a character).

        Args:
            index: an id in ``[0, vocab_size)``.

        Returns:
            The token's string.

        Raises:
            TypeError: ``index`` is not an int.
            ValueError: ``index`` is outside ``[0, vocab_size)`` (a negative id is not counted
                from the end).
        """
        if isinstance(index, bool):
            raise ArgumentTypeError("index must be an int, got bool")
        try:
            index = operator.index(index)  # an int, or a numpy or 0-d torch integer
        except TypeError:
            raise ArgumentTypeError(f"index must be an int, got {type(index).__name__}") from None
        if not 0 <= index < len(self._itos):
            raise ArgumentError(f"index must be in [0, {len(self._itos)}), got {index}")
        return self._itos[index]

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of ``text``.

        Args:
            text: the text; a character outside the alphabet becomes ``<unk>`` when there is one.

        Returns:
            One id per character.

        Raises:
            ValueError: a character is outside the alphabet and there is no ``<unk>``.
        """
        unk = self.unk_id
        ids = [self._stoi.get(c, -1) for c in text]
        if -1 in ids:
            if unk is None:
                missing = sorted({c for c in text if c not in self._stoi})
                raise ArgumentError(
                    f"text holds characters outside the vocabulary: "
                    f"{''.join(missing)!r} ({len(missing)} distinct)"
                )
            ids = [unk if i == -1 else i for i in ids]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """The text of some ids.

        Args:
            ids: token ids.
            skip_special: drop special tokens (default ``True``); ``False`` writes them out.

        Returns:
            The characters of the ids, joined.
        """
        n_special = len(self.specials)
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self._itos):
                raise ArgumentError(f"ids must be in [0, {len(self._itos)}), got {i}")
            if skip_special and i < n_special:
                continue
            out.append(self._itos[i])
        return "".join(out)

    def to_json(self) -> str:
        """The tokenizer as JSON text, which :func:`tokenizer_from_json` reads back.

        Returns:
            ``{"kind": "char", "specials": [...], "chars": [...]}`` as text.
        """
        return json.dumps(
            {"kind": "char", "specials": list(self.specials), "chars": list(self.chars)},
            ensure_ascii=False,
        )


class HFTokenizer(_SpecialIds):
    """A Hugging Face ``tokenizers.Tokenizer`` behind attnlab's tokenizer interface.

    Args:
        tokenizer: a trained ``tokenizers.Tokenizer``.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        """Number of ids, added (special) tokens included."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def token_to_id(self, token: str) -> int | None:
        """The id of a token.

        Args:
            token: a token of the vocabulary.

        Returns:
            Its id, or ``None`` when it is not in the vocabulary.
        """
        return self.tokenizer.token_to_id(token)

    def id_to_token(self, index: int) -> str:
        """The token of one id.

        Args:
            index: an id in ``[0, vocab_size)``.

        Returns:
            The token's string.

        Raises:
            ValueError: ``index`` is outside the vocabulary.
        """
        token = self.tokenizer.id_to_token(int(index))
        if token is None:
            raise ArgumentError(f"index must be in [0, {self.vocab_size}), got {index}")
        return str(token)

    def token_label(self, index: int) -> str:
        """How figures and tables show one token: its text as the tokenizer decodes it alone
        (a byte-level BPE's ``Ġcat`` is `` cat``, a line break ``\\n``), or the token itself
        when that is no whole character (part of a UTF-8 sequence) or empty.

        Args:
            index: an id in ``[0, vocab_size)``.

        Returns:
            The label.
        """
        token = self.id_to_token(index)
        text = str(self.tokenizer.decode([int(index)], skip_special_tokens=False))
        if not text or "\ufffd" in text:
            return token
        return text.replace("\n", "\\n").replace("\t", "\\t")  # line breaks stay visible

    def encode(self, text: str) -> list[int]:
        """The ids of a text, without special tokens added.

        Args:
            text: the text.

        Returns:
            Its token ids.
        """
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """The text of some ids.

        Args:
            ids: token ids.
            skip_special: drop special tokens (default ``True``).

        Returns:
            The text, as the Hugging Face tokenizer decodes it.
        """
        return str(self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special))

    def to_json(self) -> str:
        """The tokenizer as JSON text, which :func:`tokenizer_from_json` reads back.

        Returns:
            The Hugging Face tokenizer's own ``tokenizer.json`` text.
        """
        return str(self.tokenizer.to_str())


def _hf() -> Any:
    try:
        import tokenizers
    except ModuleNotFoundError as exc:  # pragma: no cover - a dev dependency
        raise ModuleNotFoundError(
            "BPE and word-level tokenizers need Hugging Face tokenizers: pip install tokenizers"
        ) from exc
    return tokenizers


def _check_training_args(vocab_size: int, min_frequency: int) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 0:
        raise ArgumentError(f"vocab_size must be a positive int, got {vocab_size!r}")
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 1:
        raise ArgumentError(f"min_frequency must be an int >= 1, got {min_frequency!r}")


def train_bpe(
    texts: Iterable[str],
    vocab_size: int,
    *,
    min_frequency: int = 2,
    specials: Sequence[str] = DEFAULT_SPECIALS,
    byte_level: bool = False,
) -> HFTokenizer:
    """Train a byte-pair-encoding vocabulary (Sennrich et al. 2016) on ``texts``.

    Args:
        texts: the training text (lines or documents).
        vocab_size: the vocabulary size to reach, special tokens included.
        min_frequency: a merge must occur at least this often.
        specials: special tokens, given the first ids.
        byte_level: GPT-2 style bytes (never an unknown token, exact round trip of any text);
            otherwise characters with ``▁`` marking word starts (SentencePiece's Metaspace).

    Returns:
        The trained tokenizer.

    Raises:
        ValueError: ``vocab_size`` or ``min_frequency`` out of range, or a vocabulary whose
            reservation exceeds the machine's memory (:func:`attnlab._budget.check_bpe_vocab`).
    """
    _check_training_args(vocab_size, min_frequency)
    # the trainer reserves the whole vocabulary up front, and aborts the process when it cannot
    check_bpe_vocab("vocab_size", vocab_size)
    tk = _hf()
    if byte_level:
        tok = tk.Tokenizer(tk.models.BPE())
        tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = tk.decoders.ByteLevel()
        alphabet = tk.pre_tokenizers.ByteLevel.alphabet()
    else:
        tok = tk.Tokenizer(tk.models.BPE(unk_token=UNK if UNK in specials else None))
        tok.pre_tokenizer = tk.pre_tokenizers.Metaspace()
        tok.decoder = tk.decoders.Metaspace()
        alphabet = []
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(specials),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return HFTokenizer(tok)


def train_word_level(
    texts: Iterable[str],
    vocab_size: int,
    *,
    min_frequency: int = 1,
    specials: Sequence[str] = DEFAULT_SPECIALS,
) -> HFTokenizer:
    """Train a whitespace word vocabulary: the ``vocab_size`` most frequent words, rest ``<unk>``.

    Args:
        texts: the training text, words separated by whitespace.
        vocab_size: the vocabulary size, special tokens included.
        min_frequency: a word must occur at least this often.
        specials: special tokens, given the first ids (must include ``<unk>``).

    Returns:
        The trained tokenizer; ``decode`` joins words with one space.
    """
    _check_training_args(vocab_size, min_frequency)
    if UNK not in specials:
        raise ArgumentError(f"specials must include {UNK!r} for a word-level vocabulary")
    tk = _hf()
    tok = tk.Tokenizer(tk.models.WordLevel(unk_token=UNK))
    tok.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
    trainer = tk.trainers.WordLevelTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(specials),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return HFTokenizer(tok)


def tokenizer_from_json(text: str) -> CharTokenizer | HFTokenizer:
    """Rebuild a tokenizer from :meth:`to_json` output (either kind).

    Args:
        text: the JSON text.

    Returns:
        A :class:`CharTokenizer` for ``"kind": "char"``, else an :class:`HFTokenizer`.

    Raises:
        ValueError: the text is not JSON, or neither kind of tokenizer.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ArgumentError(f"tokenizer JSON is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ArgumentError(f"tokenizer JSON must be an object, got {type(data).__name__}")
    if data.get("kind") == "char":
        return CharTokenizer(
            _strings(data, "chars", single=True), _strings(data, "specials", default=[])
        )
    if "model" in data:
        try:
            return HFTokenizer(_hf().Tokenizer.from_str(text))
        except Exception as exc:  # tokenizers raises its own Exception type
            raise ArgumentError(f"tokenizer JSON is not a valid tokenizers file: {exc}") from exc
    raise ArgumentError("tokenizer JSON has neither kind='char' nor a tokenizers 'model'")


def _strings(
    data: dict[str, Any], key: str, *, single: bool = False, default: Any = None
) -> list[str]:
    """``data[key]`` of a character tokenizer's JSON, checked to be a list of strings."""
    value = data.get(key, default)
    what = "single characters" if single else "strings"
    if value is None:
        raise ArgumentError(f"tokenizer JSON of kind 'char' must hold {key!r}, a list of {what}")
    if not isinstance(value, list):
        raise ArgumentError(
            f"tokenizer JSON's {key!r} must be a list of {what}, got {type(value).__name__}"
        )
    for item in value:
        if not isinstance(item, str) or (single and len(item) != 1):
            raise ArgumentError(
                f"tokenizer JSON's {key!r} must be a list of {what}, holds {item!r}"
            )
    return value


def load_tokenizer(path: str | Path) -> CharTokenizer | HFTokenizer:
    """Read a tokenizer file written by ``save`` (a ``tokenizer.json``).

    Args:
        path: the file.

    Returns:
        The tokenizer, of the kind the file records.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not UTF-8 or not a tokenizer's JSON.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ArgumentError(f"tokenizer file is not UTF-8 text: {path}") from exc
    try:
        return tokenizer_from_json(text)
    except ValueError as exc:
        raise ArgumentError(f"{path}: {exc}") from exc
