"""attnlab — Transformer attention from the equations up.

The public API; everything else is reachable through the subpackages.

``import attnlab`` itself imports nothing heavy: the public names (and torch with them) are
imported the first time one of them is used (:pep:`562`), so that the command line
(``python -m attnlab``, the ``attnlab`` script) catches Ctrl-C before torch loads and answers
``attnlab: interrupted``, exit 130, instead of an import's traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnlab import errors, inspect, training
    from attnlab.decoding.generate import generate
    from attnlab.models.config import GPTConfig, TransformerConfig
    from attnlab.models.embedding import embed
    from attnlab.models.encoder import Encoder, EncoderConfig
    from attnlab.models.gpt import GPT
    from attnlab.models.pretrained import load_pretrained
    from attnlab.models.transformer import Transformer
    from attnlab.nn import masks
    from attnlab.nn.attention import scaled_dot_product_attention
    from attnlab.nn.cache_policies import CrossKVCache, RollingKVCache, SinkKVCache
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
    "CrossKVCache",
    "Encoder",
    "EncoderConfig",
    "FullSpec",
    "GPTConfig",
    "KVCache",
    "LearnedPositionalEmbedding",
    "LinformerSpec",
    "ModelCache",
    "MultiHeadAttention",
    "PerformerSpec",
    "PerformerState",
    "RollingKVCache",
    "RotaryEmbedding",
    "SinkKVCache",
    "SinusoidalPositionalEncoding",
    "SlidingSpec",
    "Transformer",
    "TransformerConfig",
    "__version__",
    "alibi_bias",
    "alibi_slopes",
    "embed",
    "errors",
    "generate",
    "inspect",
    "load_pretrained",
    "masks",
    "register_attention",
    "scaled_dot_product_attention",
    "training",
]


# the public modules, and where each other public name lives
_MODULES = {"errors": "attnlab.errors", "inspect": "attnlab.inspect",
            "training": "attnlab.training", "masks": "attnlab.nn.masks"}  # fmt: skip
_PUBLIC = {
    "generate": "attnlab.decoding.generate",
    "GPTConfig": "attnlab.models.config",
    "TransformerConfig": "attnlab.models.config",
    "GPT": "attnlab.models.gpt",
    "Encoder": "attnlab.models.encoder",
    "EncoderConfig": "attnlab.models.encoder",
    "embed": "attnlab.models.embedding",
    "load_pretrained": "attnlab.models.pretrained",
    "Transformer": "attnlab.models.transformer",
    "scaled_dot_product_attention": "attnlab.nn.attention",
    **dict.fromkeys(
        (
            "AttentionSpec",
            "BigBirdSpec",
            "FullSpec",
            "LinformerSpec",
            "PerformerSpec",
            "SlidingSpec",
            "register_attention",
        ),
        "attnlab.nn.kinds",
    ),
    **dict.fromkeys(("KVCache", "ModelCache", "PerformerState"), "attnlab.nn.kv_cache"),
    **dict.fromkeys(("CrossKVCache", "RollingKVCache", "SinkKVCache"), "attnlab.nn.cache_policies"),
    "MultiHeadAttention": "attnlab.nn.multihead",
    **dict.fromkeys(
        (
            "LearnedPositionalEmbedding",
            "RotaryEmbedding",
            "SinusoidalPositionalEncoding",
            "alibi_bias",
            "alibi_slopes",
        ),
        "attnlab.nn.positional",
    ),
}
_loaded = False


def _load_public_api() -> None:
    """Import every public name into this module, as an eager ``__init__`` would (once)."""
    global _loaded
    _loaded = True  # before importing: a module that reads ``attnlab.X`` meanwhile gets a submodule
    try:
        for name, where in _MODULES.items():
            globals()[name] = importlib.import_module(where)
        for name, where in _PUBLIC.items():
            globals()[name] = getattr(importlib.import_module(where), name)
    except BaseException:
        _loaded = False
        raise


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not _loaded:
        _load_public_api()
        if name in globals():  # a public name, or a subpackage the public API imported
            return globals()[name]
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # e.g. attnlab.tasks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
