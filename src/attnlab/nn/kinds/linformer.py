"""Linformer: keys and values projected along the sequence to ``k`` rows (bidirectional only)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from attnlab.nn.kinds.base import (
    AttentionSite,
    AttentionSpec,
    CliOption,
    check_int_field,
    register_attention,
)

if TYPE_CHECKING:
    from attnlab.nn.multihead import MultiHeadAttention

__all__ = ["LinformerSpec"]


@register_attention
@dataclass(frozen=True)
class LinformerSpec(AttentionSpec):
    """Linformer attention (Wang et al. 2020) with projected length ``k``
    (:class:`~attnlab.nn.linformer.LinformerAttention`, ``E`` and ``F`` of ``k × max_len``).

    It cannot be causal: every projected key mixes every position. A GPT refuses it; in an
    encoder-decoder the encoder uses it and the decoder's causal self-attention stays full.

    Args:
        k: the projected length, a positive int.

    Examples:
        >>> LinformerSpec(k=64).to_dict()
        {'kind': 'linformer', 'k': 64}
    """

    name = "linformer"
    cli_options = (
        CliOption(
            "--linformer-k", "k", required=True,
            help="Linformer's projected length k (with --attention linformer)",
        ),
    )  # fmt: skip
    legacy_fields: ClassVar[Mapping[str, str]] = {"linformer_k": "k"}
    bidirectional_only = True

    k: int

    def __post_init__(self) -> None:
        check_int_field(self, "k")

    def label(self) -> str:
        """``linformer k K``.

        Returns:
            The label.
        """
        return f"linformer k {self.k}"

    def build(self, site: AttentionSite) -> MultiHeadAttention:
        """A :class:`~attnlab.nn.linformer.LinformerAttention` over the model's ``max_len``.

        Args:
            site: a bidirectional site (:meth:`AttentionSpec.at` gives full attention at a
                causal one).

        Returns:
            The layer.
        """
        if site.causal:
            return self.at(causal=True).build(site)
        from attnlab.nn.linformer import LinformerAttention

        return site.layer(LinformerAttention, k=self.k, max_len=site.max_len, backend=site.backend)

    def core_flops(
        self, t_q: int, t_k: int, *, d_head: int, heads: int, kv_heads: int, site: AttentionSite
    ) -> dict[str, int]:
        """The sequence projections ``E K`` and ``F V`` (``2 · H_kv · k · T_k · d_h`` each),
        then ``QK̄ᵀ`` and ``PV̄`` over ``k`` keys (``2 · H · T_q · k · d_h`` each).

        Args:
            t_q: queries.
            t_k: keys.
            d_head: head width.
            heads: query heads.
            kv_heads: key/value heads.
            site: the layer's site.

        Returns:
            ``{"project_k", "project_v", "scores", "reduce"}``.
        """
        k = self.k
        return {
            "project_k": 2 * kv_heads * k * t_k * d_head,  # K̄ = E K
            "project_v": 2 * kv_heads * k * t_k * d_head,  # V̄ = F V
            "scores": 2 * heads * t_q * k * d_head,  # Q K̄ᵀ
            "reduce": 2 * heads * t_q * k * d_head,  # P V̄
        }

    def matrix_elements(self, t_q: int, t_k: int, *, d_head: int, site: AttentionSite) -> int:
        """``T_q · k`` weights per head.

        Args:
            t_q: queries.
            t_k: keys.
            d_head: head width.
            site: the layer's site.

        Returns:
            The count.
        """
        return t_q * self.k

    def extra_parameters(self, site: AttentionSite) -> int:
        """``E`` and ``F``, ``k × max_len`` each (headwise sharing).

        Args:
            site: the layer's site.

        Returns:
            ``2 · k · max_len``.
        """
        return 2 * self.k * site.max_len
