"""How close attention approximations come to exact softmax attention, measured.

:func:`approximation_error_figure` draws the relative error ``‖Ã − A‖_F / ‖A‖_F`` against exact
attention ``A = softmax(Q Kᵀ / √d) V`` on log–log axes:

- left, Linformer (Wang et al. 2020) against the projected length ``k``: the Johnson–Lindenstrauss
  estimate ``P Rᵀ R V`` of the paper's Theorem 1, the layer with untrained random ``E = F = R``,
  and the layer with ``E``, ``F`` fitted to the inputs (Theorem 2);
- right, Performer / FAVOR+ (Choromanski et al. 2021) against the number of random features
  ``m``: orthogonal and i.i.d. Gaussian features, bidirectional and causal.

The errors come from :func:`attnlab.nn.approximation_errors.linformer_errors` and
:func:`attnlab.nn.approximation_errors.favor_errors`; the figure is a :class:`~attnlab.viz.Plot` holding them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.ticker import NullLocator

from attnlab._checks import check_positive_int, shape_str
from attnlab.errors import ArgumentError
from attnlab.nn.approximation_errors import favor_errors, linformer_errors
from attnlab.viz._draw import Plot, _new_figure

__all__ = ["approximation_error_figure", "approximation_inputs"]

# series name -> (label, colour, linestyle)
_LINFORMER = {
    "linformer/jl": ("JL estimate P Rᵀ R V (Thm. 1)", "C0", "-"),
    "linformer/random": ("layer, random E = F (untrained)", "C3", "-"),
    "linformer/fitted": ("layer, E, F fitted to the inputs", "C2", "-"),
}
_PERFORMER = {
    "performer/orthogonal": ("orthogonal features (FAVOR+)", "C0", "-"),
    "performer/iid": ("i.i.d. Gaussian features", "C1", "-"),
    "performer/causal": ("orthogonal, causal (prefix sums)", "C4", "--"),
}


def approximation_inputs(
    *,
    seq_len: int = 128,
    d_head: int = 16,
    heads: int = 2,
    scale: float = 0.5,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The float64 Gaussian queries, keys and values :func:`approximation_error_figure` measures
    on by default: ``Q, K ~ scale · N(0, 1)``, ``V ~ N(0, 1)``.

    Args:
        seq_len: ``T``. Default 128.
        d_head: ``d``. Default 16.
        heads: ``H``. Default 2.
        scale: the standard deviation of queries and keys. Default 0.5 (scores of standard
            deviation ``scale² ·`` 1 after the ``1/√d`` scaling).
        seed: the seed of the draw.

    Returns:
        ``(query, key, value)``.

    Shape:
        each ``(1, H, T, d)``.
    """
    for name, value in (("seq_len", seq_len), ("d_head", d_head), ("heads", heads)):
        check_positive_int(name, value)
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, 1, heads, seq_len, d_head, generator=g, dtype=torch.float64)
    return scale * q, scale * k, v


