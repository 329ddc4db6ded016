"""GPT-2 (Radford et al. 2019): attnlab's decoder stores its weights under GPT-2's own names, so
only the layout of the linear layers differs. Hugging Face's GPT-2 uses ``Conv1D``
(``y = x W + b`` with ``W`` of shape ``(in, out)``) where attnlab uses ``nn.Linear``
(``y = x Wᵀ + b``, ``W`` of shape ``(out, in)``): ``c_attn``, ``c_proj`` and ``c_fc`` are
transposed on the way in and out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from attnlab._checks import check_probability
from attnlab.errors import ArgumentError
from attnlab.models.config import GPTConfig
from attnlab.models.families import Family, State, register_family
from attnlab.models.families._common import (
    build_config,
    json_bool,
    json_float,
    json_optional_int,
    size,
    tied_head,
)

__all__ = ["GPT2"]

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
_IGNORED = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers of older transformers


def config_from_hf(config: Mapping[str, Any]) -> GPTConfig:
    """The :class:`~attnlab.models.config.GPTConfig` of a GPT-2 ``config.json``.

    Args:
        config: the config as a dict (``GPT2Config.to_dict()``).

    Returns:
        The equivalent attnlab configuration (sizes, dropout, layer-norm epsilon).

    Raises:
        ValueError: for GPT-2 options attnlab does not implement (another activation, ``n_inner``
            other than ``4 · n_embd``, unscaled or layer-scaled attention, cross-attention).
    """
    act = config.get("activation_function", "gelu_new")
    if act not in _GELU_TANH:
        raise ArgumentError(
            f"activation_function must be one of {_GELU_TANH} (tanh GELU), got {act!r}"
        )
    d = size(config, "n_embd", "width")
    n_inner = json_optional_int(config, "n_inner")
    if n_inner is not None and n_inner != 4 * d:
        raise ArgumentError(f"n_inner must be None or 4 * n_embd = {4 * d}, got {n_inner}")
    scaled = json_bool(config, "scale_attn_weights", True)
    by_layer = json_bool(config, "scale_attn_by_inverse_layer_idx", False)
    if not scaled or by_layer:
        raise ArgumentError(
            "scale_attn_weights must be True and scale_attn_by_inverse_layer_idx False "
            f"(scores scaled by 1/sqrt(d_head)), got {scaled} and {by_layer}"
        )
    if json_bool(config, "add_cross_attention", False):
        raise ArgumentError("add_cross_attention must be False: attnlab's GPT is decoder-only")
    if not json_bool(config, "tie_word_embeddings", True):
        raise ArgumentError(
            "tie_word_embeddings must be true for GPT-2 (attnlab's GPT-2 head is its token "
            "embedding), got false"
        )
    return build_config(
        config,
        "n_positions",
        vocab_size=size(config, "vocab_size", "vocab"),
        n_positions=size(config, "n_positions", "positions"),
        n_embd=d,
        n_layer=size(config, "n_layer", "layers"),
        n_head=size(config, "n_head", "heads"),
        dropout=check_probability(
            "resid_pdrop", json_float(config, "resid_pdrop", 0.0, positive=False)
        ),
        layer_norm_epsilon=json_float(config, "layer_norm_epsilon", 1e-5),
    )


def config_to_hf(config: GPTConfig) -> dict[str, Any]:
    """A GPT-2 ``config.json`` dict for a :class:`~attnlab.models.config.GPTConfig`.

    Raises:
        ValueError: for options GPT-2 does not have (an attention other than ``"full"``,
            grouped-query heads, rope/alibi, no biases, other parts than GPT-2's).
    """
    if config.attention.name != "full":
        name = config.attention.name
        raise ArgumentError(
            f"attention must be 'full' for GPT-2 (Hugging Face's GPT2LMHeadModel has no "
            f"{name!r} attention), got {name!r}"
        )
    if config.kv_heads != config.n_head:
        raise ArgumentError(
            f"num_kv_heads must be None or n_head = {config.n_head} for GPT-2, got {config.num_kv_heads}"
        )
    if config.positions != "learned":
        raise ArgumentError(f"positions must be 'learned' for GPT-2, got {config.positions!r}")
    if not config.bias:
        raise ArgumentError("bias must be True for GPT-2, got False")
    gpt2 = GPTConfig(
        vocab_size=config.vocab_size, n_embd=config.n_embd, n_head=config.n_head
    )  # GPT-2's parts, to compare the others with
    for name in ("norm", "activation", "mlp", "qkv_bias", "proj_bias", "mlp_bias",
                 "tie_embeddings", "parallel_residual"):  # fmt: skip
        if getattr(config, name) != getattr(gpt2, name):
            raise ArgumentError(
                f"{name} must be {getattr(gpt2, name)!r} for GPT-2, got {getattr(config, name)!r}"
            )
    if config.ff_width != 4 * config.n_embd:
        raise ArgumentError(
            f"d_ff must be 4 * n_embd = {4 * config.n_embd} for GPT-2, got {config.d_ff}"
        )
    special = min(50256, config.vocab_size - 1)  # GPT-2's <|endoftext|>, inside a small vocabulary
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": config.vocab_size,
        "n_positions": config.n_positions,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "activation_function": "gelu_new",
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "layer_norm_epsilon": config.layer_norm_epsilon,
        "bos_token_id": special,
        "eos_token_id": special,
    }


def state_from_hf(state: Mapping[str, torch.Tensor], config: GPTConfig) -> State:
    """attnlab's state dict of a GPT-2 state dict (``Conv1D`` weights transposed)."""
    out: State = {}
    for name, tensor in state.items():
        if name.endswith(_IGNORED) or name == "lm_head.weight":
            continue
        key = name if name.startswith("transformer.") else f"transformer.{name}"
        out[key] = tensor.t() if name.endswith(CONV1D) else tensor
    embedding = out.get("transformer.wte.weight")
    if embedding is not None:
        tied_head(state.get("lm_head.weight"), embedding, "lm_head.weight")
    return out


def state_to_hf(state: Mapping[str, torch.Tensor], config: GPTConfig) -> State:
    """GPT-2's state dict of attnlab's (``Conv1D`` weights transposed; the tied head is the
    embedding, written once)."""
    return {
        name: t.t() if name.endswith(CONV1D) else t
        for name, t in state.items()
        if name != "lm_head.weight"
    }


GPT2 = register_family(
    Family(
        name="gpt2",
        model_type="gpt2",
        hf_class="GPT2LMHeadModel",
        config_from_hf=config_from_hf,
        config_to_hf=config_to_hf,
        state_from_hf=state_from_hf,
        state_to_hf=state_to_hf,
    )
)
