"""Decoding: the KV cache and generation strategies (greedy, sampling, beam search)."""

from attnlab.decoding.generate import STRATEGIES, generate
from attnlab.decoding.scores import Generation
from attnlab.decoding.strategies import (
    greedy_choice,
    sample_choice,
    sampling_distribution,
    top_k_filter,
    top_p_filter,
)
from attnlab.nn.cache_policies import CrossKVCache, RollingKVCache, SinkKVCache
from attnlab.nn.kv_cache import KVCache, ModelCache, PerformerState

__all__ = [
    "STRATEGIES",
    "CrossKVCache",
    "Generation",
    "KVCache",
    "ModelCache",
    "PerformerState",
    "RollingKVCache",
    "SinkKVCache",
    "generate",
    "greedy_choice",
    "sample_choice",
    "sampling_distribution",
    "top_k_filter",
    "top_p_filter",
]
