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
| phi3 | `phi3` | Llama with fused `qkv_proj`/`gate_up_proj`, partial rotary, a sliding window |
| gemma2 | `gemma2` | (1 + g) RMSNorms, sandwich norms, √d embedding scale, GELU gate, soft-capped scores and logits, local/global layers |

Encoders follow the same rule with an :class:`EncoderFamily`: ``config.json`` ⇄
:class:`~attnlab.models.encoder.EncoderConfig` and the weights ⇄ attnlab's
:class:`~attnlab.models.encoder.Encoder`, registered by the same :func:`register_family`:

| family | Hugging Face `model_type` | what differs from BERT |
|---|---|---|
| bert | `bert` | — (post-norm, exact GELU, token types, learned positions, pooler) |
| roberta | `roberta` | positions counted from `pad_token_id + 1` over the tokens that are not padding |
| distilbert | `distilbert` | its own weight names, no token types, no pooler |
| electra | `electra` | no pooler; embeddings of `embedding_size` projected to the width |

Encoder-decoders too, with a :class:`Seq2SeqFamily`: ``config.json`` ⇄
:class:`~attnlab.models.config.TransformerConfig` and the weights ⇄ attnlab's
:class:`~attnlab.Transformer` (:mod:`attnlab.models.seq2seq_hf`):

| family | Hugging Face `model_type` | what differs from Vaswani et al. 2017 |
|---|---|---|
| marian | `marian` | sinusoids in halves (sines, then cosines), SiLU, one shared vocabulary, a logits bias |
| bart | `bart` | Marian's names; learned positions from 2, a LayerNorm over the embeddings, GELU |

Adding a family is one module and one :func:`register_family` call; nothing outside this
package asks a ``model_type`` (:func:`is_encoder` tells which registry a config belongs to).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, overload

import torch

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.config import GPTConfig, TransformerConfig
from attnlab.models.encoder import EncoderConfig

