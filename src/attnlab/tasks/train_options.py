"""Typed options of ``attnlab train TASK``: a frozen dataclass per task, checked when built.

:class:`TrainOptions` holds what every task shares (run folder, steps, seed, precision, cadence,
parallelism, probe); :class:`LMOptions`, :class:`TranslateOptions` and :class:`AlgorithmicOptions`
add a task's own options, with the same names and defaults as its command-line options
(``--block-size`` is ``block_size``). :func:`attnlab.tasks.train` takes them; the command line
builds them from its arguments.

Every field is checked in ``__post_init__`` (type and range; one :class:`~attnlab.errors.ArgumentError`
or :class:`~attnlab.errors.ArgumentTypeError` naming the field); the checks that involve several
options (``warmup`` below the decay's length, the attention pattern's parameters, the data files)
stay with the task's ``build``, which runs before the first step.

What a run saves of them (``config.json``'s ``"args"``, compared on resume) is :func:`run_args`:
the seed and the task's own options, as the command line has always saved them.

``warmup`` is ``None`` by default: the task's warm-up (100 steps for ``lm``, 200 for copy /
reverse / sort, 400 for ``translate``) when the run is longer than that, otherwise a tenth of the
run (:func:`warmup_steps`), so ``attnlab train lm --steps 10`` trains instead of refusing the
default. A run saves the warm-up it used, and a resumed run keeps it.

Examples:
    >>> opts = LMOptions(data="tinyshakespeare", out="runs/shk", steps=2000)
    >>> opts.block_size, opts.eval_every
    (64, 250)
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import torch

from attnlab._budget import check_at_most
from attnlab.data import corpora
from attnlab.distributed.ring_schedule import LAYOUTS
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.families import PRESETS
from attnlab.nn.kinds import AttentionSpec, FullSpec, spec_from_dict, spec_to_cli

__all__ = [
    "BLEU_TOKENIZERS",
    "CAPS",
    "PARALLEL",
    "AlgorithmicOptions",
    "AttentionFields",
    "LMOptions",
    "TrainOptions",
    "TranslateOptions",
    "attention_options",
    "options_class",
    "run_args",
    "task_fields",
    "warmup_steps",
]

#: sacrebleu's tokenizers that work offline (its sentencepiece ones download a model)
BLEU_TOKENIZERS = ("13a", "intl", "char", "zh", "ja-mecab", "ko-mecab", "none")

#: ``parallel`` choices: a replica per process, or parameters sharded over them (FSDP2)
PARALLEL = ("ddp", "fsdp")

# what each check accepts: (test, what the message says was expected)
_NUMBER = (int, float)
_CHECKS: dict[str, tuple[Any, str]] = {
    "positive_int": (lambda v: isinstance(v, int) and v >= 1, "a positive int"),
    "non_negative_int": (lambda v: isinstance(v, int) and v >= 0, "a non-negative int"),
    "positive_float": (
        lambda v: isinstance(v, _NUMBER) and 0 < v < math.inf,
        "a finite positive float",
    ),
    "non_negative_float": (
        lambda v: isinstance(v, _NUMBER) and 0 <= v < math.inf,
        "a finite non-negative float",
    ),
    "probability": (lambda v: isinstance(v, _NUMBER) and 0 <= v < 1, "a float in [0, 1)"),
    "bool": (lambda v: True, "a bool"),
    "str": (lambda v: bool(v), "a non-empty str"),
    "path": (lambda v: bool(str(v)), "a path"),
    "device": (lambda v: True, "a torch device"),
}
# the type each check needs first (a wrong type is an ArgumentTypeError)
_TYPES: dict[str, tuple[type, ...]] = {
    "positive_int": (int,),
    "non_negative_int": (int,),
    "positive_float": _NUMBER,
    "non_negative_float": _NUMBER,
    "probability": _NUMBER,
    "bool": (bool,),
    "str": (str,),
    "path": (str, os.PathLike),
    "device": (str, torch.device),
}


#: bounds of the counts that only cost time (or that no generator takes): the largest value a
#: sane run needs, and why (``--eval-iters 1000000000`` would evaluate for days)
CAPS: dict[str, tuple[int, str]] = {
    "seed": (2**32 - 1, "the generators take 32-bit seeds"),
    "eval_iters": (100_000, "batches per loss estimate; more only costs time"),
    "n_layer": (1000, "layers; deeper models take hours to build and never train here"),
    "layers": (1000, "layers each; deeper models take hours to build and never train here"),
    "beams": (1000, "beam search gains nothing from more; each costs a decoding"),
    "grad_accum": (10_000, "micro-batches per optimizer step; a step of more never ends here"),
    "max_new_tokens": (1_000_000, "tokens to generate, a forward pass each; more run for days"),
}


def _opt(default: Any, check: str | tuple[str, ...], *, optional: bool = False) -> Any:
    """A field: its default and its check (a name of ``_CHECKS`` or the allowed values);
    ``optional`` (or a ``None`` default) also accepts ``None``."""
    return field(
        default=default, metadata={"check": check, "optional": optional or default is None}
    )


def _required(check: str) -> Any:
    return field(metadata={"check": check, "optional": False})


def _check_field(name: str, value: Any, check: str | tuple[str, ...], optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(check, tuple):
        if value not in check:
            raise ArgumentError(f"{name} must be one of {', '.join(check)}, got {value!r}")
        return
    kinds = _TYPES[check]
    is_bool = isinstance(value, bool)
    if not isinstance(value, kinds) or (is_bool and check != "bool"):
        expected = _CHECKS[check][1] + (" or None" if optional else "")
        raise ArgumentTypeError(f"{name} must be {expected}, got {type(value).__name__}")
    test, what = _CHECKS[check]
    if not test(value):
        raise ArgumentError(f"{name} must be {what}, got {value!r}")
    if name in CAPS and isinstance(value, int):
        check_at_most("--" + name.replace("_", "-"), value, *CAPS[name])


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """What every task shares: the ``training`` and ``attention during training`` options of
    ``attnlab train`` (``--out``, ``--steps``, ... ``--probe-every``).

    Attributes:
        task: the registered task's name (``"lm"``, ``"translate"``, ``"reverse"``, ...).
        out: the run folder (checkpoints, ``metrics.jsonl``).
        steps: total optimizer steps (a resumed run continues up to it).
        seed: the random seed.
        resume: continue the run saved in ``out``.
        grad_accum: micro-batches per optimizer step.
        clip: clip the gradient norm to this; ``None`` does not clip.
        bf16: bf16 autocast.
        fp16: fp16 autocast with a gradient scaler (not with ``bf16``).
        grad_checkpoint: recompute activations in the backward pass (results do not change).
        eval_every: evaluate every N steps (0: at the end only).
        save_every: checkpoint every N steps (0: at the end only).
        keep_last: checkpoints to keep.
        parallel: under torchrun, ``"ddp"`` or ``"fsdp"``.
        context_parallel: processes each sequence is spread over (ring attention).
        context_layout: ``"zigzag"`` or ``"contiguous"``.
        tensor_parallel: processes each layer's heads and units are split over.
        device: ``"cpu"``, ``"cuda"``, ... or ``None`` (CUDA when available).
        force: train in a non-empty ``out`` that is not an attnlab run.
        allow_data_change: resume even though a data file changed since the checkpoint.
        probe: record the attention of this input while training (``RUN/probe/``), or ``None``.
        probe_every: steps between probe records.

    Raises:
        TypeError: a field of the wrong type (the message names it).
        ValueError: a field out of its range, or ``bf16`` with ``fp16``.
    """

    #: the task names these options fit (empty: any)
    TASKS: ClassVar[tuple[str, ...]] = ()

    task: str = _opt("", "str")
    out: str | os.PathLike[str] = _required("path")
    steps: int = _required("non_negative_int")
    seed: int = _opt(0, "non_negative_int")
    resume: bool = _opt(False, "bool")
    grad_accum: int = _opt(1, "positive_int")
    clip: float | None = _opt(1.0, "positive_float", optional=True)
    bf16: bool = _opt(False, "bool")
    fp16: bool = _opt(False, "bool")
    grad_checkpoint: bool = _opt(False, "bool")
    eval_every: int = _opt(0, "non_negative_int")
    save_every: int = _opt(0, "non_negative_int")
    keep_last: int = _opt(2, "positive_int")
    parallel: str = _opt("ddp", PARALLEL)
    context_parallel: int = _opt(1, "positive_int")
    context_layout: str = _opt("zigzag", LAYOUTS)
    tensor_parallel: int = _opt(1, "positive_int")
    device: str | torch.device | None = _opt(None, "device")
    force: bool = _opt(False, "bool")
    allow_data_change: bool = _opt(False, "bool")
    probe: str | None = _opt(None, "str")
    probe_every: int = _opt(50, "positive_int")

    def __post_init__(self) -> None:
        for f in fields(self):
            if "check" in f.metadata:
                _check_field(
                    f.name, getattr(self, f.name), f.metadata["check"], f.metadata["optional"]
                )
        if self.TASKS and self.task not in self.TASKS:
            raise ArgumentError(
                f"task must be one of {', '.join(self.TASKS)} for {type(self).__name__}, "
                f"got {self.task!r}"
            )
        if self.bf16 and self.fp16:
            raise ArgumentError("bf16 and fp16 do not combine: choose one autocast precision")


#: the common fields: not part of a run's saved task options (but ``seed``)
_COMMON = frozenset(f.name for f in fields(TrainOptions))


@dataclass(frozen=True, kw_only=True)
class AttentionFields:
    """The model's attention kind: one :class:`~attnlab.nn.kinds.AttentionSpec` (the command
    line's ``--attention NAME`` and that kind's own options, e.g. ``--window``).

    Attributes:
        attention: a spec (``SlidingSpec(window=256)``), a kind's name when its options all have
            defaults (``"performer"``), or ``None`` (full attention).
    """

    attention: AttentionSpec | None = None

    def __post_init__(self) -> None:
        value = self.attention
        if isinstance(value, (str, Mapping)):
            object.__setattr__(self, "attention", spec_from_dict(value))
        elif value is not None and not isinstance(value, AttentionSpec):
            raise ArgumentTypeError(
                f"attention must be an AttentionSpec, a kind's name or None, got "
                f"{type(value).__name__}"
            )
        super().__post_init__()  # type: ignore[misc]


@dataclass(frozen=True, kw_only=True)
class LMOptions(AttentionFields, TrainOptions):
    """``attnlab train lm``: a GPT on a packaged dataset or a text file (nanoGPT's CPU recipe by
    default; see :mod:`attnlab.tasks.lm`).

    Attributes:
        task: ``"lm"``.
        out: the run folder (checkpoints, ``metrics.jsonl``).
        steps: total optimizer steps (a resumed run continues up to it).
        seed: the random seed.
        resume: continue the run saved in ``out``.
        grad_accum: micro-batches per optimizer step.
        clip: clip the gradient norm to this; ``None`` does not clip.
        bf16: bf16 autocast.
        fp16: fp16 autocast with a gradient scaler (not with ``bf16``).
        grad_checkpoint: recompute activations in the backward pass (results do not change).
        eval_every: evaluate every N steps (0: at the end only).
        save_every: checkpoint every N steps (0: at the end only).
        keep_last: checkpoints to keep.
        parallel: under torchrun, ``"ddp"`` or ``"fsdp"``.
        context_parallel: processes each sequence is spread over (ring attention).
        context_layout: ``"zigzag"`` or ``"contiguous"``.
        tensor_parallel: processes each layer's heads and units are split over.
        device: ``"cpu"``, ``"cuda"``, ... or ``None`` (CUDA when available).
        force: train in a non-empty ``out`` that is not an attnlab run.
        allow_data_change: resume even though a data file changed since the checkpoint.
        probe: record the attention of this input while training (``RUN/probe/``), or ``None``.
        probe_every: steps between probe records.
        attention: the attention kind, an :class:`~attnlab.nn.kinds.AttentionSpec` (or a
            kind's name), or ``None`` (full).
        data: a packaged text dataset's name (``"tinyshakespeare"``) or a UTF-8 text file.
        bpe: byte-level BPE tokens instead of characters.
        bpe_vocab: the BPE vocabulary's size.
        block_size: the context length.
        n_layer: layers.
        n_head: heads.
        n_embd: the embedding width.
        family: the model family's parts, ``"gpt2"``, ``"llama"`` or ``"neox"``
            (:func:`attnlab.models.families.preset`).
        dropout: dropout probability.
        bias: biases in the linear layers and LayerNorms; ``None`` (default) the family's
            (GPT-2 and NeoX have them, Llama has none), set when the options are built.
        batch_size: sequences a step.
        lr: the peak learning rate.
        min_lr: the final learning rate.
        warmup: warm-up steps; ``None`` (default): 100, or a tenth of the decay's length when
            that is not above 100 (:func:`warmup_steps`).
        lr_decay_steps: the step at which the cosine decay reaches ``min_lr`` (``None``:
            ``steps``).
        weight_decay: AdamW's weight decay on matrices.
        eval_iters: batches per loss estimate.
    """

    TASKS: ClassVar[tuple[str, ...]] = ("lm",)
    #: the default warm-up of a run longer than it, and the least of a shorter one (the cosine
    #: schedule takes no warm-up at all)
    WARMUP: ClassVar[tuple[int, int]] = (100, 0)

    task: str = _opt("lm", "str")
    eval_every: int = _opt(250, "non_negative_int")
    data: str | os.PathLike[str] = _required("path")
    bpe: bool = _opt(False, "bool")
    bpe_vocab: int = _opt(1024, "positive_int")
    block_size: int = _opt(64, "positive_int")
    n_layer: int = _opt(4, "positive_int")
    n_head: int = _opt(4, "positive_int")
    n_embd: int = _opt(128, "positive_int")
    family: str = _opt("gpt2", PRESETS)
    dropout: float = _opt(0.0, "probability")
    bias: bool | None = _opt(None, "bool")
    batch_size: int = _opt(12, "positive_int")
    lr: float = _opt(1e-3, "positive_float")
    min_lr: float = _opt(1e-4, "positive_float")
    warmup: int | None = _opt(None, "positive_int")
    lr_decay_steps: int | None = _opt(None, "positive_int")
    weight_decay: float = _opt(0.1, "non_negative_float")
    eval_iters: int = _opt(20, "positive_int")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bias is None:  # the family's: Llama has no biases
            object.__setattr__(self, "bias", self.family != "llama")


@dataclass(frozen=True, kw_only=True)
class TranslateOptions(AttentionFields, TrainOptions):
    """``attnlab train translate``: an encoder-decoder on a packaged parallel dataset or the
    user's files (see :mod:`attnlab.tasks.translate`).

    Attributes:
        task: ``"translate"``.
        out: the run folder (checkpoints, ``metrics.jsonl``).
        steps: total optimizer steps (a resumed run continues up to it).
        seed: the random seed.
        resume: continue the run saved in ``out``.
        grad_accum: micro-batches per optimizer step.
        clip: clip the gradient norm to this; ``None`` does not clip.
        bf16: bf16 autocast.
        fp16: fp16 autocast with a gradient scaler (not with ``bf16``).
        grad_checkpoint: recompute activations in the backward pass (results do not change).
        eval_every: evaluate every N steps (0: at the end only).
        save_every: checkpoint every N steps (0: at the end only).
        keep_last: checkpoints to keep.
        parallel: under torchrun, ``"ddp"`` or ``"fsdp"``.
        context_parallel: processes each sequence is spread over (ring attention).
        context_layout: ``"zigzag"`` or ``"contiguous"``.
        tensor_parallel: processes each layer's heads and units are split over.
        device: ``"cpu"``, ``"cuda"``, ... or ``None`` (CUDA when available).
        force: train in a non-empty ``out`` that is not an attnlab run.
        allow_data_change: resume even though a data file changed since the checkpoint.
        probe: record the attention of this input while training (``RUN/probe/``), or ``None``.
        probe_every: steps between probe records.
        attention: the attention kind, an :class:`~attnlab.nn.kinds.AttentionSpec` (or a
            kind's name), or ``None`` (full).
        corpus: a packaged parallel dataset (``"small_parallel_enja"``), or ``None`` for the
            files below.
        src: the training source file.
        tgt: the training target file.
        dev_src: the dev source file, or ``None``.
        dev_tgt: the dev target file, or ``None``.
        test_src: the test source file, or ``None``.
        test_tgt: the test target file, or ``None``.
        tokenizer: ``"bpe"`` or ``"word"``.
        src_vocab: the source vocabulary's size.
        tgt_vocab: the target vocabulary's size.
        max_tokens: padded tokens per batch.
        beams: the beam size of the final translation.
        bleu_tokenize: sacrebleu's tokenizer for BLEU.
        d_model: the model width.
        layers: encoder and decoder layers each.
        heads: heads.
        d_ff: the feed-forward width.
        dropout: dropout probability.
        label_smoothing: label smoothing.
        warmup: Noam warm-up steps; ``None`` (default): the task's, or a tenth of ``steps``
            when that is not above it (:func:`warmup_steps`).
        cooldown: steps over which the rate anneals linearly to 0 (0: plain Noam).
        cooldown_end: the step at which the cool-down reaches 0.
        lr_factor: the Noam factor.
    """

    TASKS: ClassVar[tuple[str, ...]] = ("translate",)
    WARMUP: ClassVar[tuple[int, int]] = (400, 1)  # Noam's rate needs one step at least

    task: str = _opt("translate", "str")
    eval_every: int = _opt(1000, "non_negative_int")
    corpus: str | None = _opt(None, tuple(corpora.names("parallel")))
    src: str | os.PathLike[str] | None = _opt(None, "path")
    tgt: str | os.PathLike[str] | None = _opt(None, "path")
    dev_src: str | os.PathLike[str] | None = _opt(None, "path")
    dev_tgt: str | os.PathLike[str] | None = _opt(None, "path")
    test_src: str | os.PathLike[str] | None = _opt(None, "path")
    test_tgt: str | os.PathLike[str] | None = _opt(None, "path")
    tokenizer: str = _opt("bpe", ("bpe", "word"))
    src_vocab: int = _opt(8000, "positive_int")
    tgt_vocab: int = _opt(8000, "positive_int")
    max_tokens: int = _opt(4096, "positive_int")
    beams: int = _opt(4, "positive_int")
    bleu_tokenize: str = _opt("13a", BLEU_TOKENIZERS)
    d_model: int = _opt(256, "positive_int")
    layers: int = _opt(3, "positive_int")
    heads: int = _opt(4, "positive_int")
    d_ff: int = _opt(1024, "positive_int")
    dropout: float = _opt(0.1, "probability")
    label_smoothing: float = _opt(0.1, "probability")
    warmup: int | None = _opt(None, "positive_int")
    cooldown: int = _opt(0, "non_negative_int")
    cooldown_end: int = _opt(0, "non_negative_int")
    lr_factor: float = _opt(1.0, "positive_float")


@dataclass(frozen=True, kw_only=True)
class AlgorithmicOptions(AttentionFields, TrainOptions):
    """``attnlab train copy|reverse|sort``: an encoder-decoder on strings over a small alphabet
    (see :mod:`attnlab.tasks.algorithmic`).

    Attributes:
        out: the run folder (checkpoints, ``metrics.jsonl``).
        steps: total optimizer steps (a resumed run continues up to it).
        seed: the random seed.
        resume: continue the run saved in ``out``.
        grad_accum: micro-batches per optimizer step.
        clip: clip the gradient norm to this; ``None`` does not clip.
        bf16: bf16 autocast.
        fp16: fp16 autocast with a gradient scaler (not with ``bf16``).
        grad_checkpoint: recompute activations in the backward pass (results do not change).
        eval_every: evaluate every N steps (0: at the end only).
        save_every: checkpoint every N steps (0: at the end only).
        keep_last: checkpoints to keep.
        parallel: under torchrun, ``"ddp"`` or ``"fsdp"``.
        context_parallel: processes each sequence is spread over (ring attention).
        context_layout: ``"zigzag"`` or ``"contiguous"``.
        tensor_parallel: processes each layer's heads and units are split over.
        device: ``"cpu"``, ``"cuda"``, ... or ``None`` (CUDA when available).
        force: train in a non-empty ``out`` that is not an attnlab run.
        allow_data_change: resume even though a data file changed since the checkpoint.
        probe: record the attention of this input while training (``RUN/probe/``), or ``None``.
        probe_every: steps between probe records.
        attention: the attention kind, an :class:`~attnlab.nn.kinds.AttentionSpec` (or a
            kind's name), or ``None`` (full).
        task: ``"copy"``, ``"reverse"`` or ``"sort"``.
        num_symbols: the alphabet's size.
        min_len: the shortest string.
        max_len: the longest string.
        num_heldout: held-out strings.
        d_model: the model width.
        layers: encoder and decoder layers each.
        heads: heads.
        d_ff: the feed-forward width.
        dropout: dropout probability.
        label_smoothing: label smoothing.
        batch_size: strings a step.
        warmup: Noam warm-up steps; ``None`` (default): the task's, or a tenth of ``steps``
            when that is not above it (:func:`warmup_steps`).
        cooldown: steps over which the rate anneals linearly to 0 (0: plain Noam).
        cooldown_end: the step at which the cool-down reaches 0.
        lr_factor: the Noam factor.
    """

    TASKS: ClassVar[tuple[str, ...]] = ("copy", "reverse", "sort")
    WARMUP: ClassVar[tuple[int, int]] = (200, 1)  # Noam's rate needs one step at least

    task: str = _opt("reverse", TASKS)
    eval_every: int = _opt(500, "non_negative_int")
    num_symbols: int = _opt(10, "positive_int")
    min_len: int = _opt(1, "positive_int")
    max_len: int = _opt(16, "positive_int")
    num_heldout: int = _opt(500, "positive_int")
    d_model: int = _opt(128, "positive_int")
    layers: int = _opt(2, "positive_int")
    heads: int = _opt(4, "positive_int")
    d_ff: int = _opt(256, "positive_int")
    dropout: float = _opt(0.0, "probability")
    label_smoothing: float = _opt(0.1, "probability")
    batch_size: int = _opt(64, "positive_int")
    warmup: int | None = _opt(None, "positive_int")
    cooldown: int = _opt(0, "non_negative_int")
    cooldown_end: int = _opt(0, "non_negative_int")
    lr_factor: float = _opt(0.5, "positive_float")


def task_fields(options: TrainOptions | type[TrainOptions]) -> list[str]:
    """The names of a task's own options (every field but :class:`TrainOptions`'s).

    Args:
        options: an options class or instance.

    Returns:
        The field names, in declaration order.
    """
    return [f.name for f in fields(options) if f.name not in _COMMON]


#: options left out of a run's saved ``"args"`` while they hold the value here (what a run saved
#: before they existed meant): such a run compares equal when resumed
_NEWER_FIELDS: dict[str, Any] = {"corpus": None, "family": "gpt2"}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def warmup_steps(options: Any) -> int:
    """The warm-up steps of a run: ``options.warmup`` when given; otherwise the task's default
    when the run is longer than it, else a tenth of the run.

    The run's length is ``steps`` (``lr_decay_steps`` when set, for ``lm``). A run of 1200 steps
    of ``reverse`` warms up over its 200 default steps; one of 10 steps over 1.

    Args:
        options: a task's options with ``warmup`` and ``steps`` (and its class's ``WARMUP``,
            ``(default, least)``).

    Returns:
        The warm-up steps.
    """
    if options.warmup is not None:
        return int(options.warmup)
    default, least = getattr(type(options), "WARMUP", (100, 1))
    length = getattr(options, "lr_decay_steps", None) or options.steps
    return default if default < length else max(least, length // 10)


def run_args(options: TrainOptions) -> dict[str, Any]:
    """What a run saves of its options (``config.json``'s ``"args"``, compared on resume): the
    seed and the task's own options, ``None`` attention options and ``corpus`` left out.

    Args:
        options: the run's options.

    Returns:
        A JSON-able dict.
    """
    out: dict[str, Any] = {"seed": options.seed}
    for name in task_fields(options):
        value = getattr(options, name)
        if name == "attention" and (value is None or isinstance(value, AttentionSpec)):
            out.update(spec_to_cli(value))  # as the command line's options
            continue
        if name in _NEWER_FIELDS and value == _NEWER_FIELDS[name]:
            continue
        if name == "warmup":
            value = warmup_steps(options)  # the one used: a resumed run keeps it
        out[name] = _jsonable(value)
    return out


def options_class(task: Any, names: Mapping[str, Any] | None = None) -> type[TrainOptions]:
    """The options class of a registered task: its ``options`` attribute, else (a task that
    declares none, e.g. one registered by a test) a dataclass of :class:`TrainOptions` and the
    option names its command line adds, with their defaults.

    Args:
        task: a registered task.
        names: the task's own option names → defaults (from its ``add_arguments``); used only
            when the task declares no ``options``.

    Returns:
        A :class:`TrainOptions` subclass.

    Raises:
        ValueError: the task declares no options class and no names were given.
    """
    declared = getattr(task, "options", None)
    if isinstance(declared, type) and issubclass(declared, TrainOptions):
        return declared
    if names is None:
        raise ArgumentError(
            f"task {task.name!r} declares no options class (its 'options' attribute): "
            f"train it from the command line or give it one"
        )
    extra = [(name, Any, field(default=default)) for name, default in names.items()]
    cls = dataclasses.make_dataclass(
        f"{task.name.title()}Options", extra, bases=(TrainOptions,), frozen=True, kw_only=True
    )
    return cls


def attention_options(spec: AttentionSpec | None, *, causal_only: bool) -> dict[str, Any]:
    """The model config's ``attention`` from a task's ``attention`` option (full attention when
    ``None``), checked against the model.

    Args:
        spec: the task's attention spec, or ``None``.
        causal_only: the model's attention is all causal (a GPT): a kind that cannot be causal
            (``--attention linformer``) is refused.

    Returns:
        ``{"attention": spec}`` for the model config.

    Raises:
        ValueError: a kind that cannot be causal for a causal model.
    """
    spec = spec or FullSpec()
    if causal_only and spec.bidirectional_only:
        raise ArgumentError(
            f"--attention {spec.name} does not fit a GPT: its attention is causal, and "
            f"{spec.name} cannot be causal (Linformer's projected keys mix future positions); "
            f"use --attention sliding or performer"
        )
    return {"attention": spec}
