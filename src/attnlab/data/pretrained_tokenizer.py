"""Pretrained tokenizers with their special tokens and chat template, from GGUF or a folder.

Two sources give the same :class:`PretrainedTokenizer`:

- a GGUF file's metadata (:func:`tokenizer_from_gguf`): llama.cpp stores a byte-level BPE
  (``tokenizer.ggml.model == "gpt2"``) as its token list, its merges, a type per token
  (1 normal, 3 control, 4 user-defined), the special ids and the chat template. The
  ``tokenizer.tokenizers.Tokenizer`` is rebuilt exactly as ``transformers`` rebuilds it
  (``AutoTokenizer.from_pretrained(folder, gguf_file=...)``), so the ids are the same; a
  SentencePiece BPE (``"llama"``) likewise, from its pieces and their scores;
- a Hugging Face folder (:func:`tokenizer_from_folder`): ``tokenizer.json`` as it is, the chat
  template and the special tokens from ``tokenizer_config.json`` (or ``chat_template.jinja``).

The chat template is rendered as ``transformers`` renders it: a sandboxed jinja2 environment
with ``trim_blocks`` and ``lstrip_blocks``, ``raise_exception``, a ``tojson`` that keeps
non-ASCII text, and the special tokens as variables (``bos_token``, ``eos_token``, …).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab._checks import json_bool, read_small_json, read_small_text
from attnlab.data.chat_template import render_chat_template
from attnlab.data.gguf_metadata import GGUFMetadata
from attnlab.data.tokenizers import HFTokenizer, _hf
from attnlab.errors import ArgumentError

__all__ = ["PretrainedTokenizer", "tokenizer_from_folder", "tokenizer_from_gguf"]

log = logging.getLogger(__name__)

#: the largest ``tokenizer.json`` read (a vocabulary of a few hundred thousand tokens and their
#: merges takes tens of megabytes)
TOKENIZER_FILE_BYTES = 512 * 2**20

# llama.cpp's token types (llama_token_type): the ones that become added tokens
_CONTROL, _USER_DEFINED = 3, 4

# The pre-tokenizer splits of the `tokenizer.ggml.pre` names whose merges were learnt on
# another split than GPT-2's (llama.cpp's llama-vocab.cpp). Any other name — "default",
# "gpt2", "smollm", … — gets GPT-2's byte-level split, as in transformers. (llama.cpp splits
# "smollm" digits one by one first; SmolLM's vocabulary holds no token of two digits or of a
# space and a digit, so the ids are the same.)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS: dict[str, str] = {
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"), _LLAMA3_SPLIT
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
}
_GPT2_SPLIT_NAMES = ("default", "gpt2", "smollm")


class PretrainedTokenizer(HFTokenizer):
    """A pretrained ``tokenizers.Tokenizer`` with its special ids and chat template.

    Args:
        tokenizer: the ``tokenizers.Tokenizer``.
        bos_id: the beginning-of-sequence id, or ``None``.
        eos_id: the end-of-sequence id, or ``None``.
        pad_id: the padding id, or ``None``.
        unk_id: the unknown-token id, or ``None``.
        chat_template: the jinja2 chat template, or ``None``.
        add_bos: whether the model expects ``bos_id`` before a text (``encode`` never adds it).
        chat_template_source: where the template comes from (a file, a GGUF key), for the
            messages of a template that fails.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        unk_id: int | None = None,
        chat_template: str | None = None,
        add_bos: bool = False,
        chat_template_source: str | None = None,
    ) -> None:
        super().__init__(tokenizer)
        size = self.vocab_size
        for arg, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
            if value is not None and not 0 <= int(value) < size:
                raise ArgumentError(f"{arg} must be in [0, {size}), got {value}")
        if unk_id is not None and not 0 <= int(unk_id) < size:
            raise ArgumentError(f"unk_id must be in [0, {size}), got {unk_id}")
        self._bos, self._eos, self._pad, self._unk = bos_id, eos_id, pad_id, unk_id
        self.chat_template = chat_template
        self.chat_template_source = chat_template_source or "the tokenizer's chat template"
        self.add_bos = bool(add_bos)

    # the special ids are the pretrained ones, not looked up by attnlab's own names
    @property
    def bos_id(self) -> int | None:  # type: ignore[override]
        """The beginning-of-sequence id, or ``None``."""
        return self._bos

    @property
    def eos_id(self) -> int | None:  # type: ignore[override]
        """The end-of-sequence id, or ``None``."""
        return self._eos

    @property
    def pad_id(self) -> int | None:  # type: ignore[override]
        """The padding id, or ``None``."""
        return self._pad

    @property
    def unk_id(self) -> int | None:  # type: ignore[override]
        """The unknown-token id, or ``None``."""
        return self._unk

    def special_tokens(self) -> dict[str, str]:
        """The special tokens as text, by their chat-template names.

        Returns:
            ``{"bos_token": ..., "eos_token": ..., "pad_token": ..., "unk_token": ...}`` for the
            ids that are set.
        """
        names = {"bos_token": self._bos, "eos_token": self._eos}
        names.update(pad_token=self._pad, unk_token=self._unk)
        return {name: self.id_to_token(i) for name, i in names.items() if i is not None}

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
    ) -> str:
        """A conversation written out as the model's prompt, by its chat template.

        Args:
            messages: the conversation, ``[{"role": "user", "content": "..."}, ...]``.
            add_generation_prompt: end with the opening of the assistant's turn (default).

        Returns:
            The prompt text (encode it with :meth:`encode`; it holds its own special tokens).

        Raises:
            ArgumentError: the tokenizer has no chat template, a message is not a mapping, or
                the template refuses the conversation (its ``raise_exception``) or fails in any
                other way (a template is untrusted input: it runs sandboxed, with ``range`` and
                repetitions bounded and its output at most
                :data:`~attnlab.data.chat_template.MAX_CHAT_PROMPT_CHARS`); the
                message names the template's source.
        """
        if self.chat_template is None:
            raise ArgumentError("this tokenizer has no chat template (the model ships none)")
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping):
                raise ArgumentError(
                    f"messages[{i}] must be a mapping with 'role' and 'content', "
                    f"got {type(message).__name__}"
                )
        return render_chat_template(
            self.chat_template,
            self.chat_template_source,
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            tools=None,
            documents=None,
            **self.special_tokens(),
        )


