"""Why attention divides by √d_k (Vaswani et al. 2017, §3.2.1, footnote 4).

For a query ``q`` and keys ``k_j`` with independent unit-variance entries, the dot product
``q · k_j = Σ_{i=1}^{d_k} q_i k_{ji}`` has variance ``d_k``. Unscaled, the scores grow like
``√d_k``, the softmax saturates onto one key and its gradient vanishes: the Jacobian of
``p = softmax(s)`` is ``J = diag(p) − p pᵀ`` and goes to zero as ``p`` becomes one-hot. Dividing the
scores by ``√d_k`` keeps their variance at 1 whatever ``d_k``.

- :func:`softmax_scaling_stats`: the measurement (score spread, largest weight, ``‖J‖_F``) for
  random queries and keys, with and without the scale.
- :func:`softmax_scaling_figure`: the three quantities against ``d_k``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.ticker import NullLocator

from attnlab._checks import check_positive_int
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.viz._draw import Plot, _new_figure

_CHUNK = 256  # queries drawn at a time

__all__ = [
    "SoftmaxScaling",
    "softmax_jacobian_norm",
    "softmax_scaling_figure",
    "softmax_scaling_stats",
]


@dataclass(frozen=True)
class SoftmaxScaling:
    """Softmax statistics of random scores, per ``d_k``, unscaled (row 0) and scaled (row 1).

    Attributes:
        d_k: the key dimensions measured, ``(N,)``.
        score_std: the standard deviation of the scores ``q · k_j`` (row 0) and
            ``q · k_j / √d_k`` (row 1), ``(2, N)``.
        max_weight: the mean over queries of the largest softmax weight, ``(2, N)``.
        jacobian_norm: the mean over queries of ``‖∂p/∂s‖_F`` (see :func:`softmax_jacobian_norm`),
            ``(2, N)``.
        num_keys: keys per query.
        samples: queries per ``d_k``.
    """

    d_k: np.ndarray
    score_std: np.ndarray
    max_weight: np.ndarray
    jacobian_norm: np.ndarray
    num_keys: int
    samples: int


def softmax_jacobian_norm(p: torch.Tensor) -> torch.Tensor:
    """The Frobenius norm of the softmax Jacobian, from the probabilities.

    ``J = ∂p/∂s = diag(p) − p pᵀ``, so ``‖J‖_F² = Σ_i p_i² − 2 Σ_i p_i³ + (Σ_i p_i²)²``:
    ``0`` for a one-hot ``p`` (a saturated softmax passes no gradient back to the scores),
    largest for a spread-out one.

    Args:
        p: probabilities along the last dim (each row sums to 1).

    Returns:
        ``‖J‖_F`` per row.

    Shape:
        ``(..., n)`` → ``(...)``.
    """
    if not isinstance(p, torch.Tensor):
        raise ArgumentTypeError(f"p must be a torch.Tensor, got {type(p).__name__}")
    if p.dim() < 1 or not p.is_floating_point():
        raise ArgumentError(
            f"p must be a floating tensor (..., n) of probabilities, got {p.dtype} {tuple(p.shape)}"
        )
    s2 = (p * p).sum(-1)
    s3 = (p * p * p).sum(-1)
    return (s2 - 2 * s3 + s2 * s2).clamp_min(0.0).sqrt()


def softmax_scaling_stats(
    d_ks: Sequence[int] = (4, 16, 64, 256, 1024),
    *,
    num_keys: int = 16,
    samples: int = 512,
    seed: int = 0,
) -> SoftmaxScaling:
    """Measure how the softmax of ``q · k`` saturates as ``d_k`` grows, with and without ``1/√d_k``.

    For each ``d_k``, ``samples`` queries ``q ~ N(0, I)`` each meet ``num_keys`` keys
    ``k_j ~ N(0, I)`` (float64, a seeded generator, 256 queries at a time). The scores are ``s_j = q · k_j`` (unscaled)
    and ``s_j / √d_k`` (scaled), ``p = softmax(s)``.

    Args:
        d_ks: key dimensions. Default ``(4, 16, 64, 256, 1024)``.
        num_keys: keys per query ``n``. Default 16.
        samples: queries per ``d_k``. Default 512.
        seed: the generator's seed. Default 0.

    Returns:
        A :class:`SoftmaxScaling`.

    Shape:
        every array of the result is ``(2, len(d_ks))`` (row 0 unscaled, row 1 scaled), except
        ``d_k`` ``(len(d_ks),)``.
    """
    if isinstance(d_ks, (str, bytes)) or not isinstance(d_ks, Sequence) or not d_ks:
        raise ArgumentError(f"d_ks must be a non-empty sequence of positive ints, got {d_ks!r}")
    dims = [check_positive_int("d_ks[i]", d) for d in d_ks]
    check_positive_int("num_keys", num_keys)
    check_positive_int("samples", samples)
    gen = torch.Generator().manual_seed(seed)
    std = np.zeros((2, len(dims)))
    top = np.zeros((2, len(dims)))
    jac = np.zeros((2, len(dims)))
    for c, d in enumerate(dims):
        chunks = []  # the keys of all queries at once would be S · n · d_k floats: in chunks
        for start in range(0, samples, _CHUNK):
            m = min(_CHUNK, samples - start)
            q = torch.randn(m, 1, d, generator=gen, dtype=torch.float64)  # (m, 1, d_k)
            k = torch.randn(m, num_keys, d, generator=gen, dtype=torch.float64)  # (m, n, d_k)
            chunks.append((q * k).sum(-1))  # s_j = q · k_j, (m, n)
        raw = torch.cat(chunks)  # (S, n)
        for r, s in enumerate((raw, raw / d**0.5)):
            p = torch.softmax(s, dim=-1)  # (S, n)
            std[r, c] = float(s.std())
            top[r, c] = float(p.max(dim=-1).values.mean())
            jac[r, c] = float(softmax_jacobian_norm(p).mean())
    return SoftmaxScaling(np.array(dims), std, top, jac, num_keys, samples)


def softmax_scaling_figure(stats: SoftmaxScaling, *, title: str | None = None) -> Plot:
    """Score spread, largest softmax weight and softmax gradient against ``d_k``, with and without
    the ``1/√d_k`` scale (three panels, ``d_k`` on a log axis).

    Args:
        stats: from :func:`softmax_scaling_stats`.
        title: the figure title. Default names the number of keys.

    Returns:
        :class:`~attnlab.viz.Plot` with ``data["d_k"]`` ``(N,)`` and ``data["score_std"]``,
        ``data["max_weight"]``, ``data["jacobian_norm"]``, each ``(2, N)`` (row 0 unscaled,
        row 1 scaled), exactly the arrays of ``stats``.
    """
    if not isinstance(stats, SoftmaxScaling):
        raise ArgumentTypeError(f"stats must be a SoftmaxScaling, got {type(stats).__name__}")
    data = {
        "d_k": stats.d_k,
        "score_std": stats.score_std,
        "max_weight": stats.max_weight,
        "jacobian_norm": stats.jacobian_norm,
    }
    fig = _new_figure(13.0, 4.0)
    axes = fig.subplots(1, 3)
    labels = ("q·k (unscaled)", "q·k / √d_k (scaled)")
    panels = (
        ("score_std", "std of the scores", "log"),
        ("max_weight", "largest softmax weight (mean)", "linear"),
        ("jacobian_norm", "‖∂softmax/∂scores‖_F (mean)", "log"),
    )
    for ax, (key, ylabel, yscale) in zip(axes, panels):
        for row, (label, marker) in enumerate(zip(labels, ("o", "s"))):
            ax.plot(stats.d_k, data[key][row], marker=marker, color=f"C{row}", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(stats.d_k, [str(int(d)) for d in stats.d_k], fontsize=7)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_yscale(yscale)
        ax.set_xlabel("d_k")
        ax.set_title(ylabel, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[1].set_ylim(0.0, 1.05)
    axes[1].axhline(1.0 / stats.num_keys, color="gray", ls=":", lw=1, label="uniform 1/n")
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    fig.suptitle(
        title
        if title is not None
        else f"random q, k with unit-variance entries, {stats.num_keys} keys per query"
    )
    return Plot(fig, data)
