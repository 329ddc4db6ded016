"""``attnlab train translate --src FILE --tgt FILE [--dev-src --dev-tgt --test-src --test-tgt]``,
or ``attnlab train translate --corpus small_parallel_enja``.

An encoder-decoder Transformer on a parallel corpus: the user's files, or a packaged dataset
(:mod:`attnlab.data.corpora`) with its train, dev and test splits. Source and target tokenizers (BPE, or
word-level with ``--tokenizer word``) are trained locally on the training files. Batches hold
sentences of similar length (``--max-tokens`` padded tokens each). Evaluation gives the dev loss
and the dev BLEU of greedy decoding; at the end the test split (or dev, when there is no test
split) is translated with beam search and scored with sacrebleu; the translations are written to
``RUN/test.hyp`` and the score to ``RUN/bleu.json``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import nn

from attnlab._budget import check_bpe_vocab
from attnlab.data import corpora
from attnlab.data.batching import BucketedBatchSource, make_seq2seq_batch
from attnlab.data.parallel import ParallelCorpus, read_parallel
from attnlab.data.tokenizers import HFTokenizer, tokenizer_from_json, train_bpe, train_word_level
from attnlab.errors import ArgumentError
from attnlab.models.config import config_to_dict
from attnlab.models.transformer import Transformer
from attnlab.tasks.base import EvaluationSet, TaskSetup
from attnlab.tasks.budget import check_training_memory, option_sizes
from attnlab.tasks.registry import register_task
from attnlab.tasks.seq2seq import Seq2SeqIO, noam_adam_from_args, seq2seq_loss, transformer_config
from attnlab.tasks.train_options import BLEU_TOKENIZERS, TranslateOptions
from attnlab.training.trainer import IndexedBatches

__all__ = [
    "BLEU_TOKENIZERS",
    "TranslateData",
    "TranslationTask",
    "corpus_bleu",
    "load_translate_data",
    "translation_io",
]

logger = logging.getLogger(__name__)

SRC_TOKENIZER, TGT_TOKENIZER = "src_tokenizer.json", "tgt_tokenizer.json"
#: the run's training lengths: ``{"longest_source": N}`` (tokens, after the training cut)
TRAIN_LENGTHS = "train_lengths.json"


def check_bleu_tokenizer(tokenize: str) -> None:
    """Score one sentence with ``tokenize`` now, so that a tokenizer that cannot run (an extra
    package missing, e.g. ``ja-mecab``) fails before training rather than at its first evaluation.

    Raises:
        ValueError: the tokenizer is not one of :data:`BLEU_TOKENIZERS` or cannot run.
    """
    if tokenize not in BLEU_TOKENIZERS:
        raise ArgumentError(
            f"--bleu-tokenize must be one of {', '.join(BLEU_TOKENIZERS)}, got {tokenize!r}"
        )
    try:
        corpus_bleu(["a b c d"], ["a b c d"], tokenize)
    except Exception as exc:  # sacrebleu reports a missing package in many ways
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        why = lines[0] if lines else type(exc).__name__
        raise ArgumentError(f"--bleu-tokenize {tokenize} cannot run here: {why}") from None


def corpus_bleu(
    hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "13a"
) -> float:
    """Corpus BLEU (Papineni et al. 2002) with sacrebleu, on a 0–100 scale.

    Args:
        hypotheses: the model's outputs, one per sentence.
        references: the reference translations, one per sentence.
        tokenize: sacrebleu's tokenizer; default ``"13a"`` (``"ja-mecab"``, ``"zh"``, ...).

    Returns:
        The BLEU score.
    """
    import sacrebleu

    return float(
        sacrebleu.corpus_bleu(list(hypotheses), [list(references)], tokenize=tokenize).score
    )


@dataclass
class TranslateData:
    """Tokenizers and splits of a translation task.

    Attributes:
        src_tok: the source tokenizer (trained on the training split).
        tgt_tok: the target tokenizer (trained on the training split).
        train: the training pairs.
        dev: the development pairs, or ``None``.
        test: the test pairs, or ``None``.
    """

    src_tok: HFTokenizer
    tgt_tok: HFTokenizer
    train: ParallelCorpus
    dev: ParallelCorpus | None
    test: ParallelCorpus | None


#: the file options that a packaged ``--corpus`` replaces
_FILE_OPTIONS = ("src", "tgt", "dev_src", "dev_tgt", "test_src", "test_tgt")


def check_data_options(args: Any) -> None:
    """Refuse data options that do not fit together: ``--corpus`` or ``--src`` and ``--tgt``.

    Args:
        args: the task's options (``corpus`` and the file options).

    Raises:
        ValueError: both ``--corpus`` and a file, neither, or one file of a pair alone.
    """
    corpus = getattr(args, "corpus", None)
    given = [name for name in _FILE_OPTIONS if getattr(args, name, None) is not None]
    if corpus is not None:
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise ArgumentError(
                f"{flag} does not combine with --corpus {corpus} (it brings its train, dev and "
                f"test splits): give either --corpus or the files"
            )
        corpora.dataset(corpus, kind="parallel")
        return
    if args.src is None or args.tgt is None:
        known = ", ".join(corpora.names("parallel"))
        raise ArgumentError(
            f"the training data must be --src and --tgt files or --corpus NAME ({known}), "
            f"got {'--src' if args.src is not None else '--tgt' if args.tgt is not None else 'none'}"
        )
    for split in ("dev", "test"):
        if (getattr(args, f"{split}_src") is None) != (getattr(args, f"{split}_tgt") is None):
            raise ArgumentError(f"--{split}-src and --{split}-tgt must be given together")


def _pair(args: Any, split: str) -> ParallelCorpus | None:
    corpus = getattr(args, "corpus", None)
    if corpus is not None:
        return corpora.load_parallel(corpus, split)
    prefix = "" if split == "train" else f"{split}_"
    src, tgt = getattr(args, f"{prefix}src"), getattr(args, f"{prefix}tgt")
    return None if src is None else read_parallel(src, tgt, what=split)


def _data_files(args: Any) -> dict[str, Any]:
    """The files the run reads, by option (``--src``, ``--tgt``, and the dev/test ones given;
    a packaged ``--corpus``'s compressed files)."""
    corpus = getattr(args, "corpus", None)
    if corpus is not None:
        packaged = {f: corpora.resource_file(corpus, f) for f in corpora.dataset(corpus).files}
        return {f"--corpus {f}": path for f, path in packaged.items() if path is not None}
    files = {"--src": args.src, "--tgt": args.tgt}
    for split in ("dev", "test"):
        for side in ("src", "tgt"):
            path = getattr(args, f"{split}_{side}")
            if path is not None:
                files[f"--{split}-{side}"] = path
    return files


def load_translate_data(args: Any) -> TranslateData:
    """Read the files named by the options and train the two tokenizers on the training split.

    Args:
        args: parsed options with ``src``, ``tgt``, the optional ``dev_*``/``test_*`` files (or
            a packaged ``corpus``), ``tokenizer`` (``"word"`` or BPE) and the vocabulary sizes.

    Returns:
        The tokenizers and the splits.

    Raises:
        ValueError: the data options do not fit together (:func:`check_data_options`), a
            file cannot be read, or a BPE vocabulary too large to train on this machine.
    """
    check_data_options(args)
    train = _pair(args, "train")
    if train is None:  # check_data_options refuses this first: kept for callers that skip it
        raise ArgumentError("translation needs training data: --corpus NAME, or --src and --tgt")
    dev, test = _pair(args, "dev"), _pair(args, "test")
    if args.tokenizer == "word":
        src_tok = train_word_level(train.src, args.src_vocab)
        tgt_tok = train_word_level(train.tgt, args.tgt_vocab)
    else:  # the BPE trainer reserves its whole vocabulary up front
        for flag, size in (("--src-vocab", args.src_vocab), ("--tgt-vocab", args.tgt_vocab)):
            check_bpe_vocab(flag, size)  # both before either is trained
        src_tok = train_bpe(train.src, args.src_vocab)
        tgt_tok = train_bpe(train.tgt, args.tgt_vocab)
    return TranslateData(src_tok, tgt_tok, train, dev, test)


def _encode_all(tok: HFTokenizer, lines: Sequence[str], limit: int) -> list[list[int]]:
    return [tok.encode(line)[:limit] for line in lines]


#: the model's positions (source and target sides)
MAX_LEN = 256


def translation_io(
    src_tok: Any,
    tgt_tok: Any,
    beams: int,
    max_len: int = MAX_LEN,
    *,
    longest_trained: int | None = None,
) -> Seq2SeqIO:
    """The text path of a translation run: the encoder reads the sentence's tokens, nothing more;
    the decoder may write up to ``2 · S + 10`` tokens (at most ``max_len − 1``), with the run's
    final beam size by default.

    Args:
        src_tok: the source tokenizer.
        tgt_tok: the target tokenizer (it gives the special ids).
        beams: the default beam size.
        max_len: the model's positions; default ``MAX_LEN``.
        longest_trained: the longest training source in tokens: a longer sentence is translated
            with a warning (:attr:`~attnlab.tasks.seq2seq.Seq2SeqIO.longest_trained`); default
            ``None``, no warning.

    Returns:
        The run's :class:`~attnlab.tasks.seq2seq.Seq2SeqIO`.
    """
    return Seq2SeqIO(
        src_tok=src_tok,
        tgt_tok=tgt_tok,
        bos_id=tgt_tok.bos_id,
        eos_id=tgt_tok.eos_id,
        pad_id=tgt_tok.pad_id,
        source_suffix=(),
        max_source_len=max_len - 2,
        max_new_tokens=lambda n: min(max_len - 1, 2 * n + 10),
        beams=beams,
        longest_trained=longest_trained,
    )


class TranslationTask:
    """``attnlab train translate``."""

    name = "translate"
    options = TranslateOptions
    help = (
        "an encoder-decoder on a packaged corpus (--corpus) or parallel text files (BPE trained "
        "locally; BLEU with beam search)"
    )

    def build(self, args: TranslateOptions, device: torch.device) -> TaskSetup:
        # the options the evaluation and the final report use, checked before any step
        """Read the corpus, train the tokenizers, and create the encoder-decoder, its Noam-scheduled
        Adam, length-bucketed batches and the dev evaluation (loss and greedy BLEU).

        Args:
            args: the task's options (``attnlab train translate``'s).
            device: where the model will train.

        Returns:
            The trainer's set-up; its report writes the test (else dev) BLEU with beam search.

        Raises:
            ValueError: options that do not fit together, unreadable data, or sizes whose memory
                exceeds the machine's (:func:`attnlab.tasks.budget.check_training_memory`).
        """
        check_bleu_tokenizer(args.bleu_tokenize)
        data = load_translate_data(args)
        src_tok, tgt_tok = data.src_tok, data.tgt_tok
        max_len = MAX_LEN
        config = transformer_config(args, src_tok, tgt_tok, max_len=max_len)
        seq_len = min(args.max_tokens, max_len)  # a batch holds about --max-tokens tokens
        check_training_memory(
            config,
            seq_len=seq_len,
            batch=-(-args.max_tokens // seq_len),
            device=device,
            model_sizes=option_sizes(args, "d_model", "layers", "d_ff", "src_vocab", "tgt_vocab"),
            step_sizes=option_sizes(args, "max_tokens", "d_model", "layers", "d_ff"),
        )
        model = Transformer(config)
        limit = max_len - 2
        train_src = _encode_all(src_tok, data.train.src, limit)
        longest = max((len(s) for s in train_src), default=0)
        io = translation_io(src_tok, tgt_tok, args.beams, max_len, longest_trained=longest)
        source = BucketedBatchSource(
            train_src,
            _encode_all(tgt_tok, data.train.tgt, limit),
            max_tokens=args.max_tokens,
            pad_id=config.pad_id,
            bos_id=config.bos_id,
            eos_id=config.eos_id,
            seed=args.seed,
        )
        loss_fn = seq2seq_loss(config.pad_id, config.label_smoothing)
        dev = data.dev
        dev_batch = None
        if dev is not None:
            dev_batch = make_seq2seq_batch(
                _encode_all(src_tok, dev.src, limit), _encode_all(tgt_tok, dev.tgt, limit),
                pad_id=config.pad_id, bos_id=config.bos_id, eos_id=config.eos_id,
            )  # fmt: skip

        def evaluate_dev(m: nn.Module) -> dict[str, float]:
            if dev is None or dev_batch is None:
                return {}
            d = next(m.parameters()).device
            batch = type(dev_batch)(
                dev_batch.src.to(d), dev_batch.tgt_in.to(d), dev_batch.targets.to(d)
            )
            loss = float(loss_fn(m, batch).loss)
            hyps = io.translate(m, dev.src, beams=1, batch_size=128, lenient=True)
            return {"dev_loss": loss, "dev_bleu": corpus_bleu(hyps, dev.tgt, args.bleu_tokenize)}

        final = data.test if data.test is not None else dev
        final_name = "test" if data.test is not None else "dev"

        def report(m: nn.Module, run_dir: Path, console: Console) -> None:
            if final is None:
                console.print("no dev or test split given: no BLEU")
                return
            hyps = io.translate(m, final.src, beams=args.beams, lenient=True)
            bleu = corpus_bleu(hyps, final.tgt, args.bleu_tokenize)
            (Path(run_dir) / f"{final_name}.hyp").write_text(
                "\n".join(hyps) + "\n", encoding="utf-8"
            )
            (Path(run_dir) / "bleu.json").write_text(
                json.dumps({"split": final_name, "bleu": bleu, "beams": args.beams,
                            "tokenize": args.bleu_tokenize, "sentences": len(hyps)}) + "\n",
                encoding="utf-8",
            )  # fmt: skip
            console.print(f"{final_name} BLEU ({args.beams} beams): {bleu:.2f}")
            for s, h, r in list(zip(final.src, hyps, final.tgt))[:3]:
                console.print(
                    f"  {s}\n    → {h}\n    ref {r}", markup=False, highlight=False, soft_wrap=True
                )

        return TaskSetup(
            model=model,
            make_optimizer=noam_adam_from_args(args, config.d_model),
            batches=IndexedBatches(source.batch),
            loss_fn=loss_fn,
            model_config=config_to_dict(config),
            evaluate=evaluate_dev if dev is not None else None,
            files={
                SRC_TOKENIZER: src_tok.to_json(),
                TGT_TOKENIZER: tgt_tok.to_json(),
                TRAIN_LENGTHS: json.dumps({"longest_source": longest}) + "\n",
            },
            report=report,
            io=io,
            data_files=_data_files(args),
        )

    def evaluation_set(self, args: Mapping[str, Any], io: Any, limit: int) -> EvaluationSet:
        """The run's dev pairs (else its test pairs), at most ``limit``, as batches of 32.

        Args:
            args: the options saved in the run's ``config.json``.
            io: the run's text path (its tokenizers and special ids).
            limit: the most sentence pairs to use.

        Returns:
            The batches; no metric.

        Raises:
            ValueError: the run was trained without dev or test files.
        """
        if args.get("corpus"):
            pairs = corpora.load_parallel(str(args["corpus"]), "dev")
        else:
            split = "dev" if args.get("dev_src") else "test"
            if not args.get(f"{split}_src"):
                raise ArgumentError(
                    "the run was trained without --dev-src/--test-src: no held-out pairs"
                )
            pairs = read_parallel(args[f"{split}_src"], args[f"{split}_tgt"], what=split)
        src = [io.encode_source(s, lenient=True) for s in pairs.src[:limit]]
        tgt = _encode_all(io.tgt_tok, pairs.tgt[:limit], MAX_LEN - 2)
        batches = [
            make_seq2seq_batch(src[i : i + 32], tgt[i : i + 32], pad_id=io.pad_id,
                               bos_id=io.bos_id, eos_id=io.eos_id)
            for i in range(0, len(src), 32)
        ]  # fmt: skip
        return EvaluationSet(batches)

    def io(self, args: Mapping[str, Any], files: Mapping[str, str]) -> Seq2SeqIO:
        """The run's text path, from its two saved tokenizers.

        Args:
            args: the options saved in the run's ``config.json`` (``beams``).
            files: the task files of the checkpoint (both tokenizers and, in a run saved since
                it is recorded, the training lengths; without them no length warning).

        Returns:
            The run's :class:`~attnlab.tasks.seq2seq.Seq2SeqIO`.

        Raises:
            ValueError: a tokenizer file is missing, or the training lengths are not
                ``{"longest_source": N}``.
        """
        for name in (SRC_TOKENIZER, TGT_TOKENIZER):
            if name not in files:
                raise ArgumentError(f"the translation run holds no {name}")
        return translation_io(
            tokenizer_from_json(files[SRC_TOKENIZER]),
            tokenizer_from_json(files[TGT_TOKENIZER]),
            int(args.get("beams", 4)),
            longest_trained=_longest_source(files.get(TRAIN_LENGTHS)),
        )


def _longest_source(text: str | None) -> int | None:
    """The longest training source of a run's :data:`TRAIN_LENGTHS` file; ``None`` without one."""
    if text is None:
        return None
    try:
        longest = json.loads(text).get("longest_source")
    except (ValueError, AttributeError):
        longest = None
    if isinstance(longest, bool) or not isinstance(longest, int) or longest < 0:
        raise ArgumentError(
            f'the translation run\'s {TRAIN_LENGTHS} must be {{"longest_source": N}} with N a '
            f"non-negative int, got {text.strip()[:80]!r}"
        )
    return longest


register_task(TranslationTask())
