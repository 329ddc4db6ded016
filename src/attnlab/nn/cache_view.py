"""What a KV cache hands to the attention of one call (:class:`CacheView`).

Each cache policy (a growing cache, a rolling window, a sink cache, a cross-attention cache filled
once, a static cache of fixed capacity for compiled decoding) is its own class with one method,

    view = cache.update(k, v, mask, window=call.window, is_causal=call.is_causal)

which takes the call's new keys and values (``None`` when a filled cross-attention cache already
holds them) and the call's mask over every position so far, keeps what its policy keeps, and
returns the keys, values and mask the queries attend over. The layer (``MultiHeadAttention``)
holds no policy of its own: it rotates the keys by ``key_places`` when the cache gives them
(a sink cache stores keys unrotated), applies the causal rule only when ``is_causal`` says
so, and the window only when ``window_in_mask`` does not say the cache did.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["CacheView"]


@dataclass(frozen=True, eq=False)
class CacheView:
    """The keys and values one call attends over, as a cache's ``update`` returns them.

    Attributes:
        keys: every key the queries may see (the past ones and the new ones).
        values: the values beside them.
        mask: the call's mask over these keys (the user's padding cut or widened to what the
            cache holds, a sink cache's per-row visibility, a static cache's unwritten slots),
            or ``None``.
        is_causal: whether the causal rule (bottom-right) still applies to these keys; a
            static cache, whose slots do not end at the last query, folds it into ``mask``.
        key_places: the positions to rotate the keys at (a sink cache: places within the
            cache), or ``None`` when the keys are stored rotated.
        window_in_mask: the cache folded the call's sliding window into ``mask`` (a static
            cache, whose slots do not end at the last query: the window's bottom-right
            alignment would be wrong there), so the layer does not apply it again.

    Shape:
        keys ``(B, H_kv, T_k, d_head)``; values ``(B, H_kv, T_k, d_v)``; mask broadcastable to
        ``(B, H, T_q, T_k)``; key_places ``(T_k,)`` or ``(B, T_k)``.
    """

    keys: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor | None
    is_causal: bool
    key_places: torch.Tensor | None = None
    window_in_mask: bool = False
