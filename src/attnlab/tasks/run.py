"""A trained run, loaded: its model, its task and the task's one path from text to input.

Accepted paths:

* a run folder (its latest checkpoint), its ``checkpoints`` folder, or one checkpoint directory
  written by :mod:`attnlab.training.checkpoint` — the model is built from ``config.json``'s
  ``"model"`` entry, and the task named by ``"task"`` rebuilds its
  :class:`~attnlab.tasks.base.TaskIO` from the saved options and tokenizers;
* a pretrained model (:func:`attnlab.models.pretrained.load_pretrained`): a Hugging Face folder
  (``config.json`` of a supported ``model_type``: GPT-2, Llama, Mistral, Qwen2, GPT-NeoX), a
  ``.gguf`` file, the bundled name ``smollm2-135m``, or a Hub id when the network allows; its
  tokenizer read when there is one, and generation stopping at its end token; an encoder
  (BERT, RoBERTa, DistilBERT, ELECTRA, the bundled ``minilm-l6``) reads the text with its special tokens
  (:class:`~attnlab.tasks.encoder.EncoderIO`).

A checkpoint without a task (saved by hand) or a pretrained model gets the plain path of its model
family: a language model reads the text's tokens; an encoder-decoder reads the text's tokens and
decodes greedily.

A checkpoint is verified against its manifest once, and held while it is read
(:mod:`attnlab.training.checkpoint_hold`: a training rotating its checkpoints meanwhile never
deletes it), and nothing is allocated before the sizes of
``config.json`` are borne out by the tensors ``model.safetensors`` stores (its header: names and
shapes): the layer counts first, then every tensor of the model built on the ``meta`` device (see
:mod:`attnlab.training.sizes`). A crafted checkpoint gives one ``CheckpointError`` line.

Examples:
    >>> run = load_run("runs/demo")
    >>> inputs = run.inputs("abcdef")          # what the model reads, and its own output
    >>> inputs.output
    'fedcba'
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab._checks import check_device
from attnlab.data.tokenizers import tokenizer_from_json
from attnlab.errors import ArgumentError
from attnlab.models.config import GPTConfig, TransformerConfig, config_from_dict
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.families import seq2seq_family_named
from attnlab.models.gpt import GPT
from attnlab.models.pretrained import is_pretrained_source, load_pretrained
from attnlab.models.transformer import Transformer
from attnlab.tasks.base import ModelInputs, TaskIO
from attnlab.tasks.encoder import EncoderIO
from attnlab.tasks.lm import LMIO
from attnlab.tasks.registry import get_task
from attnlab.tasks.seq2seq import Seq2SeqIO
from attnlab.training.checkpoint import (
    MODEL,
    CheckpointError,
    read_config,
    read_manifest,
    read_model_weights,
)
from attnlab.training.checkpoint_hold import hold_checkpoint
from attnlab.training.sizes import check_model_fits, read_tensor_shapes

__all__ = ["Run", "load_run"]

#: checkpoint files that are not the task's
_INTERNAL = {"config.json", "model.safetensors", "manifest.json"}


@dataclass
class Run:
    """A model ready to run (eval mode), with its task's text path.

    Attributes:
        model: an :class:`attnlab.GPT` or :class:`attnlab.Transformer`.
        config: its config.
        io: the task's :class:`~attnlab.tasks.base.TaskIO`.
        task: the task's name, or ``None`` (a checkpoint saved by hand, a GPT-2 directory).
        args: the task's saved options (``config.json``'s ``"args"``).
        path: the checkpoint (or GPT-2) directory it came from.
    """

    model: nn.Module
    config: GPTConfig | TransformerConfig | EncoderConfig
    io: TaskIO
    task: str | None
    args: dict[str, Any]
    path: Path

    @property
    def is_seq2seq(self) -> bool:
        """Whether the model is the encoder-decoder."""
        return isinstance(self.config, TransformerConfig)

    @property
    def is_encoder(self) -> bool:
        """Whether the model is a pretrained encoder (BERT, RoBERTa, DistilBERT, ELECTRA)."""
        return isinstance(self.config, EncoderConfig)

    def inputs(self, text: str, **options: Any) -> ModelInputs:
        """What the model reads for ``text`` and what it writes (see ``TaskIO.inputs``).

        Args:
            text: the input text.
            **options: the task family's options (``target``/``beams`` for an encoder-decoder,
                ``max_new_tokens``/``strategy`` for a language model).

        Returns:
            The model's inputs, its decoded output and their token labels.
        """
        return self.io.inputs(self.model, text, **options)


def load_run(
    path: str | os.PathLike[str], *, device: str | torch.device = "cpu", cache: bool = True
) -> Run:
    """Load the model and the task's text path of a run, a checkpoint or a GPT-2 directory.

    Args:
        path: see the module docstring.
        device: where to put the model. Default ``"cpu"``.
        cache: a GGUF model: read its dequantised weights from the cache written by its first
            load (:mod:`attnlab.models.weight_cache`); ``False`` skips the cache. Default ``True``.

    Returns:
        A :class:`Run` (model in eval mode).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the folder holds no loadable model or no tokenizer (one line naming why).
    """
    device = check_device("device", device)
    if is_pretrained_source(path):  # a bundled name, a .gguf, a Hugging Face folder, a Hub id
        model, tokenizer = load_pretrained(str(path), device=device, cache=cache)
        if isinstance(model, Encoder):
            limit = model.config.n_positions - (model.config.position_offset or 0)
            return Run(model, model.config, EncoderIO(tokenizer, limit), None, {}, Path(path))
        if isinstance(model, Transformer):  # an encoder-decoder family (Marian)
            if tokenizer is None:
                raise ArgumentError(f"{path} holds no tokenizer.json, so a text cannot be encoded")
            bos: int | None = getattr(
                tokenizer, "bos_id", None
            )  # <s> … </s> for BART, … </s> for Marian
            framed = seq2seq_family_named(model.config.family).source_bos
            prefix = (bos,) if framed and bos is not None else ()
            pair = _seq2seq_io(model.config, tokenizer, tokenizer, suffix=(model.config.eos_id,))
            pair = dataclasses.replace(pair, source_prefix=prefix)
            return Run(model, model.config, pair, None, {}, Path(path))
        eos = getattr(tokenizer, "eos_id", None)
        io = LMIO(tokenizer, model.config.n_positions, eos_id=eos)
        return Run(model, model.config, io, None, {}, Path(path))
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such run or checkpoint folder: {p} (the path does not exist)")
    # resolved and verified once, and held: a training rotating its checkpoints leaves it be
    with hold_checkpoint(p) as ckpt:
        return _load_checkpoint(ckpt, device)


def _load_checkpoint(ckpt: Path, device: str | torch.device) -> Run:
    """:func:`load_run` of the verified checkpoint directory ``ckpt`` (read as it is)."""
    run_config = read_config(ckpt)
    model_dict = run_config.get("model")
    if not isinstance(model_dict, dict):
        raise CheckpointError(f"checkpoint {ckpt}: config.json has no 'model' entry to build from")
    config = _config_of(model_dict, ckpt)
    _check_sizes(config, ckpt)  # before anything is allocated
    model: nn.Module = GPT(config) if isinstance(config, GPTConfig) else Transformer(config)
    read_model_weights(ckpt, model)
    files = _task_files(ckpt)
    name = run_config.get("task")
    args = run_config.get("args") or {}
    if not isinstance(args, dict):
        raise CheckpointError(f"checkpoint {ckpt}: config.json's 'args' must be a JSON object")
    task = get_task(name) if isinstance(name, str) else None
    try:
        io = (
            task.io(args, files)
            if task is not None and hasattr(task, "io")
            else _plain_io(config, files, ckpt)
        )
    except (KeyError, TypeError, AttributeError) as exc:  # saved options that do not fit the task
        raise CheckpointError(
            f"checkpoint {ckpt}: config.json's options do not fit task {name!r} "
            f"({type(exc).__name__}: {exc})"
        ) from None
    return Run(model.to(device).eval(), config, io, name if task else None, dict(args), ckpt)


#: the parameter-name prefix of each layer stack, by the config field that counts its layers
_LAYER_STACKS = {
    GPTConfig: (("n_layer", "transformer.h."),),
    TransformerConfig: (
        ("num_encoder_layers", "encoder.layers."),
        ("num_decoder_layers", "decoder.layers."),
    ),
}


def _check_sizes(config: GPTConfig | TransformerConfig, ckpt: Path) -> None:
    """Refuse sizes in config.json that the stored tensors do not bear out, before allocating.

    The layer counts are compared with the layers stored (so that not even a skeleton of a
    million layers is built), then the model is built on the ``meta`` device and compared
    tensor by tensor (:func:`~attnlab.training.sizes.check_model_fits`).
    """
    stored = read_tensor_shapes(ckpt / MODEL)
    for field, prefix in _LAYER_STACKS[type(config)]:
        layers = {n[len(prefix) :].split(".", 1)[0] for n in stored if n.startswith(prefix)}
        if getattr(config, field) != len(layers):
            raise CheckpointError(
                f"checkpoint {ckpt}: config.json gives {field} = {getattr(config, field)} but "
                f"{MODEL} stores {len(layers)} such layers"
            )
    with torch.device("meta"):  # shapes only, no memory
        skeleton: nn.Module = GPT(config) if isinstance(config, GPTConfig) else Transformer(config)
    check_model_fits(skeleton, ckpt / MODEL, where=f"checkpoint {ckpt}")


def _task_files(ckpt: Path) -> dict[str, str]:
    """The task's text files of a checkpoint (the tokenizers), by name: the top-level JSON files
    its manifest lists (so verified), other than attnlab's own."""
    files = {}
    for name in sorted(read_manifest(ckpt).files):
        if "/" not in name and name.endswith(".json") and name not in _INTERNAL:
            if not name.startswith("training_state"):
                files[name] = (ckpt / name).read_text(encoding="utf-8")
    return files


