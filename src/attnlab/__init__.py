"""attnlab — Transformer attention from the equations up.

The public API; everything else is reachable through the subpackages.
"""

from attnlab import errors, inspect, training
from attnlab.decoding.generate import generate
from attnlab.models.config import GPTConfig, TransformerConfig
from attnlab.models.gpt import GPT
from attnlab.models.pretrained import load_pretrained
from attnlab.models.transformer import Transformer
from attnlab.nn import masks
from attnlab.nn.attention import scaled_dot_product_attention
from attnlab.nn.kinds import (
    AttentionSpec,
    BigBirdSpec,
    FullSpec,
    LinformerSpec,
    PerformerSpec,
    SlidingSpec,
    register_attention,
)
from attnlab.nn.kv_cache import KVCache, ModelCache, PerformerState
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_bias,
    alibi_slopes,
)

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "AttentionSpec",
    "BigBirdSpec",
    "FullSpec",
    "GPTConfig",
    "KVCache",
    "LearnedPositionalEmbedding",
    "LinformerSpec",
    "ModelCache",
    "MultiHeadAttention",
    "PerformerSpec",
    "PerformerState",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "SlidingSpec",
    "Transformer",
    "TransformerConfig",
    "__version__",
    "alibi_bias",
    "alibi_slopes",
    "errors",
    "generate",
    "inspect",
    "load_pretrained",
    "masks",
    "register_attention",
    "scaled_dot_product_attention",
    "training",
]
