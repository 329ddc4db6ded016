"""Figures of training: label smoothing, and a run's loss, learning rate and evaluations.

- :func:`label_smoothing_figure`: the smoothed target distribution of one position, and the loss
  of a prediction against its confidence, with and without smoothing (Szegedy et al. 2016;
  Vaswani et al. 2017 §5.4).
- :func:`training_curves`: a run's ``metrics.jsonl`` (what :class:`~attnlab.training.Trainer`
  writes) as curves: the training loss, the learning rate and the held-out evaluations.

Each returns a :class:`~attnlab.viz.Plot` holding the arrays it drew; the losses come from
:func:`attnlab.training.losses.label_smoothed_cross_entropy`, the loss the trainer minimises.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab._checks import check_positive_int, check_probability
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.training.losses import label_smoothed_cross_entropy
from attnlab.training.metrics_log import METRICS_FILE
from attnlab.viz._draw import Plot, _new_figure

__all__ = ["label_smoothing_figure", "training_curves"]


# ----------------------------------------------------------------------------- label smoothing


def label_smoothing_figure(
    num_classes: int,
    smoothing: float = 0.1,
    *,
    target: int = 0,
    points: int = 200,
) -> Plot:
    """The smoothed target of one position, and its loss against the prediction's confidence.

    With smoothing ε over ``V`` classes the one-hot target ``q`` becomes

        q'(k) = (1 − ε) · q(k) + ε / V

    (PyTorch's ``label_smoothing``, as :func:`~attnlab.training.losses.label_smoothed_cross_entropy`
    uses it). The right panel puts probability ``c`` on the target class and spreads ``1 − c``
    evenly over the others, and draws the plain cross-entropy ``−log c`` (ε = 0) and the
    smoothed loss ``H(q', p) = −Σ_k q'(k) log p(k)`` against ``c``. The plain loss keeps falling
    towards 0 as ``c → 1``; the smoothed one is lowest at ``c* = 1 − ε + ε / V``, where ``p = q'``
    and the loss equals the entropy ``H(q')`` — a model trained with smoothing cannot go below it,
    and is pushed back from certainty.

    Args:
        num_classes: ``V``, the number of classes (a vocabulary size), at least 2.
        smoothing: ε in [0, 1). Default 0.1.
        target: the correct class, in ``[0, V)``. Default 0.
        points: confidences drawn, evenly from ``1 / V`` to ``0.999``. Default 200.

    Returns:
        :class:`Plot` with ``data["one_hot"]`` and ``data["smoothed"]`` ``(V,)`` (``q`` and
        ``q'``); ``data["confidence"]`` ``(points,)``; ``data["cross_entropy"]`` and
        ``data["smoothed_loss"]`` ``(points,)`` (the loss at each confidence without and with
        smoothing); ``data["best_confidence"]`` (``c*``) and ``data["entropy"]`` (``H(q')``),
        0-dim.

    Shape:
        ``V`` classes; ``points`` confidences.

    Examples:
        >>> plot = label_smoothing_figure(12, 0.1)
        >>> float(plot.data["entropy"])  # the lowest loss a smoothed model can reach, in nats
        0.526...
    """
    v = check_positive_int("num_classes", num_classes)
    if v < 2:
        raise ArgumentError(f"num_classes must be at least 2, got {v}")
    eps = check_probability("smoothing", smoothing)
    if isinstance(target, bool) or not isinstance(target, int):
        raise ArgumentTypeError(f"target must be an int, got {type(target).__name__}")
    if not 0 <= target < v:
        raise ArgumentError(f"target must lie in [0, num_classes={v}), got {target}")
    n = check_positive_int("points", points)
    if n < 2:
        raise ArgumentError(f"points must be at least 2, got {n}")

    one_hot = np.zeros(v)
    one_hot[target] = 1.0
    smoothed = (1.0 - eps) * one_hot + eps / v  # q'(k) = (1 − ε) q(k) + ε / V, (V,)
    confidence = np.linspace(1.0 / v, 0.999, n)  # (N,)
    # p(target) = c, the rest spread evenly: log-probabilities (N, V)
    probs = np.repeat(((1.0 - confidence) / (v - 1))[:, None], v, axis=1)
    probs[:, target] = confidence
    log_p = torch.from_numpy(np.log(probs))
    targets = torch.full((n,), target, dtype=torch.long)
    # log p are normalised log-probabilities, so they are their own logits
    plain = label_smoothed_cross_entropy(log_p, targets, reduction="none").numpy()
    smooth = label_smoothed_cross_entropy(log_p, targets, smoothing=eps, reduction="none").numpy()
    best = 1.0 - eps + eps / v
    positive = smoothed[smoothed > 0]
    entropy = float(-(positive * np.log(positive)).sum())  # H(q'), the smoothed loss at c*

    fig = _new_figure(11.0, 4.0)
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.3]})
    classes = np.arange(v)
    ax1.bar(classes - 0.2, one_hot, width=0.4, color="0.7", label="one-hot q")
    ax1.bar(classes + 0.2, smoothed, width=0.4, color="C0", label=f"smoothed q' (ε = {eps:g})")
    ax1.set_xticks(classes)
    ax1.set_xlabel("class")
    ax1.set_ylabel("target probability")
    ax1.set_ylim(0, 1.05)
    ax1.set_title(f"the target of one position (class {target} of {v})", fontsize=10)
    ax1.legend(fontsize=8)

    ax2.plot(confidence, plain, color="0.4", label="cross-entropy, ε = 0")
    ax2.plot(confidence, smooth, color="C0", label=f"label-smoothed, ε = {eps:g}")
    if eps > 0:
        ax2.axvline(best, color="C0", ls=":", lw=1)
        ax2.axhline(entropy, color="C0", ls="--", lw=1, label=f"H(q') = {entropy:.3f} nats")
        ax2.plot([best], [entropy], "o", color="C0")
        ax2.annotate(
            f"lowest at c* = {best:.3f}",
            (best, entropy),
            textcoords="offset points",
            xytext=(-110, 25),
            fontsize=8,
            arrowprops={"arrowstyle": "->", "color": "C0"},
        )
    ax2.set_xlabel("confidence c = p(target)  (the rest spread evenly)")
    ax2.set_ylabel("loss (nats)")
    ax2.set_ylim(bottom=0)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    ax2.set_title("loss of a prediction against its confidence", fontsize=10)
    fig.suptitle("Label smoothing: a softer target, and a loss that punishes certainty")
    return Plot(
        fig,
        {
            "one_hot": one_hot,
            "smoothed": smoothed,
            "confidence": confidence,
            "cross_entropy": plain,
            "smoothed_loss": smooth,
            "best_confidence": np.asarray(best),
            "entropy": np.asarray(entropy),
        },
    )


# ----------------------------------------------------------------------------- a run's curves


def _records(metrics: object) -> list[dict[str, Any]]:
    """The records of ``metrics``: a run folder, a ``metrics.jsonl`` file or dicts."""
    if isinstance(metrics, (str, os.PathLike)):
        path = Path(metrics)
        if path.is_dir():
            path = path / METRICS_FILE
        if not path.is_file():
            raise ArgumentError(
                f"metrics must be a run folder holding {METRICS_FILE} or that file, got {metrics}"
            )
        out = []
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ArgumentError(f"{path}:{i} is not a JSON record ({exc.msg})") from None
        records: Iterable[object] = out
    elif isinstance(metrics, Iterable) and not isinstance(metrics, (bytes, Mapping)):
        records = metrics
    else:
        raise ArgumentTypeError(
            "metrics must be a run folder, a metrics.jsonl path or an iterable of records, "
            f"got {type(metrics).__name__}"
        )
    checked = []
    for r in records:
        if not isinstance(r, Mapping):
            raise ArgumentTypeError(f"metrics must hold dict records, got {type(r).__name__}")
        checked.append(dict(r))
    return checked


def _number(value: object) -> float:
    """A logged value as a float; ``None`` (a non-finite value in strict JSON) becomes NaN."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"metrics must hold numbers, got {type(value).__name__}")
    return float(value)


def training_curves(
    metrics: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    *,
    loss_floor: float | None = None,
    title: str | None = None,
) -> Plot:
    """A run's training loss, learning rate and held-out evaluations against the step.

    Reads the records :class:`~attnlab.training.Trainer` writes to ``metrics.jsonl``:
    ``{"kind": "train", "step", "loss", "lr", ...}`` and ``{"kind": "eval", "step", NAME: value}``.
    The panels: the training loss (log scale) with ``loss_floor`` as a dashed line (e.g. the
    entropy ``H(q')`` of the label-smoothed target, which a smoothed loss cannot go below); the
    learning rate; and, when the run evaluated, every evaluated metric.

    Args:
        metrics: a run folder, its ``metrics.jsonl``, or the records themselves (dicts).
        loss_floor: the lowest loss reachable, drawn as a dashed line. Default none.
        title: the figure title. Default ``"Training"``.

    Returns:
        :class:`Plot` with ``data["step"]``, ``data["loss"]`` and ``data["lr"]`` ``(N,)`` (the
        train records, in file order; NaN where a value was logged as ``null``), and when there
        are evaluations ``data["eval_step"]`` ``(E,)`` and ``data["eval/NAME"]`` ``(E,)`` per
        metric (NaN where a record lacks it).

    Shape:
        ``N`` train records, ``E`` eval records.

    Raises:
        ValueError: no train record, or an unreadable file.
        TypeError: a record is not a dict, or a value is not a number.
    """
    records = _records(metrics)
    if loss_floor is not None:
        loss_floor = _number(loss_floor)
    train = [r for r in records if r.get("kind") == "train"]
    if not train:
        raise ArgumentError("metrics must hold at least one train record, got none")
    evals = [r for r in records if r.get("kind") == "eval"]
    step = np.array([_number(r.get("step")) for r in train])
    loss = np.array([_number(r.get("loss")) for r in train])
    lr = np.array([_number(r.get("lr")) for r in train])
    data: dict[str, np.ndarray] = {"step": step, "loss": loss, "lr": lr}
    names = [k for k in dict.fromkeys(k for r in evals for k in r) if k not in ("kind", "step")]
    if evals:
        data["eval_step"] = np.array([_number(r.get("step")) for r in evals])
        for name in names:
            data[f"eval/{name}"] = np.array([_number(r.get(name)) for r in evals])

    panels = 3 if evals and names else 2
    fig = _new_figure(4.3 * panels, 3.6)
    axes = fig.subplots(1, panels)
    ax = axes[0]
    ax.plot(step, loss, color="C0", lw=1, label="training loss")
    if loss_floor is not None:
        ax.axhline(loss_floor, color="C3", ls="--", lw=1, label=f"floor {loss_floor:.3f}")
    if np.nanmin(loss) > 0:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats)")
    ax.set_title("training loss", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    axes[1].plot(step, lr, color="C2")
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("learning rate")
    axes[1].set_title("learning rate", fontsize=10)
    axes[1].grid(alpha=0.3)
    if panels == 3:
        ax3 = axes[2]
        for i, name in enumerate(names):
            ax3.plot(data["eval_step"], data[f"eval/{name}"], marker="o", color=f"C{i + 4}",
                     label=name)  # fmt: skip
        ax3.set_xlabel("step")
        ax3.set_title("held-out evaluation", fontsize=10)
        ax3.grid(alpha=0.3)
        ax3.legend(fontsize=8)
    fig.suptitle(title if title is not None else "Training")
    return Plot(fig, data)