def _plain_io(config: GPTConfig | TransformerConfig, files: dict[str, str], where: Path) -> TaskIO:
    """The text path of a model family, for a run that names no task."""
    text = files.get("tokenizer.json") or files.get("src_tokenizer.json")
    tok = None if text is None else tokenizer_from_json(text)
    if isinstance(config, GPTConfig):
        return LMIO(tok, config.n_positions)
    if tok is None:
        raise ArgumentError(f"{where} holds no tokenizer.json, so a text cannot be encoded")
    tgt = tokenizer_from_json(files["tgt_tokenizer.json"]) if "tgt_tokenizer.json" in files else tok
    return _seq2seq_io(config, tok, tgt, suffix=())


def _seq2seq_io(
    config: TransformerConfig, src: Any, tgt: Any, *, suffix: tuple[int, ...]
) -> Seq2SeqIO:
    """An encoder-decoder's text path: its ids from the config, ``suffix`` after each source
    (a pretrained family's encoder reads ``</s>`` last, as its tokenizer writes it)."""
    return Seq2SeqIO(
        src_tok=src, tgt_tok=tgt, bos_id=config.bos_id, eos_id=config.eos_id,
        pad_id=config.pad_id, source_suffix=suffix, max_source_len=config.max_len,
        max_new_tokens=lambda n: min(config.max_len - 1, 2 * n + 10),
    )  # fmt: skip


def _config_of(data: dict[str, Any], ckpt: Path) -> GPTConfig | TransformerConfig:
    kind = data.get("kind")
    if kind is None:  # no class name saved: tell the two apart by their fields
        kind = "GPTConfig" if "n_embd" in data else "TransformerConfig"
    classes = {"GPTConfig": GPTConfig, "TransformerConfig": TransformerConfig}
    if not isinstance(kind, str) or kind not in classes:
        raise CheckpointError(
            f"checkpoint {ckpt}: model kind must be GPTConfig or TransformerConfig, got {kind!r}"
        )
    try:
        return config_from_dict(classes[kind], data)  # type: ignore[no-any-return]
    except (TypeError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {ckpt}: config.json's model is invalid ({exc})"
        ) from None
