"""Heads as low-rank bilinear relations: the spectra of every head's QK and OV circuits.

Head ``h`` of a layer scores query token ``x_i`` against key token ``x_j`` with (Elhage et al.
2021, "A Mathematical Framework for Transformer Circuits")

    s_ij = (x_i W_Q^hᵀ)(x_j W_K^gᵀ)ᵀ / √d_head = x_i M_QK^h x_jᵀ,
    M_QK^h = W_Q^hᵀ W_K^g / √d_head                                     (d_model × d_model)

and writes, when it attends to ``x_j``, ``x_j M_OV^h`` with ``M_OV^h = W_V^gᵀ W_O^hᵀ``. Here
``W_Q^h``, ``W_K^g``, ``W_V^g`` are the ``(d_head, d_model)`` row blocks of the layer's fused
``[W_Q; W_K; W_V]`` (``y = x Wᵀ``), ``W_O^h`` the ``(d_model, d_head)`` column block of the output
projection, and ``g = h // (H / H_kv)`` the key/value group of a grouped-query head. Both
matrices are products of two ``d_model × d_head`` factors, so their rank is at most ``d_head``:
multi-head attention is an ensemble of ``H`` relations of rank ``≤ d_model / H`` each, where one
head as wide as the model would be a single relation of rank ``≤ d_model`` — for the same
``4 · d_model²`` projection parameters.

:func:`qk_spectrum` returns the singular values of both circuits of every head
(:class:`CircuitSpectrum`), and from them three ranks:

- **numerical rank**: singular values above ``σ_max · d_model · ε``, with ``ε`` the machine
  epsilon of the dtype the weights are stored in (NumPy's ``matrix_rank`` rule, at the precision
  the weights actually have);
- **effective rank** (Roy & Vetterli 2007): ``exp(−Σ_i p_i log p_i)`` with ``p_i = σ_i / Σ_k σ_k``
  — ``r`` for ``r`` equal singular values, fractional in between, 0 for a head of zeros;
- **energy rank**: the fewest singular values that hold a fraction (default 90%) of
  ``‖M‖_F² = Σ_i σ_i²``.

What is left out: with rotary embeddings the score is ``x_i W_Q^hᵀ R_{j−i} W_K^g x_jᵀ / √d_head``
(a rotation between the factors), so ``M_QK^h`` is the form at offset 0 (its rank bound holds at
every offset); the biases add terms linear in ``x_i`` or ``x_j`` and a constant; the input is the
normed residual stream ``N(x)`` (the norm's gain is not folded in); ALiBi's bias is not bilinear.

The singular values are computed in float64 without forming the ``d_model × d_model`` matrix: with
reduced QR factorisations ``A = Q_A R_A`` and ``B = Q_B R_B`` of the two factors of ``M = A Bᵀ``,
``M = Q_A (R_A R_Bᵀ) Q_Bᵀ`` has the singular values of the ``d_head × d_head`` core ``R_A R_Bᵀ``
(the other ``d_model − d_head`` are 0).

Examples:
    >>> model, _ = attnlab.load_pretrained("smollm2-135m")
    >>> spec = qk_spectrum(model)
    >>> spec.qk.shape, int(spec.rank().max())
    (torch.Size([30, 9, 64]), 64)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch
from torch import nn

from attnlab._checks import all_finite
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.capture import attention_modules
from attnlab.nn.multihead import MultiHeadAttention

__all__ = ["CIRCUITS", "CircuitSpectrum", "HeadWeights", "head_weights", "qk_spectrum"]

Circuit = Literal["qk", "ov"]
#: the circuits :func:`qk_spectrum` measures
CIRCUITS: tuple[Circuit, ...] = ("qk", "ov")


class HeadWeights(NamedTuple):
    """The projection weights of every query head of one attention layer (:func:`head_weights`).

    Key and value weights are given per *query* head: head ``h`` holds its group's
    ``g = h // (H / H_kv)`` (a view, repeated for grouped-query layers).

    Attributes:
        query: ``W_Q^h``, ``q_h = x W_Q^hᵀ``.
        key: ``W_K^g``, ``k_h = x W_K^gᵀ``.
        value: ``W_V^g``, ``v_h = x W_V^gᵀ``.
        output: ``W_O^h``, the layer's output ``Σ_h z_h W_O^hᵀ``.

    Shape:
        query, key, value ``(H, d_head, d_model)``; output ``(H, d_model, d_head)``.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    output: torch.Tensor


