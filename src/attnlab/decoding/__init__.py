"""Decoding: the KV cache and generation strategies."""

from attnlab.decoding.cache import KVCache, ModelCache

__all__ = ["KVCache", "ModelCache"]
