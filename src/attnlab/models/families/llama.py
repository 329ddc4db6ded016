"""Llama, Mistral and Qwen2: one layout of weights, three configs.

    x = x + o_proj(Attention(RoPE(q_proj(RMS(x))), RoPE(k_proj(RMS(x))), v_proj(RMS(x))))
    x = x + down_proj(SiLU(gate_proj(RMS(x))) ⊙ up_proj(RMS(x)))

Hugging Face names → attnlab's (``i`` a layer):

    model.embed_tokens                         transformer.wte
    model.layers.i.input_layernorm             transformer.h.i.ln_1
    model.layers.i.self_attn.{q,k,v}_proj      transformer.h.i.attn.c_attn   (rows [q; k; v])
    model.layers.i.self_attn.o_proj            transformer.h.i.attn.c_proj
    model.layers.i.post_attention_layernorm    transformer.h.i.ln_2
    model.layers.i.mlp.gate_proj               transformer.h.i.mlp.c_gate
    model.layers.i.mlp.up_proj                 transformer.h.i.mlp.c_fc
    model.layers.i.mlp.down_proj               transformer.h.i.mlp.c_proj
    model.norm                                 transformer.ln_f
    lm_head                                    lm_head (its own weight only when untied)

Mistral's ``sliding_window = w`` lets a token see the ``w`` positions ending at itself
(``i − j < w``): attnlab's :class:`~attnlab.nn.kinds.SlidingSpec` of ``window = w − 1`` (itself
and the ``w − 1`` before it). Qwen2 has biases on ``q_proj``, ``k_proj`` and ``v_proj`` only;
with ``use_sliding_window`` its ``layer_types`` (by default: the layers from
``max_window_layers`` on) are windowed as Mistral's and the others full
(``GPTConfig.full_layers``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from attnlab.errors import ArgumentError
from attnlab.models.config import GPTConfig
from attnlab.models.families import Family, State, register_family
from attnlab.models.families._common import (
    TensorTaker,
    activation_of,
    build_config,
    ends_from_hf,
    ends_to_hf,
    head_sizes,
    hf_activation,
    hf_rope,
    json_bool,
    json_float,
    json_optional_int,
    qkv_from_hf,
    qkv_to_hf,
    rope_fields,
    size,
)
from attnlab.nn.kinds import FullSpec, SlidingSpec

__all__ = ["LLAMA", "MISTRAL", "QWEN2"]

_IGNORED = (".rotary_emb.inv_freq",)


def _config_from_hf(config: Mapping[str, Any], family: str) -> GPTConfig:
    d, heads, kv = head_sizes(config)
    attention: Any = FullSpec()
    if family == "mistral":
        w = json_optional_int(config, "sliding_window", minimum=2)
        if w is not None:
            attention = SlidingSpec(w - 1)  # i − j < w: itself and w − 1 before it
    full_layers: tuple[int, ...] = ()
    if family == "qwen2":
        attention, full_layers = _qwen2_layers(config, size(config, "num_hidden_layers", "layers"))
    bias = json_bool(config, "attention_bias", False)
    return build_config(
        config,
        "max_position_embeddings",
        vocab_size=size(config, "vocab_size", "vocab"),
        n_positions=size(config, "max_position_embeddings", "positions"),
        n_embd=d,
        n_layer=size(config, "num_hidden_layers", "layers"),
        n_head=heads,
        num_kv_heads=None if kv == heads else kv,
        positions="rope",
        layer_norm_epsilon=json_float(config, "rms_norm_eps", 1e-6),
        bias=False,
        attention=attention,
        norm="rmsnorm",
        activation=activation_of(config.get("hidden_act", "silu")),
        mlp="gated",
        d_ff=size(config, "intermediate_size", "width"),
        qkv_bias=True if family == "qwen2" else bias,
        proj_bias=False if family == "qwen2" else bias,
        mlp_bias=json_bool(config, "mlp_bias", False),
        tie_embeddings=json_bool(config, "tie_word_embeddings", False),
        full_layers=full_layers,
        family=family,
        **rope_fields(config, d // heads, partial=False),
    )


def _qwen2_layers(config: Mapping[str, Any], n_layer: int) -> tuple[Any, tuple[int, ...]]:
    """Qwen2's attention per layer, as ``Qwen2Config`` reads it: with ``use_sliding_window``,
    the layers ``layer_types`` names ``"sliding_attention"`` (by default those from
    ``max_window_layers`` on) see the ``sliding_window`` positions ending at themselves, the
    others all; without it, every layer attends fully.

    Returns:
        The windowed layers' spec (full attention when none is windowed) and the full layers.
    """
    if not json_bool(config, "use_sliding_window", False):
        return FullSpec(), ()
    w = json_optional_int(config, "sliding_window", minimum=2)
    types = config.get("layer_types")
    if types is None:
        first = size(config, "max_window_layers", "layers", 28) if n_layer else 0
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layer)]
    kinds = ("sliding_attention", "full_attention")
    if not isinstance(types, list) or len(types) != n_layer or any(t not in kinds for t in types):
        raise ArgumentError(
            f"config.json's layer_types must be a list of num_hidden_layers = {n_layer} of "
            f"{' or '.join(map(repr, kinds))}, got {types!r}"
        )
    if w is None or "sliding_attention" not in types:
        return FullSpec(), ()
    full = tuple(i for i, t in enumerate(types) if t == "full_attention")
    return SlidingSpec(w - 1), full  # i − j < w: itself and w − 1 before it


def _config_to_hf(config: GPTConfig, family: str, hf_class: str) -> dict[str, Any]:
    _check_exportable(config, family)
    out: dict[str, Any] = {
        "model_type": {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2"}[family],
        "architectures": [hf_class],
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.n_positions,
        "hidden_size": config.n_embd,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.d_head,
        "intermediate_size": config.ff_width,
        "hidden_act": hf_activation(config.activation),
        "rms_norm_eps": config.layer_norm_epsilon,
        "tie_word_embeddings": config.tie_embeddings,
        "attention_dropout": 0.0,
        **hf_rope(config),
    }
    if family == "llama":
        out["attention_bias"] = config.bias_of("qkv")
        out["mlp_bias"] = config.bias_of("mlp")
    if family == "mistral":
        spec = config.attention
        out["sliding_window"] = spec.window + 1 if isinstance(spec, SlidingSpec) else None
    if family == "qwen2":
        spec = config.attention
        out["use_sliding_window"] = isinstance(spec, SlidingSpec)
        if isinstance(spec, SlidingSpec):
            full = set(config.full_layers)
            out["sliding_window"] = spec.window + 1
            # the leading full layers (layer_types, written too, is what transformers reads)
            out["max_window_layers"] = next(i for i in range(config.n_layer + 1) if i not in full)
            out["layer_types"] = [
                "full_attention" if i in full else "sliding_attention"
                for i in range(config.n_layer)
            ]
    return out


def _check_exportable(config: GPTConfig, family: str) -> None:
    """Refuse a config the family's Hugging Face class cannot hold."""
    wants = {
        "positions": "rope", "norm": "rmsnorm", "mlp": "gated", "rope_pairing": "halves",
        "parallel_residual": False, "rotary_dim": None,
    }  # fmt: skip
    biases = {"llama": None, "mistral": (False, False, False), "qwen2": (True, False, False)}
    for name, value in wants.items():
        if getattr(config, name) != value:
            raise ArgumentError(
                f"{name} must be {value!r} for {family}, got {getattr(config, name)!r}"
            )
    got = (config.bias_of("qkv"), config.bias_of("proj"), config.bias_of("mlp"))
    want = biases[family]
    if want is None:
        if got[0] != got[1]:
            raise ArgumentError(
                "qkv_bias and proj_bias must agree for llama (attention_bias), got "
                f"{got[0]} and {got[1]}"
            )
    elif got != want:
        raise ArgumentError(
            f"(qkv_bias, proj_bias, mlp_bias) must be {want} for {family}, got {got}"
        )
    allowed = (FullSpec,) if family == "llama" else (FullSpec, SlidingSpec)
    if not isinstance(config.attention, allowed):
        raise ArgumentError(
            f"attention must be {' or '.join(c.name for c in allowed)} for {family}, got "
            f"{config.attention.name!r}"
        )
    if config.full_layers and family != "qwen2":
        raise ArgumentError(
            f"full_layers must be () for {family} (its config.json has no per-layer "
            f"attention), got {config.full_layers}"
        )


