"""Model families: how a Hugging Face decoder's ``config.json`` and weights map onto attnlab's one
decoder (:class:`~attnlab.GPT`), and back.

A family is data, not a model class: the config chooses the block's parts
(:func:`~attnlab.models.gpt_layers.block_parts`), and a :class:`Family` converts

    config.json (a dict)  ⇄  GPTConfig            state dict (Hugging Face names)  ⇄  attnlab's

so that every attnlab tool (backends, head masks, hooks, capture, the KV cache, decoding, the FLOP
calculator, ``torchrun`` training) works on every family with the same hook names.

| family | Hugging Face `model_type` | what differs from GPT-2 |
|---|---|---|
| gpt2 | `gpt2` | — |
| llama | `llama` | RMSNorm, SwiGLU, RoPE (halves), GQA, untied or tied |
| mistral | `mistral` | Llama + a sliding window |
| qwen2 | `qwen2` | Llama + query/key/value biases |
| neox | `gpt_neox` | parallel residual, partial rotary, exact GELU |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.config import GPTConfig

__all__ = ["Family", "family_named", "family_of", "register_family", "supported_model_types"]

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Family:
    """One model family's conversions (see the module docstring).

    Attributes:
        name: attnlab's name (``GPTConfig.family``).
        model_type: Hugging Face's ``model_type``.
        hf_class: the ``transformers`` class of the causal language model.
        config_from_hf: ``config.json`` dict → :class:`~attnlab.models.config.GPTConfig`;
            refuses options attnlab does not implement with a one-line error.
        config_to_hf: config → ``config.json`` dict (refuses what the family cannot hold).
        state_from_hf: Hugging Face state dict → attnlab's (``lm_head.weight`` only when untied).
        state_to_hf: attnlab's state dict → Hugging Face's.

    Shape:
        the state dicts' tensors keep their shapes, except where a layout differs (GPT-2's
        ``Conv1D`` weights are transposed; Llama's ``q/k/v_proj`` rows are concatenated into
        ``c_attn``; NeoX's ``query_key_value`` rows are regrouped).
    """

    name: str
    model_type: str
    hf_class: str
    config_from_hf: Callable[[Mapping[str, Any]], GPTConfig]
    config_to_hf: Callable[[GPTConfig], dict[str, Any]]
    state_from_hf: Callable[[Mapping[str, torch.Tensor], GPTConfig], State]
    state_to_hf: Callable[[Mapping[str, torch.Tensor], GPTConfig], State]


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Add a family (by its ``name``; its ``model_type`` is looked up too).

    Args:
        family: the :class:`Family`.

    Returns:
        ``family``.
    """
    _FAMILIES[family.name] = family
    return family


def supported_model_types() -> tuple[str, ...]:
    """The Hugging Face ``model_type`` values attnlab reads.

    Returns:
        Sorted model types.
    """
    _load()
    return tuple(sorted(f.model_type for f in _FAMILIES.values()))


def family_named(name: str) -> Family:
    """The family of a :class:`~attnlab.models.config.GPTConfig`'s ``family`` field.

    Args:
        name: ``"gpt2"``, ``"llama"``, ``"mistral"``, ``"qwen2"`` or ``"neox"``.

    Returns:
        The :class:`Family`.
    """
    _load()
    if name not in _FAMILIES:
        raise ArgumentError(f"family must be one of {sorted(_FAMILIES)}, got {name!r}")
    return _FAMILIES[name]


def family_of(config: Mapping[str, Any]) -> Family:
    """The family of a Hugging Face ``config.json`` (its ``model_type``).

    Args:
        config: the config as a dict.

    Returns:
        The :class:`Family`.

    Raises:
        ValueError: a ``model_type`` attnlab does not read (the message lists those it does).
    """
    _load()
    if not isinstance(config, Mapping):
        raise ArgumentTypeError(f"config must be a dict, got {type(config).__name__}")
    model_type = config.get("model_type")
    for family in _FAMILIES.values():
        if family.model_type == model_type:
            return family
    raise ArgumentError(
        f"model_type must be one of {', '.join(supported_model_types())}, got {model_type!r}"
    )


def _load() -> None:
    """Register the built-in families (their modules import this one)."""
    if not _FAMILIES:
        from attnlab.models.families import gpt2, llama, neox  # noqa: F401