def approximation_error_figure(
    query: torch.Tensor | None = None,
    key: torch.Tensor | None = None,
    value: torch.Tensor | None = None,
    *,
    ks: Sequence[int] = (4, 8, 16, 32, 64, 128),
    num_features: Sequence[int] = (16, 64, 256, 1024, 4096),
    trials: int = 4,
    fit_steps: int = 100,
    seed: int = 0,
    title: str | None = None,
) -> Plot:
    """Measured error of Linformer (against ``k``) and Performer (against ``m``) relative to
    exact softmax attention, mean over ``trials`` draws with the min–max range shaded.

    Each series draws from its own generator, seeded ``seed + 1`` (JL), ``seed + 2`` (random
    ``E = F``), ``seed + 3`` (fitted), ``seed + 4`` (orthogonal), ``seed + 5`` (i.i.d.) and
    ``seed + 6`` (causal), so that a test can measure the same numbers again. The fitted
    projections are one fit per ``k`` (``trials`` does not apply). A dotted line of slope
    ``−1/2`` marks the ``1/√k`` (``1/√m``) rate of a Monte-Carlo estimate.

    Args:
        query: ``(B, H, T, d)``; default :func:`approximation_inputs` with ``seed``.
        key: ``(B, H, T, d)``; default as ``query``.
        value: ``(B, H, T, d_v)``; default as ``query``.
        ks: Linformer's projected lengths ``k``.
        num_features: Performer's numbers of features ``m``.
        trials: random draws per point. Default 4.
        fit_steps: Adam steps fitting ``E`` and ``F``. Default 100.
        seed: seeds the inputs (when not given) and the draws.
        title: the figure title; default names ``T`` and ``d``.

    Returns:
        :class:`~attnlab.viz.Plot` whose ``data`` holds ``"k"`` ``(K,)``, ``"num_features"``
        ``(M,)``, the errors ``"linformer/jl"`` and ``"linformer/random"`` ``(K, trials)``,
        ``"linformer/fitted"`` ``(K, 1)``, and ``"performer/orthogonal"``, ``"performer/iid"``,
        ``"performer/causal"`` ``(M, trials)``.

    Raises:
        ValueError: only some of ``query``/``key``/``value`` given, or not 4-D.

    Shape:
        query/key ``(B, H, T, d)``, value ``(B, H, T, d_v)``.

    Examples:
        >>> plot = approximation_error_figure(ks=[8, 32], num_features=[16, 256], trials=2)
        >>> plot.data["performer/orthogonal"].shape
        (2, 2)
    """
    given = [x is not None for x in (query, key, value)]
    if any(given) and not all(given):
        raise ArgumentError("query, key and value must be given together or not at all")
    if query is None or key is None or value is None:
        query, key, value = approximation_inputs(seed=seed)
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.dim() != 4:
            raise ArgumentError(f"{name} must have shape (B, H, T, d), got {shape_str(x.shape)}")
    check_positive_int("trials", trials)
    check_positive_int("fit_steps", fit_steps)

    def gen(offset: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed + offset)

    q, k, v = query, key, value
    data: dict[str, np.ndarray] = {
        "k": np.asarray(list(ks), dtype=np.int64),
        "num_features": np.asarray(list(num_features), dtype=np.int64),
    }
    data["linformer/jl"] = linformer_errors(q, k, v, ks, trials=trials, generator=gen(1)).numpy()
    data["linformer/random"] = linformer_errors(
        q, k, v, ks, projections="random", trials=trials, generator=gen(2)
    ).numpy()
    data["linformer/fitted"] = linformer_errors(
        q, k, v, ks, projections="fitted", trials=1, steps=fit_steps, generator=gen(3)
    ).numpy()
    m = num_features
    data["performer/orthogonal"] = favor_errors(q, k, v, m, trials=trials, generator=gen(4)).numpy()
    data["performer/iid"] = favor_errors(
        q, k, v, m, trials=trials, orthogonal=False, generator=gen(5)
    ).numpy()
    data["performer/causal"] = favor_errors(
        q, k, v, m, trials=trials, is_causal=True, generator=gen(6)
    ).numpy()

    fig = _new_figure(11.0, 4.3)
    ax_l, ax_p = fig.subplots(1, 2)
    _draw(ax_l, data["k"], data, _LINFORMER)
    ax_l.axvline(k.shape[-2], color="gray", linestyle=":", linewidth=1)
    ax_l.text(k.shape[-2], 0.6, "k = T ", transform=ax_l.get_xaxis_transform(), fontsize=8,
              color="dimgray", ha="right")  # fmt: skip
    ax_l.set_xlabel("projected length k")
    ax_l.set_title("Linformer (Wang et al. 2020)", fontsize=10)
    _draw(ax_p, data["num_features"], data, _PERFORMER)
    ax_p.set_xlabel("random features m")
    ax_p.set_title("Performer, FAVOR+ (Choromanski et al. 2021)", fontsize=10)
    ax_l.set_ylabel("relative error ‖Ã − A‖ / ‖A‖")
    t, d = q.shape[-2], q.shape[-1]
    fig.suptitle(
        title if title is not None else f"Error against exact softmax attention (T = {t}, d = {d})",
        fontsize=11,
    )
    return Plot(fig, data)


def _draw(
    ax: Axes, x: np.ndarray, data: dict[str, np.ndarray], series: dict[str, tuple[str, str, str]]
) -> None:
    for name, (label, colour, style) in series.items():
        err = data[name]
        mean = err.mean(axis=1)
        ax.plot(x, mean, color=colour, linestyle=style, marker="o", markersize=3, label=label)
        if err.shape[1] > 1:
            ax.fill_between(x, err.min(axis=1), err.max(axis=1), color=colour, alpha=0.15)
    # a 1/√x guide through the first point of the first series
    first = data[next(iter(series))].mean(axis=1)
    ax.plot(x, first[0] * np.sqrt(x[0] / x), color="black", linestyle=":", linewidth=1,
            label="∝ 1/√x")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([int(v) for v in x], [str(int(v)) for v in x], fontsize=8)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
