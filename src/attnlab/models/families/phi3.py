"""Phi-3: Llama's block with fused projections and, in its config, partial rotary and a
sliding window.

    x = x + o_proj(Attention(RoPE(qkv_proj(RMS(x)))))
    x = x + down_proj(SiLU(gate) ⊙ up),   [gate | up] = gate_up_proj(RMS(x))

Hugging Face names → attnlab's (``i`` a layer):

    model.embed_tokens                         transformer.wte
    model.layers.i.input_layernorm             transformer.h.i.ln_1
    model.layers.i.self_attn.qkv_proj          transformer.h.i.attn.c_attn   (rows [q; k; v], as is)
    model.layers.i.self_attn.o_proj            transformer.h.i.attn.c_proj
    model.layers.i.post_attention_layernorm    transformer.h.i.ln_2
    model.layers.i.mlp.gate_up_proj            transformer.h.i.mlp.c_gate (first half of the rows)
                                               and transformer.h.i.mlp.c_fc (second half)
    model.layers.i.mlp.down_proj               transformer.h.i.mlp.c_proj
    model.norm                                 transformer.ln_f
    lm_head                                    lm_head (its own weight only when untied)

``sliding_window = w`` applies to every layer, as Mistral's (attnlab's ``SlidingSpec(w − 1)``);
``partial_rotary_factor`` rotates the first dimensions of each head (``rotary_dim``), as
``Phi3RotaryEmbedding`` does. Its ``longrope`` scaling (factors switched by the sequence length)
is refused with the other rope types attnlab does not implement.
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
    rope_fields,
    size,
)
from attnlab.nn.kinds import FullSpec, SlidingSpec

__all__ = ["PHI3"]

_IGNORED = (".rotary_emb.inv_freq",)


def _config_from_hf(config: Mapping[str, Any]) -> GPTConfig:
    d, heads, kv = head_sizes(config)
    w = json_optional_int(config, "sliding_window", minimum=2)
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
        layer_norm_epsilon=json_float(config, "rms_norm_eps", 1e-5),
        bias=False,
        attention=FullSpec() if w is None else SlidingSpec(w - 1),  # i − j < w
        norm="rmsnorm",
        activation=activation_of(config.get("hidden_act", "silu")),
        mlp="gated",
        d_ff=size(config, "intermediate_size", "width"),
        tie_embeddings=json_bool(config, "tie_word_embeddings", False),
        family="phi3",
        **rope_fields(config, d // heads, partial=True),
    )


def _config_to_hf(config: GPTConfig) -> dict[str, Any]:
    wants = {
        "positions": "rope", "norm": "rmsnorm", "mlp": "gated", "rope_pairing": "halves",
        "parallel_residual": False, "full_layers": (),
    }  # fmt: skip
    for name, value in wants.items():
        if getattr(config, name) != value:
            raise ArgumentError(f"{name} must be {value!r} for phi3, got {getattr(config, name)!r}")
    biases = (config.bias_of("qkv"), config.bias_of("proj"), config.bias_of("mlp"))
    if any(biases):
        raise ArgumentError(
            f"(qkv_bias, proj_bias, mlp_bias) must be (False, False, False) for phi3, got {biases}"
        )
    spec = config.attention
    if not isinstance(spec, (FullSpec, SlidingSpec)):
        raise ArgumentError(f"attention must be 'full' or 'sliding' for phi3, got {spec.name!r}")
    return {
        "model_type": "phi3",
        "architectures": ["Phi3ForCausalLM"],
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.n_positions,
        "original_max_position_embeddings": config.n_positions,
        "hidden_size": config.n_embd,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.kv_heads,
        "intermediate_size": config.ff_width,
        "hidden_act": hf_activation(config.activation),
        "rms_norm_eps": config.layer_norm_epsilon,
        "tie_word_embeddings": config.tie_embeddings,
        "sliding_window": spec.window + 1 if isinstance(spec, SlidingSpec) else None,
        "attention_dropout": 0.0,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        # Phi3Config's defaults (32000) lie outside a smaller vocabulary: its embedding refuses
        # such a padding index; attnlab's config holds no token ids
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        **hf_rope(config),
    }


_RENAMED = (
    ("input_layernorm", "ln_1"),
    ("post_attention_layernorm", "ln_2"),
    ("self_attn.qkv_proj", "attn.c_attn"),
    ("self_attn.o_proj", "attn.c_proj"),
    ("mlp.down_proj", "mlp.c_proj"),
)
_BACK = tuple((ours, theirs) for theirs, ours in _RENAMED)


def _state_from_hf(state: Mapping[str, torch.Tensor], config: GPTConfig) -> State:
    src = TensorTaker(state, "the weights", ignore=_IGNORED)
    out = ends_from_hf(src, config)
    for i in range(config.n_layer):
        hf, at = f"model.layers.{i}.", f"transformer.h.{i}."
        # [gate | up] = gate_up_proj(x): (2 · d_ff, d), the gate's rows first (Phi3MLP's chunk)
        gate, up = src.take(f"{hf}mlp.gate_up_proj.weight").chunk(2)
        out[f"{at}mlp.c_gate.weight"], out[f"{at}mlp.c_fc.weight"] = gate, up
        src.move(out, _RENAMED, hf, at)
    src.done()
    return out


def _state_to_hf(state: Mapping[str, torch.Tensor], config: GPTConfig) -> State:
    src = TensorTaker(state, "the model")
    out = ends_to_hf(src, config)
    for i in range(config.n_layer):
        hf, at = f"model.layers.{i}.", f"transformer.h.{i}."
        gate, up = src.take(f"{at}mlp.c_gate.weight"), src.take(f"{at}mlp.c_fc.weight")
        out[f"{hf}mlp.gate_up_proj.weight"] = torch.cat([gate, up])
        src.move(out, _BACK, at, hf)
    src.done()
    return out


PHI3 = register_family(
    Family(
        name="phi3",
        model_type="phi3",
        hf_class="Phi3ForCausalLM",
        config_from_hf=_config_from_hf,
        config_to_hf=_config_to_hf,
        state_from_hf=_state_from_hf,
        state_to_hf=_state_to_hf,
    )
)
