"""Marian (Junczys-Dowmunt et al. 2018; the OPUS-MT translators, Tiedemann & Thottingal 2020):
the encoder-decoder family read into attnlab's :class:`~attnlab.Transformer`.

Marian is the paper's post-norm Transformer with four differences, each a
:class:`~attnlab.models.config.TransformerConfig` field:

- the sinusoidal table in halves, all sines then all cosines (``sinusoid_layout="halves"``);
- SiLU ("swish") in the feed-forward layers, ``scale_embedding`` of the config;
- one vocabulary for source and target, the embedding shared by both and by the output
  (``share_embeddings``, ``tie_output``), and ``final_logits_bias`` added to the logits;
- the decoder starts from ``pad_token_id`` and its keys are never masked for padding
  (``mask_target_padding=False``).

Names (``MarianMTModel``): ``model.shared``, ``model.{encoder,decoder}.layers.{i}.self_attn.
{q,k,v,out}_proj``, ``self_attn_layer_norm``, ``encoder_attn.{q,k,v,out}_proj`` and
``encoder_attn_layer_norm`` (decoder), ``fc1``, ``fc2``, ``final_layer_norm``; ``lm_head``
(the shared embedding), ``final_logits_bias`` ``(1, V)``. The query, key and value weights are
stacked into each attention's ``in_proj_weight``. ``activation_dropout`` is read as the
residual ``dropout`` (attnlab has one dropout rate; evaluation is the same).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from attnlab.errors import ArgumentError
from attnlab.models.config import TransformerConfig
from attnlab.models.families import Seq2SeqFamily, State, register_family
from attnlab.models.families._common import (
    TensorTaker,
    activation_of,
    hf_activation,
    json_bool,
    json_float,
    size,
    tied_head,
)

__all__ = [
    "MARIAN",
    "TIED",
    "config_from_hf_like",
    "config_to_hf_like",
    "embeddings_from_hf",
    "layers_from_hf",
    "state_to_hf",
]

_ENCODER_LAYER = (
    ("self_attn.out_proj", "self_attn.out_proj"),
    ("self_attn_layer_norm", "norm1"),
    ("fc1", "ff.linear1"),
    ("fc2", "ff.linear2"),
    ("final_layer_norm", "norm2"),
)
_DECODER_LAYER = (
    ("self_attn.out_proj", "self_attn.out_proj"),
    ("self_attn_layer_norm", "norm1"),
    ("encoder_attn.out_proj", "cross_attn.out_proj"),
    ("encoder_attn_layer_norm", "norm2"),
    ("fc1", "ff.linear1"),
    ("fc2", "ff.linear2"),
    ("final_layer_norm", "norm3"),
)
#: (their attention, ours) whose query, key and value are stacked, per stack
_QKV = {"encoder": (("self_attn", "self_attn"),),
        "decoder": (("self_attn", "self_attn"), ("encoder_attn", "cross_attn"))}  # fmt: skip
#: the sinusoidal tables older ``transformers`` saved (attnlab makes its own)
_TABLES = ("embed_positions.weight",)


def _same(config: Mapping[str, Any], a: str, b: str, kind: str) -> int:
    """A size the encoder and the decoder must share (attnlab's Transformer has one of each)."""
    x, y = size(config, a, kind), size(config, b, kind)
    if x != y:
        raise ArgumentError(f"{b} must equal {a} = {x} for attnlab's Transformer, got {y}")
    return x


def _token(config: Mapping[str, Any], key: str, default: int) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ArgumentError(f"{key} must be an int ≥ 0, got {value!r}")
    return value


def config_from_hf_like(
    config: Mapping[str, Any], family: str, *, pad: int, eos: int, start: int | None, **fields: Any
) -> TransformerConfig:
    """A BART-like ``config.json`` (BART's keys, which Marian shares) →
    :class:`~attnlab.models.config.TransformerConfig`: post-norm, one shared vocabulary, a logits
    bias, target padding never masked; ``fields`` the family's own.

    Args:
        config: the ``config.json`` dict.
        family: attnlab's name of the family.
        pad: the default ``pad_token_id``.
        eos: the default ``eos_token_id``.
        start: the default ``decoder_start_token_id`` (``None``: ``pad``).
        **fields: the family's :class:`~attnlab.models.config.TransformerConfig` fields.

    Returns:
        The config.
    """
    vocab = size(config, "vocab_size", "vocab")
    decoder_vocab = config.get("decoder_vocab_size")
    if decoder_vocab not in (None, vocab):
        raise ArgumentError(
            f"decoder_vocab_size must equal vocab_size = {vocab} (one shared vocabulary), "
            f"got {decoder_vocab!r}"
        )
    for key in ("share_encoder_decoder_embeddings", "tie_word_embeddings"):
        if not json_bool(config, key, True):
            raise ArgumentError(f"{key} must be true (one embedding for source, target, output)")
    pad = _token(config, "pad_token_id", pad)
    return TransformerConfig(
        src_vocab_size=vocab,
        tgt_vocab_size=vocab,
        d_model=size(config, "d_model", "width"),
        num_heads=_same(config, "encoder_attention_heads", "decoder_attention_heads", "heads"),
        num_encoder_layers=size(config, "encoder_layers", "layers"),
        num_decoder_layers=size(config, "decoder_layers", "layers"),
        d_ff=_same(config, "encoder_ffn_dim", "decoder_ffn_dim", "width"),
        dropout=json_float(config, "dropout", 0.1, positive=False),
        attention_dropout=json_float(config, "attention_dropout", 0.0, positive=False),
        activation=activation_of(config.get("activation_function", "gelu")),
        layer_norm_eps=1e-5,  # nn.LayerNorm's default, fixed in BART and Marian
        share_embeddings=True,
        tie_output=True,
        max_len=size(config, "max_position_embeddings", "positions", 1024),
        pad_id=pad,
        bos_id=_token(config, "decoder_start_token_id", pad if start is None else start),
        eos_id=_token(config, "eos_token_id", eos),
        family=family,
        scale_embedding=json_bool(config, "scale_embedding", False),
        final_logits_bias=True,
        mask_target_padding=False,
        **fields,
    )


def config_to_hf_like(
    config: TransformerConfig, family: str, architecture: str, **want: Any
) -> dict[str, Any]:
    """:class:`~attnlab.models.config.TransformerConfig` → a BART-like ``config.json`` dict;
    refused (one line naming each field) where the config is not the family's: ``want`` its
    own fields' values.

    Args:
        config: the config.
        family: the ``model_type``.
        architecture: the ``transformers`` class.
        **want: the family's own field values.

    Returns:
        The dict.
    """
    want = {"norm_first": False, "share_embeddings": True, "tie_output": True,
            "final_logits_bias": True, "mask_target_padding": False, "layer_norm_eps": 1e-5,
            "num_kv_heads": None, **want}  # fmt: skip
    wrong = [
        f"{name} = {getattr(config, name)!r} ({family}'s is {value!r})"
        for name, value in want.items()
        if getattr(config, name) != value
    ]
    if wrong:
        raise ArgumentError(f"config cannot be written as {family}: {', '.join(wrong)}")
    return {
        "model_type": family,
        "architectures": [architecture],
        "vocab_size": config.src_vocab_size,
        "d_model": config.d_model,
        "encoder_layers": config.num_encoder_layers,
        "decoder_layers": config.num_decoder_layers,
        "encoder_attention_heads": config.num_heads,
        "decoder_attention_heads": config.num_heads,
        "encoder_ffn_dim": config.d_ff,
        "decoder_ffn_dim": config.d_ff,
        "activation_function": hf_activation(config.activation),
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "activation_dropout": config.dropout,
        "max_position_embeddings": config.max_len,
        "scale_embedding": config.scale_embedding,
        "pad_token_id": config.pad_id,
        "decoder_start_token_id": config.bos_id,
        "eos_token_id": config.eos_id,
        "forced_eos_token_id": config.eos_id,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
    }


def _config_from_hf(config: Mapping[str, Any]) -> TransformerConfig:
    """``MarianConfig`` → :class:`~attnlab.models.config.TransformerConfig`."""
    d = size(config, "d_model", "width")
    if d % 2:
        raise ArgumentError(f"d_model must be even for Marian's sinusoids in halves, got {d}")
    return config_from_hf_like(
        config, "marian", pad=58100, eos=0, start=None, sinusoid_layout="halves"
    )


def _config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """:class:`~attnlab.models.config.TransformerConfig` → ``MarianConfig``'s dict."""
    data = config_to_hf_like(
        config, "marian", "MarianMTModel", sinusoid_layout="halves", positions="sinusoidal"
    )
    return {**data, "decoder_vocab_size": config.tgt_vocab_size,
            "share_encoder_decoder_embeddings": True}  # fmt: skip


def embeddings_from_hf(take: TensorTaker, config: TransformerConfig) -> State:
    """The shared embedding (its tied copies checked and dropped) and the logits bias of a
    ``MarianMTModel``/``BartForConditionalGeneration`` state dict, ``model.`` taken off.

    Args:
        take: the state dict's tensors not yet read.
        config: the model's config.

    Returns:
        attnlab's embeddings (source, target, output: one tensor) and ``final_logits_bias``
        (zeros where the weights hold none: a bare ``MarianModel``).

    Shape:
        ``shared.weight`` ``(V, d_model)``; ``final_logits_bias`` ``(1, V)`` → ``(V,)``.
    """
    shared = take.take("shared.weight")
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"):
        tied_head(take.maybe(name), shared, name)
    out: State = {"src_embed.weight": shared, "tgt_embed.weight": shared, "lm_head.weight": shared}
    bias = take.maybe("final_logits_bias")
    out["final_logits_bias"] = (
        torch.zeros(config.tgt_vocab_size, dtype=shared.dtype, device=shared.device)
        if bias is None
        else bias.reshape(-1)
    )
    return out


def layers_from_hf(take: TensorTaker, config: TransformerConfig, out: State) -> None:
    """The encoder's and the decoder's layers (BART's names, which Marian shares) into ``out``.

    Args:
        take: the state dict's tensors not yet read.
        config: the model's config (its layer counts).
        out: attnlab's state dict being built.

    Shape:
        each attention's ``{q,k,v}_proj`` ``(d_model, d_model)`` ×3 → ``in_proj_weight``
        ``(3 · d_model, d_model)``; the rest as it is.
    """
    for stack, n, pairs in (
        ("encoder", config.num_encoder_layers, _ENCODER_LAYER),
        ("decoder", config.num_decoder_layers, _DECODER_LAYER),
    ):
        for i in range(n):
            at = f"{stack}.layers.{i}."
            for theirs, ours in _QKV[stack]:
                for kind, name in (("weight", "in_proj_weight"), ("bias", "in_proj_bias")):
                    out[f"{at}{ours}.{name}"] = torch.cat(
                        [take.take(f"{at}{theirs}.{p}_proj.{kind}") for p in "qkv"]
                    )
            take.move(out, pairs, at, at)


def _state_from_hf(state: Mapping[str, torch.Tensor], config: TransformerConfig) -> State:
    """``MarianMTModel``'s (or ``MarianModel``'s) state dict → attnlab's."""
    take = TensorTaker({n.removeprefix("model."): t for n, t in state.items()}, "the weights",
                       ignore=_TABLES)  # fmt: skip
    out = embeddings_from_hf(take, config)
    layers_from_hf(take, config, out)
    take.done()
    return out


def state_to_hf(state: Mapping[str, torch.Tensor], config: TransformerConfig) -> State:
    """attnlab's state dict → ``MarianMTModel``'s or ``BartForConditionalGeneration``'s layers,
    the shared embedding (once) and the logits bias.

    Args:
        state: attnlab's state dict.
        config: the model's config (its layer counts).

    Returns:
        The tensors under Hugging Face's names (a family adds its own: BART's positions).

    Shape:
        ``in_proj_weight`` ``(3 · d_model, d_model)`` → ``{q,k,v}_proj`` ×3;
        ``final_logits_bias`` ``(V,)`` → ``(1, V)``.
    """
    out: State = {
        "model.shared.weight": state["src_embed.weight"],  # the tied names left out
        "final_logits_bias": state["final_logits_bias"].reshape(1, -1),
    }
    for stack, n, pairs in (
        ("encoder", config.num_encoder_layers, _ENCODER_LAYER),
        ("decoder", config.num_decoder_layers, _DECODER_LAYER),
    ):
        for i in range(n):
            ours_at, theirs_at = f"{stack}.layers.{i}.", f"model.{stack}.layers.{i}."
            for theirs, ours in _QKV[stack]:
                for kind, name in (("weight", "in_proj_weight"), ("bias", "in_proj_bias")):
                    parts = state[f"{ours_at}{ours}.{name}"].chunk(3)
                    for p, t in zip("qkv", parts, strict=True):
                        out[f"{theirs_at}{theirs}.{p}_proj.{kind}"] = t
            for theirs, ours in pairs:
                for kind in ("weight", "bias"):
                    out[f"{theirs_at}{theirs}.{kind}"] = state[f"{ours_at}{ours}.{kind}"]
    return out


#: the names BART and Marian tie to the shared embedding (not written, not missing)
TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")


MARIAN = register_family(
    Seq2SeqFamily(
        name="marian",
        model_type="marian",
        hf_class="MarianMTModel",
        config_from_hf=_config_from_hf,
        config_to_hf=_config_to_hf,
        state_from_hf=_state_from_hf,
        state_to_hf=state_to_hf,
        tied=(
            *TIED,
            "model.encoder.embed_positions.weight",
            "model.decoder.embed_positions.weight",
        ),
    )
)
