"""Hugging Face interop for the encoder-decoder families (Marian, BART): weights in and out of
``transformers`` models and Hugging Face folders, as :mod:`attnlab.models.encoder_hf` does for
the encoders. The family of a ``config.json``
(:func:`attnlab.models.families.seq2seq_family_of`) converts the config and the weight names;
:class:`~attnlab.Transformer` runs them all.

A folder is read from safetensors only, its ``config.json`` sizes checked against the shapes the
weights' headers record before anything is allocated (:func:`check_seq2seq_directory`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.config import TransformerConfig
from attnlab.models.families import Seq2SeqFamily, seq2seq_family_named, seq2seq_family_of
from attnlab.models.hf import (
    _read_config,
    folder_headers,
    hf_model_of,
    model_parts,
    read_weights,
    write_folder,
)
from attnlab.models.transformer import Transformer, position_encoding

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = [
    "check_seq2seq_directory",
    "is_seq2seq",
    "save_transformer_hf",
    "transformer_from_hf",
    "transformer_from_state",
    "transformer_to_hf",
]


def is_seq2seq(config: Mapping[str, Any]) -> bool:
    """Whether a Hugging Face ``config.json`` is of an encoder-decoder family attnlab reads.

    Args:
        config: the config as a dict.

    Returns:
        ``True`` for a registered encoder-decoder ``model_type`` (``marian``, ``bart``).
    """
    return seq2seq_family_of(config) is not None


def _family(config: Mapping[str, Any]) -> Seq2SeqFamily:
    family = seq2seq_family_of(config)
    if family is None:
        raise ArgumentError(
            f"model_type must be an encoder-decoder's (marian, bart), got {config.get('model_type')!r}"
        )
    return family


def _converted(
    hf_config: Mapping[str, Any], state: Mapping[str, torch.Tensor]
) -> tuple[TransformerConfig, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The config, attnlab's state dict and the state dict a model built on ``meta`` expects."""
    family = _family(hf_config)
    config = family.config_from_hf(hf_config)
    ours = family.state_from_hf(state, config)
    with torch.device("meta"):
        expected = Transformer(config).state_dict()
    return config, ours, expected


def _mismatch(ours: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> str | None:
    """The first tensor whose shape is not the config's, described; ``None`` when all fit."""
    for name, want in expected.items():
        got = ours.get(name)
        if got is None or tuple(got.shape) != tuple(want.shape):
            held = "no such tensor" if got is None else f"shape {tuple(got.shape)}"
            return f"gives {name} the shape {tuple(want.shape)} but the weights hold {held}"
    return None


def transformer_from_state(
    hf_config: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    *,
    dtype: torch.dtype | None = None,
) -> Transformer:
    """An :class:`~attnlab.Transformer` from a Hugging Face config and state dict.

    Built on the ``meta`` device (no random initialisation) and given the tensors as they are;
    the sinusoidal table is made again on the weights' device.

    Args:
        hf_config: the ``config.json`` dict.
        state: the weights under Hugging Face's names.
        dtype: convert the weights to this dtype; default: keep theirs.

    Returns:
        The model, in eval mode.

    Raises:
        ArgumentError: a tensor missing, unused or of the wrong shape (named).

    Shape:
        ``state[name]``: as Hugging Face's model holds it (``(out, in)`` for a linear weight).
    """
    config, ours, expected = _converted(hf_config, state)
    wrong = _mismatch(ours, expected)
    if wrong is not None:
        raise ArgumentError(f"the config {wrong}")
    with torch.device("meta"):
        model = Transformer(config)
    ours = {n: (t if dtype is None else t.to(dtype)).contiguous() for n, t in ours.items()}
    shared = ours["src_embed.weight"]  # one tensor for the tied names, as the model ties them
    ours.update({n: shared for n in ("tgt_embed.weight", "lm_head.weight")})
    model.load_state_dict(ours, strict=True, assign=True)
    if config.tie_output:  # assign gave each name a Parameter of its own: one again
        model.lm_head.weight = model.tgt_embed.weight
    if config.positions == "sinusoidal":
        model.positions = position_encoding(config).to(shared.device)
    return model.eval()


def transformer_from_hf(
    model_or_directory: PreTrainedModel | str | Path, *, dtype: torch.dtype | None = None
) -> Transformer:
    """An :class:`~attnlab.Transformer` with the weights of a Hugging Face encoder-decoder.

    Args:
        model_or_directory: a ``MarianMTModel`` or ``BartForConditionalGeneration`` (or their
            bare ``MarianModel``/``BartModel``), or a local folder as
            ``save_pretrained`` writes it.
        dtype: convert the weights; default: keep theirs.

    Returns:
        The model, in the source's train/eval mode (eval for a folder).
    """
    if isinstance(model_or_directory, (str, Path)):
        check_seq2seq_directory(model_or_directory)  # before anything is allocated
        path = Path(model_or_directory)
        return transformer_from_state(_read_config(path), read_weights(path, dtype=dtype))
    config, state = model_parts(model_or_directory, "MarianMTModel, BartForConditionalGeneration")
    model = transformer_from_state(config, state, dtype=dtype)
    return model.train(bool(getattr(model_or_directory, "training", False)))


def _hf_parts(model: Transformer) -> tuple[Seq2SeqFamily, dict[str, Any]]:
    if not isinstance(model, Transformer):
        raise ArgumentTypeError(f"model must be an attnlab Transformer, got {type(model).__name__}")
    family = seq2seq_family_named(model.config.family)
    return family, family.config_to_hf(model.config)


def transformer_to_hf(model: Transformer, *, attn_implementation: str = "eager") -> PreTrainedModel:
    """The ``transformers`` model of an :class:`~attnlab.Transformer`'s family.

    Args:
        model: a model read from (or built as) a family (``config.family == "marian"``).
        attn_implementation: Hugging Face's attention (``"eager"``, the default, returns
            attention weights; ``"sdpa"``).

    Returns:
        The Hugging Face model (``MarianMTModel``) on the same device and dtype, same mode.
    """
    family, data = _hf_parts(model)
    return hf_model_of(
        family.hf_class,
        data,
        family.state_to_hf(model.state_dict(), model.config),
        like=model.lm_head.weight,
        training=model.training,
        attn_implementation=attn_implementation,
        tied=family.tied,
    )


def save_transformer_hf(model: Transformer, directory: str | Path) -> Path:
    """Write an :class:`~attnlab.Transformer` of a family as a Hugging Face folder
    (``config.json`` + ``model.safetensors``), replaced as a whole; other files (a tokenizer)
    are kept.

    Args:
        model: the model (``config.family`` a registered encoder-decoder family).
        directory: the folder (made when missing).

    Returns:
        The folder.
    """
    family, data = _hf_parts(model)
    return write_folder(directory, data, family.state_to_hf(model.state_dict(), model.config))


def check_seq2seq_directory(path: str | Path) -> TransformerConfig:
    """Check an encoder-decoder's Hugging Face folder before anything is allocated from it:
    safetensors weights whose shapes (their headers) are those its ``config.json`` gives.

    Args:
        path: the folder.

    Returns:
        The :class:`~attnlab.models.config.TransformerConfig`.

    Raises:
        ArgumentError: one line naming the file, the size and what the weights hold.
    """
    path = Path(path)
    data, stored = folder_headers(path)
    try:
        config, ours, expected = _converted(data, stored)
    except (ValueError, TypeError) as exc:
        raise ArgumentError(f"{path / 'config.json'}: {exc}") from None
    wrong = _mismatch(ours, expected)
    if wrong is not None:
        raise ArgumentError(f"{path / 'config.json'} {wrong}")
    return config
