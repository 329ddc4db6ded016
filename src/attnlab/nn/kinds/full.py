"""Full attention: every query sees every key its mask allows (the default kind)."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.nn.kinds.base import AttentionSpec, register_attention

__all__ = ["FullSpec"]


@register_attention
@dataclass(frozen=True)
class FullSpec(AttentionSpec):
    """Full softmax attention (Vaswani et al. 2017): the default ``attention`` of every config.

    Its layer is a :class:`~attnlab.nn.multihead.MultiHeadAttention`; decoding keeps the keys and
    values of every position (a :class:`~attnlab.nn.kv_cache.KVCache`).

    Examples:
        >>> FullSpec().to_dict()
        {'kind': 'full'}
    """

    name = "full"
    shards_by_heads = True
    decodes_statically = True

    def label(self) -> str:
        """Nothing: full attention is the default.

        Returns:
            ``""``.
        """
        return ""
