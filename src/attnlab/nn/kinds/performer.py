"""Performer: softmax attention approximated by FAVOR+ random features, in linear time."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from attnlab.errors import ArgumentError
from attnlab.nn.kinds.base import (
    AttentionSite,
    AttentionSpec,
    CliOption,
    check_int_field,
    register_attention,
)

if TYPE_CHECKING:
    from attnlab.nn.multihead import MultiHeadAttention

__all__ = ["PERFORMER_CHUNK", "PerformerSpec", "default_num_features"]

#: performer's causal prefix sums run this many queries a chunk (favor_attention's default)
PERFORMER_CHUNK = 128


def default_num_features(d_head: int) -> int:
    """The paper's number of random features, ``round(d_h · ln d_h)``, at least ``d_h``.

    Args:
        d_head: head width ``d_h``.

    Returns:
        ``m``.
    """
    return max(d_head, round(d_head * math.log(d_head)))


@register_attention
@dataclass(frozen=True)
class PerformerSpec(AttentionSpec):
    """Performer attention, FAVOR+ (Choromanski et al. 2021,
    :class:`~attnlab.nn.performer.PerformerAttention`): bidirectional at an encoder site, causal
    by prefix sums at a causal one, where decoding keeps FAVOR+'s running sums
    (:class:`~attnlab.nn.kv_cache.PerformerState`, ``O(1)`` per token) instead of a KV cache.

    The layer applies neither rotary embeddings nor an additive bias: it needs learned or
    sinusoidal positions.

    Args:
        num_features: random features ``m``; ``None`` (default) takes
            :func:`default_num_features` of the head width.

    Examples:
        >>> PerformerSpec(num_features=64).to_dict()
        {'kind': 'performer', 'num_features': 64}
    """

    name = "performer"
    cli_options = (
        CliOption(
            "--num-features", "num_features",
            help="Performer's random features m (with --attention performer; default d_head·ln d_head)",
        ),
    )  # fmt: skip
    legacy_fields: ClassVar[Mapping[str, str]] = {"num_features": "num_features"}

    num_features: int | None = None

    def __post_init__(self) -> None:
        if self.num_features is not None:
            check_int_field(self, "num_features")

    def label(self) -> str:
        """``performer``, with ``m M`` when the features are set.

        Returns:
            The label.
        """
        return "performer" + ("" if self.num_features is None else f" m {self.num_features}")

    def check_model(self, *, causal_only: bool, positions: str) -> None:
        """Refuse rotary and ALiBi positions (the FAVOR+ layer applies neither).

        Args:
            causal_only: the model is causal only.
            positions: the model's positions.

        Raises:
            ArgumentError: ``positions`` is ``"rope"`` or ``"alibi"``.
        """
        super().check_model(causal_only=causal_only, positions=positions)
        if positions in ("rope", "alibi"):
            raise ArgumentError(
                f"attention='performer' needs positions='learned' (the FAVOR+ layer applies "
                f"neither rotary embeddings nor ALiBi's additive bias), got positions={positions!r}"
            )

    def features(self, d_head: int) -> int:
        """``m`` for a head width: :attr:`num_features`, or the default.

        Args:
            d_head: head width.

        Returns:
            ``m``.
        """
        return default_num_features(d_head) if self.num_features is None else self.num_features

    def build(self, site: AttentionSite) -> MultiHeadAttention:
        """A :class:`~attnlab.nn.performer.PerformerAttention`, causal at a causal site.

        Args:
            site: the model's sizes and the layer's role.

        Returns:
            The layer.
        """
        from attnlab.nn.performer import PerformerAttention

        return site.layer(PerformerAttention, num_features=self.num_features, causal=site.causal)

    def core_flops(
        self, t_q: int, t_k: int, *, d_head: int, heads: int, kv_heads: int, site: AttentionSite
    ) -> dict[str, int]:
        """The feature map ``φ`` (``2 · (T_q + T_k) · d_h · m``), then linear attention:
        bidirectional ``φ(K)ᵀV`` and ``φ(Q)(φ(K)ᵀV)`` (``2 · T · m · d_h`` each) and the
        normaliser (``2 · T · m``); causal, the prefix sums as
        :func:`~attnlab.nn.performer.favor_attention` runs them, chunk by chunk, with each
        chunk's own masked block counted exactly.

        Args:
            t_q: queries.
            t_k: keys.
            d_head: head width.
            heads: query heads.
            kv_heads: key/value heads.
            site: the layer's site (its causality).

        Returns:
            ``{"features", "kv_state", "scores"?, "reduce", "normalizer"}``.
        """
        m, h, d_h = self.features(d_head), heads, d_head
        terms = {"features": 2 * h * (t_q + t_k) * d_h * m}  # φ(Q), φ(K)
        if not site.causal:
            terms["kv_state"] = 2 * h * t_k * m * d_h  # φ(K)ᵀ V
            terms["reduce"] = 2 * h * t_q * m * d_h  # φ(Q) (φ(K)ᵀ V)
            terms["normalizer"] = 2 * h * t_q * m  # φ(Q) (φ(K)ᵀ 1)
            return terms
        off = t_k - t_q
        starts = range(0, t_q, PERFORMER_CHUNK)  # as attnlab.nn.performer._causal_prefix
        bounds = [min(max(i0 + off + 1, 0), t_k) for i0 in starts] + [t_k]
        state = 2 * m * bounds[0] * d_h  # S = φ(K)ᵀ V over the keys every query sees
        reduce = norm = scores = 0
        for c_idx, i0 in enumerate(starts):
            c = min(i0 + PERFORMER_CHUNK, t_q) - i0
            reduce += 2 * c * m * d_h  # φ(Q) S
            norm += 2 * c * m  # φ(Q) z
            n = bounds[c_idx + 1] - bounds[c_idx]  # the chunk's own keys
            if n > 0:
                scores += 2 * c * m * n  # its block φ(Q) φ(K)ᵀ
                reduce += 2 * c * n * d_h  # its (masked) weights times V
                if c_idx + 1 < len(starts):
                    state += 2 * m * n * d_h  # S += φ(K)ᵀ V for the chunks after it
        terms["kv_state"] = h * state
        terms["scores"] = h * scores
        terms["reduce"] = h * reduce
        terms["normalizer"] = h * norm
        return terms

    def matrix_elements(self, t_q: int, t_k: int, *, d_head: int, site: AttentionSite) -> int:
        """The ``(T_q + T_k) × m`` feature maps.

        Args:
            t_q: queries.
            t_k: keys.
            d_head: head width.
            site: the layer's site.

        Returns:
            The count.
        """
        return (t_q + t_k) * self.features(d_head)

    def cache_bytes(
        self, seq_len: int, *, batch: int, kv_heads: int, d_head: int, dtype: torch.dtype
    ) -> int:
        """The running sums ``S`` (``m × d_h``), ``z`` (``m``) and the stabiliser per key/value
        head, in float32 at least, whatever ``seq_len``.

        Args:
            seq_len: tokens decoded (the size does not depend on it).
            batch: sequences.
            kv_heads: ``H_kv``.
            d_head: ``d_h``.
            dtype: the model's dtype (promoted to float32 at least).

        Returns:
            The size in bytes.
        """
        m = self.features(d_head)
        sums = torch.promote_types(dtype, torch.float32)
        return batch * kv_heads * (m * (d_head + 1) + 1) * sums.itemsize
