"""What a task is: the protocol, what it hands the trainer, and the one path from text to input.

A task is an object with a ``name``, a one-line ``help``, ``options`` — its typed options, a
frozen dataclass subclassing :class:`~attnlab.tasks.train_options.TrainOptions` with a field per
option of its own (the common ones — ``out``, ``steps``, ``seed``, ``resume``, ``grad_accum``,
``clip``, ``bf16``, ``fp16``, ... ``probe_every`` — are :class:`TrainOptions`'s; a task may
change their defaults, e.g. ``eval_every: int = 250``) — ``build(options, device) ->
TaskSetup`` and ``io(args, files) -> TaskIO``. :func:`attnlab.tasks.train` builds the options,
seeds the random generators with ``seed`` and calls ``build``, which must create the model, the
data and the optimizer deterministically from them. ``attnlab train TASK`` has the built-in
tasks' command-line options in :mod:`attnlab.cli.task_arguments`; a task registered from
outside brings ``add_arguments(parser)`` instead of ``options`` (the command line makes a
dataclass of the options it adds).

Every option is checked before the first step: by its options dataclass (and the command line's
``type``/``choices``), or in ``build`` (which runs before training) — never first when it is used at an evaluation or in the
final report, where a mistake would cost the whole run. ``build`` also names the files its data
came from (``TaskSetup.data_files``), so that a resumed run notices changed data.

``io`` rebuilds, from a run's saved options (``config.json``'s ``"args"``) and its files (the
tokenizers), the task's :class:`TaskIO`: the one way a text becomes exactly what the model saw at
evaluation (special tokens, source and target sides) and the model's output becomes text. The
task's own evaluation goes through the same object, and so do ``attnlab translate``,
``generate``, ``view``, ``inspect``, ``plot`` and the demo — so what they show is what the model
saw.

What ends up in the checkpoint's ``config.json``::

    {"task": NAME, "args": {"seed": S, <every option the task added>: value, ...},
     "model": TaskSetup.model_config, "train": {"grad_accum", "clip", "bf16"[, "fp16"]}}

(``--steps``, ``--out``, ``--resume``, ``--device``, ``--grad-checkpoint``, the probe and the
eval/save/keep cadence are not part of it, so they may change on resume; everything else must match or ``--resume`` fails.) A schedule
that depends on the length of the run (warmup + cosine) should take it from a task option such as
``--decay-steps`` rather than from ``args.steps``: then ``--steps 20`` followed by ``--resume
--steps 40`` follows the same trajectory as ``--steps 40``. Batch sources must be synchronous and
deterministic (no prefetching worker processes), so that their saved position is exact.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import torch
from torch import nn

from attnlab._checks import check_finite_weights
from attnlab.training.trainer import BatchSource

if TYPE_CHECKING:
    from attnlab.tasks.token_scores import TokenScore

__all__ = [
    "EvaluationSet",
    "ModelInputs",
    "Task",
    "TaskIO",
    "TaskSetup",
    "check_finite_weights",
    "special_ids",
    "token_labels",
]


@dataclass
class TaskSetup:
    """Everything the trainer needs from a task.

    Attributes:
        model: the model (on the CPU is fine; the trainer moves it).
        make_optimizer: ``model -> optimizer`` or ``model -> (optimizer, scheduler)``.
        batches: the global batches, with a resumable position (see
            :class:`attnlab.training.trainer.BatchSource`).
        loss_fn: ``(model, batch) -> TokenLoss | Tensor``; must call ``model(...)`` (it may be
            wrapped in DistributedDataParallel).
        model_config: JSON-able description of the model (e.g. ``config_to_dict(config)``),
            stored under ``"model"`` in ``config.json``.
        evaluate: ``model -> {metric: value}`` run every ``--eval-every`` steps and at the end
            (rank 0, eval mode, no grad), or ``None``.
        files: files stored in every checkpoint, e.g. ``{"tokenizer.json": tokenizer_json}``.
        report: called once after training on rank 0 with ``(model, run_dir, console)`` to print
            the task's summary (accuracy, decoded examples, BLEU, figures), or ``None``.
        io: the task's :class:`TaskIO` (text ↔ model input), the same object ``Task.io``
            rebuilds from the saved run.
        data_files: every file the data came from, by its option (``{"--data": path}``): their
            size and SHA-256 are kept with the run, and ``--resume`` refuses changed data.
    """

    model: nn.Module
    make_optimizer: Callable[[nn.Module], Any]
    batches: BatchSource
    loss_fn: Callable[[nn.Module, Any], Any]
    model_config: Mapping[str, Any]
    evaluate: Callable[[nn.Module], Mapping[str, float]] | None = None
    files: Mapping[str, str | bytes | os.PathLike[str]] = field(default_factory=dict)
    report: Callable[..., None] | None = None
    io: TaskIO | None = None
    data_files: Mapping[str, str | os.PathLike[str]] = field(default_factory=dict)


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """The text of each token, as figures and tables label positions.

    Args:
        tokenizer: the run's tokenizer, or ``None``.
        ids: token ids.

    Returns:
        One label per id: the token's text (the tokenizer's ``token_label`` where it has one:
        a byte-level BPE token as the text it stands for; ``<eos>`` stays visible), or the id
        itself without a tokenizer.
    """
    if tokenizer is None:
        return [str(int(i)) for i in ids]
    label = getattr(tokenizer, "token_label", tokenizer.id_to_token)
    return [str(label(int(i))) for i in ids]


def special_ids(tokenizer: Any) -> list[int]:
    """The ids of a tokenizer's special tokens: bos/eos/pad/unk and added special tokens.

    Args:
        tokenizer: the run's tokenizer, or ``None`` (no special token).

    Returns:
        The ids, sorted, each once.
    """
    if tokenizer is None:
        return []
    ids = [getattr(tokenizer, name, None) for name in ("bos_id", "eos_id", "pad_id", "unk_id")]
    backend = getattr(tokenizer, "tokenizer", None)
    added = getattr(backend, "get_added_tokens_decoder", None)
    if callable(added):
        ids += [i for i, token in added().items() if getattr(token, "special", True)]
    return sorted({int(i) for i in ids if isinstance(i, int)})


@dataclass(frozen=True)
class ModelInputs:
    """Exactly what a model read for one text, and what it wrote.

    For an encoder-decoder (``kind == "seq2seq"``): the encoder reads ``source_ids`` (special
    tokens included, e.g. the ``<eos>`` of the copy/reverse/sort tasks); the decoded sequence is
    ``target_ids = <bos> y_1 … y_n [<eos>]``; the decoder reads ``target_ids[:-1]`` and its row
    ``i`` writes ``target_ids[i + 1]``. ``target_tokens`` label those rows by what they wrote
    (``y_1 … y_n <eos>``), so row ``i`` of a cross-attention map shows where the model looked to
    write token ``i``.

    For a language model (``kind == "lm"``): ``source_ids`` is the prompt and ``target_ids`` the
    continuation the model generated (empty when none was asked for); the model reads both,
    concatenated.

    Attributes:
        kind: ``"seq2seq"`` or ``"lm"``.
        source_ids: what the encoder reads (seq2seq) or the prompt (lm), see above.
        target_ids: the decoded sequence (seq2seq) or the generated continuation (lm).
        source_tokens: labels of ``source_ids``.
        target_tokens: labels of what the decoder rows wrote (seq2seq) or of the continuation (lm).
        output: the decoded output text, as ``attnlab translate`` / ``generate`` print it.
        token_scores: a language model's generated tokens with their probabilities,
            alternatives and entropies (:class:`~attnlab.tasks.token_scores.TokenScore`);
            empty when nothing was generated.
        bidirectional: the model is an encoder (BERT): every token sees every token, no
            look-ahead mask (``kind`` is ``"lm"``: one sequence).
        special_positions: the positions of ``source_ids`` holding special tokens
            (``[CLS]``, ``[SEP]``), which figures and the viewer mark.
    """

    kind: Literal["seq2seq", "lm"]
    source_ids: tuple[int, ...]
    target_ids: tuple[int, ...]
    source_tokens: tuple[str, ...]
    target_tokens: tuple[str, ...]
    output: str
    token_scores: tuple[TokenScore, ...] = ()
    bidirectional: bool = False
    special_positions: tuple[int, ...] = ()

    @property
    def decoder_input_ids(self) -> tuple[int, ...]:
        """What the decoder reads: ``<bos> y_1 … y_n`` (seq2seq only)."""
        return self.target_ids[:-1]

    @property
    def tokens(self) -> tuple[str, ...]:
        """Labels of every position a language model reads (prompt then continuation)."""
        return self.source_tokens + self.target_tokens

    def tensors(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
        """The forward's arguments as batches of one.

        Args:
            device: where to create them; default ``"cpu"``.

        Returns:
            ``(src, tgt_in)`` for seq2seq, ``(input_ids,)`` for a language model (``torch.long``).

        Shape:
            seq2seq: ``src (1, S)``, ``tgt_in (1, T)``; lm: ``input_ids (1, S + T)``.
        """
        if self.kind == "seq2seq":
            src = torch.tensor([self.source_ids], dtype=torch.long, device=device)
            tgt = torch.tensor([self.decoder_input_ids], dtype=torch.long, device=device)
            return src, tgt
        ids = [*self.source_ids, *self.target_ids]
        return (torch.tensor([ids], dtype=torch.long, device=device),)

    def forward(self, model: nn.Module) -> Any:
        """Run ``model`` once on these inputs (teacher forcing the decoded target).

        Args:
            model: the run's model; the inputs go to the device of its parameters.

        Returns:
            What the model's forward returns (a :class:`~attnlab.models.outputs.Seq2SeqOutput` or
            :class:`~attnlab.models.outputs.CausalLMOutput`).
        """
        device = next(model.parameters()).device
        return model(*self.tensors(device))

    def to_dict(self) -> dict[str, Any]:
        """The inputs as plain data, for JSON.

        Returns:
            ``kind``, ``source_tokens``, ``target_tokens``, ``output``, ``source_ids`` and
            ``target_ids``, as lists and strings.
        """
        return {
            "kind": self.kind,
            "source_tokens": list(self.source_tokens),
            "target_tokens": list(self.target_tokens),
            "output": self.output,
            "source_ids": list(self.source_ids),
            "target_ids": list(self.target_ids),
        }


@dataclass(frozen=True)
class EvaluationSet:
    """Held-out data of a run, to measure what removing heads costs
    (:func:`attnlab.inspect.head_importance`, ``attnlab inspect RUN --ablate``).

    Attributes:
        batches: teacher-forced batches the model's default loss reads.
        metric: ``model -> float``, the task's score (e.g. exact-match accuracy of greedy
            decoding), or ``None``.
        metric_name: what the metric is.
    """

    batches: list[Any]
    metric: Callable[[nn.Module], float] | None = None
    metric_name: str = "metric"


@runtime_checkable
class TaskIO(Protocol):
    """A task's one path between text and the model (see the module docstring).

    ``inputs(model, text, **options) -> ModelInputs``: what ``model`` reads for ``text``, with its
    own decoded output as the target (the options are the family's: ``target``/``beams`` for an
    encoder-decoder, ``max_new_tokens``/``strategy`` for a language model; ``source_ids`` for
    token ids read verbatim). ``probe_inputs(text) -> ModelInputs``: a fixed input for recording
    attention during training (no model needed).
    """

    @property
    def kind(self) -> str:
        """``"seq2seq"`` or ``"lm"``."""
        ...

    @property
    def inputs(self) -> Callable[..., ModelInputs]:
        """``inputs(model, text, **options) -> ModelInputs``: what ``model`` reads for ``text``."""
        ...

    @property
    def probe_inputs(self) -> Callable[[str], ModelInputs]:
        """``probe_inputs(text) -> ModelInputs``: the attention probe's fixed input (no model)."""
        ...


