"""Figures of what attention costs: FLOPs and memory against sequence length.

- :func:`flops_figure`: the FLOP and memory calculator (:func:`attnlab.inspect.flops`) over a
  range of sequence lengths — FLOPs per component (attention scores and weights·V, the
  projections, the MLP, the lm head) and memory (KV cache for MHA / GQA / MQA, one layer's
  ``T × T`` attention matrix, parameters and the training state), both on log axes.
- :func:`memory_figure`: measured peak memory against sequence length, one line per attention
  backend (e.g. from :func:`attnlab.inspect.memory.peak_memory`), with predictions dashed.
- :func:`scaling_figure`: measured time (and memory) against sequence length, one line per
  method, log–log, with ``∝ T`` and ``∝ T²`` guides — how each method scales.
- :func:`residual_growth_figure`: the residual stream's standard deviation block by block, with
  and without GPT-2's ``1 / √(2 · n_layer)`` initialisation of the residual projections.

Every function returns a :class:`~attnlab.viz.Plot` holding the arrays it drew.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.ticker import NullLocator

from attnlab._checks import check_positive_int
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.flops import flops
from attnlab.viz._draw import Plot, _new_figure

if TYPE_CHECKING:
    from attnlab.models.config import GPTConfig, TransformerConfig

__all__ = ["flops_figure", "memory_figure", "residual_growth_figure", "scaling_figure"]

# kind of term (the last part of a FlopReport.forward key) -> component drawn
_COMPONENTS: dict[str, str] = {
    "scores": "attention",
    "reduce": "attention",
    "qkv": "projections",
    "q": "projections",
    "kv": "projections",
    "proj": "projections",
    "ffw1": "mlp",
    "ffw2": "mlp",
    "lm_head": "lm_head",
}
_FLOP_LABELS = {
    "attention": "attention: QKᵀ and weights·V  (∝ T²)",
    "projections": "projections: Q, K, V and output  (∝ T)",
    "mlp": "MLP  (∝ T)",
    "lm_head": "lm head  (∝ T)",
    "total": "total forward",
}
_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B"))


def _check_lengths(name: str, values: object) -> np.ndarray:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence | np.ndarray):
        raise ArgumentTypeError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    items = [v.item() if isinstance(v, np.integer) else v for v in values]
    if not items:
        raise ArgumentError(f"{name} must hold at least one length, got none")
    for v in items:
        check_positive_int(f"every entry of {name}", v)
    if any(b <= a for a, b in itertools.pairwise(items)):
        raise ArgumentError(f"{name} must be strictly increasing, got {items}")
    return np.asarray(items, dtype=np.int64)


def _bytes_axis_label(values: np.ndarray) -> tuple[float, str]:
    top = float(np.nanmax(values)) if values.size else 1.0
    for scale, unit in _UNITS:
        if top >= scale:
            return float(scale), unit
    return 1.0, "B"


def flops_figure(
    config: GPTConfig | TransformerConfig,
    seq_lens: Sequence[int],
    *,
    batch: int = 1,
    num_kv_heads: int | None = None,
    dtype: torch.dtype = torch.float32,
    title: str | None = None,
) -> Plot:
    """FLOPs per component and memory against sequence length, from :func:`attnlab.inspect.flops`.

    Left: forward FLOPs of one batch per component, log–log: the attention scores ``QKᵀ`` plus
    ``weights · V`` (quadratic in ``T``), the Q/K/V and output projections, the MLP and the lm
    head (linear in ``T``), and their total. Where the attention term overtakes projections + MLP
    inside the range (``T ≈ 6 · d_model`` for a GPT), a dotted vertical line marks it.
    Right: memory in bytes, log–log: the KV cache for multi-head, grouped (when the config uses
    it) and multi-query attention, one layer's ``B · H · T × T`` attention matrix of the explicit
    ``"math"`` backend, and — flat — the parameters and the training state (parameters, gradients
    and AdamW's moments).

    Args:
        config: a :class:`~attnlab.GPTConfig` or :class:`~attnlab.TransformerConfig`.
        seq_lens: strictly increasing sequence lengths ``T`` (each at most the model's
            positions); for the encoder-decoder the source is as long as the target.
        batch: sequences ``B``. Default 1.
        num_kv_heads: override the config's key/value heads (as in :func:`~attnlab.inspect.flops`).
        dtype: element type for the byte counts. Default ``torch.float32``.
        title: the figure title. Default names the model's size.

    Returns:
        :class:`~attnlab.viz.Plot` whose ``data`` holds, each of shape ``(N,)`` for ``N``
        lengths: ``"seq_len"``; the forward FLOPs ``"flops/attention"``, ``"flops/projections"``,
        ``"flops/mlp"``, ``"flops/lm_head"``, ``"flops/total"``; and the bytes
        ``"memory/kv_cache/MHA"`` (and ``".../GQA"`` when the config groups its heads),
        ``"memory/kv_cache/MQA"``, ``"memory/attention_matrix"``, ``"memory/parameters"``,
        ``"memory/training_state"``. ``"crossover"`` ``(1,)`` holds the interpolated ``T`` where
        attention FLOPs equal projections + MLP (NaN when not inside the range).

    Shape:
        - ``seq_lens``: ``(N,)`` ints.

    Raises:
        TypeError: ``config`` is not a model config, or ``seq_lens`` not a sequence of ints.
        ValueError: ``seq_lens`` is empty, not increasing, or longer than the model holds.

    Examples:
        >>> from attnlab import GPTConfig
        >>> plot = flops_figure(GPTConfig(), [64, 128, 256, 512, 1024])
        >>> float(plot.data["flops/attention"][-1] / plot.data["flops/mlp"][-1])  # T / (4 d)
        0.333...
    """
    lengths = _check_lengths("seq_lens", seq_lens)
    check_positive_int("batch", batch)
    reports = [
        flops(config, int(t), batch, num_kv_heads=num_kv_heads, dtype=dtype) for t in lengths
    ]
    components = ("attention", "projections", "mlp", "lm_head")
    data: dict[str, np.ndarray] = {"seq_len": lengths}
    for comp in components:
        data[f"flops/{comp}"] = np.zeros(len(lengths), dtype=np.float64)
    for i, report in enumerate(reports):
        for kind, value in report.grouped().items():
            data[f"flops/{_COMPONENTS[kind]}"][i] += value
    data["flops/total"] = np.asarray([r.forward_total for r in reports], dtype=np.float64)
    kv_names = list(reports[0].kv_cache)
    for name in kv_names:
        data[f"memory/kv_cache/{name}"] = np.asarray(
            [r.kv_cache[name] for r in reports], dtype=np.float64
        )
    for key in ("attention_matrix", "parameters", "training_state"):
        data[f"memory/{key}"] = np.asarray([r.memory[key] for r in reports], dtype=np.float64)
    linear = data["flops/projections"] + data["flops/mlp"]
    data["crossover"] = np.asarray([_crossover(lengths, data["flops/attention"], linear)])

    fig = _new_figure(11.0, 4.3)
    ax_f, ax_m = fig.subplots(1, 2)
    styles = {"attention": "C3", "projections": "C0", "mlp": "C2", "lm_head": "C4"}
    for comp in components:
        ax_f.plot(lengths, data[f"flops/{comp}"], color=styles[comp], marker="o", markersize=3,
                  label=_FLOP_LABELS[comp])  # fmt: skip
    ax_f.plot(lengths, data["flops/total"], color="black", linestyle="--", label="total forward")
    cross = float(data["crossover"][0])
    if np.isfinite(cross):
        ax_f.axvline(cross, color="gray", linestyle=":", linewidth=1)
        ax_f.text(cross, 0.03, f"attention = proj. + MLP\nat T ≈ {cross:.0f} ", fontsize=7,
                  color="dimgray", ha="right", va="bottom",
                  transform=ax_f.get_xaxis_transform())  # fmt: skip
    _length_ticks(ax_f, lengths)
    ax_f.set_yscale("log")
    ax_f.set_xlabel("sequence length T")
    ax_f.set_ylabel(f"forward FLOPs (batch {batch})")
    ax_f.set_title("FLOPs per component", fontsize=10)
    ax_f.grid(alpha=0.3, which="both")
    ax_f.legend(fontsize=7)

    heads = reports[0].kv_heads
    mem_keys = [f"memory/kv_cache/{n}" for n in kv_names] + [
        "memory/attention_matrix", "memory/parameters", "memory/training_state",
    ]  # fmt: skip
    scale, unit = _bytes_axis_label(np.concatenate([data[k] for k in mem_keys]))
    dtype_name = str(dtype).removeprefix("torch.")
    for n, name in enumerate(kv_names):
        ax_m.plot(lengths, data[f"memory/kv_cache/{name}"] / scale, color=f"C{n}", marker="o",
                  markersize=3, label=f"KV cache, {name} ({_plural(heads[name], 'kv head')})")  # fmt: skip
    ax_m.plot(lengths, data["memory/attention_matrix"] / scale, color="C3", marker="s",
              markersize=3, label="attention matrix, one layer (math)")  # fmt: skip
    ax_m.plot(lengths, data["memory/parameters"] / scale, color="gray", label="parameters")
    ax_m.plot(lengths, data["memory/training_state"] / scale, color="black", linestyle="--",
              label="training state (params + grads + AdamW)")  # fmt: skip
    _length_ticks(ax_m, lengths)
    ax_m.set_yscale("log")
    ax_m.set_xlabel("sequence length T")
    ax_m.set_ylabel(f"{unit} ({dtype_name}, batch {batch})")
    ax_m.set_title("Memory", fontsize=10)
    ax_m.grid(alpha=0.3, which="both")
    ax_m.legend(fontsize=7)
    fig.suptitle(title if title is not None else _default_title(config, reports[0]), fontsize=11)
    return Plot(fig, data)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _length_ticks(ax: Axes, lengths: np.ndarray) -> None:
    """Base-2 log x axis labelled with the lengths themselves (when few enough to read)."""
    ax.set_xscale("log", base=2)
    if len(lengths) <= 12:
        ax.set_xticks([int(t) for t in lengths], [str(int(t)) for t in lengths], fontsize=8)
        ax.xaxis.set_minor_locator(NullLocator())


def _crossover(lengths: np.ndarray, quadratic: np.ndarray, linear: np.ndarray) -> float:
    """The ``T`` (log-interpolated) where ``quadratic`` first reaches ``linear``; NaN if never."""
    ratio = quadratic / linear
    above = np.nonzero(ratio >= 1.0)[0]
    if above.size == 0:
        return float("nan")
    i = int(above[0])
    if i == 0:
        return float(lengths[0]) if ratio[0] == 1.0 else float("nan")
    x0, x1 = np.log(lengths[i - 1]), np.log(lengths[i])
    y0, y1 = np.log(ratio[i - 1]), np.log(ratio[i])
    return float(np.exp(x0 + (0.0 - y0) * (x1 - x0) / (y1 - y0)))


def _default_title(config: object, report: object) -> str:
    total = getattr(report, "params", {}).get("total", 0)
    name = type(config).__name__.removesuffix("Config")
    return f"{name}, {total / 1e6:.1f}M parameters: cost against sequence length"


def _series(name: str, values: object, n: int, what: str = "bytes") -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (n,):
        raise ArgumentError(f"{name} must have one value per length ({n}), got shape {arr.shape}")
    if (arr[np.isfinite(arr)] < 0).any():
        raise ArgumentError(f"{name} must be {what} >= 0, got {arr.tolist()}")
    return arr


def memory_figure(
    seq_lens: Sequence[int],
    peaks: Mapping[str, Sequence[float]],
    *,
    expected: Mapping[str, Sequence[float]] | None = None,
    title: str | None = None,
    ylabel: str = "peak memory",
    xlabel: str = "sequence length T",
    legend_title: str | None = "backend",
) -> Plot:
    """Measured memory against sequence length, one line per series (e.g. per backend), log–log;
    optionally a prediction per series as a dashed line of the same colour.

    Args:
        seq_lens: strictly increasing sequence lengths ``T``.
        peaks: series name (e.g. a backend) → measured bytes at each length (``NaN`` for a
            length not run), e.g. from :func:`attnlab.inspect.memory.peak_memory`.
        expected: series name → predicted bytes at each length (e.g. from
            :func:`attnlab.inspect.flops`), drawn dashed with open squares in the colour of the
            measured series of the same name (grey for a name not in ``peaks``), so that a
            prediction that matches shows as a square around each measured point. Default none.
        title: the figure title. Default ``"Peak memory of attention against T"``.
        ylabel: the y axis label (the unit is appended). Default ``"peak memory"``.
        xlabel: the x axis label. Default ``"sequence length T"``.
        legend_title: the legend's title, or ``None`` for none. Default ``"backend"``.

    Returns:
        :class:`~attnlab.viz.Plot` with ``data["seq_len"]`` ``(N,)``, ``data["peak/<name>"]``
        ``(N,)`` and ``data["expected/<name>"]`` ``(N,)``, in bytes, as given.

    Shape:
        - ``seq_lens``: ``(N,)``; each ``peaks[name]`` and ``expected[name]``: ``(N,)``.

    Raises:
        TypeError: ``peaks`` or ``expected`` is not a mapping.
        ValueError: ``peaks`` is empty, a series has another length than ``seq_lens``, or holds
            a negative value.

    Examples:
        >>> plot = memory_figure([256, 512], {"math": [1e6, 4e6], "blockwise": [2e5, 4e5]})
    """
    lengths = _check_lengths("seq_lens", seq_lens)
    if not isinstance(peaks, Mapping):
        raise ArgumentTypeError(
            f"peaks must be a mapping of name -> bytes, got {type(peaks).__name__}"
        )
    if not peaks:
        raise ArgumentError("peaks must hold at least one series, got none")
    if expected is not None and not isinstance(expected, Mapping):
        raise ArgumentTypeError(
            f"expected must be a mapping of name -> bytes or None, got {type(expected).__name__}"
        )
    n = len(lengths)
    data: dict[str, np.ndarray] = {"seq_len": lengths}
    for name, values in peaks.items():
        data[f"peak/{name}"] = _series(f"peaks[{name!r}]", values, n)
    for name, values in (expected or {}).items():
        data[f"expected/{name}"] = _series(f"expected[{name!r}]", values, n)
    everything = np.concatenate([v for k, v in data.items() if k != "seq_len"])
    scale, unit = _bytes_axis_label(everything[np.isfinite(everything)])
    fig = _new_figure(8.0, 4.2)
    ax = fig.add_subplot()
    colours = {name: f"C{i}" for i, name in enumerate(peaks)}
    for name in peaks:
        ax.plot(lengths, data[f"peak/{name}"] / scale, marker="o", markersize=4,
                color=colours[name], label=f"{name} (measured)" if expected else name)  # fmt: skip
    for name in expected or {}:
        ax.plot(lengths, data[f"expected/{name}"] / scale, linestyle="--", linewidth=1,
                marker="s", markersize=9, markerfacecolor="none",
                color=colours.get(name, "gray"), label=f"{name} (predicted)")  # fmt: skip
    _length_ticks(ax, lengths)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"{ylabel} ({unit})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(title=legend_title, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title if title is not None else "Peak memory of attention against T")
    return Plot(fig, data)


def residual_growth_figure(
    stds: Mapping[str, Sequence[float]], *, title: str | None = None
) -> Plot:
    """The standard deviation of the residual stream after each block, one line per model.

    GPT-2 scales the initial weights of the projections that write into the residual stream by
    ``1 / √(2 · n_layer)`` (Radford et al. 2019, §2.3): every block adds two branches to the
    stream, and without the scaling its variance grows linearly with depth. This draws what a
    forward hook on ``hook_resid_pre`` / ``hook_resid_post`` of each block measured.

    Args:
        stds: a name (e.g. ``"scaled 1/√(2L)"``) → the stream's standard deviation at the
            embedding (entry 0) and after each of the ``L`` blocks (entries ``1 … L``); every
            series has the same length ``L + 1``.
        title: the figure title. Default ``"Residual stream at initialisation"``.

    Returns:
        :class:`~attnlab.viz.Plot` with ``data["layer"]`` ``(L + 1,)`` (``0 … L``) and
        ``data["std/<name>"]`` ``(L + 1,)``, as given.

    Shape:
        - each ``stds[name]``: ``(L + 1,)``.

    Raises:
        TypeError: ``stds`` is not a mapping.
        ValueError: ``stds`` is empty, or its series differ in length or hold fewer than 2 values.

    Examples:
        >>> plot = residual_growth_figure({"scaled": [0.03, 0.05, 0.06], "unscaled": [0.03, 0.2, 0.3]})
    """
    if not isinstance(stds, Mapping):
        raise ArgumentTypeError(
            f"stds must be a mapping of name -> stds, got {type(stds).__name__}"
        )
    if not stds:
        raise ArgumentError("stds must hold at least one series, got none")
    arrays = {name: np.asarray(v, dtype=np.float64) for name, v in stds.items()}
    sizes = {name: a.shape for name, a in arrays.items()}
    first = next(iter(arrays.values()))
    if first.ndim != 1 or first.size < 2 or any(a.shape != first.shape for a in arrays.values()):
        raise ArgumentError(
            f"stds must hold 1-D series of one length L + 1 >= 2 (embedding, then each block), "
            f"got shapes {sizes}"
        )
    layers = np.arange(first.size)
    data: dict[str, np.ndarray] = {"layer": layers}
    fig = _new_figure(6.5, 4.0)
    ax = fig.add_subplot()
    for i, (name, arr) in enumerate(arrays.items()):
        data[f"std/{name}"] = arr
        ax.plot(layers, arr, marker="o", markersize=3, color=f"C{i}",
                label=f"{name}: ×{arr[-1] / arr[0]:.1f} over {first.size - 1} blocks")  # fmt: skip
    ax.set_xlabel("block (0 = embedding)")
    ax.set_ylabel("std of the residual stream")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title if title is not None else "Residual stream at initialisation")
    return Plot(fig, data)


_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"))


def _seconds_axis_label(values: np.ndarray) -> tuple[float, str]:
    top = float(np.nanmax(values)) if values.size else 1.0
    for scale, unit in _TIME_UNITS:
        if top >= scale:
            return scale, unit
    return 1e-6, "µs"


def _guides(ax: Axes, lengths: np.ndarray, first: np.ndarray) -> dict[str, np.ndarray]:
    """Grey ``∝ T`` and ``∝ T²`` lines through the first finite point of ``first``."""
    finite = np.nonzero(np.isfinite(first) & (first > 0))[0]
    if finite.size == 0:
        return {}
    i = int(finite[0])
    x = lengths.astype(np.float64) / float(lengths[i])
    out = {"T": first[i] * x, "T^2": first[i] * x**2}
    for (name, y), style in zip(out.items(), (":", "-."), strict=True):
        label = "∝ T" if name == "T" else "∝ T²"
        ax.plot(lengths, y, color="gray", linestyle=style, linewidth=1, alpha=0.7, label=label)
    return out


def scaling_figure(
    seq_lens: Sequence[int],
    times: Mapping[str, Sequence[float]],
    memory: Mapping[str, Sequence[float]] | None = None,
    *,
    title: str | None = None,
    time_label: str = "time",
    memory_label: str = "peak memory",
    guides: bool = True,
) -> Plot:
    """How attention methods scale: measured time, and optionally memory, against sequence
    length, one line per method, log–log.

    Left: time in seconds (drawn in s, ms or µs). Right (when ``memory`` is given): bytes. A
    length a method did not run is ``NaN`` and leaves a gap. With ``guides``, grey ``∝ T``
    (dotted) and ``∝ T²`` (dash-dotted) lines pass through the first measured point of the first
    series, so that a quadratic method runs parallel to one and a linear method to the other.

    Args:
        seq_lens: strictly increasing sequence lengths ``T``.
        times: method name → seconds at each length (``NaN`` for a length not run). The first
            series anchors the guides (e.g. the peer the others are compared with).
        memory: method name → bytes at each length (``NaN`` for not measured), e.g. from
            :func:`attnlab.inspect.memory.peak_memory`; default none (one panel).
        title: the figure title. Default ``"Cost of attention against T"``.
        time_label: the time axis label (the unit is appended). Default ``"time"``.
        memory_label: the memory axis label (the unit is appended). Default ``"peak memory"``.
        guides: draw the ``∝ T`` and ``∝ T²`` guides. Default ``True``.

    Returns:
        :class:`~attnlab.viz.Plot` with ``data["seq_len"]`` ``(N,)``, ``data["time/<name>"]``
        ``(N,)`` in seconds and ``data["memory/<name>"]`` ``(N,)`` in bytes, as given; with
        ``guides``, ``data["guide/time/T"]`` and ``data["guide/time/T^2"]`` (and
        ``"guide/memory/..."``) ``(N,)``, the guide lines in the series' units.

    Shape:
        - ``seq_lens``: ``(N,)``; each ``times[name]`` and ``memory[name]``: ``(N,)``.

    Raises:
        TypeError: ``times`` or ``memory`` is not a mapping.
        ValueError: ``times`` (or a given ``memory``) is empty, a series has another length than
            ``seq_lens``, or holds a negative value.

    Examples:
        >>> plot = scaling_figure(
        ...     [1024, 4096], {"full": [0.01, 0.16], "window": [0.002, 0.008]},
        ...     {"full": [1e6, 4e6], "window": [1e6, 4e6]},
        ... )
        >>> len(plot.figure.axes)
        2
    """
    lengths = _check_lengths("seq_lens", seq_lens)
    n = len(lengths)
    panels: list[tuple[str, Mapping[str, Sequence[float]]]] = [("time", times)]
    if memory is not None:
        panels.append(("memory", memory))
    data: dict[str, np.ndarray] = {"seq_len": lengths}
    for kind, series in panels:
        arg = "times" if kind == "time" else "memory"
        if not isinstance(series, Mapping):
            raise ArgumentTypeError(
                f"{arg} must be a mapping of name -> values, got {type(series).__name__}"
            )
        if not series:
            raise ArgumentError(f"{arg} must hold at least one series, got none")
        for name, values in series.items():
            what = "seconds" if kind == "time" else "bytes"
            data[f"{kind}/{name}"] = _series(f"{arg}[{name!r}]", values, n, what)
    fig = _new_figure(12.0 if memory is not None else 7.5, 4.6)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    colours = {name: f"C{i}" for i, name in enumerate({**times, **(memory or {})})}
    for ax, (kind, series) in zip(axes, panels, strict=True):
        drawn = np.concatenate([data[f"{kind}/{name}"] for name in series])
        drawn = drawn[np.isfinite(drawn)]
        if kind == "time":
            scale, unit = _seconds_axis_label(drawn)
        else:
            scale, unit = _bytes_axis_label(drawn)
        for name in series:
            ax.plot(lengths, data[f"{kind}/{name}"] / scale, marker="o", markersize=4,
                    color=colours[name], label=name)  # fmt: skip
        if guides:
            first = data[f"{kind}/{next(iter(series))}"] / scale
            for g, y in _guides(ax, lengths, first).items():
                data[f"guide/{kind}/{g}"] = y * scale
        _length_ticks(ax, lengths)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        label = time_label if kind == "time" else memory_label
        ax.set_ylabel(f"{label} ({unit})")
        ax.grid(alpha=0.3, which="both")
        ax.set_title(label[:1].upper() + label[1:], fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    axes[-1].legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(title if title is not None else "Cost of attention against T", fontsize=11)
    return Plot(fig, data)
