"""One head of attention by hand, as the tutorials compute it: your ``x`` and weights, drawn.

:func:`step_panel_by_hand` takes token vectors ``x`` (``T × d_model``) and a head's
``W_q``, ``W_k`` (``d_model × d_k``) and ``W_v`` (``d_model × d_v``) — random where not given —
and draws :func:`~attnlab.viz.step_panel` of

    Q = x W_q,   K = x W_k,   V = x W_v,   A = softmax(Q Kᵀ / √d_k + mask),   Z = A V

in float64, with no mask, or the masks a model applies to the token texts (:func:`token_masks`:
padding keys hidden, and the look-ahead rule). :func:`load_step_inputs` reads ``x`` and the
weights from a file (``attnlab plot steps --inputs FILE``):

- ``.json``: an object ``{"x": [[…], …], "W_q": [[…], …], "W_k": …, "W_v": …}`` (nested lists
  of numbers);
- ``.pt``/``.pth``: a ``dict`` of tensors with those keys (read with ``weights_only=True``);
- ``.npz``: arrays with those names;
- ``.safetensors``: tensors with those names.

``x`` is required; each ``W_*`` is optional. Any other key is an error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from attnlab._checks import shape_str
from attnlab.errors import ArgumentError
from attnlab.viz._draw import Plot
from attnlab.viz.lessons import token_masks
from attnlab.viz.steps import step_panel

__all__ = ["STEP_INPUT_KEYS", "check_step_inputs", "load_step_inputs", "step_panel_by_hand"]

STEP_INPUT_KEYS = ("x", "W_q", "W_k", "W_v")


def load_step_inputs(path: str | Path) -> dict[str, torch.Tensor]:
    """Read ``x`` and optionally ``W_q``, ``W_k``, ``W_v`` from a file (formats: module docstring).

    Args:
        path: a ``.json``, ``.pt``/``.pth``, ``.npz`` or ``.safetensors`` file.

    Returns:
        The tensors by key, float64, checked by :func:`check_step_inputs`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: another suffix, a file that cannot be read as its suffix says, a key that is
            not one of ``x``, ``W_q``, ``W_k``, ``W_v``, no ``x``, or shapes that do not fit.

    Shape:
        x ``(T, d_model)``; W_q, W_k ``(d_model, d_k)``; W_v ``(d_model, d_v)``.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"inputs file {str(p)!r} does not exist")
    suffix = p.suffix.lower()
    try:
        raw: Mapping[str, object]
        if suffix == ".json":
            raw = json.loads(p.read_text(encoding="utf-8"))
        elif suffix in (".pt", ".pth"):
            raw = torch.load(p, map_location="cpu", weights_only=True)
        elif suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                raw = {k: z[k] for k in z.files}
        elif suffix == ".safetensors":
            from safetensors.torch import load_file

            raw = load_file(p)
        else:
            raise ArgumentError(
                f"inputs file must be .json, .pt, .npz or .safetensors, got {p.name!r}"
            )
    except (OSError, ValueError, RuntimeError) as e:
        if isinstance(e, ArgumentError):
            raise
        raise ArgumentError(f"inputs file {p.name!r} could not be read as {suffix}: {e}") from e
    if not isinstance(raw, Mapping):
        raise ArgumentError(
            f"inputs file {p.name!r} must hold a mapping of {', '.join(STEP_INPUT_KEYS)}, got "
            f"{type(raw).__name__}"
        )
    return check_step_inputs(raw)


def check_step_inputs(inputs: Mapping[str, object]) -> dict[str, torch.Tensor]:
    """``x`` (``T × d_model``) and the optional ``W_q``, ``W_k`` (``d_model × d_k``) and ``W_v``
    (``d_model × d_v``) as float64 tensors, checked.

    Args:
        inputs: key → a tensor, an array or nested lists of numbers.

    Returns:
        The same keys, float64 tensors.

    Raises:
        ValueError: an unknown key, no ``x``, a value that is not a finite real matrix, or a
            shape that does not fit (the message names the key, the expected and the actual
            shape).

    Shape:
        x ``(T, d_model)``; W_q, W_k ``(d_model, d_k)``; W_v ``(d_model, d_v)``.
    """
    unknown = [k for k in inputs if k not in STEP_INPUT_KEYS]
    if unknown:
        raise ArgumentError(
            f"inputs hold unknown key(s) {', '.join(map(repr, unknown))}; allowed: "
            f"{', '.join(STEP_INPUT_KEYS)}"
        )
    if "x" not in inputs:
        raise ArgumentError(f"inputs must hold 'x' (T × d_model), got keys {list(inputs)}")
    out: dict[str, torch.Tensor] = {}
    for key in STEP_INPUT_KEYS:
        if key not in inputs:
            continue
        value = inputs[key]
        try:
            t = torch.as_tensor(np.asarray(value, dtype=np.float64))
        except (TypeError, ValueError) as e:
            raise ArgumentError(f"inputs[{key!r}] must be a matrix of numbers: {e}") from e
        if t.dim() != 2 or 0 in t.shape:
            raise ArgumentError(
                f"inputs[{key!r}] must be a 2-D matrix "
                f"({'T × d_model' if key == 'x' else 'd_model × d'}), got {shape_str(t.shape)}"
            )
        if not torch.isfinite(t).all():
            raise ArgumentError(f"inputs[{key!r}] holds NaN or inf")
        out[key] = t
    d_model = out["x"].shape[1]
    for key in ("W_q", "W_k", "W_v"):
        if key in out and out[key].shape[0] != d_model:
            raise ArgumentError(
                f"inputs[{key!r}] must be (d_model, d) = ({d_model}, d) to multiply x "
                f"{shape_str(out['x'].shape)}, got {shape_str(out[key].shape)}"
            )
    if "W_q" in out and "W_k" in out and out["W_q"].shape != out["W_k"].shape:
        raise ArgumentError(
            f"inputs['W_k'] must be {shape_str(out['W_q'].shape)} like W_q (queries and keys "
            f"share d_k), got {shape_str(out['W_k'].shape)}"
        )
    return out