__all__ = [
    "PRESETS",
    "EncoderFamily",
    "Family",
    "Seq2SeqFamily",
    "encoder_family_named",
    "encoder_family_of",
    "family_named",
    "family_of",
    "is_encoder",
    "llama_ff_width",
    "preset",
    "register_family",
    "seq2seq_family_named",
    "seq2seq_family_of",
    "supported_model_types",
]

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
        state_to_hf: attnlab's state dict → Hugging Face's (a tied head left out: it is the
            embedding, as ``save_pretrained`` writes it).

    Shape:
        the state dicts' tensors keep their shapes but for the fused projections: NeoX's
        ``query_key_value`` rows are regrouped, Llama's ``q_proj``/``k_proj``/``v_proj``
        ``(H · d_head, d)``, ``(H_kv · d_head, d)`` ×2 are stacked into ``c_attn``.
    """

    name: str
    model_type: str
    hf_class: str
    config_from_hf: Callable[[Mapping[str, Any]], GPTConfig]
    config_to_hf: Callable[[GPTConfig], dict[str, Any]]
    state_from_hf: Callable[[Mapping[str, torch.Tensor], GPTConfig], State]
    state_to_hf: Callable[[Mapping[str, torch.Tensor], GPTConfig], State]


@dataclass(frozen=True)
class EncoderFamily:
    """One encoder family's conversions: :class:`Family`'s fields for an
    :class:`~attnlab.models.encoder.Encoder`.

    Attributes:
        name: attnlab's name (``EncoderConfig.family``).
        model_type: Hugging Face's ``model_type``.
        hf_class: the ``transformers`` class of the bare encoder (``BertModel``).
        config_from_hf: ``config.json`` dict → :class:`~attnlab.models.encoder.EncoderConfig`.
        config_to_hf: config → ``config.json`` dict (refuses what the family cannot hold).
        state_from_hf: Hugging Face state dict → attnlab's (a task head left out).
        state_to_hf: attnlab's state dict → Hugging Face's.
        hf_init: the keyword arguments of ``hf_class`` beside its config for a config
            (BERT's ``add_pooling_layer``); default none.

    Shape:
        the state dicts' tensors keep their shapes but for the attention's query, key and value
        ``(d_model, d_model)`` ×3, stacked into ``in_proj_weight`` ``(3 · d_model, d_model)``.
    """

    name: str
    model_type: str
    hf_class: str
    config_from_hf: Callable[[Mapping[str, Any]], EncoderConfig]
    config_to_hf: Callable[[EncoderConfig], dict[str, Any]]
    state_from_hf: Callable[[Mapping[str, torch.Tensor], EncoderConfig], State]
    state_to_hf: Callable[[Mapping[str, torch.Tensor], EncoderConfig], State]
    hf_init: Callable[[EncoderConfig], dict[str, Any]] = lambda config: {}


@dataclass(frozen=True)
class Seq2SeqFamily:
    """One encoder-decoder family's conversions: :class:`Family`'s fields for an
    :class:`~attnlab.Transformer`.

    Attributes:
        name: attnlab's name (``TransformerConfig.family``).
        model_type: Hugging Face's ``model_type``.
        hf_class: the ``transformers`` class of the translation model (``MarianMTModel``).
        config_from_hf: ``config.json`` dict → :class:`~attnlab.models.config.TransformerConfig`.
        config_to_hf: config → ``config.json`` dict.
        state_from_hf: Hugging Face state dict → attnlab's.
        state_to_hf: attnlab's state dict → Hugging Face's (a tied matrix once, as
            ``save_pretrained`` writes it).
        tied: the names ``state_to_hf`` leaves out because the model ties them.
        source_bos: the encoder reads the tokenizer's ``bos`` before a text (BART's ``<s>``);
            every family reads ``</s>`` after it.

    Shape:
        the state dicts' tensors keep their shapes but for the attentions' query, key and value
        ``(d_model, d_model)`` ×3, stacked into ``in_proj_weight`` ``(3 · d_model, d_model)``,
        and the logits bias, ``(1, V)`` in Hugging Face's, ``(V,)`` in attnlab's.
    """

    name: str
    model_type: str
    hf_class: str
    config_from_hf: Callable[[Mapping[str, Any]], TransformerConfig]
    config_to_hf: Callable[[TransformerConfig], dict[str, Any]]
    state_from_hf: Callable[[Mapping[str, torch.Tensor], TransformerConfig], State]
    state_to_hf: Callable[[Mapping[str, torch.Tensor], TransformerConfig], State]
    tied: tuple[str, ...] = ()
    source_bos: bool = False


_FAMILIES: dict[str, Family] = {}
_ENCODERS: dict[str, EncoderFamily] = {}
_SEQ2SEQ: dict[str, Seq2SeqFamily] = {}


@overload
def register_family(family: Family) -> Family: ...
@overload
def register_family(family: EncoderFamily) -> EncoderFamily: ...
@overload
def register_family(family: Seq2SeqFamily) -> Seq2SeqFamily: ...


def register_family(
    family: Family | EncoderFamily | Seq2SeqFamily,
) -> Family | EncoderFamily | Seq2SeqFamily:
    """Add a family (by its ``name``; its ``model_type`` is looked up too): a decoder's
    :class:`Family` or an encoder's :class:`EncoderFamily`.

    Args:
        family: the family.

    Returns:
        ``family``.
    """
    if isinstance(family, EncoderFamily):
        _ENCODERS[family.name] = family
    elif isinstance(family, Family):
        _FAMILIES[family.name] = family
    elif isinstance(family, Seq2SeqFamily):
        _SEQ2SEQ[family.name] = family
    else:
        raise ArgumentTypeError(
            "family must be a Family, an EncoderFamily or a Seq2SeqFamily, "
            f"got {type(family).__name__}"
        )
    return family


def is_encoder(config: Mapping[str, Any]) -> bool:
    """Whether a Hugging Face ``config.json`` is of an encoder family (its ``model_type``).

    Args:
        config: the config as a dict.

    Returns:
        ``True`` for a registered :class:`EncoderFamily`'s ``model_type``.
    """
    return _encoder_of(config) is not None


def _encoder_of(config: Mapping[str, Any]) -> EncoderFamily | None:
    """The registered encoder family of a ``config.json``'s ``model_type``, or ``None``."""
    _load()
    if not isinstance(config, Mapping):
        raise ArgumentTypeError(f"config must be a dict, got {type(config).__name__}")
    found = [f for f in _ENCODERS.values() if f.model_type == config.get("model_type")]
    return found[0] if found else None


def encoder_family_of(config: Mapping[str, Any]) -> EncoderFamily:
    """The encoder family of a Hugging Face ``config.json`` (its ``model_type``).

    Args:
        config: the config as a dict.

    Returns:
        The :class:`EncoderFamily`.
    """
    family = _encoder_of(config)
    if family is not None:
        return family
    known = ", ".join(sorted(f.model_type for f in _ENCODERS.values()))
    raise ArgumentError(
        f"model_type must be an encoder's ({known}), got {config.get('model_type')!r}"
    )


def encoder_family_named(name: str) -> EncoderFamily:
    """The family of an :class:`~attnlab.models.encoder.EncoderConfig`'s ``family`` field.

    Args:
        name: ``"bert"``, ``"roberta"`` or ``"distilbert"``.

    Returns:
        The :class:`EncoderFamily`.
    """
    _load()
    if name not in _ENCODERS:
        raise ArgumentError(f"family must be one of {sorted(_ENCODERS)}, got {name!r}")
    return _ENCODERS[name]


def seq2seq_family_of(config: Mapping[str, Any]) -> Seq2SeqFamily | None:
    """The encoder-decoder family of a Hugging Face ``config.json`` (its ``model_type``).

    Args:
        config: the config as a dict.

    Returns:
        The registered :class:`Seq2SeqFamily`, or ``None`` when it is not an encoder-decoder's.
    """
    _load()
    if not isinstance(config, Mapping):
        raise ArgumentTypeError(f"config must be a dict, got {type(config).__name__}")
    found = [f for f in _SEQ2SEQ.values() if f.model_type == config.get("model_type")]
    return found[0] if found else None