# ----------------------------------------------------------------------------------------------
# from GGUF metadata
# ----------------------------------------------------------------------------------------------


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of the 256 bytes (``bytes_to_unicode``): byte → character.

    The printable bytes ``!..~``, ``¡..¬`` and ``®..ÿ`` stand for themselves; the other 68
    bytes, in order, become the characters ``U+0100``, ``U+0101``, … (space is ``Ġ``).
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    spelling = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


def _spelled(token: str, spelling: dict[int, str]) -> str:
    """A token's UTF-8 bytes in GPT-2's byte alphabet."""
    return "".join(spelling[b] for b in token.encode("utf-8"))


def _merges_from_scores(tokens: list[str], vocab: dict[str, int], meta: GGUFMetadata) -> list[str]:
    """The merges a SentencePiece vocabulary implies, as ``transformers`` derives them
    (``generate_merges``): every split of a token into two tokens, ranked by the token's score
    (``tokenizer.ggml.scores``), best first; ties by the pieces' lengths, then by their ids.

    Returns:
        The merges, ``"left right"``.
    """
    scores = meta.array("tokenizer.ggml.scores", "number", None)
    if scores is None or len(scores) != len(tokens):
        got = "none" if scores is None else len(scores)
        raise ArgumentError(
            f"GGUF key 'tokenizer.ggml.scores' must hold one score per token ({len(tokens)}) "
            f"when the file holds no tokenizer.ggml.merges, got {got}"
        )
    ranked: list[tuple[str, str, float]] = []
    for token, score in dict(zip(tokens, scores)).items():  # a repeated token: its last score
        pairs = [(token[:i], token[i:]) for i in range(1, len(token))]
        pairs = sorted(
            (p for p in pairs if p[0] in vocab and p[1] in vocab),
            key=lambda p: (vocab[p[0]], vocab[p[1]]),
        )
        ranked += [(left, right, score) for left, right in pairs]
    ranked.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [f"{left} {right}" for left, right, _ in ranked]


