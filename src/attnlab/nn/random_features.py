"""FAVOR+'s positive random features (Choromanski et al. 2021, §2.3–2.4): the feature map

    φ(x) = exp(W x − ‖x‖²/2) / √m

with ``W``'s rows drawn in blocks of exactly orthogonal directions
(:func:`orthogonal_random_features`), so that ``exp(qᵀk) ≈ φ(q)ᵀ φ(k)``. Used by
:func:`attnlab.nn.performer.favor_attention` and, through :func:`favor_features`, by the
resolved call a :class:`~attnlab.nn.performer.PerformerAttention` layer emits (the same
features the layer computed with).
"""

from __future__ import annotations

import math

import torch

from attnlab._checks import check_positive_int
from attnlab.errors import ArgumentError
from attnlab.nn.approximation import key_mask
from attnlab.nn.backends.common import repeat_kv

__all__ = ["favor_features", "orthogonal_random_features", "softmax_features"]


def orthogonal_random_features(
    m: int,
    d: int,
    *,
    generator: torch.Generator | None = None,
    orthogonal: bool = True,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``m`` random feature directions ``ω`` for FAVOR+ (Choromanski et al. 2021, §2.4).

    Rows come in blocks of ``d``: each block is a uniformly random orthogonal matrix (QR of a
    Gaussian matrix, signs fixed by ``diag(R)`` so that it is Haar-distributed), the last block
    cut to the rows left; each row is then scaled to the norm of an independent ``N(0, I_d)``
    vector (chi-distributed with ``d`` degrees of freedom), so that every row is marginally
    ``N(0, I_d)`` (the estimator stays unbiased) while rows within a block are exactly orthogonal.

    Args:
        m: number of features (rows).
        d: dimension of the queries and keys (columns).
        generator: the random generator; default the global one.
        orthogonal: ``False`` draws i.i.d. Gaussian rows instead (plain random features).
        dtype: element type; default the current default dtype. Drawn in float64.
        device: where to put the result; default the current default device.

    Returns:
        ``W``, one direction ``ω`` per row.

    Shape:
        ``(m, d)``.

    Examples:
        >>> w = orthogonal_random_features(8, 4, generator=torch.Generator().manual_seed(0))
        >>> w.shape
        torch.Size([8, 4])
    """
    check_positive_int("m", m)
    check_positive_int("d", d)
    f64 = torch.float64
    if not orthogonal:
        w = torch.randn(m, d, generator=generator, dtype=f64)
    else:
        blocks = []
        for _ in range(math.ceil(m / d)):
            g = torch.randn(d, d, generator=generator, dtype=f64)
            q, r = torch.linalg.qr(g)
            q = q * torch.sign(torch.diagonal(r)).where(torch.diagonal(r) != 0, 1.0)
            blocks.append(q.T)  # rows orthonormal
        norms = torch.randn(m, d, generator=generator, dtype=f64).norm(dim=-1)  # ~ chi(d)
        w = torch.cat(blocks)[:m] * norms[:, None]
    return w.to(dtype=dtype or torch.get_default_dtype(), device=device)


def softmax_features(
    x: torch.Tensor,
    features: torch.Tensor,
    *,
    scale: float = 1.0,
    stabilize: str = "row",
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The positive random features ``φ(x) = exp(W x' − ‖x'‖²/2 − c) / √m`` of ``x' = √scale · x``.

    ``φ(q)ᵀ φ(k) · e^{c_q + c_k}`` estimates ``exp(scale · qᵀk)`` (Lemma 1); the stabiliser ``c``
    cancels in attention's normalisation when it is the same for all keys.

    Args:
        x: queries or keys ``(..., T, d)``.
        features: ``W`` ``(m, d)`` (:func:`orthogonal_random_features`).
        scale: the score scale the features absorb (``1/√d`` for attention). Default ``1.0``.
        stabilize: ``"row"`` (``c`` = each row's maximum exponent: for queries), ``"all"``
            (``c`` = one maximum over the last two dims: for keys) or ``"none"`` (``c = 0``).
        mask: ``None`` or boolean ``(..., T)``, ``True = keep``: masked rows get ``φ = 0`` and
            are left out of the maximum.

    Returns:
        ``φ(x)``, non-negative.

    Shape:
        x ``(..., T, d)``, features ``(m, d)``, mask ``(..., T)`` → ``(..., T, m)``.
    """
    if stabilize not in ("row", "all", "none"):
        raise ArgumentError(f"stabilize must be one of 'row', 'all', 'none', got {stabilize!r}")
    logits = _exponents(x, features, scale, mask)  # (..., T, m)
    if stabilize != "none":
        dims = (-1,) if stabilize == "row" else (-2, -1)
        c = logits.detach().amax(dim=dims, keepdim=True)
        c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))  # a fully masked row/head
        logits = logits - c
    return torch.exp(logits) * features.shape[0] ** -0.5


def _exponents(
    x: torch.Tensor, features: torch.Tensor, scale: float, mask: torch.Tensor | None
) -> torch.Tensor:
    """The exponents ``ωᵀx' − ‖x'‖²/2`` of the features of ``x' = √scale · x``, ``−∞`` at masked
    rows: ``(..., T, d)`` → ``(..., T, m)``."""
    w = features.to(x.dtype)
    x = x * math.sqrt(scale)
    # ωᵀx − ‖x‖²/2                                                        (..., T, m)
    logits = x @ w.T - x.square().sum(-1, keepdim=True) / 2
    if mask is not None:
        logits = logits.masked_fill(~mask[..., None], -math.inf)
    return logits


def favor_features(
    q: torch.Tensor,
    k: torch.Tensor,
    features: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``φ(Q)`` and ``φ(K)`` as :func:`favor_attention` computes them (the same function): the
    keys repeated to the query heads, hidden keys ``φ = 0``, the queries' stabiliser per row and
    the keys' one per batch and head. ``D⁻¹ φ(Q) φ(K)ᵀ`` are the implied weights.

    Args:
        q: queries ``(B, H, T_q, D)``.
        k: keys ``(B, H_kv, T_k, D)``.
        features: ``W`` ``(m, D)``.
        mask: boolean key mask broadcastable to ``(B, H, 1, T_k)``, or ``None``.
        scale: the score scale; default ``1 / √D``.

    Returns:
        ``(φ(Q), φ(K))``.

    Shape:
        ``(B, H, T_q, m)`` and ``(B, H, T_k, m)``.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    k = repeat_kv(k, q.shape[-3] // k.shape[-3])
    return _phi(q, k, features, scale, _kept_keys(q, k, mask))


def _kept_keys(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
    """The key mask ``(..., H, T_k)`` (``True`` = kept) of keys already repeated to ``H``."""
    h, t_k = q.shape[-3], k.shape[-2]
    batch = q.shape[0] if q.dim() >= 4 else 1
    m = key_mask(mask, batch, h, t_k, "FAVOR+ attention")
    if m is None:
        return None
    return m.expand(*k.shape[:-2], t_k) if q.dim() == 4 else m.reshape(k.shape[:-1])


def _phi(
    q: torch.Tensor,
    k: torch.Tensor,
    features: torch.Tensor,
    scale: float,
    keep: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``φ(Q)`` (stabilised per row) and ``φ(K)`` (one stabiliser per head, hidden keys 0)."""
    phi_q = softmax_features(q, features, scale=scale, stabilize="row")  # (..., H, T_q, m)
    phi_k = softmax_features(k, features, scale=scale, stabilize="all", mask=keep)  # (…, T_k, m)
    return phi_q, phi_k