_NORMS = (("input_layernorm", "ln_1"), ("post_attention_layernorm", "ln_2"))
#: the projections renamed one to one (weight, and bias where there is one)
_RENAMED = (
    ("self_attn.o_proj", "attn.c_proj"),
    ("mlp.gate_proj", "mlp.c_gate"),
    ("mlp.up_proj", "mlp.c_fc"),
    ("mlp.down_proj", "mlp.c_proj"),
)
_BACK = tuple((ours, theirs) for theirs, ours in _RENAMED)


def _state_from_hf(state: Mapping[str, torch.Tensor], config: GPTConfig) -> State:
    src = TensorTaker(state, "the weights", ignore=_IGNORED)
    out = ends_from_hf(src, config)
    for i in range(config.n_layer):
        hf, at = f"model.layers.{i}.", f"transformer.h.{i}."
        for theirs, ours in _NORMS:
            out[f"{at}{ours}.weight"] = src.take(f"{hf}{theirs}.weight")
        qkv_from_hf(
            src, out, hf, at
        )  # c_attn = [q_proj; k_proj; v_proj]: (H + 2 · H_kv) · d_head rows
        src.move(out, _RENAMED, hf, at)
    src.done()
    return out


def _state_to_hf(state: Mapping[str, torch.Tensor], config: GPTConfig) -> State:
    src = TensorTaker(state, "the model")
    out = ends_to_hf(src, config)
    for i in range(config.n_layer):
        hf, at = f"model.layers.{i}.", f"transformer.h.{i}."
        for theirs, ours in _NORMS:
            out[f"{hf}{theirs}.weight"] = src.take(f"{at}{ours}.weight")
        qkv_to_hf(src, out, hf, at, config)
        src.move(out, _BACK, at, hf)
    src.done()
    return out


def _family(name: str, model_type: str, hf_class: str) -> Family:
    return register_family(
        Family(
            name=name,
            model_type=model_type,
            hf_class=hf_class,
            config_from_hf=lambda c: _config_from_hf(c, name),
            config_to_hf=lambda c: _config_to_hf(c, name, hf_class),
            state_from_hf=_state_from_hf,
            state_to_hf=_state_to_hf,
        )
    )


LLAMA = _family("llama", "llama", "LlamaForCausalLM")
MISTRAL = _family("mistral", "mistral", "MistralForCausalLM")
QWEN2 = _family("qwen2", "qwen2", "Qwen2ForCausalLM")
