"""BERT (Devlin et al. 2019), RoBERTa (Liu et al. 2019), DistilBERT (Sanh et al. 2019) and ELECTRA
(Clark et al. 2020, the discriminator): the encoder families, read into attnlab's
:class:`~attnlab.models.encoder.Encoder`.

All three are the same post-norm encoder; they differ in names and in two parts:

- BERT: ``embeddings.{word,position,token_type}_embeddings``, ``embeddings.LayerNorm``;
  ``encoder.layer.{i}.attention.self.{query,key,value}``, ``attention.output.dense``,
  ``attention.output.LayerNorm``, ``intermediate.dense``, ``output.dense``,
  ``output.LayerNorm``; ``pooler.dense``.
- RoBERTa: BERT's names, positions counted from ``pad_token_id + 1`` over the tokens that are
  not padding (``EncoderConfig.position_offset``).
- DistilBERT: ``transformer.layer.{i}.attention.{q,k,v,out}_lin``, ``sa_layer_norm``,
  ``ffn.lin{1,2}``, ``output_layer_norm``; no token types, no pooler; LayerNorm ε = 1e-12.
- ELECTRA: BERT's names, no pooler, embeddings of ``embedding_size`` projected to the model's
  width by ``embeddings_project`` (when the two differ).

The query, key and value weights are stacked into the layer's one ``in_proj_weight``. A model
saved with a task head (``BertForMaskedLM``: ``bert.`` before every name, ``cls.…``) is read
without the head: the encoder is what attnlab runs. The pooler is read where the weights hold
one (``BertModel``) and left out where they do not (a masked-LM checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from attnlab.errors import ArgumentError
from attnlab.models.encoder import EncoderConfig
from attnlab.models.families import EncoderFamily, State, register_family
from attnlab.models.families._common import TensorTaker, json_bool, json_float, size

__all__ = ["BERT", "DISTILBERT", "ELECTRA", "ROBERTA", "strip_task_head"]

#: the prefixes of a task head's tensors (masked LM, classification, QA): not the encoder's
_HEADS = ("cls.", "lm_head.", "vocab_transform.", "vocab_layer_norm.", "vocab_projector.",
          "classifier.", "pre_classifier.", "qa_outputs.", "discriminator_predictions.",
          "generator_predictions.", "generator_lm_head.")  # fmt: skip
#: buffers older ``transformers`` saved with the weights
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")

_BERT_LAYER = (
    ("attention.output.dense", "self_attn.out_proj"),
    ("attention.output.LayerNorm", "norm1"),
    ("intermediate.dense", "ff.linear1"),
    ("output.dense", "ff.linear2"),
    ("output.LayerNorm", "norm2"),
)
_DISTIL_LAYER = (
    ("attention.out_lin", "self_attn.out_proj"),
    ("sa_layer_norm", "norm1"),
    ("ffn.lin1", "ff.linear1"),
    ("ffn.lin2", "ff.linear2"),
    ("output_layer_norm", "norm2"),
)
#: a layer stack's prefix, its renamed parts and its query/key/value projections
_BERT = ("encoder.layer.", _BERT_LAYER,
         ("attention.self.query", "attention.self.key", "attention.self.value"))  # fmt: skip
_DISTIL = ("transformer.layer.", _DISTIL_LAYER,
           ("attention.q_lin", "attention.k_lin", "attention.v_lin"))  # fmt: skip
_EMBEDDINGS = (
    ("word_embeddings", "word_embeddings"),
    ("position_embeddings", "position_embeddings"),
    ("token_type_embeddings", "token_type_embeddings"),
    ("LayerNorm", "norm"),
)


def _gelu(config: Mapping[str, Any], key: str) -> None:
    act = config.get(key, "gelu")
    if act != "gelu":
        raise ArgumentError(f"{key} must be 'gelu' (exact GELU), got {act!r}")


def _bert_config(config: Mapping[str, Any], family: str) -> EncoderConfig:
    """``BertConfig`` / ``RobertaConfig`` / ``ElectraConfig`` →
    :class:`~attnlab.models.encoder.EncoderConfig`."""
    _gelu(config, "hidden_act")
    kind = config.get("position_embedding_type", "absolute")
    if kind not in (None, "absolute"):
        raise ArgumentError(f"position_embedding_type must be 'absolute', got {kind!r}")
    for key in ("is_decoder", "add_cross_attention"):
        if json_bool(config, key, False):
            raise ArgumentError(f"{key} must be false: attnlab's Encoder is an encoder")
    pad = config.get("pad_token_id", 1 if family == "roberta" else 0)
    if pad is not None and (not isinstance(pad, int) or isinstance(pad, bool) or pad < 0):
        raise ArgumentError(f"pad_token_id must be an int ≥ 0 or null, got {pad!r}")
    offset = None
    if family == "roberta":
        if pad is None:
            raise ArgumentError("pad_token_id must be set for RoBERTa (its positions skip padding)")
        offset = pad + 1
    d = size(config, "hidden_size", "width")
    e = size(config, "embedding_size", "width", d) if family == "electra" else d
    return EncoderConfig(
        vocab_size=size(config, "vocab_size", "vocab"),
        n_positions=size(config, "max_position_embeddings", "positions", 512),
        d_model=d,
        n_layer=size(config, "num_hidden_layers", "layers"),
        n_head=size(config, "num_attention_heads", "heads"),
        d_ff=size(config, "intermediate_size", "width"),
        type_vocab_size=size(config, "type_vocab_size", "vocab", 2),
        layer_norm_eps=json_float(config, "layer_norm_eps", 1e-12),
        dropout=json_float(config, "hidden_dropout_prob", 0.0, positive=False),
        attention_dropout=json_float(config, "attention_probs_dropout_prob", 0.0, positive=False),
        pad_id=pad,
        position_offset=offset,
        pooler=family != "electra",
        embedding_size=None if e == d else e,
        family=family,
    )


def _bert_to_hf(config: EncoderConfig, model_type: str, architecture: str) -> dict[str, Any]:
    if not config.type_vocab_size:
        raise ArgumentError(f"type_vocab_size must be ≥ 1 for {model_type}, got 0")
    if config.embedding_size is not None and model_type != "electra":
        raise ArgumentError(
            f"embedding_size must be None for {model_type} (only ELECTRA projects its "
            f"embeddings), got {config.embedding_size}"
        )
    if config.pooler and model_type == "electra":
        raise ArgumentError("pooler must be False for electra (ElectraModel has none), got True")
    expected = (config.pad_id or 0) + 1 if model_type == "roberta" else None
    if config.position_offset != expected:
        raise ArgumentError(
            f"position_offset must be {expected} for {model_type}, got {config.position_offset}"
        )
    return {
        "model_type": model_type,
        "architectures": [architecture],
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "intermediate_size": config.d_ff,
        "hidden_act": "gelu",
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.n_positions,
        "type_vocab_size": config.type_vocab_size,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_id,
        "position_embedding_type": "absolute",
        **(
            {"embedding_size": config.embedding_size or config.d_model}
            if model_type == "electra"
            else {}
        ),
    }


def _distil_config(config: Mapping[str, Any]) -> EncoderConfig:
    """``DistilBertConfig`` → :class:`~attnlab.models.encoder.EncoderConfig`."""
    _gelu(config, "activation")
    pad = config.get("pad_token_id", 0)
    return EncoderConfig(
        vocab_size=size(config, "vocab_size", "vocab"),
        n_positions=size(config, "max_position_embeddings", "positions", 512),
        d_model=size(config, "dim", "width"),
        n_layer=size(config, "n_layers", "layers"),
        n_head=size(config, "n_heads", "heads"),
        d_ff=size(config, "hidden_dim", "width"),
        type_vocab_size=0,
        layer_norm_eps=1e-12,  # fixed in DistilBERT
        dropout=json_float(config, "dropout", 0.0, positive=False),
        attention_dropout=json_float(config, "attention_dropout", 0.0, positive=False),
        pad_id=pad if isinstance(pad, int) and not isinstance(pad, bool) else None,
        pooler=False,
        family="distilbert",
    )


def _distil_to_hf(config: EncoderConfig) -> dict[str, Any]:
    if (
        config.type_vocab_size
        or config.pooler
        or config.position_offset is not None
        or config.embedding_size is not None
    ):
        raise ArgumentError(
            "DistilBERT has no token types, no pooler and plain positions: type_vocab_size must "
            f"be 0, pooler False, position_offset None, got {config.type_vocab_size}, "
            f"{config.pooler}, {config.position_offset}"
        )
    if config.layer_norm_eps != 1e-12:
        raise ArgumentError(
            f"layer_norm_eps must be 1e-12 for DistilBERT, got {config.layer_norm_eps}"
        )
    return {
        "model_type": "distilbert",
        "architectures": ["DistilBertModel"],
        "vocab_size": config.vocab_size,
        "dim": config.d_model,
        "n_layers": config.n_layer,
        "n_heads": config.n_head,
        "hidden_dim": config.d_ff,
        "activation": "gelu",
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "max_position_embeddings": config.n_positions,
        "sinusoidal_pos_embds": False,
        "pad_token_id": config.pad_id,
    }


def strip_task_head(state: Mapping[str, torch.Tensor], prefix: str) -> State:
    """The encoder's tensors of a state dict: ``prefix`` (``"bert."``) taken off the names, a task
    head's tensors (``cls.…``, ``classifier.…``) and old buffers left out.

    Args:
        state: the state dict under Hugging Face's names.
        prefix: the base model's attribute in a task model, with its dot.

    Returns:
        The bare model's tensors.

    Shape:
        each tensor as it is.
    """
    return {
        name.removeprefix(prefix): t
        for name, t in state.items()
        if not name.startswith(_HEADS) and not name.endswith(_BUFFERS)
    }


def _qkv(
    take: TensorTaker, source: str, names: tuple[str, str, str], out: State, target: str
) -> None:
    """Stack the query, key and value projections into ``in_proj_weight``/``in_proj_bias``."""
    for kind, ours in (("weight", "in_proj_weight"), ("bias", "in_proj_bias")):
        out[f"{target}self_attn.{ours}"] = torch.cat(
            [take.take(f"{source}{n}.{kind}") for n in names]
        )


def _state_from_hf(
    state: Mapping[str, torch.Tensor], config: EncoderConfig, prefix: str, distil: bool
) -> State:
    take = TensorTaker(strip_task_head(state, prefix), "the weights")
    out: State = {}
    take.move(out, _EMBEDDINGS, "embeddings.", "embeddings.")
    stack, pairs, qkv = _DISTIL if distil else _BERT
    for i in range(config.n_layer):
        _qkv(take, f"{stack}{i}.", qkv, out, f"layers.{i}.")
        take.move(out, pairs, f"{stack}{i}.", f"layers.{i}.")
    take.move(
        out, (("pooler.dense", "pooler"), ("embeddings_project", "embeddings_project")), "", ""
    )
    take.done()
    return out


def _state_to_hf(state: Mapping[str, torch.Tensor], config: EncoderConfig, distil: bool) -> State:
    out: State = {}
    for theirs, ours in _EMBEDDINGS:
        for kind in ("weight", "bias"):
            t = state.get(f"embeddings.{ours}.{kind}")
            if t is not None:
                out[f"embeddings.{theirs}.{kind}"] = t
    stack, pairs, qkv = _DISTIL if distil else _BERT
    for i in range(config.n_layer):
        for kind, ours in (("weight", "in_proj_weight"), ("bias", "in_proj_bias")):
            parts = state[f"layers.{i}.self_attn.{ours}"].chunk(3)
            for name, t in zip(qkv, parts, strict=True):
                out[f"{stack}{i}.{name}.{kind}"] = t
        for theirs, ours in pairs:
            for kind in ("weight", "bias"):
                out[f"{stack}{i}.{theirs}.{kind}"] = state[f"layers.{i}.{ours}.{kind}"]
    if config.embedding_size is not None and config.embedding_size != config.d_model:
        for kind in ("weight", "bias"):
            out[f"embeddings_project.{kind}"] = state[f"embeddings_project.{kind}"]
    if config.pooler:
        out["pooler.dense.weight"], out["pooler.dense.bias"] = (
            state["pooler.weight"],
            state["pooler.bias"],
        )
    return out


def _bert_like(name: str, hf_class: str, *, pooler: bool) -> EncoderFamily:
    """Register a family with BERT's names (``name.`` before them in a task model)."""
    return register_family(
        EncoderFamily(
            name=name,
            model_type=name,
            hf_class=hf_class,
            config_from_hf=lambda c: _bert_config(c, name),
            config_to_hf=lambda c: _bert_to_hf(c, name, hf_class),
            state_from_hf=lambda s, c: _state_from_hf(s, c, f"{name}.", distil=False),
            state_to_hf=lambda s, c: _state_to_hf(s, c, distil=False),
            hf_init=(lambda c: {"add_pooling_layer": c.pooler}) if pooler else (lambda c: {}),
        )
    )


BERT = _bert_like("bert", "BertModel", pooler=True)
ROBERTA = _bert_like("roberta", "RobertaModel", pooler=True)
ELECTRA = _bert_like("electra", "ElectraModel", pooler=False)  # ElectraModel has none
DISTILBERT = register_family(
    EncoderFamily(
        name="distilbert",
        model_type="distilbert",
        hf_class="DistilBertModel",
        config_from_hf=_distil_config,
        config_to_hf=_distil_to_hf,
        state_from_hf=lambda s, c: _state_from_hf(s, c, "distilbert.", distil=True),
        state_to_hf=lambda s, c: _state_to_hf(s, c, distil=True),
    )
)