def seq2seq_family_named(name: str) -> Seq2SeqFamily:
    """The family of a :class:`~attnlab.models.config.TransformerConfig`'s ``family`` field.

    Args:
        name: ``"marian"``.

    Returns:
        The :class:`Seq2SeqFamily`.
    """
    _load()
    if name not in _SEQ2SEQ:
        raise ArgumentError(
            f"family must be one of {sorted(_SEQ2SEQ)} to export, got {name!r} (a model of "
            "attnlab's own exports with attnlab.save_run)"
        )
    return _SEQ2SEQ[name]


def supported_model_types() -> tuple[str, ...]:
    """The Hugging Face ``model_type`` values attnlab reads.

    Returns:
        Sorted model types.
    """
    _load()
    families: list[Family | EncoderFamily | Seq2SeqFamily] = [
        *_FAMILIES.values(),
        *_ENCODERS.values(),
        *_SEQ2SEQ.values(),
    ]
    return tuple(sorted(f.model_type for f in families))


def family_named(name: str) -> Family:
    """The family of a :class:`~attnlab.models.config.GPTConfig`'s ``family`` field.

    Args:
        name: ``"gpt2"``, ``"llama"``, ``"mistral"``, ``"qwen2"``, ``"neox"``, ``"phi3"`` or
            ``"gemma2"``.

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
    if is_encoder(config):
        raise ArgumentError(
            f"model_type {model_type!r} is an encoder, not a decoder: load it with "
            "attnlab.load_pretrained or attnlab.Encoder.from_hf"
        )
    if seq2seq_family_of(config) is not None:
        raise ArgumentError(
            f"model_type {model_type!r} is an encoder-decoder, not a decoder: load it with "
            "attnlab.load_pretrained or attnlab.models.seq2seq_hf.transformer_from_hf"
        )
    raise ArgumentError(
        f"model_type must be one of {', '.join(supported_model_types())}, got {model_type!r}"
    )


#: the families a model can be trained from scratch as (:func:`preset`)
PRESETS = ("gpt2", "llama", "neox")


def llama_ff_width(n_embd: int) -> int:
    """Llama's MLP width for a model width: ``8/3 · n_embd`` rounded up to a multiple of 8.

    A gated MLP has three matrices where GPT-2's has two: ``8/3 · n_embd`` keeps its parameters
    and FLOPs those of a ``4 · n_embd`` standard MLP (``3 · 8/3 = 2 · 4``), as Llama does (Touvron
    et al. 2023, §2.2, rounding up to a multiple of 256); a multiple of 8 splits evenly over 2,
    4 or 8 tensor-parallel processes and fills tensor cores.

    Args:
        n_embd: the model width.

    Returns:
        The hidden width ``d_ff``.
    """
    return 8 * -(-8 * n_embd // 24)  # ceil(8/3 · n_embd / 8) · 8


def preset(name: str, *, n_embd: int, n_head: int) -> dict[str, Any]:
    """The :class:`~attnlab.models.config.GPTConfig` fields that make a model of one family, for
    training from scratch (``attnlab train lm --family``); the one place a family's parts are
    named. The sizes, the vocabulary and the attention kind are the caller's.

    ========  ==================================================================================
    family    fields
    ========  ==================================================================================
    gpt2      none (GPT-2's defaults: LayerNorm, tanh GELU, learned positions, biases, tied head)
    llama     RMSNorm, SwiGLU (``mlp="gated"``, ``activation="silu"``, ``d_ff`` from
              :func:`llama_ff_width`), RoPE paired by halves, no biases, untied head
    neox      LayerNorm, exact GELU, parallel residual, partial RoPE paired by halves
              (``rotary_dim`` = ``d_head / 4`` rounded to an even number, at least 2), biases,
              untied head
    ========  ==================================================================================

    Args:
        name: ``"gpt2"``, ``"llama"`` or ``"neox"``.
        n_embd: the model width (``d_ff`` of Llama).
        n_head: the query heads (``rotary_dim`` of NeoX).

    Returns:
        ``{field: value}`` to pass to :class:`~attnlab.models.config.GPTConfig`.

    Raises:
        ValueError: an unknown family.
    """
    if name not in PRESETS:
        raise ArgumentError(f"family must be one of {', '.join(PRESETS)}, got {name!r}")
    if name == "gpt2":
        return {}
    rope = {"positions": "rope", "rope_pairing": "halves", "tie_embeddings": False}
    if name == "llama":
        return {
            **rope, "norm": "rmsnorm", "activation": "silu", "mlp": "gated",
            "d_ff": llama_ff_width(n_embd), "bias": False, "family": "llama",
        }  # fmt: skip
    d_head = max(1, n_embd // n_head)
    return {
        **rope, "norm": "layernorm", "activation": "gelu", "parallel_residual": True,
        "rotary_dim": min(d_head, max(2, 2 * round(d_head / 8))), "bias": True, "family": "neox",
    }  # fmt: skip


def _load() -> None:
    """Register the built-in families (their modules import this one)."""
    if not _FAMILIES or not _ENCODERS or not _SEQ2SEQ:
        from attnlab.models.families import (  # noqa: F401
            bart,
            bert,
            gemma2,
            gpt2,
            llama,
            marian,
            neox,
            phi3,
        )
