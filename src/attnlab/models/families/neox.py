"""GPT-NeoX and Pythia (Black et al. 2022; Biderman et al. 2023).

    x = x + dense(Attention(LN_1(x))) + MLP(LN_2(x))        (use_parallel_residual, the default)

with rotary embeddings on the first ``rotary_pct · d_head`` dimensions of each head, exact GELU,
LayerNorms and biases everywhere, and an output projection ``embed_out`` of its own.

Hugging Face names → attnlab's (``i`` a layer):

    gpt_neox.embed_in                              transformer.wte
    gpt_neox.layers.i.input_layernorm              transformer.h.i.ln_1
    gpt_neox.layers.i.attention.query_key_value    transformer.h.i.attn.c_attn  (rows regrouped)
    gpt_neox.layers.i.attention.dense              transformer.h.i.attn.c_proj
    gpt_neox.layers.i.post_attention_layernorm     transformer.h.i.ln_2
    gpt_neox.layers.i.mlp.dense_h_to_4h            transformer.h.i.mlp.c_fc
    gpt_neox.layers.i.mlp.dense_4h_to_h            transformer.h.i.mlp.c_proj
    gpt_neox.final_layer_norm                      transformer.ln_f
    embed_out (lm_head in transformers 5)          lm_head

NeoX's fused ``query_key_value`` holds its rows head by head, ``[q_h; k_h; v_h]`` for each head
``h``; attnlab's ``c_attn`` holds all queries, then all keys, then all values:

    (H, 3, d_head, ·) → (3, H, d_head, ·)
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
    hf_activation,
    hf_rope,
    json_bool,
    json_float,
    rope_fields,
    size,
    tied_head,
)
from attnlab.nn.kinds import FullSpec

__all__ = ["NEOX"]

_IGNORED = (".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq")
_LAYER = (
    ("input_layernorm", "ln_1"),
    ("post_attention_layernorm", "ln_2"),
    ("attention.dense", "attn.c_proj"),
    ("mlp.dense_h_to_4h", "mlp.c_fc"),
    ("mlp.dense_4h_to_h", "mlp.c_proj"),
)
_BACK = tuple((ours, theirs) for theirs, ours in _LAYER)


def _config_from_hf(config: Mapping[str, Any]) -> GPTConfig:
    d = size(config, "hidden_size", "width")
    heads = size(config, "num_attention_heads", "heads")
    if d % heads:
        raise ArgumentError(f"hidden_size = {d} must be divisible by num_attention_heads = {heads}")
    bias = json_bool(config, "attention_bias", True)
    return build_config(
        config,
        "max_position_embeddings",
        vocab_size=size(config, "vocab_size", "vocab"),
        n_positions=size(config, "max_position_embeddings", "positions"),
        n_embd=d,
        n_layer=size(config, "num_hidden_layers", "layers"),
        n_head=heads,
        positions="rope",
        layer_norm_epsilon=json_float(config, "layer_norm_eps", 1e-5),
        bias=True,
        activation=activation_of(config.get("hidden_act", "gelu")),
        d_ff=size(config, "intermediate_size", "width"),
        qkv_bias=bias,
        proj_bias=bias,
        tie_embeddings=json_bool(config, "tie_word_embeddings", False),
        parallel_residual=json_bool(config, "use_parallel_residual", True),
        family="neox",
        **rope_fields(config, d // heads, partial=True),
    )


def _config_to_hf(config: GPTConfig) -> dict[str, Any]:
    wants = {
        "positions": "rope", "norm": "layernorm", "mlp": "standard", "rope_pairing": "halves",
        "num_kv_heads": None, "bias": True, "mlp_bias": None,
    }  # fmt: skip
    for name, value in wants.items():
        if getattr(config, name) != value:
            raise ArgumentError(f"{name} must be {value!r} for neox, got {getattr(config, name)!r}")
    if config.bias_of("qkv") != config.bias_of("proj"):
        raise ArgumentError("qkv_bias and proj_bias must agree for neox (attention_bias)")
    if not isinstance(config.attention, FullSpec):
        raise ArgumentError(f"attention must be 'full' for neox, got {config.attention.name!r}")
    return {
        "model_type": "gpt_neox",
        "architectures": ["GPTNeoXForCausalLM"],
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.n_positions,
        "hidden_size": config.n_embd,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "intermediate_size": config.ff_width,
        "hidden_act": hf_activation(config.activation),
        "layer_norm_eps": config.layer_norm_epsilon,
        "use_parallel_residual": config.parallel_residual,
        "attention_bias": config.bias_of("qkv"),
        "tie_word_embeddings": config.tie_embeddings,
        "rotary_pct": config.rotary_width / config.d_head,
        "rotary_emb_base": config.rope_base,
        "partial_rotary_factor": config.rotary_width / config.d_head,
        **hf_rope(config),
    }


def _regroup(t: torch.Tensor, heads: int, to_ours: bool) -> torch.Tensor:
    """``(H, 3, d_head, ·)`` ⇄ ``(3, H, d_head, ·)`` over the rows of ``query_key_value``."""
    rest = t.shape[1:]
    if to_ours:
        return t.reshape(heads, 3, -1, *rest).transpose(0, 1).reshape(t.shape)
    return t.reshape(3, heads, -1, *rest).transpose(0, 1).reshape(t.shape)


def _state_from_hf(state: Mapping[str, torch.Tensor], config: GPTConfig) -> State:
    src = TensorTaker(state, "the weights", ignore=_IGNORED)
    out = {"transformer.wte.weight": src.take("gpt_neox.embed_in.weight")}
    for kind in ("weight", "bias"):
        out[f"transformer.ln_f.{kind}"] = src.take(f"gpt_neox.final_layer_norm.{kind}")
    # embed_out (the name in Pythia's files and transformers 4), lm_head (transformers 5)
    name = "embed_out.weight" if "embed_out.weight" in src.left else "lm_head.weight"
    if not config.tie_embeddings:
        out["lm_head.weight"] = src.take(name)
    else:
        tied_head(src.maybe(name), out["transformer.wte.weight"], name)
    for i in range(config.n_layer):
        hf, at = f"gpt_neox.layers.{i}.", f"transformer.h.{i}."
        for kind in ("weight", "bias"):
            qkv = src.maybe(f"{hf}attention.query_key_value.{kind}")
            if qkv is not None:
                out[f"{at}attn.c_attn.{kind}"] = _regroup(qkv, config.n_head, to_ours=True)
        src.move(out, _LAYER, hf, at)
    src.done()
    return out


def _state_to_hf(state: Mapping[str, torch.Tensor], config: GPTConfig) -> State:
    src = TensorTaker(state, "the model")
    out = {"gpt_neox.embed_in.weight": src.take("transformer.wte.weight")}
    head = src.take("lm_head.weight")
    if not config.tie_embeddings:  # a tied head is the embedding: written once
        out["embed_out.weight"] = head
    for kind in ("weight", "bias"):
        out[f"gpt_neox.final_layer_norm.{kind}"] = src.take(f"transformer.ln_f.{kind}")
    for i in range(config.n_layer):
        hf, at = f"gpt_neox.layers.{i}.", f"transformer.h.{i}."
        for kind in ("weight", "bias"):
            qkv = src.maybe(f"{at}attn.c_attn.{kind}")
            if qkv is not None:
                out[f"{hf}attention.query_key_value.{kind}"] = _regroup(
                    qkv, config.n_head, to_ours=False
                )
        src.move(out, _BACK, at, hf)
    src.done()
    return out


NEOX = register_family(
    Family(
        name="neox",
        model_type="gpt_neox",
        hf_class="GPTNeoXForCausalLM",
        config_from_hf=_config_from_hf,
        config_to_hf=_config_to_hf,
        state_from_hf=_state_from_hf,
        state_to_hf=_state_to_hf,
    )
)
