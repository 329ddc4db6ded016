"""What models return: small dataclasses, not positional tuples."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.nn.kv_cache import ModelCache

__all__ = ["CausalLMOutput", "Seq2SeqOutput"]


@dataclass
class CausalLMOutput:
    """Output of a decoder-only language model.

    Attributes:
        logits: ``(B, T, vocab_size)``.
        loss: mean cross-entropy of next-token prediction when labels were given, else ``None``.
        cache: the :class:`~attnlab.nn.kv_cache.ModelCache` that was used, if any.

    Shape:
        logits ``(B, T, vocab_size)``; loss a scalar ``()``.
    """

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    cache: ModelCache | None = None


@dataclass
class Seq2SeqOutput:
    """Output of an encoder-decoder model.

    Attributes:
        logits: ``(B, T_tgt, tgt_vocab_size)``.
        loss: label-smoothed cross-entropy over non-padding targets when targets were given.
        cache: the decoder's :class:`~attnlab.nn.kv_cache.ModelCache`, if any.

    Shape:
        logits ``(B, T_tgt, tgt_vocab_size)``; loss a scalar ``()``.
    """

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    cache: ModelCache | None = None