def _sentencepiece_parts(backend: Any, prefix_space: bool) -> None:
    """A SentencePiece BPE's text handling, as ``transformers``' ``LlamaTokenizer`` sets it: no
    normaliser; spaces become ``▁`` and one is put before the text (``Metaspace``, the first
    piece only) unless ``tokenizer.ggml.add_space_prefix`` is false; decoding turns ``▁`` back
    into spaces, joins the bytes of ``<0x..>`` pieces and drops the space put first."""
    tk = _hf()
    scheme = "first" if prefix_space else "never"
    backend.normalizer = None
    backend.pre_tokenizer = tk.pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme=scheme, split=False
    )
    steps = [tk.decoders.Replace("\u2581", " "), tk.decoders.ByteFallback(), tk.decoders.Fuse()]
    if prefix_space:
        steps.append(tk.decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = tk.decoders.Sequence(steps)


def tokenizer_from_gguf(
    metadata: Mapping[str, Any], *, source: str | None = None
) -> PretrainedTokenizer:
    """The tokenizer a GGUF file's metadata describes: byte-level BPE (``"gpt2"``) or
    SentencePiece BPE (``"llama"``: its pieces, and its merges stored or implied by
    ``tokenizer.ggml.scores``, built with the ``tokenizers`` library as ``transformers``
    builds them).

    Args:
        metadata: the file's key/value metadata as Python values (``tokenizer.ggml.tokens`` a
            list of strings, …), e.g. ``{k: f.contents() for k, f in reader.fields.items()}``;
            :func:`attnlab.models.gguf.read_gguf` passes it.
        source: the file the metadata comes from, to name in the messages of its chat template.

    Returns:
        The tokenizer, with the file's special ids, ``add_bos`` and chat template.

    Raises:
        ArgumentError: the metadata holds no tokenizer, or one of another kind than byte-level
            or SentencePiece BPE (``"bert"``, ``"t5"``, …), a SentencePiece file without merges
            and without one score per token, or merges the ``tokenizers`` library refuses.
        ArgumentTypeError: a key of the wrong type (a ``bos_token_id`` that is a string, …).
    """
    meta = GGUFMetadata(metadata)
    model = meta.string("tokenizer.ggml.model", None)
    if model is None or "tokenizer.ggml.tokens" not in meta:
        raise ArgumentError("the GGUF metadata holds no tokenizer (no tokenizer.ggml.model/tokens)")
    if model not in ("gpt2", "llama"):
        raise ArgumentError(
            f"tokenizer.ggml.model is {model!r}; attnlab reads byte-level BPE ('gpt2') and "
            "SentencePiece BPE ('llama') tokenizers"
        )
    if model == "gpt2" and "tokenizer.ggml.merges" not in meta:
        raise ArgumentError("the GGUF tokenizer is BPE but holds no tokenizer.ggml.merges")
    tk = _hf()
    tokens = meta.array("tokenizer.ggml.tokens", "string")
    types = meta.array("tokenizer.ggml.token_type", "integer", [])
    if types and len(types) != len(tokens):
        raise ArgumentError(
            f"GGUF key 'tokenizer.ggml.token_type' must hold one type per token "
            f"({len(tokens)}), got {len(types)}"
        )
    spelling = _byte_alphabet()
    # SentencePiece spells its pieces as text ("▁" for a space, "<0x0A>" for a byte it falls
    # back to): every token as it is; byte-level BPE's are in the byte alphabet, and a token
    # outside it (a file that stores raw text) is spelled in bytes
    alphabet = set(spelling.values()) if model == "gpt2" else None
    vocab = {
        t if alphabet is None or set(t) <= alphabet else _spelled(t, spelling): i
        for i, t in enumerate(tokens)
    }
    if len(vocab) != len(tokens):  # one text, two ids: the tokenizers library panics on it
        seen: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if seen.setdefault(t, i) != i:
                raise ArgumentError(
                    f"GGUF key 'tokenizer.ggml.tokens' holds the token {t!r} twice "
                    f"(ids {seen[t]} and {i})"
                )
        raise ArgumentError(
            "GGUF key 'tokenizer.ggml.tokens' holds two tokens that spell the same bytes"
        )
    merges = []
    stored = meta.array("tokenizer.ggml.merges", "string", None)
    if stored is None:  # SentencePiece files: the merges the scores imply
        stored = _merges_from_scores(tokens, vocab, meta)
    for i, merge in enumerate(stored):
        left, space, right = merge.partition(" ")
        if not (left and space and right):
            raise ArgumentError(
                f"GGUF key 'tokenizer.ggml.merges' must hold pairs 'left right', got {merge!r} "
                f"(merge {i})"
            )
        merges.append((left, right))
    # SentencePiece: unknown text falls back to its bytes (<0x..>), as LlamaTokenizer's BPE
    options = {"fuse_unk": True, "byte_fallback": True} if alphabet is None else {}
    try:
        backend = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=merges, **options))
    except BaseException as exc:  # tokenizers raises Exception, or a PanicException
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise  # KeyboardInterrupt, SystemExit
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ArgumentError(
            f"GGUF key 'tokenizer.ggml.merges' is refused by the tokenizers library: {reason}"
        ) from None
    pre = meta.string("tokenizer.ggml.pre", "default")
    split = PRE_TOKENIZER_SPLITS.get(pre)
    if alphabet is None:
        _sentencepiece_parts(backend, meta.flag("tokenizer.ggml.add_space_prefix", True))
    elif split is None:
        if pre not in _GPT2_SPLIT_NAMES:
            log.warning("GGUF pre-tokenizer %r is not known; using GPT-2's split", pre)
        backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        backend.pre_tokenizer = tk.pre_tokenizers.Sequence(
            [
                tk.pre_tokenizers.Split(tk.Regex(split), behavior="isolated"),
                tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if alphabet is not None:
        backend.decoder = tk.decoders.ByteLevel()
    # control tokens (<|im_start|>, …) are matched whole and are special; user-defined ones
    # (<think>, …) are matched whole and are text. A "control" token spelled outside the byte
    # alphabet is a mislabel of llama.cpp's and stays a plain token (as in transformers).
    control = [
        tk.AddedToken(t, normalized=False, special=True)
        for t, kind in zip(tokens, types)
        if kind == _CONTROL and (alphabet is None or set(t) <= alphabet)
    ]
    if control:
        backend.add_special_tokens(control)
    user = [
        tk.AddedToken(t, normalized=False, special=False)
        for t, kind in zip(tokens, types)
        if kind == _USER_DEFINED and t in vocab
    ]
    if user:
        backend.add_tokens(user)

    def special(key: str) -> int | None:
        return meta.integer(f"tokenizer.ggml.{key}", None, low=0, high=len(tokens) - 1)

    where = f"{source}'s " if source else "the GGUF key "
    return PretrainedTokenizer(
        backend,
        bos_id=special("bos_token_id"),
        eos_id=special("eos_token_id"),
        pad_id=special("padding_token_id"),
        unk_id=special("unknown_token_id"),
        chat_template=meta.string("tokenizer.chat_template", None),
        # llama.cpp adds BOS to a SentencePiece vocabulary whose file does not say otherwise
        add_bos=meta.flag("tokenizer.ggml.add_bos_token", model == "llama"),
        chat_template_source=f"{where}chat template (tokenizer.chat_template)",
    )


# ----------------------------------------------------------------------------------------------
# from a Hugging Face folder
# ----------------------------------------------------------------------------------------------


def _token_text(value: Any) -> str | None:
    """A special token of ``tokenizer_config.json``: a string or ``{"content": ...}``."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _folder_template(folder: Path, config: Mapping[str, Any]) -> tuple[str | None, str]:
    """The chat template: ``chat_template.jinja``, else ``tokenizer_config.json``'s; and
    where it comes from, for the messages of a template that fails."""
    jinja_file = folder / "chat_template.jinja"
    if os.path.lexists(jinja_file):  # a FIFO, a device or a huge file: one line (read_small_text)
        return read_small_text(jinja_file), str(jinja_file)
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}]
        named = {
            t.get("name"): t.get("template")
            for t in template
            if isinstance(t, Mapping) and isinstance(t.get("name"), str)
        }
        template = named.get("default")
    source = f"{folder / 'tokenizer_config.json'}'s chat_template"
    return (template if isinstance(template, str) else None), source


def tokenizer_from_folder(path: str | Path) -> PretrainedTokenizer:
    """The tokenizer of a Hugging Face model folder (``tokenizer.json``, ``tokenizer_config.json``).

    Args:
        path: the folder.

    Returns:
        The tokenizer; its special ids are those of ``tokenizer_config.json``'s ``bos_token``,
        ``eos_token``, ``pad_token`` and ``unk_token``, its chat template that file's
        ``chat_template`` (or ``chat_template.jinja`` beside it).

    Raises:
        FileNotFoundError: no ``tokenizer.json`` in the folder.
        ArgumentError: a file that is not valid JSON or not a tokenizer, or a special token
            that is not in the vocabulary.
    """
    folder = Path(path)
    tokenizer_file = folder / "tokenizer.json"
    if not os.path.lexists(tokenizer_file):
        raise FileNotFoundError(f"no tokenizer.json in {folder}")
    vocabulary = read_small_text(tokenizer_file, TOKENIZER_FILE_BYTES)
    try:
        backend = _hf().Tokenizer.from_str(vocabulary)
    except Exception as exc:  # tokenizers raises its own Exception type
        raise ArgumentError(f"{tokenizer_file}: not a valid tokenizers file: {exc}") from exc
    config: dict[str, Any] = {}
    config_file = folder / "tokenizer_config.json"
    if os.path.lexists(config_file):
        config = read_small_json(config_file)
    ids: dict[str, int | None] = {}
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        text = _token_text(config.get(name))
        token_id = None if text is None else backend.token_to_id(text)
        if text is not None and token_id is None:
            raise ArgumentError(f"{config_file}: {name} {text!r} is not in the vocabulary")
        ids[name] = token_id
    template, source = _folder_template(folder, config)
    return PretrainedTokenizer(
        backend,
        bos_id=ids["bos_token"],
        eos_id=ids["eos_token"],
        pad_id=ids["pad_token"],
        unk_id=ids["unk_token"],
        chat_template=template,
        add_bos=json_bool(config, "add_bos_token", False, where=str(config_file)),
        chat_template_source=source,
    )
