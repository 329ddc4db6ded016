"""Attention building blocks: masks, the functional core, modules and positional encodings.

Beside exact attention (:func:`scaled_dot_product_attention`, :class:`MultiHeadAttention`), two
approximations of softmax attention: :class:`~attnlab.nn.linformer.LinformerAttention` (keys and
values projected along the sequence to ``k`` rows) and
:class:`~attnlab.nn.performer.PerformerAttention` (FAVOR+ positive orthogonal random features).
"""

from attnlab.nn import kinds, masks
from attnlab.nn.attention import scaled_dot_product_attention
from attnlab.nn.linformer import LinformerAttention, linformer_attention
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.performer import PerformerAttention, favor_attention, orthogonal_random_features

__all__ = [
    "LinformerAttention",
    "MultiHeadAttention",
    "PerformerAttention",
    "favor_attention",
    "kinds",
    "linformer_attention",
    "masks",
    "orthogonal_random_features",
    "scaled_dot_product_attention",
]
