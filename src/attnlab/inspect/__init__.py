"""Looking inside: attention capture, per-head diagnostics, long-sequence statistics, FLOPs.

- :func:`capture` / :func:`run_with_cache`: record the attention weights of every layer, named by
  module path, without changing what forward computes; :func:`capture_attention` stops the
  forward after the last attention layer (no logits).
- :func:`diagnose`: per-head entropy, maximum weight, row sums, masked rows, uniform and
  one-token heads, and the first NaN/inf weight.
- :func:`find_nonfinite` / :func:`watch_nonfinite`: the first module (any module) whose output
  holds a NaN/inf, with its layer, position and whether it made the value or inherited it.
- :func:`attention_stats`: entropy, maximum weight, log-sum-exp and first-key weight per query
  row, blockwise — never the ``T × T`` matrix.
- :func:`flops`: FLOPs, parameters and memory term by term, and KV-cache bytes for MHA/GQA/MQA.
- :func:`peak_memory`: the peak resident memory a call adds (CPU, Linux), measured.
- :func:`head_roles` / :func:`role_scores` / :func:`copying_scores`: previous-token,
  duplicate-token, induction and copying scores of every head on repeated random tokens
  (Olsson et al. 2022), as a :class:`HeadRoles`.
- :func:`patch_heads` / :func:`patch_residual` / :func:`run_with_patches`: activation patching,
  a clean run's head outputs or residual stream put into a corrupted run, scored by a metric
  such as :func:`logit_difference`; :func:`attribution_patch`: every head's and position's
  patching effect estimated from one forward of each prompt and one backward;
  :func:`path_patch` / :func:`path_patch_heads`: a head's effect through other heads' queries,
  keys or values only; :func:`direct_logit_attribution`: each head's direct part
  in a logit.
- :func:`qk_spectrum`: every head as a low-rank bilinear relation — the singular values, numerical
  rank and effective rank of its QK circuit ``W_Q^hᵀ W_K^h / √d_head`` and OV circuit
  ``W_V^hᵀ W_O^hᵀ`` (a :class:`CircuitSpectrum`); :func:`head_weights` reads any family's per-head
  ``W_Q``, ``W_K``, ``W_V``, ``W_O``.
- :func:`mixing`: what each position takes from each token, by raw weights, rollout, flow,
  norm-based analysis, ALTI, value zeroing, gradient-weighted attention or integrated gradients
  (a :class:`Mixing`), read from each layer's resolved call.
- :func:`faithfulness` / :func:`faithfulness_table` / :func:`leave_one_out`: deletion and
  insertion curves, ERASER's comprehensiveness and sufficiency, and rank agreement with
  leave-one-out importance of an explanation, and with exact per-token patching
  (:func:`patching_importance`), beside a random one's; :func:`faithfulness_over_prompts`: the
  same over a set of prompts, mean ± std; :func:`plausibility` /
  :func:`plausibility_of_batches`: an encoder-decoder's alignments against the known sources of
  copy/reverse/sort.
- :func:`logit_lens` / :func:`train_tuned_lens` / :func:`lens_comparison`: what each layer would
  predict, read through the model's own final norm and unembedding (the last layer is the
  model's logits, bit for bit), or through a trained affine translator per layer (the tuned lens,
  Belrose et al. 2023, a :class:`TunedLens`); per-layer KL to the final distribution and bits
  per token.
- :func:`masked_heads` / :func:`head_importance` / :func:`pruning_order` / :func:`pruning_curve`:
  switch heads off, score them by ablation and by the gradient of their mask, and prune them
  (Michel et al. 2019).
"""

