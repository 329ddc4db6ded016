"""The ``"math"`` backend: the attention equation written out, weights materialised."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.nn.backends.common import compute_dtype, head_groups, repeat_kv
from attnlab.nn.mask_spec import Masking


def math_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    masking: Masking,
    scale: float,
    dropout_p: float,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``softmax(Q Kᵀ · scale + bias, hidden → −∞) · V`` with explicit ``(..., H, T_q, T_k)`` weights.

    Args:
        query: the queries, validated by :func:`attnlab.scaled_dot_product_attention`.
        key: the keys; ``H`` is a multiple of ``H_kv`` (grouped-query attention).
        value: the values.
        masking: the normalised mask; every query row sees at least one key.
        scale: the score scale (``1 / √D`` by default upstream).
        dropout_p: dropout probability on the weights, in ``[0, 1)``; ``0.0`` for none.
        need_weights: also compute the attention weights (before dropout).

    Returns:
        ``(output, weights)``, ``weights`` being ``None`` unless ``need_weights``.

    Shape:
        query ``(..., H, T_q, D)``, key ``(..., H_kv, T_k, D)``, value ``(..., H_kv, T_k, D_v)``
        → output ``(..., H, T_q, D_v)``, weights ``(..., H, T_q, T_k)``.
    """
    groups = head_groups(query, key)
    value = repeat_kv(value, groups)
    acc = compute_dtype(query.dtype)
    scores = attention_scores(query, key, masking, scale, dtype=acc)

    # P = softmax(S) along the keys (in fp32 for half types)
    weights = torch.softmax(scores, dim=-1)

    # O = dropout(P) V   (..., H, T_q, D_v); accumulated in fp32 for half types, as P is
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    out = torch.matmul(dropped, value.to(acc)).to(query.dtype)
    return out, (weights.to(query.dtype) if need_weights else None)


def attention_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    masking: Masking,
    scale: float,
    *,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``S = Q Kᵀ · scale + bias``, hidden entries ``−∞``: the scores whose softmax is attention;
    with ``masking.softcap = c`` the scaled product is soft-capped first,
    ``S = c · tanh(Q Kᵀ · scale / c) + bias`` (Gemma 2).

    The one place the score equation is written out: the math backend and
    :meth:`attnlab.nn.resolved_call.ResolvedCall.scores` (what inspection draws) both call it.

    Args:
        query: the queries.
        key: the keys; ``H`` a multiple of ``H_kv`` (grouped-query attention).
        masking: the normalised mask.
        scale: the score scale.
        dtype: the dtype of the product (default: fp32 for half types, as the fused kernels
            accumulate, else the query's).

    Returns:
        The scores.

    Shape:
        query ``(..., H, T_q, D)``, key ``(..., H_kv, T_k, D)`` → ``(..., H, T_q, T_k)``.
    """
    key = repeat_kv(key, head_groups(query, key))
    t_q, t_k = query.shape[-2], key.shape[-2]
    # S = Q Kᵀ · scale + B    (..., H, T_q, T_k); in fp32 for half types, as the fused kernels
    # do: a half-precision Q Kᵀ overflows (fp16) or rounds (bf16) before it is scaled
    acc = compute_dtype(query.dtype) if dtype is None else dtype
    scores = torch.matmul(query.to(acc), key.to(acc).transpose(-2, -1)) * scale
    if masking.softcap is not None:
        # S = c · tanh(S / c): every score in (−c, c), smoothly (Gemma 2's attention soft-cap)
        scores = torch.tanh(scores / masking.softcap) * masking.softcap
    if masking.bias is not None:
        scores = scores + masking.bias.to(acc)
    visible = masking.visible(t_q, t_k, query.device)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    return scores
