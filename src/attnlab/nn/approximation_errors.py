"""How far the approximations of softmax attention are from it: the relative error
``‖Ã − A‖_F / ‖A‖_F`` of Linformer (:func:`linformer_errors`) and of FAVOR+ (:func:`favor_errors`)
against exact attention, over draws of their random projections or features, in float64."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from attnlab._checks import check_choice, check_positive_int, check_tensor
from attnlab.nn.approximation import check_qkv, relative_error
from attnlab.nn.attention import scaled_dot_product_attention
from attnlab.nn.linformer import linformer_attention, random_projection
from attnlab.nn.performer import favor_attention, orthogonal_random_features

__all__ = ["favor_errors", "linformer_errors"]


def linformer_errors(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    ks: Sequence[int],
    *,
    projections: Literal["jl", "random", "fitted"] = "jl",
    trials: int = 4,
    steps: int = 300,
    lr: float = 0.05,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The relative error ``‖Ã − A‖_F / ‖A‖_F`` of Linformer-style attention against exact
    softmax attention ``A = softmax(Q Kᵀ / √D) V``, for each projected length ``k``, in float64.

    Three kinds of projection:

    * ``"jl"`` — Theorem 1 of Wang et al. (2020): ``Ã = P Rᵀ R V`` with the exact context mapping
      ``P`` and a Gaussian :func:`random_projection` ``R`` (``E[Rᵀ R] = I``, error ``O(1/√k)``);
    * ``"random"`` — the layer with untrained projections ``E = F = R``
      (:func:`linformer_attention`): what an untrained Linformer computes;
    * ``"fitted"`` — the layer with ``E`` and ``F`` fitted to these inputs by ``steps`` of Adam
      from a random start (Theorem 2 says good ones exist for ``k = O(d log d)``).

    Args:
        query: ``(B, H, T, D)``.
        key: ``(B, H, T, D)``.
        value: ``(B, H, T, D_v)``.
        ks: projected lengths ``k``.
        projections: ``"jl"`` (default), ``"random"`` or ``"fitted"``.
        trials: independent draws of ``R`` (or starts of the fit) per ``k``. Default 4.
        steps: Adam steps of the ``"fitted"`` projections. Default 300.
        lr: Adam's learning rate for ``"fitted"``. Default 0.05.
        generator: the random generator of the draws; default the global one.

    Returns:
        The errors, float64.

    Shape:
        query/key/value ``(B, H, T, D)`` → errors ``(len(ks), trials)``.

    Examples:
        >>> q, k, v = torch.randn(3, 1, 2, 64, 16).unbind(0)
        >>> linformer_errors(q, k, v, [8, 64], trials=2).shape
        torch.Size([2, 2])
    """
    check_qkv(query, key, value)
    check_choice("projections", projections, ("jl", "random", "fitted"))
    check_positive_int("trials", trials)
    check_positive_int("steps", steps)
    sizes = [check_positive_int("every entry of ks", k) for k in ks]
    q, k, v = query.detach().double(), key.detach().double(), value.detach().double()
    t = k.shape[-2]
    scale = q.shape[-1] ** -0.5
    exact, p = scaled_dot_product_attention(q, k, v, backend="math", need_weights=True)
    errors = torch.zeros(len(sizes), trials, dtype=torch.float64)
    for i, size in enumerate(sizes):
        for j in range(trials):
            r = random_projection(size, t, generator=generator, dtype=torch.float64)
            if projections == "jl":
                approx = p @ r.T @ (r @ v)  # P Rᵀ R V
            elif projections == "random":
                out = linformer_attention(q, k, v, r, scale=scale, backend="math")
                approx = out if isinstance(out, torch.Tensor) else out[0]
            else:
                approx = _fit(q, k, v, r, exact, scale, steps, lr, generator)
            errors[i, j] = relative_error(approx, exact)
    return errors


def _fit(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    start: torch.Tensor,
    exact: torch.Tensor,
    scale: float,
    steps: int,
    lr: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Fit ``E`` and ``F`` (from ``E = start``, ``F`` a fresh draw) to ``exact`` by Adam."""
    e = start.clone().requires_grad_(True)
    f = random_projection(*start.shape, generator=generator, dtype=start.dtype)
    f.requires_grad_(True)
    opt = torch.optim.Adam([e, f], lr=lr)
    norm = exact.square().sum()
    with torch.enable_grad():
        for _ in range(steps):
            opt.zero_grad()
            # eq. 7 written out (the checks of linformer_attention cost more than the maths here)
            w = torch.softmax((q @ (e @ k).transpose(-2, -1)) * scale, dim=-1)
            loss = (w @ (f @ v) - exact).square().sum() / norm
            loss.backward()
            opt.step()
    with torch.no_grad():
        out = linformer_attention(q, k, v, e, f, scale=scale, backend="math")
    return out if isinstance(out, torch.Tensor) else out[0]


def favor_errors(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    num_features: Sequence[int],
    *,
    trials: int = 8,
    is_causal: bool = False,
    orthogonal: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The relative error ``‖Ã − A‖_F / ‖A‖_F`` of FAVOR+ against exact softmax attention
    ``A = softmax(Q Kᵀ / √D) V``, for each number of random features ``m``, in float64.

    Args:
        query: ``(B, H, T_q, D)``.
        key: ``(B, H, T_k, D)``.
        value: ``(B, H, T_k, D_v)``.
        num_features: the numbers of features ``m``.
        trials: independent draws of the features per ``m``. Default 8.
        is_causal: compare causal attention. Default ``False``.
        orthogonal: orthogonal random features (default) or i.i.d. Gaussian ones.
        generator: the random generator of the draws; default the global one.

    Returns:
        The errors, float64.

    Shape:
        query/key/value ``(B, H, T, D)`` → errors ``(len(num_features), trials)``.

    Examples:
        >>> q, k, v = torch.randn(3, 1, 2, 64, 16).unbind(0)
        >>> favor_errors(q, k, v, [16, 256], trials=2).shape
        torch.Size([2, 2])
    """
    check_positive_int("trials", trials)
    sizes = [check_positive_int("every entry of num_features", m) for m in num_features]
    q, k, v = (check_tensor(n, x).detach().double() for n, x in
               (("query", query), ("key", key), ("value", value)))  # fmt: skip
    exact = scaled_dot_product_attention(q, k, v, is_causal=is_causal, backend="math")
    errors = torch.zeros(len(sizes), trials, dtype=torch.float64)
    for i, m in enumerate(sizes):
        for j in range(trials):
            w = orthogonal_random_features(
                m, q.shape[-1], generator=generator, orthogonal=orthogonal, dtype=torch.float64
            )
            out = favor_attention(q, k, v, w, is_causal)
            approx = out if isinstance(out, torch.Tensor) else out[0]
            errors[i, j] = relative_error(approx, exact)
    return errors