from attnlab.inspect.ablation import (
    HeadImportance,
    PruningCurve,
    head_importance,
    masked_heads,
    pruning_curve,
    pruning_order,
)
from attnlab.inspect.attribution import LogitAttribution, direct_logit_attribution
from attnlab.inspect.attribution_patching import Attribution, attribution_patch
from attnlab.inspect.capture import (
    ActivationCache,
    attention_modules,
    capture,
    capture_attention,
    run_with_cache,
)
from attnlab.inspect.diagnostics import (
    HeadHealth,
    HealthReport,
    NonFiniteLocation,
    attention_entropy,
    diagnose,
    diagnose_model,
)
from attnlab.inspect.faithfulness import (
    Faithfulness,
    FaithfulnessSummary,
    PromptSetFaithfulness,
    faithfulness,
    faithfulness_over_prompts,
    faithfulness_table,
    leave_one_out,
    patching_importance,
)
from attnlab.inspect.flops import FlopReport, flops, kv_cache_bytes
from attnlab.inspect.lens import LensComparison, LensResult, lens_comparison, logit_lens
from attnlab.inspect.memory import (
    peak_memory,
    peak_memory_supported,
    resident_bytes,
    stabilize_allocator,
)
from attnlab.inspect.mixing import METHODS as MIXING_METHODS
from attnlab.inspect.mixing import Mixing, mixing
from attnlab.inspect.nonfinite import (
    NonFiniteOrigin,
    NonFiniteWatch,
    find_nonfinite,
    watch_nonfinite,
)
from attnlab.inspect.patching import (
    Metric,
    PatchResult,
    logit_difference,
    patch_heads,
    patch_residual,
    run_with_patches,
)
from attnlab.inspect.path_patching import PathPatch, path_patch, path_patch_heads
from attnlab.inspect.plausibility import (
    Plausibility,
    plausibility,
    plausibility_of_batches,
    plausibility_table,
)
from attnlab.inspect.qk_circuits import CircuitSpectrum, HeadWeights, head_weights, qk_spectrum
from attnlab.inspect.roles import (
    HeadRoles,
    copying_scores,
    head_roles,
    ordinary_token_range,
    repeated_tokens,
    role_scores,
)
from attnlab.inspect.stats import AttentionStats, attention_stats
from attnlab.inspect.tuned_lens import TunedLens, load_tuned_lens, train_tuned_lens

__all__ = [
    "MIXING_METHODS",
    "ActivationCache",
    "AttentionStats",
    "Attribution",
    "CircuitSpectrum",
    "Faithfulness",
    "FaithfulnessSummary",
    "FlopReport",
    "HeadHealth",
    "HeadImportance",
    "HeadRoles",
    "HeadWeights",
    "HealthReport",
    "LensComparison",
    "LensResult",
    "LogitAttribution",
    "Metric",
    "Mixing",
    "NonFiniteLocation",
    "NonFiniteOrigin",
    "NonFiniteWatch",
    "PatchResult",
    "PathPatch",
    "Plausibility",
    "PromptSetFaithfulness",
    "PruningCurve",
    "TunedLens",
    "attention_entropy",
    "attention_modules",
    "attention_stats",
    "attribution_patch",
    "capture",
    "capture_attention",
    "copying_scores",
    "diagnose",
    "diagnose_model",
    "direct_logit_attribution",
    "faithfulness",
    "faithfulness_over_prompts",
    "faithfulness_table",
    "find_nonfinite",
    "flops",
    "head_importance",
    "head_roles",
    "head_weights",
    "kv_cache_bytes",
    "leave_one_out",
    "lens_comparison",
    "load_tuned_lens",
    "logit_difference",
    "logit_lens",
    "masked_heads",
    "mixing",
    "ordinary_token_range",
    "patch_heads",
    "patch_residual",
    "patching_importance",
    "path_patch",
    "path_patch_heads",
    "peak_memory",
    "peak_memory_supported",
    "plausibility",
    "plausibility_of_batches",
    "plausibility_table",
    "pruning_curve",
    "pruning_order",
    "qk_spectrum",
    "repeated_tokens",
    "resident_bytes",
    "role_scores",
    "run_with_cache",
    "run_with_patches",
    "stabilize_allocator",
    "train_tuned_lens",
    "watch_nonfinite",
]
