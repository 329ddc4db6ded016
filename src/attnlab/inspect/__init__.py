"""Looking inside: attention capture, per-head diagnostics, long-sequence statistics, FLOPs.

- :func:`capture` / :func:`run_with_cache`: record the attention weights of every layer, named by
  module path, without changing what forward computes.
- :func:`diagnose`: per-head entropy, maximum weight, row sums, masked rows and the first NaN/inf.
- :func:`attention_stats`: entropy, maximum weight and log-sum-exp per query row, blockwise —
  never the ``T × T`` matrix.
- :func:`flops`: FLOPs, parameters and memory term by term, and KV-cache bytes for MHA/GQA/MQA.
"""

from attnlab.inspect.capture import ActivationCache, attention_modules, capture, run_with_cache
from attnlab.inspect.diagnostics import (
    HeadHealth,
    HealthReport,
    NonFiniteLocation,
    attention_entropy,
    diagnose,
    diagnose_model,
)
from attnlab.inspect.flops import FlopReport, flops, kv_cache_bytes
from attnlab.inspect.stats import AttentionStats, attention_stats

__all__ = [
    "ActivationCache",
    "AttentionStats",
    "FlopReport",
    "HeadHealth",
    "HealthReport",
    "NonFiniteLocation",
    "attention_entropy",
    "attention_modules",
    "attention_stats",
    "capture",
    "diagnose",
    "diagnose_model",
    "flops",
    "kv_cache_bytes",
    "run_with_cache",
]
