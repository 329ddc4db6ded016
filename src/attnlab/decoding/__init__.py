"""Decoding: the KV cache and generation strategies (greedy, sampling, beam search)."""

from attnlab.decoding.generate import STRATEGIES, generate
from attnlab.decoding.strategies import greedy_choice, sample_choice, top_k_filter, top_p_filter
from attnlab.nn.cache_policies import CrossKVCache, RollingKVCache, SinkKVCache
from attnlab.nn.kv_cache import KVCache, ModelCache, PerformerState

__all__ = [
    "STRATEGIES",
    "CrossKVCache",
    "KVCache",
    "ModelCache",
    "PerformerState",
    "RollingKVCache",
    "SinkKVCache",
    "generate",
    "greedy_choice",
    "sample_choice",
    "top_k_filter",
    "top_p_filter",
]