def _output_weight(layer: nn.Module) -> torch.Tensor:
    """``W_O`` of an attention layer: GPT-2's ``c_proj`` or ``nn.MultiheadAttention``'s
    ``out_proj``.

    Shape:
        ``(d_model, H · d_head)``.
    """
    for name in ("c_proj", "out_proj"):
        proj = getattr(layer, name, None)
        if isinstance(proj, nn.Linear):
            return proj.weight
    raise ArgumentTypeError(
        f"{type(layer).__name__} has no output projection (c_proj or out_proj) to read W_O from"
    )


def head_weights(attn: MultiHeadAttention) -> HeadWeights:
    """Every query head's ``W_Q``, ``W_K``, ``W_V`` and ``W_O``, for any family.

    Read from the layer's fused ``[W_Q; W_K; W_V]`` (:meth:`~attnlab.nn.multihead.MultiHeadAttention.qkv_parameters`:
    GPT-2's ``c_attn``, Llama/Mistral/Qwen2's ``q/k/v_proj`` and NeoX's interleaved
    ``query_key_value`` are all stored as ``H · d_head`` query rows, then ``H_kv · d_head`` key
    rows, then as many value rows) and its output projection. Detached views in the weights'
    dtype and device.

    Args:
        attn: an attention layer.

    Returns:
        A :class:`HeadWeights`; grouped-query key/value heads are repeated for the
        ``H / H_kv`` query heads that share them (head ``h`` reads group ``h // (H / H_kv)``).

    Raises:
        TypeError: ``attn`` is not a ``MultiHeadAttention``, or it has no output projection.

    Shape:
        query, key, value ``(H, d_head, d_model)``; output ``(H, d_model, d_head)``.
    """
    if not isinstance(attn, MultiHeadAttention):
        raise ArgumentTypeError(f"attn must be a MultiHeadAttention, got {type(attn).__name__}")
    heads, kv_heads, d_head = attn.num_heads, attn.num_kv_heads, attn.d_head
    w_qkv, _ = attn.qkv_parameters()
    w_qkv = w_qkv.detach()
    d, kv = heads * d_head, kv_heads * d_head  # [W_Q; W_K; W_V]: rows d, kv, kv

    def per_head(rows: torch.Tensor, n: int) -> torch.Tensor:  # (n · d_head, d) → (H, d_head, d)
        return rows.unflatten(0, (n, d_head)).repeat_interleave(heads // n, dim=0)

    w_o = _output_weight(attn).detach().unflatten(-1, (heads, d_head))  # (d, H, d_head)
    return HeadWeights(
        query=per_head(w_qkv[:d], heads),
        key=per_head(w_qkv[d : d + kv], kv_heads),
        value=per_head(w_qkv[d + kv : d + 2 * kv], kv_heads),
        output=w_o.permute(1, 0, 2),
    )


def _low_rank_singular_values(a: torch.Tensor, b: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The ``r`` singular values of ``M = scale · A Bᵀ`` that can be nonzero, from its ``r × r`` core.

    ``A = Q_A R_A``, ``B = Q_B R_B`` (reduced QR) give ``M = Q_A (R_A R_Bᵀ) Q_Bᵀ`` with
    orthonormal ``Q_A``, ``Q_B``: the singular values of ``M`` are those of ``R_A R_Bᵀ`` and
    ``d − r`` zeros. Float64.

    Shape:
        a, b ``(H, d, r)`` with ``r ≤ d`` → ``(H, r)``, descending.
    """
    _, r_a = torch.linalg.qr(a.double(), mode="r")  # R only                 (H, r, r)
    _, r_b = torch.linalg.qr(b.double(), mode="r")
    return torch.linalg.svdvals(r_a @ r_b.transpose(-2, -1)) * scale


@dataclass
class CircuitSpectrum:
    """The singular values of every head's QK and OV circuits (:func:`qk_spectrum`).

    Attributes:
        layers: the attention layers' module paths, one per row.
        indices: their positions in the model's list of attention layers.
        qk: singular values of ``M_QK^h = W_Q^hᵀ W_K^g / √d_head``, descending (the
            1/√d_head of the scores included: the layer's ``score_scale``, Gemma 2's own),
            float64.
        ov: singular values of ``M_OV^h = W_V^gᵀ W_O^hᵀ``, descending, float64.
        d_model: the width of the residual stream (each matrix is ``d_model × d_model``).
        d_head: the width of a head, the largest rank a head's circuit can have.
        num_kv_heads: key/value heads per layer (``H`` without grouped-query attention).
        eps: machine epsilon of the weights' dtype, for the numerical rank.

    Shape:
        qk, ov ``(n_layers, H, d_head)``: only the ``d_head`` values that can be nonzero (the
        other ``d_model − d_head`` are exactly 0).
    """

    layers: list[str]
    indices: list[int]
    qk: torch.Tensor
    ov: torch.Tensor
    d_model: int
    d_head: int
    num_kv_heads: int
    eps: float

    def values(self, circuit: str = "qk") -> torch.Tensor:
        """One circuit's singular values.

        Args:
            circuit: ``"qk"`` or ``"ov"``.

        Returns:
            The singular values, descending per head.

        Raises:
            ValueError: ``circuit`` is neither.

        Shape:
            ``(n_layers, H, d_head)``.
        """
        if circuit not in CIRCUITS:
            raise ArgumentError(f"circuit must be one of {', '.join(CIRCUITS)}, got {circuit!r}")
        result: torch.Tensor = getattr(self, circuit)
        return result

    def rank(self, circuit: str = "qk") -> torch.Tensor:
        """The numerical rank: singular values above ``σ_max · d_model · ε`` (``ε`` of the
        weights' dtype).

        Args:
            circuit: ``"qk"`` or ``"ov"``.

        Returns:
            int64 ranks, each at most ``d_head`` (0 for a head of zeros).

        Shape:
            ``(n_layers, H)``.
        """
        s = self.values(circuit)
        tol = s[..., :1] * self.d_model * self.eps  # σ_max · d_model · ε        (L, H, 1)
        return (s > tol).sum(-1)

    def effective_rank(self, circuit: str = "qk") -> torch.Tensor:
        """Roy & Vetterli's effective rank ``exp(−Σ_i p_i log p_i)``, ``p_i = σ_i / Σ_k σ_k``.

        ``r`` equal singular values (and zeros) give exactly ``r``; a head of zeros gives 0.

        Args:
            circuit: ``"qk"`` or ``"ov"``.

        Returns:
            float64 effective ranks in ``[0, d_head]``.

        Shape:
            ``(n_layers, H)``.
        """
        s = self.values(circuit)
        total = s.sum(-1, keepdim=True)
        p = s / torch.where(total > 0, total, torch.ones_like(total))
        entropy = -torch.special.xlogy(p, p).sum(-1)  # 0 · log 0 = 0
        return torch.where(total[..., 0] > 0, entropy.exp(), torch.zeros_like(entropy))

    def energy_rank(self, circuit: str = "qk", energy: float = 0.9) -> torch.Tensor:
        """The fewest singular values holding ``energy`` of ``‖M‖_F² = Σ_i σ_i²``.

        Args:
            circuit: ``"qk"`` or ``"ov"``.
            energy: the fraction, in ``(0, 1]``. Default 0.9.

        Returns:
            int64 counts ``k``: the smallest with ``Σ_{i ≤ k} σ_i² ≥ energy · Σ_i σ_i²`` (0 for a
            head of zeros).

        Raises:
            ValueError: ``energy`` outside ``(0, 1]``.

        Shape:
            ``(n_layers, H)``.
        """
        if isinstance(energy, bool) or not isinstance(energy, (int, float)) or not 0 < energy <= 1:
            raise ArgumentError(f"energy must be a fraction in (0, 1], got {energy!r}")
        sq = self.values(circuit) ** 2
        cum = sq.cumsum(-1)
        total = cum[..., -1:]
        # relative rounding of the cumulative sum: a full (energy = 1) count still ends at the last
        reached = cum >= energy * total * (1 - 1e-12)
        return torch.where(
            total[..., 0] > 0, (~reached).sum(-1) + 1, torch.zeros_like(cum[..., 0]).long()
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types: the layers, the sizes, and per circuit the singular values and ranks.

        Returns:
            ``{"layers", "indices", "d_model", "d_head", "num_kv_heads", "qk": {...}, "ov": {...}}``
            where each circuit holds ``singular_values`` ``[layer][head][i]``, ``rank``,
            ``effective_rank`` and ``energy_rank_90`` ``[layer][head]``.
        """
        out: dict[str, Any] = {
            "layers": list(self.layers),
            "indices": list(self.indices),
            "d_model": self.d_model,
            "d_head": self.d_head,
            "num_kv_heads": self.num_kv_heads,
        }
        for circuit in CIRCUITS:
            out[circuit] = {
                "singular_values": self.values(circuit).tolist(),
                "rank": self.rank(circuit).tolist(),
                "effective_rank": self.effective_rank(circuit).tolist(),
                "energy_rank_90": self.energy_rank(circuit).tolist(),
            }
        return out


def _chosen(layer: object, n: int) -> list[int]:
    """``layer`` (``None``, an index or a sequence of them) as a list of indices in ``[0, n)``."""
    if layer is None:
        return list(range(n))
    items = list(layer) if isinstance(layer, Sequence) and not isinstance(layer, str) else [layer]
    chosen: list[int] = []
    for i in items:
        if isinstance(i, bool) or not isinstance(i, int):
            raise ArgumentTypeError(
                f"layer must be an int, a sequence of ints or None, got {type(i).__name__}"
            )
        if not 0 <= i < n:
            raise ArgumentError(
                f"layer must be in [0, {n}) (the model's attention layers), got {i}"
            )
        chosen.append(i)
    if not chosen:
        raise ArgumentError("layer must name at least one layer, got an empty sequence")
    return chosen


@torch.no_grad()
def _check_finite_heads(w: HeadWeights, where: str) -> None:
    """Refuse non-finite weights (the SVD cannot converge on them), naming the head."""
    parts = {"W_Q": w.query, "W_K": w.key, "W_V": w.value, "W_O": w.output}
    if all_finite(parts.values()):
        return
    for name, t in parts.items():
        bad = ~torch.isfinite(t).flatten(1).all(1)
        if bool(bad.any()):
            head = int(bad.nonzero()[0, 0])
            raise ArgumentError(
                f"{where} head {head}: its {name} holds NaN or infinity, so its circuits have "
                "no singular values; the model's weights are damaged (or its training diverged)"
            )


def qk_spectrum(model: nn.Module, layer: int | Sequence[int] | None = None) -> CircuitSpectrum:
    """The singular values of every head's QK and OV circuits, layer by layer.

    The equations, the rank definitions and what is left out are in the module docstring. The
    layers are the model's :class:`~attnlab.nn.multihead.MultiHeadAttention` modules in
    ``named_modules()`` order (for an :class:`attnlab.GPT`, block ``i`` is layer ``i``).

    Args:
        model: an :class:`attnlab.GPT` of any family (GPT-2's fused ``c_attn``, Llama, Mistral,
            Qwen2, NeoX; grouped-query heads read their group's ``W_K`` and ``W_V``), or any
            module with attention layers of equal shape.
        layer: one layer index, a sequence of them, or ``None`` (default) for every layer.

    Returns:
        A :class:`CircuitSpectrum`.

    Raises:
        ValueError: the model has no attention layer, a layer index outside
            ``[0, number of layers)``, the chosen layers differ in heads or width, or a head's
            weights hold NaN or infinity (the message names the layer and the head).
        TypeError: ``model`` is not a module, or ``layer`` is not an int, a sequence of ints or
            ``None``.

    Shape:
        the result's ``qk`` and ``ov`` ``(n_layers, H, d_head)``.

    Examples:
        >>> spec = qk_spectrum(model, layer=0)
        >>> spec.rank("qk")            # ≤ d_head for every head
        tensor([[64, 64, 64, 64, 64, 64, 64, 64, 64]])
    """
    modules = attention_modules(model)
    if not modules:
        raise ArgumentError(f"{type(model).__name__} has no attention layer (MultiHeadAttention)")
    paths = list(modules)
    indices = _chosen(layer, len(paths))
    chosen = [modules[paths[i]] for i in indices]
    shapes = {(m.num_heads, m.num_kv_heads, m.d_head, m.d_model) for m in chosen}
    if len(shapes) != 1:
        raise ArgumentError(
            f"the chosen layers differ in (heads, kv heads, d_head, d_model): {sorted(shapes)}; "
            "pass one layer at a time"
        )
    (_, kv_heads, d_head, d_model) = shapes.pop()
    qk, ov = [], []
    for i, attn in zip(indices, chosen, strict=True):
        w = head_weights(attn)
        _check_finite_heads(w, f"layer {i} ({paths[i]})")
        # M_QK^h = W_Q^hᵀ W_K^g · scale: factors A = W_Q^hᵀ, B = W_K^gᵀ, the layer's score
        # scale (1/√d_head, or its own: Gemma 2's query_pre_attn_scalar^(−1/2))
        scale = getattr(attn, "score_scale", None) or d_head**-0.5
        qk.append(_low_rank_singular_values(w.query.mT, w.key.mT, scale))
        # M_OV^h = W_V^gᵀ W_O^hᵀ: factors A = W_V^gᵀ, B = W_O^h                          (H, d, e)
        ov.append(_low_rank_singular_values(w.value.mT, w.output))
    dtype = chosen[0].qkv_parameters()[0].dtype
    return CircuitSpectrum(
        layers=[paths[i] for i in indices],
        indices=indices,
        qk=torch.stack(qk).cpu(),
        ov=torch.stack(ov).cpu(),
        d_model=d_model,
        d_head=d_head,
        num_kv_heads=kv_heads,
        eps=float(torch.finfo(dtype).eps),
    )
