"""Hugging Face interop for the encoder families (BERT, RoBERTa, DistilBERT, ELECTRA): weights in and out
of ``transformers`` models and Hugging Face folders, as :mod:`attnlab.models.hf` does for the
decoders. The family of a ``config.json`` (:func:`attnlab.models.families.encoder_family_of`)
converts the config and the weight names; :class:`~attnlab.models.encoder.Encoder` runs them all.

A folder is read from safetensors only, its ``config.json`` sizes checked against the shapes
the weights' headers record before anything is allocated (:func:`check_encoder_directory`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.families import encoder_family_named, encoder_family_of
from attnlab.models.hf import (
    _as_dict,
    _read_config,
    folder_headers,
    hf_model_of,
    model_parts,
    read_weights,
    write_folder,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = [
    "check_encoder_directory",
    "encoder_config_from_hf",
    "encoder_from_hf",
    "encoder_from_state",
    "encoder_to_hf",
    "save_encoder_hf",
]


def encoder_config_from_hf(hf_config: Any) -> EncoderConfig:
    """The :class:`~attnlab.models.encoder.EncoderConfig` of a Hugging Face encoder config.

    Args:
        hf_config: a ``transformers`` config or a ``config.json`` dict (``bert``, ``roberta``,
            ``distilbert``).

    Returns:
        The config (``pooler=True`` but for DistilBERT and ELECTRA; a loader sets it from the weights).
    """
    data = _as_dict(hf_config)
    return encoder_family_of(data).config_from_hf(data)


def _converted(
    hf_config: Mapping[str, Any], state: Mapping[str, torch.Tensor]
) -> tuple[EncoderConfig, dict[str, torch.Tensor]]:
    """The config (its pooler where the weights hold one) and attnlab's state dict."""
    family = encoder_family_of(hf_config)
    config = family.config_from_hf(hf_config)
    ours = family.state_from_hf(state, config.replace(pooler=False))
    return config.replace(pooler="pooler.weight" in ours), ours


def encoder_from_state(
    hf_config: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    *,
    dtype: torch.dtype | None = None,
) -> Encoder:
    """An :class:`~attnlab.models.encoder.Encoder` from a Hugging Face config and state dict.

    Built on the ``meta`` device (no random initialisation) and given the tensors as they are.

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
    config, ours = _converted(hf_config, state)
    with torch.device("meta"):
        model = Encoder(config)
    expected = model.state_dict()
    for name, want in expected.items():
        got = ours.get(name)
        if got is None or tuple(got.shape) != tuple(want.shape):
            held = "no such tensor" if got is None else f"shape {tuple(got.shape)}"
            raise ArgumentError(
                f"the config gives {name} the shape {tuple(want.shape)} but the weights hold {held}"
            )
    ours = {n: (t if dtype is None else t.to(dtype)).contiguous() for n, t in ours.items()}
    model.load_state_dict(ours, strict=True, assign=True)
    return model.eval()


def encoder_from_hf(
    model_or_directory: PreTrainedModel | str | Path, *, dtype: torch.dtype | None = None
) -> Encoder:
    """An :class:`~attnlab.models.encoder.Encoder` with the weights of a Hugging Face encoder.

    Args:
        model_or_directory: a ``BertModel``, ``RobertaModel`` or ``DistilBertModel`` (or one of
            their task models: the encoder is read, the head left out), or a local folder as
            ``save_pretrained`` writes it.
        dtype: convert the weights; default: keep theirs.

    Returns:
        The model, in the source's train/eval mode (eval for a folder).
    """
    if isinstance(model_or_directory, (str, Path)):
        check_encoder_directory(model_or_directory)  # before anything is allocated
        path = Path(model_or_directory)
        return encoder_from_state(_read_config(path), read_weights(path, dtype=dtype))
    config, state = model_parts(model_or_directory, "BertModel, RobertaModel")
    model = encoder_from_state(config, state, dtype=dtype)
    return model.train(bool(getattr(model_or_directory, "training", False)))


def encoder_to_hf(model: Encoder, *, attn_implementation: str = "eager") -> PreTrainedModel:
    """The ``transformers`` model of an :class:`~attnlab.models.encoder.Encoder`'s family.

    Args:
        model: the encoder.
        attn_implementation: Hugging Face's attention (``"eager"``, the default, returns
            attention weights; ``"sdpa"``).

    Returns:
        The Hugging Face model (``BertModel`` …) on the same device and dtype, same mode.
    """
    if not isinstance(model, Encoder):
        raise ArgumentTypeError(f"model must be an attnlab Encoder, got {type(model).__name__}")
    family = encoder_family_named(model.config.family)
    return hf_model_of(
        family.hf_class,
        family.config_to_hf(model.config),
        family.state_to_hf(model.state_dict(), model.config),
        like=model.embeddings.word_embeddings.weight,
        training=model.training,
        attn_implementation=attn_implementation,
        init=family.hf_init(model.config),
    )


def save_encoder_hf(model: Encoder, directory: str | Path) -> Path:
    """Write an :class:`~attnlab.models.encoder.Encoder` as a Hugging Face folder
    (``config.json`` + ``model.safetensors``), replaced as a whole
    (:func:`attnlab._files.replace_folder`); other files (a tokenizer) are kept.

    Args:
        model: the encoder.
        directory: the folder (made when missing).

    Returns:
        The folder.
    """
    if not isinstance(model, Encoder):
        raise ArgumentTypeError(f"model must be an attnlab Encoder, got {type(model).__name__}")
    family = encoder_family_named(model.config.family)
    data = family.config_to_hf(model.config)
    return write_folder(directory, data, family.state_to_hf(model.state_dict(), model.config))


def check_encoder_directory(path: str | Path) -> EncoderConfig:
    """Check an encoder's Hugging Face folder before anything is allocated from it: safetensors
    weights whose shapes (their headers) are those its ``config.json`` gives.

    Args:
        path: the folder.

    Returns:
        The :class:`~attnlab.models.encoder.EncoderConfig` (with the pooler the weights hold).

    Raises:
        ArgumentError: one line naming the file, the size and what the weights hold.
    """
    path = Path(path)
    data, stored = folder_headers(path)
    try:
        config, ours = _converted(data, stored)
        with torch.device("meta"):
            expected = Encoder(config).state_dict()
    except (ValueError, TypeError) as exc:
        raise ArgumentError(f"{path / 'config.json'}: {exc}") from None
    for name, want in expected.items():
        got = ours.get(name)
        if got is None or tuple(got.shape) != tuple(want.shape):
            held = "no such tensor" if got is None else tuple(got.shape)
            raise ArgumentError(
                f"{path / 'config.json'} gives {name} the shape {tuple(want.shape)} but the "
                f"weights store {held}"
            )
    return config
