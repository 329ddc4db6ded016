"""The ``"sdpa"`` backend: PyTorch's fused ``scaled_dot_product_attention``.

Two things PyTorch does differently from attnlab, and how they are bridged:

* its ``is_causal`` is aligned top-left; it is passed through only when ``T_q == T_k`` (where the two
  alignments agree) — otherwise the bottom-right causal mask is built explicitly, and so are a
  sliding window and a block layout (the fused function has no argument for either);
* grouped-query heads use ``enable_gqa`` where it reaches a fused kernel (flash: the CPU, or CUDA
  in half types without a mask), else keys/values are repeated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.nn.backends.common import head_groups, repeat_kv
from attnlab.nn.backends.math import math_attention
from attnlab.nn.mask_spec import Masking

# enable_gqa arrived in torch 2.5; the fused function is a builtin without a Python signature
_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def sdpa_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    masking: Masking,
    scale: float,
    dropout_p: float,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention through ``torch.nn.functional.scaled_dot_product_attention``.

    With ``need_weights`` the weights are computed by the math backend (no fused kernel returns
    them); the output still comes from the fused kernel.

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
        as :func:`attnlab.nn.backends.math.math_attention`.
    """
    t_q, t_k = query.shape[-2], key.shape[-2]
    is_causal = False
    attn_mask: torch.Tensor | None
    if (
        masking.allowed is None
        and masking.bias is None
        and masking.causal_offset in (None, 0)
        and masking.window is None
        and masking.blocks is None
    ):
        attn_mask, is_causal = None, masking.causal_offset == 0
    else:
        visible = masking.visible(t_q, t_k, query.device)
        if masking.bias is None:
            attn_mask = visible
        elif visible is None:
            attn_mask = masking.bias
        else:
            attn_mask = masking.bias.masked_fill(~visible, float("-inf"))

    if attn_mask is not None and attn_mask.shape[-1] != t_k:
        # a view; torch 2.4's CPU flash kernel reads past a mask whose last dim is 1 (pytorch#128816)
        attn_mask = attn_mask.expand(*attn_mask.shape[:-1], t_k)

    groups = head_groups(query, key)
    kwargs: dict[str, bool] = {}
    if groups > 1 and uses_enable_gqa(query, key, value, attn_mask):
        kwargs["enable_gqa"] = True
    else:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        **kwargs,
    )
    weights = None
    if need_weights:
        _, weights = math_attention(query, key, value, masking, scale, 0.0, True)
    return out, weights


def uses_enable_gqa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None
) -> bool:
    """Whether grouped-query heads go to PyTorch as they are (``enable_gqa``) rather than repeated.

    Only the flash kernel takes ``enable_gqa``: on the CPU in every dtype and with a mask, on CUDA
    in half types without a mask (the memory-efficient and cuDNN kernels need as many key/value
    heads as query heads, so ``enable_gqa`` would fall back to the unfused math kernel). And half
    types whose keys or values need gradients repeat: the fused backward sums the grouped heads'
    gradients after rounding each to the half type (2x the error of repeating the heads first).

    Args:
        query: the queries.
        key: the keys, fewer heads than ``query``.
        value: the values.
        attn_mask: the mask passed to PyTorch, or ``None`` (``is_causal`` alone).

    Returns:
        ``True`` to pass ``enable_gqa=True``, ``False`` to repeat the key/value heads.

    Shape:
        as :func:`sdpa_attention`.
    """
    half = query.dtype in (torch.float16, torch.bfloat16)
    if not _HAS_GQA or (half and (key.requires_grad or value.requires_grad)):
        return False
    return query.device.type == "cpu" or (half and attn_mask is None)