@runtime_checkable
class Task(Protocol):
    """What ``attnlab train TASK`` and the commands that read its runs need from a task."""

    name: str
    help: str

    def build(self, args: Any, device: torch.device) -> TaskSetup:
        """Create model, data and optimizer from the options.

        Args:
            args: the task's options (its :class:`~attnlab.tasks.train_options.TrainOptions`
                dataclass, as :func:`attnlab.tasks.train` gives them; the fields are read as
                attributes).
            device: where the model will train.

        Returns:
            Everything the trainer needs (model, optimizer factory, batches, loss, evaluation,
            files to save, the report and the task's text path).
        """
        ...

    def io(self, args: Mapping[str, Any], files: Mapping[str, str]) -> TaskIO:
        """The task's :class:`TaskIO` from a run's saved options and files.

        Args:
            args: the options saved in the run's ``config.json``.
            files: the task files saved in the checkpoint (tokenizers), name → text.

        Returns:
            The run's one path between text and the model.
        """
        ...

    def evaluation_set(self, args: Mapping[str, Any], io: TaskIO, limit: int) -> EvaluationSet:
        """Held-out examples of a run, as batches and a metric (optional).

        Args:
            args: the options saved in the run's ``config.json``.
            io: the run's text path, from :meth:`io`.
            limit: the most examples to use.

        Returns:
            The batches the model's default loss reads, and the task's metric if it has one.
        """
        ...
