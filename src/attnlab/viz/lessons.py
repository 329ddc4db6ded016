"""Figures of the lessons around attention: masks, the Noam schedule, positional encodings.

Each returns a :class:`~attnlab.viz.Plot` holding the arrays it drew; the values come from the
library's own code (:mod:`attnlab.nn.masks`, :func:`attnlab.training.schedules.noam_rate`,
:func:`attnlab.nn.positional.sinusoidal_table`), so a figure shows exactly what a model uses.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from attnlab._checks import check_positive_int
from attnlab.errors import ArgumentError
from attnlab.training.schedules import noam_rate
from attnlab.viz._draw import Plot, _new_figure, _tick_labels

__all__ = ["mask_panel", "noam_curve", "positional_encoding_figure", "token_masks"]


# ----------------------------------------------------------------------------- masks


def token_masks(tokens: Sequence[str], *, pad_token: str = "<pad>") -> dict[str, torch.Tensor]:
    """The masks a model applies to one sequence of token texts, built by the model's own code.

    The tokens get ids (``pad_token`` → 0, every other text its own id ≥ 1) and the masks come
    from :func:`attnlab.masks.padding_mask` (``pad_id = 0``, as the models' default key mask),
    :func:`attnlab.masks.causal_mask` (``is_causal=True``) and :func:`attnlab.masks.combine`:

        padding[i, j] = token_j ≠ pad,   look_ahead[i, j] = j ≤ i,   combined = padding ∧ look_ahead

    (``True = may attend``). ``plot masks`` draws them and ``plot steps`` applies them.

    Args:
        tokens: one sequence, possibly ending in padding.
        pad_token: the padding token's text. Default ``"<pad>"``.

    Returns:
        ``{"padding", "look_ahead", "combined"}``, boolean tensors.

    Raises:
        ValueError: ``tokens`` is empty.

    Shape:
        each mask ``(T, T)``.
    """
    from attnlab.nn.masks import causal_mask, combine, padding_mask

    toks = [str(t) for t in tokens]
    if not toks:
        raise ArgumentError("tokens must hold at least one token, got none")
    t = len(toks)
    vocab = {pad_token: 0}
    ids = torch.tensor([[vocab.setdefault(tok, len(vocab)) for tok in toks]])  # (1, T)
    padding = padding_mask(ids, 0)[0, 0].expand(t, t)  # (1, 1, 1, T) → (T, T)
    look_ahead = causal_mask(t)
    return {"padding": padding, "look_ahead": look_ahead, "combined": combine(padding, look_ahead)}


def mask_panel(
    tokens: Sequence[str],
    *,
    pad_token: str = "<pad>",
) -> Plot:
    """Padding and look-ahead masks side by side, and their combination.

    ``padding[i, j] = token_j != pad``; ``look_ahead[i, j] = j <= i``;
    ``combined = padding ∧ look_ahead`` (``True = may attend``, drawn dark), from
    :func:`token_masks`.

    Args:
        tokens: one sequence, possibly ending in padding.
        pad_token: the padding token's text. Default ``"<pad>"``.

    Returns:
        :class:`Plot` with ``data`` ``padding``, ``look_ahead``, ``combined`` (boolean ``(T, T)``).
    """
    toks = [str(t) for t in tokens]
    masks = token_masks(toks, pad_token=pad_token)
    t = len(toks)
    data = {
        "padding": masks["padding"].numpy().copy(),
        "look_ahead": masks["look_ahead"].numpy().copy(),
        "combined": masks["combined"].numpy().copy(),
    }
    side = min(6.0, max(2.8, 0.3 * t + 1.2))
    fig = _new_figure(3 * side, side + 0.5)
    axes = fig.subplots(1, 3)
    for ax, (name, m) in zip(axes, data.items()):
        ax.imshow(m.astype(float), cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
        _tick_labels(ax, toks, toks)
        ax.set_title(
            {
                "padding": "padding mask",
                "look_ahead": "look-ahead mask",
                "combined": "combined (decoder self-attention)",
            }[name],
            fontsize=9,
        )
        ax.set_xlabel("key")
    axes[0].set_ylabel("query")
    fig.suptitle("True = may attend (dark)")
    return Plot(fig, data)


# ----------------------------------------------------------------------------- schedules, positions


def noam_curve(
    configs: Sequence[tuple[int, int]] = ((512, 4000), (512, 8000), (256, 4000)),
    *,
    steps: int = 20000,
    factor: float = 1.0,
) -> Plot:
    """The Noam learning-rate schedule for a few ``(d_model, warmup_steps)`` pairs.

    The rates are those of :func:`attnlab.training.schedules.noam_rate` (and so of
    :class:`~attnlab.training.NoamLR`), steps counted from 1.

    Args:
        configs: ``(d_model, warmup_steps)`` pairs. Default the Annotated Transformer's three.
        steps: how many steps to draw. Default 20000.
        factor: overall scale. Default 1.

    Returns:
        :class:`Plot` with ``data["step"]`` ``(steps,)`` and ``data["lr"]`` ``(len(configs), steps)``.
    """
    check_positive_int("steps", steps)
    if not configs:
        raise ArgumentError("configs must hold at least one (d_model, warmup_steps) pair, got none")
    step = np.arange(1, steps + 1)  # (steps,)
    lrs = []
    fig = _new_figure(7.0, 4.0)
    ax = fig.add_subplot()
    for d_model, warmup in configs:
        check_positive_int("d_model", d_model)
        check_positive_int("warmup_steps", warmup)
        # lr = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), (steps,)
        lr = noam_rate(step, d_model, warmup, factor)
        lrs.append(lr)
        ax.plot(step, lr, label=f"d_model={d_model}, warmup={warmup}")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title("Noam schedule: linear warm-up, then ∝ 1/√step")
    ax.legend()
    ax.grid(alpha=0.3)
    return Plot(fig, {"step": step, "lr": np.stack(lrs)})


def positional_encoding_figure(
    max_len: int = 100, d_model: int = 64, *, dims: Sequence[int] = (4, 5, 6, 7)
) -> Plot:
    """Sinusoidal positional encodings: the table as a heatmap, and a few dimensions as curves.

    ``PE(pos, 2i) = sin(pos / 10000^{2i/d})``, ``PE(pos, 2i+1) = cos(pos / 10000^{2i/d})``
    (:func:`attnlab.nn.positional.sinusoidal_table`).

    Args:
        max_len: positions to draw. Default 100.
        d_model: encoding width. Default 64.
        dims: dimensions drawn as curves. Default ``(4, 5, 6, 7)``.

    Returns:
        :class:`Plot` with ``data["table"]`` ``(max_len, d_model)`` and ``data["curves"]``
        ``(len(dims), max_len)``.
    """
    from attnlab.nn.positional import sinusoidal_table

    table = sinusoidal_table(max_len, d_model).numpy()
    for d in dims:
        if not 0 <= d < d_model:
            raise ArgumentError(f"dims must lie in [0, d_model={d_model}), got {d}")
    fig = _new_figure(12.0, 4.0)
    ax1, ax2 = fig.subplots(1, 2)
    img = ax1.imshow(table, cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax1.set_xlabel("dimension")
    ax1.set_ylabel("position")
    ax1.set_title("PE table")
    fig.colorbar(img, ax=ax1)
    curves = table[:, list(dims)].T
    for d, curve in zip(dims, curves):
        ax2.plot(np.arange(max_len), curve, label=f"dim {d}")
    ax2.set_xlabel("position")
    ax2.set_title("a few dimensions")
    ax2.legend()
    return Plot(fig, {"table": table, "curves": curves})
