"""``attnlab train lm --data NAME|FILE [--bpe]``: a GPT language model on a packaged dataset
(``--data tinyshakespeare``, see :mod:`attnlab.data.corpora`) or any UTF-8 text file.

Defaults are nanoGPT's ``shakespeare_char`` recipe for a CPU (Karpathy's README): 4 layers,
4 heads, ``n_embd = 128``, context 64, batch 12, no dropout, AdamW (β₂ = 0.99, weight decay 0.1
on matrices), learning rate 1e-3 with 100 warm-up steps and cosine decay to 1e-4 by the last step
(``--lr-decay-steps`` defaults to ``--steps``: a short run ends at the low rate, not the peak).
The first 90% of the text trains, the last 10% validates. Characters are the tokens unless
``--bpe`` trains a byte-level BPE vocabulary (on the training part only).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from rich.console import Console
from torch import nn

from attnlab._budget import check_bpe_vocab
from attnlab._checks import check_seed
from attnlab.data import corpora
from attnlab.data.text import LMBatch, LMBatchSource, read_text_file, split_train_val
from attnlab.data.tokenizers import CharTokenizer, HFTokenizer, tokenizer_from_json, train_bpe
from attnlab.decoding.generate import STRATEGIES, generate
from attnlab.decoding.scores import Generation, merge_generations
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.config import GPTConfig, config_to_dict
from attnlab.models.families import preset
from attnlab.models.gpt import GPT
from attnlab.nn.kinds import AttentionSpec, SlidingSpec
from attnlab.tasks.base import (
    EvaluationSet,
    ModelInputs,
    TaskSetup,
    check_finite_weights,
    token_labels,
)
from attnlab.tasks.budget import check_training_memory, option_sizes
from attnlab.tasks.registry import register_task
from attnlab.tasks.token_scores import token_scores
from attnlab.tasks.train_options import LMOptions, attention_options, warmup_steps
from attnlab.training.losses import TokenLoss, token_loss
from attnlab.training.schedules import WarmupCosineLR
from attnlab.training.trainer import IndexedBatches

__all__ = [
    "LMIO",
    "LMCorpus",
    "LanguageModelTask",
    "generate_text",
    "lm_config",
    "lm_data_files",
    "lm_loss",
    "load_corpus",
    "read_lm_text",
]

logger = logging.getLogger(__name__)

_TRAIN_STREAM, _VAL_STREAM, _TRAIN_EVAL_STREAM = 0, 1, 2


@dataclass(frozen=True)
class LMCorpus:
    """A tokenized text split 90 / 10.

    Attributes:
        tokenizer: characters or BPE.
        train: the 1-D token stream of the first 90% of the text.
        val: the 1-D token stream of the last 10%.

    Shape:
        train ``(N_train,)``, val ``(N_val,)``, ``torch.long``.
    """

    tokenizer: CharTokenizer | HFTokenizer
    train: torch.Tensor
    val: torch.Tensor


def read_lm_text(data: str | os.PathLike[str]) -> str:
    """The text of ``--data``: a packaged text dataset by name, else a file.

    A packaged dataset's name (:mod:`attnlab.data.corpora`, e.g. ``"tinyshakespeare"``) is that
    dataset; any other value is a path (a file called like a dataset is ``./tinyshakespeare``).

    Args:
        data: a dataset's name or a UTF-8 text file.

    Returns:
        The text.

    Raises:
        ValueError: neither a packaged dataset nor a readable text file (one line; a bare
            name lists the packaged datasets).
    """
    if corpora.is_dataset(data, kind="text"):
        return corpora.load_text(str(data))
    path = Path(data)
    if not path.exists() and len(path.parts) == 1:
        known = ", ".join(corpora.names("text"))
        raise ArgumentError(
            f"--data must be a text file or a packaged text dataset ({known}), got {str(data)!r}: "
            f"--data file not found"
        )
    return read_text_file(path, what="--data file")


def lm_data_files(data: str | os.PathLike[str]) -> dict[str, str | os.PathLike[str]]:
    """What a run fingerprints for ``--data`` (:class:`~attnlab.tasks.base.TaskSetup`'s
    ``data_files``): the file, or the packaged dataset's compressed file.

    Args:
        data: a dataset's name or a text file.

    Returns:
        ``{"--data": path}``, or ``{}`` for a dataset not on the file system.
    """
    if corpora.is_dataset(data, kind="text"):
        name = str(data)
        packaged = corpora.resource_file(name, corpora.dataset(name).files[0])
        return {} if packaged is None else {"--data": packaged}
    return {"--data": data}


def load_corpus(
    path: str | os.PathLike[str], *, bpe: bool = False, bpe_vocab: int = 1024
) -> LMCorpus:
    """Read, tokenize and split a text (first 90% train, last 10% validation).

    Args:
        path: a UTF-8 text file, or the name of a packaged text dataset
            (``"tinyshakespeare"``, see :func:`read_lm_text`).
        bpe: train a byte-level BPE vocabulary on the training text instead of using characters.
        bpe_vocab: its size.

    Returns:
        An :class:`LMCorpus`.

    Raises:
        ValueError: the file is missing, empty, not UTF-8, or too short to split.
    """
    text = read_lm_text(path)
    if bpe:
        # split the characters first, so that the vocabulary never sees the validation text
        n = int(0.9 * len(text))
        if n == 0 or n == len(text):
            raise ArgumentError(
                f"--data file is too short to split 90% / 10%: {len(text)} characters"
            )
        tokenizer: CharTokenizer | HFTokenizer = train_bpe(
            [text[:n]], bpe_vocab, byte_level=True, specials=()
        )
        train = torch.tensor(tokenizer.encode(text[:n]), dtype=torch.long)
        val = torch.tensor(tokenizer.encode(text[n:]), dtype=torch.long)
        return LMCorpus(tokenizer, train, val)
    # nanoGPT: the vocabulary is every character of the file; the split is on characters
    tokenizer = CharTokenizer.train(text)
    data = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    train, val = split_train_val(data, 0.9)
    return LMCorpus(tokenizer, train, val)


def lm_loss(model: nn.Module, batch: LMBatch) -> TokenLoss:
    """Mean next-token cross-entropy over every position of the batch (nanoGPT's loss).

        loss = −(1 / BT) Σ_{b,t} log softmax(logits[b, t])[targets[b, t]]

    Args:
        model: the GPT.
        batch: inputs and their next-token targets.

    Returns:
        The mean loss over ``B · T`` positions, with that count.

    Shape:
        batch.input_ids and batch.targets ``(B, T)``; logits ``(B, T, vocab_size)``; loss ``()``.
    """
    logits = model(batch.input_ids).logits  # (B, T, V)
    return token_loss(logits, batch.targets)


@torch.no_grad()
def estimate_loss(model: nn.Module, source: LMBatchSource, iters: int) -> float:
    """The mean loss over ``iters`` batches of ``source`` (nanoGPT's ``estimate_loss``)."""
    device = next(model.parameters()).device
    total = 0.0
    for i in range(iters):
        b = source.batch(i)
        batch = LMBatch(b.input_ids.to(device), b.targets.to(device))
        total += float(lm_loss(model, batch).loss)
    return total / iters


def adamw_nanogpt(
    lr: float, weight_decay: float, warmup: int, decay_steps: int, min_lr: float
) -> Any:
    """``model -> (AdamW, WarmupCosineLR)``; weight decay on matrices only, as nanoGPT."""

    def make(model: nn.Module) -> tuple[torch.optim.Optimizer, WarmupCosineLR]:
        params = [p for p in model.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99))
        return opt, WarmupCosineLR(opt, warmup, decay_steps, min_ratio=min_lr / lr)

    return make


def generate_text(
    model: nn.Module,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    scores: list[Generation] | None = None,
    **kwargs: Any,
) -> list[int]:
    """Generate past the context length by sliding the window (oldest tokens dropped, as
    nanoGPT's ``sample.py``).

    Args:
        model: a GPT.
        prompt_ids: the prompt's token ids (at least one).
        max_new_tokens: how many tokens to add.
        scores: a list that receives the scores of the whole continuation, one
            :class:`~attnlab.decoding.scores.Generation` (the calls of each window merged,
            :func:`~attnlab.decoding.scores.merge_generations`); ``None`` (default): none kept.
        **kwargs: passed to :func:`attnlab.generate` (strategy, temperature, generator, …).

    Returns:
        The prompt's ids followed by the new ones.
    """
    n_pos: int = model.config.n_positions  # type: ignore[union-attr,assignment]
    device = next(model.parameters()).device
    if n_pos < 2:
        raise ArgumentError(
            f"the model's context must hold at least 2 tokens, got n_positions={n_pos}"
        )
    ids = list(prompt_ids)
    remaining = max_new_tokens
    parts: list[Generation] = []
    while remaining > 0:
        chunk = min(remaining, max(1, n_pos // 2))
        context = ids[-(n_pos - chunk) :]
        prompt = torch.tensor([context], dtype=torch.long, device=device)
        if scores is None:
            out = generate(model, prompt, max_new_tokens=chunk, **kwargs)
        else:
            parts.append(generate(model, prompt, max_new_tokens=chunk, return_scores=True,
                                  **kwargs))  # fmt: skip
            out = parts[-1].sequences
        new = out[0, len(context) :].tolist()
        ids.extend(new)
        remaining -= chunk
        if len(new) < chunk:  # stopped on an end token
            break
    if scores is not None:
        scores.append(merge_generations(parts, torch.tensor([ids], dtype=torch.long)))
    return ids


def _check_new_tokens(max_new_tokens: object) -> None:
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or max_new_tokens < 0
    ):
        raise ArgumentError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")


@dataclass(frozen=True)
class LMIO:
    """The one path between text and a language model's input (see :mod:`attnlab.tasks.base`):
    the text's tokens, no special tokens added; the output is the prompt and its continuation.

    Args:
        tokenizer: characters or BPE (``None`` for a run saved without one: ids only).
        n_positions: the model's context length.
        kind: always ``"lm"`` (the :class:`~attnlab.tasks.base.TaskIO` family).
        eos_id: generation stops after this token (a pretrained model's end token), or
            ``None`` (default: it runs for ``max_new_tokens``).
    """

    tokenizer: Any
    n_positions: int
    kind: Literal["lm"] = "lm"
    eos_id: int | None = None

    def encode(self, text: str) -> list[int]:
        """The prompt's ids.

        Args:
            text: the prompt.

        Returns:
            Its token ids, no special token added.

        Raises:
            TypeError: ``text`` is not a str.
            ValueError: ``text`` encodes to no token, or the run has no tokenizer.
        """
        if not isinstance(text, str):
            raise ArgumentTypeError(f"text must be a str, got {type(text).__name__}")
        if self.tokenizer is None:
            raise ArgumentError("the run holds no tokenizer.json, so a text cannot be encoded")
        ids = list(self.tokenizer.encode(text))
        if not ids:
            raise ArgumentError(f"the text {text!r} encodes to no tokens")
        return ids

    def generate(
        self,
        model: nn.Module,
        text: str | None,
        *,
        max_new_tokens: int,
        strategy: str = "greedy",
        seed: int = 0,
        source_ids: Sequence[int] | None = None,
        scores: list[Generation] | None = None,
        **options: Any,
    ) -> list[int]:
        """Prompt ids followed by ``max_new_tokens`` new ones (see :func:`generate_text`).

        Args:
            model: the GPT.
            text: the prompt.
            max_new_tokens: how many tokens to add (0: none).
            strategy: ``"greedy"``, ``"sample"`` or ``"beam"``.
            seed: the sampling generator's seed.
            source_ids: the prompt's ids verbatim, instead of ``text``.
            scores: a list that receives the continuation's scores (see :func:`generate_text`;
                nothing for ``max_new_tokens=0``).
            **options: ``temperature``, ``top_k``, ``top_p`` (sampling), ``num_beams`` (beam),
                ``num_alternatives`` (with ``scores``).

        Returns:
            The prompt's ids followed by the new ones (the prompt alone for ``max_new_tokens=0``).

        Raises:
            ValueError: the prompt alone has more tokens than the model's context (refused,
                never cut; past the context the *continuation* slides, see :func:`generate_text`).
        """
        if strategy not in STRATEGIES:
            raise ArgumentError(
                f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}"
            )
        _check_new_tokens(max_new_tokens)
        ids = list(source_ids) if source_ids is not None else self.encode(text or "")
        if len(ids) > self.n_positions:  # never cut: its head (a chat template's) would be lost
            raise ArgumentError(
                f"the prompt has {len(ids)} tokens, more than the model's limit of "
                f"{self.n_positions}; shorten it"
            )
        if max_new_tokens == 0:
            return ids
        check_finite_weights(model)
        kwargs: dict[str, Any] = {"strategy": strategy}
        if self.eos_id is not None:
            kwargs["eos_token_id"] = self.eos_id
        if strategy == "sample":
            device = next(model.parameters()).device
            kwargs["generator"] = torch.Generator(device=device).manual_seed(
                check_seed("seed", seed)
            )
            kwargs.update(
                {k: options[k] for k in ("temperature", "top_k", "top_p") if k in options}
            )
        elif strategy == "beam" and "num_beams" in options:
            kwargs["num_beams"] = options["num_beams"]
        if "num_alternatives" in options:
            kwargs["num_alternatives"] = options["num_alternatives"]
        return generate_text(model, ids, max_new_tokens=max_new_tokens, scores=scores, **kwargs)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of some ids.

        Args:
            ids: token ids.

        Returns:
            The decoded text, or the ids joined by spaces when the run has no tokenizer.
        """
        if self.tokenizer is None:
            return " ".join(str(int(i)) for i in ids)
        return str(self.tokenizer.decode(list(ids)))

    def inputs(
        self,
        model: nn.Module,
        text: str | None,
        *,
        max_new_tokens: int = 0,
        source_ids: Sequence[int] | None = None,
        **options: Any,
    ) -> ModelInputs:
        """What ``model`` reads for ``text`` (or ``source_ids``) and the continuation it writes.

        Args:
            model: the GPT.
            text: the prompt (ignored when ``source_ids`` is given).
            max_new_tokens: how many tokens to generate after it; default 0 (none).
            source_ids: the prompt's ids verbatim, instead of ``text``.
            **options: as :meth:`generate` (``strategy``, ``seed``, ``temperature``, ...).

        Returns:
            The prompt and the continuation, with their token labels and the output text.

        Raises:
            ValueError: the prompt and ``max_new_tokens`` do not fit the model's context, so one
                forward could not see them all (checked before anything is generated).
        """
        prompt = list(source_ids) if source_ids is not None else self.encode(text or "")
        _check_new_tokens(max_new_tokens)
        if len(prompt) + max_new_tokens > self.n_positions:  # before generating any of them
            more = f" and {max_new_tokens} new ones (max_new_tokens)" if max_new_tokens else ""
            raise ArgumentError(
                f"the text has {len(prompt)} tokens{more}: {len(prompt) + max_new_tokens}, "
                f"more than the model's limit of {self.n_positions}"
            )
        scores: list[Generation] = []
        ids = self.generate(
            model, None, max_new_tokens=max_new_tokens, source_ids=prompt, scores=scores, **options
        )
        inputs = self._model_inputs(ids[: len(prompt)], ids[len(prompt) :])
        if not scores:
            return inputs
        return replace(inputs, token_scores=tuple(token_scores(self.tokenizer, scores[0])))

    def probe_inputs(self, text: str) -> ModelInputs:
        """The text's tokens, without a continuation (the attention probe's input).

        Args:
            text: the probe text.

        Returns:
            The model's input for ``text``.

        Raises:
            ValueError: the text is longer than the model's context.
        """
        ids = self.encode(text)
        if len(ids) > self.n_positions:
            raise ArgumentError(
                f"the probe text has {len(ids)} tokens, more than the model's limit of "
                f"{self.n_positions}"
            )
        return self._model_inputs(ids, [])

    def _model_inputs(self, prompt: list[int], new: list[int]) -> ModelInputs:
        return ModelInputs(
            kind="lm",
            source_ids=tuple(prompt),
            target_ids=tuple(new),
            source_tokens=tuple(token_labels(self.tokenizer, prompt)),
            target_tokens=tuple(token_labels(self.tokenizer, new)),
            output=self.decode([*prompt, *new]),
        )


def lm_config(args: LMOptions, vocab_size: int, attention: AttentionSpec) -> GPTConfig:
    """The model of ``attnlab train lm``: the family's parts
    (:func:`attnlab.models.families.preset`), the options' sizes, biases and attention. A Llama
    with a sliding window is Mistral (``family="mistral"``, the Hugging Face class it exports to).

    Args:
        args: the task's options.
        vocab_size: the tokenizer's vocabulary.
        attention: the attention kind.

    Returns:
        The validated config.

    Raises:
        ValueError: options that do not fit together (``--attention performer`` with a family
            whose positions are rotary; a head width RoPE cannot rotate).
    """
    parts = preset(args.family, n_embd=args.n_embd, n_head=args.n_head)
    parts["bias"] = bool(args.bias)
    if args.family == "llama" and isinstance(attention, SlidingSpec):
        parts["family"] = "mistral"
    try:
        return GPTConfig(
            vocab_size=vocab_size,
            n_positions=args.block_size,
            n_embd=args.n_embd,
            n_layer=args.n_layer,
            n_head=args.n_head,
            dropout=args.dropout,
            attention=attention,
            **parts,
        )
    except ArgumentError as err:
        if args.family == "gpt2":
            raise
        raise ArgumentError(f"--family {args.family}: {err}") from err


class LanguageModelTask:
    """``attnlab train lm``."""

    name = "lm"
    options = LMOptions
    help = "a GPT language model on a packaged dataset or a UTF-8 text file (characters, or BPE)"

    def build(self, args: LMOptions, device: torch.device) -> TaskSetup:
        """Create the GPT, AdamW with warmup and cosine decay, the batches and the evaluation.

        Args:
            args: the task's options (``attnlab train lm``'s).
            device: where the model will train.

        Returns:
            The trainer's set-up; evaluation estimates the training and validation losses.

        Raises:
            ValueError: inconsistent options (``--warmup`` not below the decay's length,
                ``--min-lr`` above ``--lr``, attention options that do not fit together), a split shorter than ``--block-size``, or sizes whose memory exceeds the machine's
                (:func:`attnlab.tasks.budget.check_training_memory`), all before any allocation.
        """
        decay_steps = args.steps if args.lr_decay_steps is None else args.lr_decay_steps
        warmup = warmup_steps(args)  # a default one fits the run's length
        if warmup >= decay_steps:
            where = "--lr-decay-steps" if args.lr_decay_steps is not None else "--steps"
            raise ArgumentError(
                f"--warmup must be < the cosine decay's length ({where} = {decay_steps}, "
                f"--lr-decay-steps defaults to --steps), got {warmup}"
            )
        if args.min_lr > args.lr:
            raise ArgumentError(f"--min-lr must be at most --lr ({args.lr}), got {args.min_lr}")
        attention = attention_options(args.attention, causal_only=True)
        if args.bpe:  # the BPE trainer reserves its whole vocabulary up front
            check_bpe_vocab("--bpe-vocab", args.bpe_vocab)
        corpus = load_corpus(args.data, bpe=args.bpe, bpe_vocab=args.bpe_vocab)
        for split, ids in (("training", corpus.train), ("validation", corpus.val)):
            if len(ids) <= args.block_size:
                raise ArgumentError(
                    f"--block-size must be below the {split} split's length: {args.data} gives "
                    f"{len(ids)} {split} tokens (the last 10% validate), --block-size is "
                    f"{args.block_size}; use a longer file or a smaller --block-size"
                )
        config = lm_config(args, corpus.tokenizer.vocab_size, attention["attention"])
        check_training_memory(
            config,
            seq_len=args.block_size,
            batch=args.batch_size,
            device=device,
            model_sizes=option_sizes(
                args, "n_embd", "n_layer", "block_size", *(["bpe_vocab"] if args.bpe else [])
            ),
            step_sizes=option_sizes(args, "batch_size", "block_size", "n_embd", "n_layer"),
        )
        model = GPT(config)
        train = LMBatchSource(
            corpus.train, args.block_size, args.batch_size, args.seed, _TRAIN_STREAM
        )
        val = LMBatchSource(corpus.val, args.block_size, args.batch_size, args.seed, _VAL_STREAM)
        train_eval = LMBatchSource(
            corpus.train, args.block_size, args.batch_size, args.seed, _TRAIN_EVAL_STREAM
        )
        iters = args.eval_iters

        def evaluate(m: nn.Module) -> dict[str, float]:
            return {
                "train_loss": estimate_loss(m, train_eval, iters),
                "val_loss": estimate_loss(m, val, iters),
            }

        def report(m: nn.Module, run_dir: Path, console: Console) -> None:
            tok = corpus.tokenizer
            dev = next(m.parameters()).device
            start = torch.tensor([corpus.val[:1].tolist()], dtype=torch.long, device=dev)
            ids = generate(
                m, start, max_new_tokens=min(200, config.n_positions - 1), strategy="sample",
                top_k=None, generator=torch.Generator(device=dev).manual_seed(args.seed),
            )  # fmt: skip
            console.print("sample:")
            console.print(
                tok.decode(ids[0].tolist()), markup=False, highlight=False, soft_wrap=True
            )

        return TaskSetup(
            model=model,
            make_optimizer=adamw_nanogpt(
                args.lr, args.weight_decay, warmup, decay_steps, args.min_lr
            ),
            batches=IndexedBatches(train.batch),
            loss_fn=lm_loss,
            model_config=config_to_dict(config),
            evaluate=evaluate,
            files={"tokenizer.json": corpus.tokenizer.to_json()},
            report=report,
            io=LMIO(corpus.tokenizer, config.n_positions),
            data_files=lm_data_files(args.data),
        )

    def evaluation_set(self, args: Mapping[str, Any], io: Any, limit: int) -> EvaluationSet:
        """Validation batches of the run's ``--data`` file (at most ``limit`` sequences).

        Args:
            args: the options saved in the run's ``config.json``.
            io: the run's text path (its tokenizer is compared with the file's).
            limit: the most sequences to use (at least one batch).

        Returns:
            The validation batches; no metric (the loss is the measure).

        Raises:
            ValueError: the file changed since the run was trained, so that its tokens would not
                be the ones the model knows (its vocabulary is not the run's saved one).
        """
        corpus = load_corpus(args["data"], bpe=args["bpe"], bpe_vocab=args["bpe_vocab"])
        saved = getattr(io, "tokenizer", None)
        if saved is not None and corpus.tokenizer.to_json() != saved.to_json():
            raise ArgumentError(
                f"the --data file {args['data']} changed since the run was trained: its "
                f"vocabulary is not the run's, so its tokens would be read as other ones"
            )
        block, size = int(args["block_size"]), int(args["batch_size"])
        val = LMBatchSource(corpus.val, block, size, int(args["seed"]), _VAL_STREAM)
        return EvaluationSet([val.batch(i) for i in range(max(1, limit // size))])

    def io(self, args: Mapping[str, Any], files: Mapping[str, str]) -> LMIO:
        """The run's text path, from its saved ``tokenizer.json``.

        Args:
            args: the options saved in the run's ``config.json`` (``block_size``).
            files: the task files of the checkpoint.

        Returns:
            The run's :class:`LMIO`.

        Raises:
            ValueError: the run holds no ``tokenizer.json``.
        """
        if "tokenizer.json" not in files:
            raise ArgumentError("the language-model run holds no tokenizer.json")
        return LMIO(tokenizer_from_json(files["tokenizer.json"]), int(args["block_size"]))


register_task(LanguageModelTask())
