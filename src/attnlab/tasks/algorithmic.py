"""``attnlab train copy|reverse|sort``: an encoder-decoder learns a string transformation.

The defaults are those of ``attnlab demo`` (reverse): strings of 1–16 symbols over a 10-letter
alphabet (the encoder reads them followed by ``<eos>``), a 2 + 2 layer Transformer with
``d_model = 128``, 4 heads, ``d_ff = 256``, no dropout, label smoothing 0.1, batch 64, Adam with
the Noam schedule (factor 0.5, 200 warm-up steps). The demo adds ``--cooldown`` (the rate annealed
to 0 over the last third). The score is the exact-match accuracy of greedy decoding on held-out
strings (never seen in training, see :mod:`attnlab.data.toy_sequences`).

The attention pattern is chosen as for ``attnlab train translate`` (``--attention
sliding|linformer|performer|bigbird`` with its parameters, e.g. ``--attention linformer
--linformer-k 8``: the encoder's self-attention over ``k`` projected key rows), checked before any
step and saved with the run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from rich.console import Console
from torch import nn

from attnlab.data.tokenizers import tokenizer_from_json
from attnlab.data.toy_sequences import TASK_NAMES, SequenceTask, SequenceTaskConfig
from attnlab.errors import ArgumentError
from attnlab.models.config import TransformerConfig, config_to_dict
from attnlab.models.transformer import Transformer
from attnlab.tasks.base import EvaluationSet, TaskSetup
from attnlab.tasks.budget import check_training_memory, option_sizes
from attnlab.tasks.figures import save_attention_figures
from attnlab.tasks.registry import register_task
from attnlab.tasks.seq2seq import (
    Seq2SeqIO,
    decode_sources,
    exact_match_accuracy,
    noam_adam_from_args,
    seq2seq_loss,
    transformer_config,
)
from attnlab.tasks.train_options import AlgorithmicOptions
from attnlab.training.trainer import IndexedBatches

__all__ = [
    "AlgorithmicTask",
    "SequenceReport",
    "evaluate_task",
    "report_task",
    "sequence_io",
    "task_model_config",
]

logger = logging.getLogger(__name__)

_HELP = {
    "copy": "copy a string (encoder-decoder; exact-match accuracy on held-out strings)",
    "reverse": "reverse a string (encoder-decoder; the task of `attnlab demo`)",
    "sort": "sort the letters of a string (encoder-decoder; exact-match accuracy)",
}


def model_len(task: SequenceTask) -> int:
    """The positions of a copy/reverse/sort model: the longest string, ``<bos>``/``<eos>``, and
    room to spare (at least 64)."""
    return max(64, task.config.max_len + 2)


def task_model_config(task: SequenceTask, args: Any) -> TransformerConfig:
    """The encoder-decoder for a copy/reverse/sort task.

    Args:
        task: the task (its tokenizer gives both vocabularies, shared embeddings).
        args: the parsed options (sizes, dropout, label smoothing, and the attention pattern of
            :func:`~attnlab.cli.options.add_attention_arguments`; full when unset).

    Returns:
        The model's configuration, with :func:`model_len` positions.

    Raises:
        ValueError: the attention options do not fit together
            (:func:`~attnlab.tasks.train_options.attention_options`).
    """
    tok = task.tokenizer
    return transformer_config(args, tok, tok, max_len=model_len(task), share=True)


@dataclass(frozen=True)
class SequenceReport:
    """The held-out score of a model on a task.

    Attributes:
        accuracy: exact-match accuracy in [0, 1].
        sources: token lists of the held-out strings.
        predictions: the model's greedy outputs for them, token lists.
        targets: the correct outputs, token lists.
    """

    accuracy: float
    sources: list[list[int]]
    predictions: list[list[int]]
    targets: list[list[int]]


def sequence_io(task: SequenceTask, tokenizer: Any = None) -> Seq2SeqIO:
    """The text path of a copy/reverse/sort run: the encoder reads the string then ``<eos>``.

    Args:
        task: the task (its alphabet, lengths and correct answers).
        tokenizer: the run's saved tokenizer; default the task's own (they are equal).

    Returns:
        The task's :class:`~attnlab.tasks.seq2seq.Seq2SeqIO`, refusing characters outside the
        alphabet.

    Raises:
        ValueError: the tokenizer lacks ``<bos>``, ``<eos>`` or ``<pad>``.
    """
    tok = task.tokenizer if tokenizer is None else tokenizer
    bos, eos, pad = tok.bos_id, tok.eos_id, tok.pad_id
    if bos is None or eos is None or pad is None:
        raise ArgumentError(
            "the tokenizer of a copy/reverse/sort run must have <bos>, <eos>, <pad>"
        )
    positions = model_len(task)
    shortest = task.max_target_len
    return Seq2SeqIO(
        src_tok=tok,
        tgt_tok=tok,
        bos_id=bos,
        eos_id=eos,
        pad_id=pad,
        source_suffix=(eos,),
        max_source_len=positions,
        # the target is as long as the source (<eos> included): held-out strings get max_len + 1
        max_new_tokens=lambda n: min(positions - 1, max(shortest, n)),
        reference=task.target,
        reject_unknown=True,
        trained_len=task.config.max_len,  # the positions take more: the answer would be wrong
    )


def evaluate_task(model: nn.Module, task: SequenceTask) -> SequenceReport:
    """Greedy-decode every held-out string and score exact matches.

    Args:
        model: the trained encoder-decoder.
        task: the task whose held-out strings are decoded.

    Returns:
        The accuracy with the sources, predictions and targets.
    """
    io = sequence_io(task)
    sources = task.heldout()
    inputs = [io.source_ids(s) for s in sources]
    predictions = decode_sources(model, inputs, max_new_tokens=io.max_new_tokens)
    targets = [task.target(s) for s in sources]
    return SequenceReport(exact_match_accuracy(predictions, targets), sources, predictions, targets)


def report_task(
    model: nn.Module,
    task: SequenceTask,
    run_dir: str | Path,
    console: Console,
    *,
    examples: int = 5,
    evaluation: SequenceReport | None = None,
) -> SequenceReport:
    """Print the accuracy and a few decoded examples; draw one example's attention.

    Writes ``RUN/attention.png`` (cross-attention of the last decoder layer, mean over heads),
    ``RUN/attention_heads.png`` (every head) and ``RUN/attention.html`` (the interactive viewer
    of every layer) for the longest of the shown examples.

    Args:
        model: the trained encoder-decoder.
        task: its task.
        run_dir: where the figures go.
        console: where the text goes.
        examples: how many decoded examples to print.
        evaluation: a :class:`SequenceReport` of this very model, to reuse instead of decoding.

    Returns:
        The :class:`SequenceReport`.
    """
    report = evaluation if evaluation is not None else evaluate_task(model, task)
    tok = task.tokenizer
    console.print(
        f"exact-match accuracy: {100 * report.accuracy:.1f}%  "
        f"({len(report.sources)} held-out strings, greedy decoding)",
        soft_wrap=True,
    )
    # a spread of lengths, longest first
    by_length = sorted(range(len(report.sources)), key=lambda i: -len(report.sources[i]))
    shown = by_length[:: max(1, len(by_length) // examples)][:examples]
    for i in shown:
        ok = report.predictions[i] == report.targets[i]
        mark = "[green]✓[/green]" if ok else "[red]✗[/red]"
        console.print(
            f"  {mark} {tok.decode(report.sources[i]):<18} → {tok.decode(report.predictions[i])}"
            + ("" if ok else f"   (expected {tok.decode(report.targets[i])})"),
            soft_wrap=True,
        )
    # the figures of the longest shown example, through the one text path of the task
    inputs = sequence_io(task).inputs(model, tok.decode(report.sources[shown[0]]))
    save_attention_figures(
        model, inputs, Path(run_dir), console, title=f"attnlab {task.config.name}: {inputs.output}"
    )
    return report


class AlgorithmicTask:
    """One of copy / reverse / sort as an ``attnlab train`` task.

    Args:
        name: ``"copy"``, ``"reverse"`` or ``"sort"``.
    """

    options = AlgorithmicOptions

    def __init__(self, name: str) -> None:
        if name not in TASK_NAMES:
            raise ArgumentError(f"name must be one of {', '.join(TASK_NAMES)}, got {name!r}")
        self.name = name
        self.help = _HELP[name]

    def make_task(self, args: Any) -> SequenceTask:
        """The :class:`~attnlab.data.toy_sequences.SequenceTask` the options describe.

        Args:
            args: parsed (or saved) options with ``num_symbols``, ``min_len``, ``max_len``,
                ``num_heldout`` and ``seed``.

        Returns:
            The task, its data a function of the seed.
        """
        config = SequenceTaskConfig(
            self.name,
            num_symbols=args.num_symbols,
            min_len=args.min_len,
            max_len=args.max_len,
            num_heldout=args.num_heldout,
        )
        return SequenceTask(config, seed=args.seed)

    def build(self, args: AlgorithmicOptions, device: torch.device) -> TaskSetup:
        """Create the encoder-decoder, its Noam-scheduled Adam, the batches and the evaluation.

        Args:
            args: the task's options (``attnlab train TASK``'s).
            device: where the model will train.

        Returns:
            The trainer's set-up; evaluation is exact-match accuracy on the held-out strings.

        Raises:
            ValueError: options that do not fit together, or sizes whose memory exceeds the
                machine's (:func:`attnlab.tasks.budget.check_training_memory`).
        """
        task = self.make_task(args)
        config = task_model_config(task, args)
        check_training_memory(
            config,
            seq_len=config.max_len,
            batch=args.batch_size,
            device=device,
            model_sizes=option_sizes(args, "d_model", "layers", "d_ff", "max_len"),
            step_sizes=option_sizes(args, "batch_size", "max_len", "d_model", "layers", "d_ff"),
        )
        model = Transformer(config)
        batch_size = args.batch_size

        # the trainer evaluates after the last step and the report follows at once: keep that
        # evaluation (keyed by the parameters' version counters) instead of decoding twice
        last: dict[str, Any] = {}

        def fingerprint(m: nn.Module) -> tuple[int, ...]:
            return tuple(p._version for p in m.parameters())

        def evaluate(m: nn.Module) -> dict[str, Any]:
            last["report"], last["key"] = evaluate_task(m, task), fingerprint(m)
            return {"exact_match": last["report"].accuracy}

        def report(m: nn.Module, run_dir: Path, console: Console) -> None:
            fresh = last.get("report") if last.get("key") == fingerprint(m) else None
            report_task(m, task, run_dir, console, evaluation=fresh)

        io = sequence_io(task)
        return TaskSetup(
            model=model,
            make_optimizer=noam_adam_from_args(args, config.d_model),
            batches=IndexedBatches(lambda step: task.batch(step, batch_size)),
            loss_fn=seq2seq_loss(config.pad_id, config.label_smoothing),
            model_config=config_to_dict(config),
            evaluate=evaluate,
            files={"tokenizer.json": task.tokenizer.to_json()},
            report=report,
            io=io,
        )

    def evaluation_set(self, args: Mapping[str, Any], io: Any, limit: int) -> EvaluationSet:
        """The first ``limit`` held-out strings: batches of 64 and greedy exact-match accuracy.

        Args:
            args: the options saved in the run's ``config.json``.
            io: the run's text path (its source ids and output lengths).
            limit: the most held-out strings to use.

        Returns:
            The batches and the exact-match accuracy metric.
        """
        task = self.make_task(SimpleNamespace(**args))
        sources = task.heldout()[:limit]
        batches = [task.make_batch(sources[i : i + 64]) for i in range(0, len(sources), 64)]
        targets = [task.target(s) for s in sources]
        inputs = [io.source_ids(s) for s in sources]

        def accuracy(model: nn.Module) -> float:
            predictions = decode_sources(model, inputs, max_new_tokens=io.max_new_tokens)
            return exact_match_accuracy(predictions, targets)

        return EvaluationSet(batches, accuracy, "exact-match accuracy")

    def io(self, args: Mapping[str, Any], files: Mapping[str, str]) -> Seq2SeqIO:
        """The run's text path, from its saved options and ``tokenizer.json``.

        Args:
            args: the options saved in the run's ``config.json``.
            files: the task files of the checkpoint; ``"tokenizer.json"`` when present.

        Returns:
            The run's :class:`~attnlab.tasks.seq2seq.Seq2SeqIO`.
        """
        task = self.make_task(SimpleNamespace(**args))
        tok = tokenizer_from_json(files["tokenizer.json"]) if "tokenizer.json" in files else None
        return sequence_io(task, tok)


for _name in TASK_NAMES:
    register_task(AlgorithmicTask(_name))
