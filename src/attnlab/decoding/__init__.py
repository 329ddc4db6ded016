"""Decoding: the KV cache and generation strategies (greedy, sampling, beam search)."""

from attnlab.decoding.cache import KVCache, ModelCache
from attnlab.decoding.generate import STRATEGIES, generate
from attnlab.decoding.strategies import greedy_choice, sample_choice, top_k_filter, top_p_filter

__all__ = [
    "STRATEGIES",
    "KVCache",
    "ModelCache",
    "generate",
    "greedy_choice",
    "sample_choice",
    "top_k_filter",
    "top_p_filter",
]
