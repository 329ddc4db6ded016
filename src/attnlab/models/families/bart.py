"""BART (Lewis et al. 2020): the encoder-decoder family read into attnlab's
:class:`~attnlab.Transformer`, with Marian's names and layers (:mod:`.marian`) and three parts of
its own, each a :class:`~attnlab.models.config.TransformerConfig` field:

- learned positions, one table for the encoder and one for the decoder, each of
  ``max_position_embeddings + 2`` rows read at position ``t + 2`` (``positions="learned"``,
  ``position_offset=2``);
- a LayerNorm over embeddings + positions (``layernorm_embedding``: ``norm_embeddings``);
- GELU (exact), no embedding scale by default; the decoder starts from ``</s>`` (2).

Names (``BartForConditionalGeneration``): Marian's, plus ``model.{encoder,decoder}.
embed_positions.weight`` and ``model.{encoder,decoder}.layernorm_embedding``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from attnlab.models.config import TransformerConfig
from attnlab.models.families import Seq2SeqFamily, State, register_family
from attnlab.models.families._common import TensorTaker
from attnlab.models.families.marian import (
    TIED,
    config_from_hf_like,
    config_to_hf_like,
    embeddings_from_hf,
    layers_from_hf,
    state_to_hf,
)

__all__ = ["BART"]

_OWN = ("embed_positions", "layernorm_embedding")
_OURS = {"embed_positions": "{}_positions", "layernorm_embedding": "{}_embed_norm"}
_SIDES = (("encoder", "src"), ("decoder", "tgt"))
_OWN_FIELDS = {"positions": "learned", "position_offset": 2, "norm_embeddings": True}


def _config_from_hf(config: Mapping[str, Any]) -> TransformerConfig:
    """``BartConfig`` → :class:`~attnlab.models.config.TransformerConfig`."""
    return config_from_hf_like(config, "bart", pad=1, eos=2, start=2, **_OWN_FIELDS)


def _config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """:class:`~attnlab.models.config.TransformerConfig` → ``BartConfig``'s dict."""
    return config_to_hf_like(config, "bart", "BartForConditionalGeneration", **_OWN_FIELDS)


def _state_from_hf(state: Mapping[str, torch.Tensor], config: TransformerConfig) -> State:
    """``BartForConditionalGeneration``'s (or ``BartModel``'s) state dict → attnlab's."""
    take = TensorTaker({n.removeprefix("model."): t for n, t in state.items()}, "the weights")
    out = embeddings_from_hf(take, config)
    for stack, side in _SIDES:
        take.move(out, [(part, _OURS[part].format(side)) for part in _OWN], f"{stack}.", "")
    layers_from_hf(take, config, out)
    take.done()
    return out


def _state_to_hf(state: Mapping[str, torch.Tensor], config: TransformerConfig) -> State:
    """attnlab's state dict → ``BartForConditionalGeneration``'s."""
    out = state_to_hf(state, config)
    for stack, side in _SIDES:
        for part in _OWN:
            for kind in ("weight", "bias"):
                t = state.get(f"{_OURS[part].format(side)}.{kind}")
                if t is not None:
                    out[f"model.{stack}.{part}.{kind}"] = t
    return out


BART = register_family(
    Seq2SeqFamily(
        name="bart",
        model_type="bart",
        hf_class="BartForConditionalGeneration",
        config_from_hf=_config_from_hf,
        config_to_hf=_config_to_hf,
        state_from_hf=_state_from_hf,
        state_to_hf=_state_to_hf,
        tied=TIED,
        source_bos=True,
    )
)
