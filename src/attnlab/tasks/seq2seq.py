"""The encoder-decoder tasks' shared parts: decoding, scoring, the Noam optimizer, the loss, and
:class:`Seq2SeqIO` — the one path between text and an encoder-decoder's inputs."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from attnlab.data.batching import Seq2SeqBatch, pad_batch
from attnlab.decoding.generate import generate
from attnlab.errors import ArgumentError, ArgumentTypeError, AttnlabError, UntrainedLengthWarning
from attnlab.models.config import TransformerConfig
from attnlab.tasks.base import ModelInputs, check_finite_weights, token_labels
from attnlab.tasks.train_options import attention_options, warmup_steps
from attnlab.training.losses import TokenLoss, token_loss
from attnlab.training.schedules import NoamLR, noam_rate

__all__ = [
    "Seq2SeqIO",
    "Translation",
    "cooldown_factor",
    "decode_sources",
    "exact_match_accuracy",
    "noam_adam",
    "noam_adam_from_args",
    "seq2seq_loss",
    "strip_special",
    "transformer_config",
]


def strip_special(ids: Sequence[int], *, bos_id: int, eos_id: int, pad_id: int) -> list[int]:
    """The tokens of a decoded row: ``<bos>`` dropped, cut at the first ``<eos>``, no padding.

    Args:
        ids: one decoded row.
        bos_id: the begin-of-sequence id.
        eos_id: the end-of-sequence id.
        pad_id: the padding id.

    Returns:
        The output tokens.
    """
    out = []
    for i, t in enumerate(int(x) for x in ids):
        if (i == 0 and t == bos_id) or t == pad_id:  # the start first: BART's is </s>
            continue
        if t == eos_id:
            break
        out.append(t)
    return out


def _trim(row: Sequence[int], eos_id: int, pad_id: int) -> list[int]:
    """A decoded row up to and including its first ``<eos>`` after the start, without the
    padding after it; its first token, the decoder's start, kept even where that is ``pad_id``
    (Marian's) or ``eos_id`` (BART's)."""
    out = [int(row[0])] if len(row) else []
    for t in (int(x) for x in row[1:]):
        if t == eos_id:
            out.append(t)
            break
        if t != pad_id:
            out.append(t)
    return out


@torch.no_grad()
def decode_sources(
    model: nn.Module,
    sources: Sequence[Sequence[int]],
    *,
    max_new_tokens: int | Callable[[int], int],
    strategy: str = "greedy",
    num_beams: int = 4,
    batch_size: int = 256,
    raw: bool = False,
) -> list[list[int]]:
    """Decode every source with :func:`attnlab.generate` (KV cache), in batches.

    Sources with the same step limit are decoded together, so a source's output never depends on
    which other sources share its batch (the limit is a function of the source alone).

    Args:
        model: an encoder-decoder (:class:`attnlab.Transformer`).
        sources: what the encoder reads, one token list per source (special tokens included).
        max_new_tokens: the most target tokens (``<eos>`` included), or a function of a
            source's length giving it.
        strategy: ``"greedy"`` or ``"beam"``.
        num_beams: beams for ``"beam"``.
        batch_size: sources per call.
        raw: return the decoded rows as they are (``<bos>`` first, up to and including the first
            ``<eos>``) instead of the output tokens alone.

    Returns:
        One token list per source, in the order given: the output tokens without special tokens,
        or the raw rows with ``raw=True``.
    """
    cfg: Any = model.config
    device = next(model.parameters()).device
    limit = max_new_tokens if callable(max_new_tokens) else (lambda n: max_new_tokens)
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(sources):
        groups.setdefault(int(limit(len(s))), []).append(i)
    out: list[list[int]] = [[] for _ in sources]
    for steps, members in groups.items():
        for start in range(0, len(members), batch_size):
            chunk = members[start : start + batch_size]
            src = pad_batch([sources[i] for i in chunk], cfg.pad_id).to(device)
            ids = generate(model, src, max_new_tokens=steps, strategy=strategy, num_beams=num_beams)
            for i, row in zip(chunk, ids.tolist()):
                out[i] = (
                    _trim(row, cfg.eos_id, cfg.pad_id)
                    if raw
                    else strip_special(row, bos_id=cfg.bos_id, eos_id=cfg.eos_id, pad_id=cfg.pad_id)
                )
    return out


def transformer_config(
    args: Any, src_tok: Any, tgt_tok: Any, *, max_len: int, share: bool = False
) -> TransformerConfig:
    """The encoder-decoder of a task.

    Args:
        args: the options of ``add_transformer_arguments`` (sizes, dropout, label smoothing) and,
            when the task has them, of ``add_attention_arguments`` (default full attention).
        src_tok: the source tokenizer (vocabulary size).
        tgt_tok: the target tokenizer (vocabulary size and the special ids).
        max_len: the model's positions on each side.
        share: one embedding for both sides and the output layer (needs one vocabulary);
            default ``False``.

    Returns:
        The model's configuration.
    """
    if src_tok.pad_id != tgt_tok.pad_id:
        raise ArgumentError("the source and target tokenizers must share the padding id")
    return TransformerConfig(
        src_vocab_size=src_tok.vocab_size,
        tgt_vocab_size=tgt_tok.vocab_size,
        d_model=args.d_model,
        num_heads=args.heads,
        num_encoder_layers=args.layers,
        num_decoder_layers=args.layers,
        d_ff=args.d_ff,
        dropout=args.dropout,
        label_smoothing=args.label_smoothing,
        share_embeddings=share,
        max_len=max_len,
        pad_id=tgt_tok.pad_id,
        bos_id=tgt_tok.bos_id,
        eos_id=tgt_tok.eos_id,
        **attention_options(getattr(args, "attention", None), causal_only=False),
    )


def exact_match_accuracy(
    predictions: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
) -> float:
    """The fraction of predictions equal to their target, token for token.

    Args:
        predictions: decoded token lists.
        targets: the correct token lists (same count).

    Returns:
        A number in [0, 1].
    """
    if len(predictions) != len(targets):
        raise ArgumentError(
            f"predictions and targets must have the same count, got {len(predictions)} and "
            f"{len(targets)}"
        )
    if not targets:
        raise ArgumentError("targets must not be empty")
    hits = sum(list(p) == list(t) for p, t in zip(predictions, targets))
    return hits / len(targets)


def cooldown_factor(step: int, cooldown: int, end: int) -> float:
    """1 until ``end - cooldown``, then falling linearly to 0 at step ``end`` (steps from 1).

    factor(s) = clamp((end - s + 1) / cooldown, 0, 1); ``cooldown = 0`` means no cool-down.

    Args:
        step: the optimizer step ``s``, counted from 1.
        cooldown: length of the cool-down in steps; 0 for none.
        end: the step at which the factor reaches 0.

    Returns:
        The factor, in ``[0, 1]``.
    """
    if cooldown == 0:
        return 1.0
    return min(1.0, max(0.0, (end - step + 1) / cooldown))


def noam_adam(
    d_model: int, warmup: int, factor: float, *, cooldown: int = 0, cooldown_end: int = 0
) -> Callable[[nn.Module], tuple[torch.optim.Optimizer, LRScheduler]]:
    """``model -> (Adam, schedule)`` as in Vaswani et al. (2017) §5.3: β = (0.9, 0.98), ε = 1e-9,

        lr(s) = factor · d_model^-0.5 · min(s^-0.5, s · warmup^-1.5) · cooldown_factor(s)

    With ``cooldown = 0`` the schedule is :class:`attnlab.training.NoamLR` itself; otherwise the
    Noam rate is annealed linearly to 0 over the ``cooldown`` steps that end at ``cooldown_end``
    (a fixed step, part of the run's configuration, so that a resumed run follows the same rates).

    Args:
        d_model: the model width.
        warmup: warm-up steps.
        factor: the Noam factor.
        cooldown: cool-down steps; default 0 (plain Noam).
        cooldown_end: the step at which the cool-down reaches 0; default 0.

    Returns:
        The optimizer factory the trainer calls with the model.
    """
    if cooldown < 0 or (cooldown and cooldown_end < cooldown):
        raise ArgumentError(
            f"--cooldown-end must be >= --cooldown ({cooldown}) when cooling down, got {cooldown_end}"
        )

    def make(model: nn.Module) -> tuple[torch.optim.Optimizer, LRScheduler]:
        opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
        if not cooldown:
            return opt, NoamLR(opt, d_model, warmup_steps=warmup, factor=factor)
        # LambdaLR's epoch e is the number of steps done, so the coming step is e + 1
        return opt, LambdaLR(
            opt,
            lambda e: (
                noam_rate(e + 1, d_model, warmup, factor)
                * cooldown_factor(e + 1, cooldown, cooldown_end)
            ),
        )

    return make


def noam_adam_from_args(
    args: Any, d_model: int
) -> Callable[[nn.Module], tuple[torch.optim.Optimizer, LRScheduler]]:
    """:func:`noam_adam` with the options of ``add_transformer_arguments``.

    Args:
        args: parsed options with ``warmup`` (``None``: :func:`~attnlab.tasks.train_options.warmup_steps`),
            ``steps``, ``lr_factor``, ``cooldown`` and ``cooldown_end``.
        d_model: the model width.

    Returns:
        The optimizer factory the trainer calls with the model.
    """
    return noam_adam(
        d_model,
        warmup_steps(args),
        args.lr_factor,
        cooldown=args.cooldown,
        cooldown_end=args.cooldown_end,
    )


def seq2seq_loss(pad_id: int, smoothing: float) -> Callable[[nn.Module, Any], TokenLoss]:
    """The loss of an encoder-decoder task: label-smoothed cross-entropy over non-pad targets.

    Args:
        pad_id: the padding id (its targets are ignored).
        smoothing: the label smoothing ``ε`` (0.1 in the paper).

    Returns:
        ``(model, Seq2SeqBatch) -> TokenLoss``.
    """

    def loss(model: nn.Module, batch: Seq2SeqBatch) -> TokenLoss:
        logits = model(batch.src, batch.tgt_in).logits  # (B, T, V)
        return token_loss(logits.float(), batch.targets, smoothing=smoothing, ignore_index=pad_id)

    return loss


@dataclass(frozen=True)
class Translation:
    """One text's result of :meth:`Seq2SeqIO.translate_each`: its output, or why it has none.

    Attributes:
        text: the source text as given.
        output: the decoded text, or ``None`` when the text was refused.
        error: why the text was refused (too long, no tokens, characters outside the
            alphabet, not a str), or ``None``.
        warning: why the output is likely poor though given (longer than any training
            sentence: :attr:`Seq2SeqIO.longest_trained`), or ``None``.
    """

    text: object
    output: str | None
    error: AttnlabError | None = None
    warning: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the text was translated."""
        return self.error is None


@dataclass(frozen=True)
class Seq2SeqIO:
    """The one path between text and an encoder-decoder's inputs (see :mod:`attnlab.tasks.base`).

    Args:
        src_tok: the source tokenizer.
        tgt_tok: the target tokenizer (the same object when the vocabulary is shared).
        bos_id: the model's begin-of-sequence id (the decoder's first input).
        eos_id: the model's end-of-sequence id (decoding stops there).
        pad_id: the model's padding id.
        source_suffix: tokens the encoder reads after the text (the copy/reverse/sort tasks end
            the source with ``<eos>``; translation adds nothing).
        max_source_len: the longest source (suffix included) the model takes; a longer text is an
            error, never silently cut.
        trained_len: the longest text (in tokens, suffix excluded) the model was trained on, when
            that is below what its positions take (copy/reverse/sort: ``--max-len``); a longer
            text is an error, since the model's answer to it would be wrong. ``None``: no limit
            beyond ``max_source_len``.
        longest_trained: the longest training source (in tokens, after the training cut) of a
            run whose positions take longer texts (translation); a longer text is translated
            all the same, with an :class:`~attnlab.errors.UntrainedLengthWarning`, since its
            answer is likely poor. ``None`` (a run saved before it was recorded): no warning.
        max_new_tokens: the decoding step limit as a function of the source length.
        reference: the correct target ids for the source ids (without suffix), when the task
            knows it (copy/reverse/sort); used for the training probe.
        reject_unknown: refuse a text with tokens outside the vocabulary (a character-level
            task's alphabet) instead of reading them as ``<unk>``.
        beams: the beam size of the task's own evaluation (1: greedy), the default everywhere.
        source_prefix: tokens the encoder reads before the text (a pretrained BART's ``<s>``).
        kind: always ``"seq2seq"`` (the :class:`~attnlab.tasks.base.TaskIO` family).
    """

    src_tok: Any
    tgt_tok: Any
    bos_id: int
    eos_id: int
    pad_id: int
    source_suffix: tuple[int, ...]
    max_source_len: int
    max_new_tokens: Callable[[int], int]
    reference: Callable[[list[int]], list[int]] | None = None
    reject_unknown: bool = False
    beams: int = 1
    trained_len: int | None = None
    longest_trained: int | None = None
    source_prefix: tuple[int, ...] = ()
    kind: Literal["seq2seq"] = "seq2seq"

    def source_ids(self, ids: Sequence[int]) -> list[int]:
        """What the encoder reads for the text's token ids.

        Args:
            ids: the text's token ids.

        Returns:
            ``ids`` then the suffix.
        """
        return [*self.source_prefix, *(int(i) for i in ids), *self.source_suffix]

    def encode_source(self, text: str, *, lenient: bool = False) -> list[int]:
        """What the encoder reads for ``text``.

        Args:
            text: the source text.
            lenient: for corpus evaluation: cut a long text to the model's limit and read an
                empty one as ``<unk>``, instead of raising.

        Returns:
            The source ids, suffix included.

        Raises:
            TypeError: ``text`` is not a str.
            ValueError: ``text`` encodes to no token, to more than the model takes, or to more
                than it was trained on (:attr:`trained_len`).
        """
        if not isinstance(text, str):
            raise ArgumentTypeError(f"text must be a str, got {type(text).__name__}")
        body = list(self.src_tok.encode(text))
        unk = self.src_tok.unk_id
        if self.reject_unknown and unk is not None and unk in body:
            outside = sorted({c for c, i in zip(text, body) if i == unk})
            raise ArgumentError(
                f"the text holds characters outside the task's alphabet: {''.join(outside)!r}; "
                f"the alphabet is {self.src_tok.decode(range(self.src_tok.vocab_size))!r}"
            )
        if lenient:
            body = body[: self.max_source_len - len(self.source_suffix) - len(self.source_prefix)]
            body = body[: self.trained_len] if self.trained_len is not None else body
            body = body or [unk if unk is not None else self.pad_id + 1]
        ids = self.source_ids(body)
        if not body:
            raise ArgumentError(f"the text {text!r} encodes to no tokens")
        if len(ids) > self.max_source_len:
            raise ArgumentError(
                f"the text has {len(ids)} tokens (with special tokens), more than the model's "
                f"limit of {self.max_source_len}"
            )
        if self.trained_len is not None and len(body) > self.trained_len:
            raise ArgumentError(
                f"text must have at most {self.trained_len} tokens, the longest the model was "
                f"trained on (its answer to a longer one would be wrong), got {len(body)}"
            )
        return ids

    def length_warning(self, source: Sequence[int]) -> str | None:
        """Why the answer to a source is likely poor: it is longer than :attr:`longest_trained`.

        Args:
            source: the source ids, as :meth:`encode_source` gives them (suffix included).

        Returns:
            The reason (its length and the longest trained one), or ``None`` when there is none.
        """
        n = len(source) - len(self.source_suffix) - len(self.source_prefix)
        if self.longest_trained is None or n <= self.longest_trained:
            return None
        return (
            f"{n} tokens, longer than the longest training sentence ({self.longest_trained} "
            f"tokens): the translation is likely poor"
        )

    def decode_output(self, ids: Sequence[int]) -> str:
        """The text of output ids.

        Args:
            ids: output token ids.

        Returns:
            The decoded text, special tokens dropped.
        """
        return str(self.tgt_tok.decode(list(ids)))

    def translate(
        self,
        model: nn.Module,
        texts: Sequence[str],
        *,
        beams: int | None = None,
        batch_size: int = 64,
        lenient: bool = False,
    ) -> list[str]:
        """Decode texts to output text.

        Args:
            model: the encoder-decoder.
            texts: the source texts.
            beams: the beam size: 1 is greedy, more is beam search; default :attr:`beams`.
            batch_size: sources decoded together; default 64.
            lenient: as :meth:`encode_source` (corpus evaluation); default ``False``.

        Returns:
            One output text per source, in order.

        Raises:
            ValueError: a text the model cannot take (:meth:`encode_source`); the message names
                it as ``texts[i]``. :meth:`translate_each` translates the others instead.
            TypeError: a text is not a str.

        Warns:
            UntrainedLengthWarning: a text longer than any training sentence
                (:meth:`length_warning`; not with ``lenient``), named as ``texts[i]``.
        """
        sources = []
        for i, text in enumerate(texts):
            try:
                sources.append(self.encode_source(text, lenient=lenient))
            except AttnlabError as exc:
                raise type(exc)(f"texts[{i}]: {exc}") from None
            if not lenient:
                _warn_length(i, self.length_warning(sources[-1]))
        return [self._output_text(row) for row in self._decode(model, sources, beams, batch_size)]

    def translate_each(
        self,
        model: nn.Module,
        texts: Sequence[str],
        *,
        beams: int | None = None,
        batch_size: int = 64,
    ) -> list[Translation]:
        """Decode every text the model can take; a text it cannot take gets its error instead,
        and the others are translated all the same.

        Args:
            model: the encoder-decoder.
            texts: the source texts.
            beams: the beam size: 1 is greedy, more is beam search; default :attr:`beams`.
            batch_size: sources decoded together; default 64.

        Returns:
            One :class:`Translation` per text, in order: its output, or its error (the
            ``ValueError``/``TypeError`` :meth:`encode_source` raised for it).

        Raises:
            ValueError: ``beams`` is not a positive int (every text would fail alike).

        Warns:
            UntrainedLengthWarning: a text longer than any training sentence, named as
                ``texts[i]`` (also its :attr:`Translation.warning`).
        """
        sources: dict[int, list[int]] = {}
        errors: dict[int, AttnlabError] = {}
        notes: dict[int, str] = {}
        for i, text in enumerate(texts):
            try:
                sources[i] = self.encode_source(text)
            except AttnlabError as exc:
                errors[i] = exc
                continue
            if (note := self.length_warning(sources[i])) is not None:
                notes[i] = note
                _warn_length(i, note)
        rows = self._decode(model, list(sources.values()), beams, batch_size) if sources else []
        outputs = {i: self._output_text(row) for i, row in zip(sources, rows)}
        return [
            Translation(text, outputs.get(i), errors.get(i), notes.get(i))
            for i, text in enumerate(texts)
        ]

    def _output_text(self, row: Sequence[int]) -> str:
        ids = strip_special(row, bos_id=self.bos_id, eos_id=self.eos_id, pad_id=self.pad_id)
        return self.decode_output(ids)

    def _decode(
        self, model: nn.Module, sources: list[list[int]], beams: int | None, batch_size: int = 64
    ) -> list[list[int]]:
        beams = self.beams if beams is None else beams
        if isinstance(beams, bool) or not isinstance(beams, int) or beams < 1:
            raise ArgumentError(f"beams must be a positive int, got {beams!r}")
        check_finite_weights(model)
        return decode_sources(
            model, sources, max_new_tokens=self.max_new_tokens,
            strategy="beam" if beams > 1 else "greedy", num_beams=beams, batch_size=batch_size,
            raw=True,
        )  # fmt: skip

    def inputs(
        self,
        model: nn.Module,
        text: str,
        *,
        target: str | None = None,
        beams: int | None = None,
        source_ids: Sequence[int] | None = None,
    ) -> ModelInputs:
        """What ``model`` reads for ``text``: the source, and its own decoded output as target.

        Args:
            model: the encoder-decoder.
            text: the source text.
            target: teacher-force this target text instead of decoding (``<bos> … <eos>``).
            beams: decode with this many beams (1: greedy), as ``attnlab translate --beams``;
                default the task's evaluation (:attr:`beams`).
            source_ids: the encoder's input ids verbatim, instead of ``text``.

        Returns:
            :class:`~attnlab.tasks.base.ModelInputs`.
        """
        src = list(source_ids) if source_ids is not None else self.encode_source(text)
        if target is not None:
            tgt = [self.bos_id, *self.tgt_tok.encode(target), self.eos_id]
        else:
            tgt = self._decode(model, [src], beams)[0]
        return self._model_inputs(src, tgt)

    def probe_inputs(self, text: str) -> ModelInputs:
        """A fixed teacher-forced input: the source and its correct target.

        The target is the task's reference answer when it knows one (copy/reverse/sort);
        otherwise ``text`` may carry it as ``"SOURCE ||| TARGET"``; without either the decoder
        reads ``<bos>`` alone.

        Args:
            text: the probe text, optionally ``"SOURCE ||| TARGET"``.

        Returns:
            The model's inputs for the probe.
        """
        source, sep, target = text.partition(" ||| ")
        src = self.encode_source(source)
        if sep:
            body = list(self.tgt_tok.encode(target))
        elif self.reference is not None:
            body = self.reference(src[: len(src) - len(self.source_suffix)])
        else:
            body = []
        return self._model_inputs(src, [self.bos_id, *body, self.eos_id])

    def _model_inputs(self, src: list[int], tgt: list[int]) -> ModelInputs:
        return ModelInputs(
            kind="seq2seq",
            source_ids=tuple(src),
            target_ids=tuple(tgt),
            source_tokens=tuple(token_labels(self.src_tok, src)),
            target_tokens=tuple(token_labels(self.tgt_tok, tgt[1:])),
            output=self._output_text(tgt),
        )


def _warn_length(i: int, note: str | None) -> None:
    """Warn that ``texts[i]`` is longer than any training sentence (``note``: why), if it is."""
    if note is not None:  # stacklevel 3: the caller of translate / translate_each
        warnings.warn(f"texts[{i}] has {note}", UntrainedLengthWarning, stacklevel=3)