def step_panel_by_hand(
    x: torch.Tensor | np.ndarray,
    *,
    w_q: torch.Tensor | np.ndarray | None = None,
    w_k: torch.Tensor | np.ndarray | None = None,
    w_v: torch.Tensor | np.ndarray | None = None,
    tokens: Sequence[str] | None = None,
    mask: str = "none",
    pad_token: str = "<pad>",
    seed: int = 0,
    title: str | None = None,
) -> Plot:
    """One head computed by hand from ``x`` and its weights, drawn step by step.

    A weight not given is drawn at random (``seed``), ``N(0, 1) / √d_model`` of shape
    ``(d_model, d_k)`` with ``d_k`` that of the other given query/key weight, else ``d_model``.

    Args:
        x: the token vectors.
        w_q: the query weights; default random.
        w_k: the key weights; default random.
        w_v: the value weights; default random.
        tokens: a label per row of ``x`` (default ``t0``, ``t1``, …); with ``mask`` other than
            ``"none"``, the texts equal to ``pad_token`` are padding.
        mask: ``"none"`` (every query sees every key), ``"padding"`` (padding keys hidden) or
            ``"causal"`` (padding keys hidden and the look-ahead rule, as a decoder applies them;
            :func:`~attnlab.viz.lessons.token_masks`).
        pad_token: the padding token's text. Default ``"<pad>"``.
        seed: the seed of the random weights.
        title: the figure's title (default says which weights were given).

    Returns:
        :func:`~attnlab.viz.step_panel`'s :class:`~attnlab.viz.Plot` (``data``: ``x``, ``q``,
        ``k``, ``v``, ``scores``, ``weights``, ``output`` = ``weights @ v``, ``mask``), plus
        ``w_q``, ``w_k``, ``w_v``.

    Raises:
        ValueError: shapes that do not fit (see :func:`check_step_inputs`), a wrong number of
            ``tokens``, or an unknown ``mask``.

    Shape:
        x ``(T, d_model)``; w_q, w_k ``(d_model, d_k)``; w_v ``(d_model, d_v)``; the output
        ``(T, d_v)``.
    """
    if mask not in ("none", "padding", "causal"):
        raise ArgumentError(f"mask must be 'none', 'padding' or 'causal', got {mask!r}")
    given = {k: v for k, v in (("x", x), ("W_q", w_q), ("W_k", w_k), ("W_v", w_v)) if v is not None}
    inputs = check_step_inputs(given)
    xa = inputs["x"]
    t, d_model = xa.shape
    labels = [f"t{i}" for i in range(t)] if tokens is None else [str(s) for s in tokens]
    if len(labels) != t:
        raise ArgumentError(f"tokens must hold one label per row of x ({t}), got {len(labels)}")
    d_k = next((inputs[k].shape[1] for k in ("W_q", "W_k") if k in inputs), d_model)
    gen = torch.Generator().manual_seed(seed)

    def weight(key: str, cols: int) -> torch.Tensor:
        if key in inputs:
            return inputs[key]
        return torch.randn(d_model, cols, generator=gen, dtype=torch.float64) / math.sqrt(d_model)

    wq, wk, wv = weight("W_q", d_k), weight("W_k", d_k), weight("W_v", d_model)
    # Q = x W_q, K = x W_k, V = x W_v
    q, k, v = xa @ wq, xa @ wk, xa @ wv
    m = None
    if mask != "none":
        masks = token_masks(labels, pad_token=pad_token)
        m = masks["combined" if mask == "causal" else "padding"]
    if title is None:
        own = [key for key in ("W_q", "W_k", "W_v") if key in inputs]
        title = (
            f"one head by hand: d_model = {d_model}, d_k = {d_k}; "
            + (f"your {', '.join(own)}" if own else f"random weights (seed {seed})")
            + f"; mask: {mask}"
        )
    plot = step_panel(xa, q, k, v, mask=m, tokens=labels, title=title, x_title="x")
    plot.data.update({"w_q": wq.numpy(), "w_k": wk.numpy(), "w_v": wv.numpy()})
    return plot
