"""Gemma 2: Llama's layout with four norms a block, soft-capped scores and logits, and local
(sliding-window) and global layers alternating.

    h_0 = √d · embed_tokens(x)
    x = x + RMS₁₊(o_proj(Attention(RoPE(q), RoPE(k), v)))       scores c_a · tanh(s / c_a)
    x = x + RMS₁₊(down_proj(GELU(gate_proj(RMS₁₊(x))) ⊙ up_proj(RMS₁₊(x))))
    logits = c_f · tanh(lm_head(RMS₁₊(h_L)) / c_f)

where ``RMS₁₊`` is RMSNorm with the gain ``1 + g`` (``norm="rmsnorm_offset"``), ``s`` the scores
scaled by ``query_pre_attn_scalar^(−1/2)`` (``attn_scale``), ``c_a`` ``attn_logit_softcapping``
(``attn_softcap``) and ``c_f`` ``final_logit_softcapping`` (``logit_softcap``). The layers
``layer_types`` names ``"sliding_attention"`` (by default the even ones) see the
``sliding_window`` positions ending at themselves (``SlidingSpec(w − 1)``), the others all
(``full_layers``).

Hugging Face names → attnlab's (``i`` a layer):

    model.embed_tokens                           transformer.wte (and the tied lm_head)
    model.layers.i.input_layernorm               transformer.h.i.ln_1
    model.layers.i.self_attn.{q,k,v}_proj        transformer.h.i.attn.c_attn   (rows [q; k; v])
    model.layers.i.self_attn.o_proj              transformer.h.i.attn.c_proj
    model.layers.i.post_attention_layernorm      transformer.h.i.ln_attn_out
    model.layers.i.pre_feedforward_layernorm     transformer.h.i.ln_2
    model.layers.i.mlp.{gate,up,down}_proj       transformer.h.i.mlp.c_gate, c_fc, c_proj
    model.layers.i.post_feedforward_layernorm    transformer.h.i.ln_mlp_out
    model.norm                                   transformer.ln_f

attnlab's heads split the model width: a config whose ``head_dim · num_attention_heads`` is not
``hidden_size`` (the published Gemma 2 checkpoints: 256 · 8 ≠ 2304) is refused in one line.
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

__all__ = ["GEMMA2"]

_IGNORED = (".rotary_emb.inv_freq", "embed_tokens.embed_scale")
_KINDS = ("sliding_attention", "full_attention")


def _optional_positive(config: Mapping[str, Any], key: str, default: float | None) -> float | None:
    if key in config and config[key] is None:
        return None
    return json_float(config, key, default)  # a finite positive number


def _layers(config: Mapping[str, Any], n_layer: int) -> tuple[Any, tuple[int, ...]]:
    """The windowed layers' spec and the full layers: ``layer_types``, by default
    ``sliding_attention`` for the even layers (Gemma2Config's ``(i + 1) % 2``)."""
    w = (
        json_optional_int(config, "sliding_window", minimum=2)
        if "sliding_window" in config
        else 4096
    )
    types = config.get("layer_types")
    if types is None:
        types = [_KINDS[0] if (i + 1) % 2 else _KINDS[1] for i in range(n_layer)]
    if not isinstance(types, list) or len(types) != n_layer or any(t not in _KINDS for t in types):
        raise ArgumentError(
            f"config.json's layer_types must be a list of num_hidden_layers = {n_layer} of "
            f"{' or '.join(map(repr, _KINDS))}, got {types!r}"
        )
    if w is None or _KINDS[0] not in types:
        return FullSpec(), ()
    return SlidingSpec(w - 1), tuple(i for i, t in enumerate(types) if t == _KINDS[1])


def _config_from_hf(config: Mapping[str, Any]) -> GPTConfig:
    d, heads, kv = head_sizes(config, 256)  # Gemma2Config's default head_dim
    if config.get("use_bidirectional_attention") is not None and json_bool(
        config, "use_bidirectional_attention"
    ):  # null in transformers' own files: causal
        raise ArgumentError("use_bidirectional_attention must be false for gemma2, got true")
    n_layer = size(config, "num_hidden_layers", "layers")
    attention, full_layers = _layers(config, n_layer)
    bias = json_bool(config, "attention_bias", False)
    scalar = json_float(config, "query_pre_attn_scalar", 256.0)  # finite and positive
    act = config.get("hidden_activation", config.get("hidden_act", "gelu_pytorch_tanh"))
    return build_config(
        config,
        "max_position_embeddings",
        vocab_size=size(config, "vocab_size", "vocab"),
        n_positions=size(config, "max_position_embeddings", "positions"),
        n_embd=d,
        n_layer=n_layer,
        n_head=heads,
        num_kv_heads=None if kv == heads else kv,
        positions="rope",
        layer_norm_epsilon=json_float(config, "rms_norm_eps", 1e-6),
        bias=False,
        attention=attention,
        full_layers=full_layers,
        norm="rmsnorm_offset",
        activation=activation_of(act),
        mlp="gated",
        d_ff=size(config, "intermediate_size", "width"),
        qkv_bias=bias,
        proj_bias=bias,
        mlp_bias=False,
        tie_embeddings=json_bool(config, "tie_word_embeddings", True),
        sandwich_norm=True,
        embedding_scale=True,
        attn_scale=scalar**-0.5,
        attn_softcap=_optional_positive(config, "attn_logit_softcapping", 50.0),
        logit_softcap=_optional_positive(config, "final_logit_softcapping", 30.0),
        family="gemma2",
        **rope_fields(config, d // heads, partial=False),
    )


def _config_to_hf(config: GPTConfig) -> dict[str, Any]:
    wants = {
        "positions": "rope", "norm": "rmsnorm_offset", "mlp": "gated", "rope_pairing": "halves",
        "parallel_residual": False, "rotary_dim": None, "sandwich_norm": True,
        "embedding_scale": True,
    }  # fmt: skip
    for name, value in wants.items():
        if getattr(config, name) != value:
            raise ArgumentError(
                f"{name} must be {value!r} for gemma2, got {getattr(config, name)!r}"
            )
    if config.bias_of("qkv") != config.bias_of("proj") or config.bias_of("mlp"):
        raise ArgumentError("qkv_bias must equal proj_bias and mlp_bias be False for gemma2")
    spec = config.attention
    if not isinstance(spec, (FullSpec, SlidingSpec)):
        raise ArgumentError(f"attention must be 'full' or 'sliding' for gemma2, got {spec.name!r}")
    full = set(config.full_layers) if isinstance(spec, SlidingSpec) else set(range(config.n_layer))
    scale = config.attn_scale if config.attn_scale is not None else config.d_head**-0.5
    scalar = scale**-2  # Gemma2Config holds an int: the one read gives back the same scale
    if abs(scalar - round(scalar)) <= 1e-9 * scalar:
        scalar = round(scalar)
    return {
        "model_type": "gemma2",
        "architectures": ["Gemma2ForCausalLM"],
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.n_positions,
        "hidden_size": config.n_embd,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.d_head,
        "intermediate_size": config.ff_width,
        "hidden_activation": hf_activation(config.activation),
        "rms_norm_eps": config.layer_norm_epsilon,
        "tie_word_embeddings": config.tie_embeddings,
        "attention_bias": config.bias_of("qkv"),
        "attention_dropout": 0.0,
        "query_pre_attn_scalar": scalar,
        "sliding_window": spec.window + 1 if isinstance(spec, SlidingSpec) else None,
        "layer_types": [_KINDS[i in full] for i in range(config.n_layer)],
        "attn_logit_softcapping": config.attn_softcap,
        "final_logit_softcapping": config.logit_softcap,
        **hf_rope(config),
    }


#: the tensors renamed one to one (weight, and bias where there is one)
_RENAMED = (
    ("input_layernorm", "ln_1"),
    ("post_attention_layernorm", "ln_attn_out"),
    ("pre_feedforward_layernorm", "ln_2"),
    ("post_feedforward_layernorm", "ln_mlp_out"),
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
        qkv_from_hf(src, out, hf, at)  # c_attn = [q_proj; k_proj; v_proj]
        src.move(out, _RENAMED, hf, at)
    src.done()
    return out


def _state_to_hf(state: Mapping[str, torch.Tensor], config: GPTConfig) -> State:
    src = TensorTaker(state, "the model")
    out = ends_to_hf(src, config)
    for i in range(config.n_layer):
        hf, at = f"model.layers.{i}.", f"transformer.h.{i}."
        qkv_to_hf(src, out, hf, at, config)
        src.move(out, _BACK, at, hf)
    src.done()
    return out


GEMMA2 = register_family(
    Family(
        name="gemma2",
        model_type="gemma2",
        hf_class="Gemma2ForCausalLM",
        config_from_hf=_config_from_hf,
        config_to_hf=_config_to_hf,
        state_from_hf=_state_from_hf,
        state_to_hf=_state_to_hf,
    )
)
