"""Attention building blocks: masks, the functional core, modules and positional encodings."""

from attnlab.nn import masks
from attnlab.nn.attention import scaled_dot_product_attention

__all__ = ["masks", "scaled_dot_product_attention"]
