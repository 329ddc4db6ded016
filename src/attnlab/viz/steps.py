"""The step panel: one head of attention computed and drawn step by step, from x to Z.

:func:`step_panel` draws given ``x``, ``Q``, ``K``, ``V`` (Vaswani et al. 2017, §3.2.1);
:func:`step_panel_from_module` and :func:`step_panel_from_model` draw the call an attention layer
resolved (its ``hook_call``, :class:`~attnlab.nn.resolved_call.ResolvedCall`) when a module or a
model ran: the weights and outputs the layer computed, its mask, window and layout as it applied
them; nothing is re-derived from the forward's arguments.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from attnlab._checks import shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.viz._draw import (
    CMAP,
    DIVERGING,
    ArrayLike,
    Plot,
    _draw_matrix,
    _labels,
    _labels_that_fit,
    _new_figure,
    _readable,
    _to_numpy,
)

if TYPE_CHECKING:
    from attnlab.nn.multihead import MultiHeadAttention
    from attnlab.nn.resolved_call import ResolvedCall

__all__ = ["step_data_from_model", "step_panel", "step_panel_from_model", "step_panel_from_module"]


def _split_mask(
    mask: ArrayLike | None, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray | None]:
    """A boolean or additive mask as ``(allowed, bias)``; ``bias`` is ``None`` for boolean masks.

    Hidden entries of an additive mask are ``-inf`` or at most the minimum of its own dtype (the
    rule of :func:`attnlab.masks.is_masked_bias`), decided before any conversion to float64.
    """
    if mask is None:
        return np.ones(shape, dtype=bool), None
    if isinstance(mask, torch.Tensor):
        t = mask.detach().cpu()
        if t.is_floating_point():
            hidden = t <= torch.finfo(t.dtype).min
            m = _to_numpy("mask", ~hidden, 2)
            bias = _to_numpy("mask", t.masked_fill(hidden, 0.0).double(), 2)
        elif t.dtype == torch.bool:
            m, bias = _to_numpy("mask", t, 2), None
        else:
            raise ArgumentTypeError(
                f"mask must be bool or floating (additive), got dtype {t.dtype}"
            )
    else:
        a = _to_numpy("mask", mask, 2)
        if a.dtype == np.bool_:
            m, bias = a, None
        elif np.issubdtype(a.dtype, np.floating):
            hidden = a <= np.finfo(a.dtype).min
            m, bias = ~hidden, np.where(hidden, 0.0, a).astype(np.float64)
        else:
            raise ArgumentTypeError(
                f"mask must be bool or floating (additive), got dtype {a.dtype}"
            )
    if m.shape != shape:
        raise ArgumentError(
            f"mask must have shape (T_q, T_k) = {shape_str(shape)}, got {shape_str(m.shape)}"
        )
    return m, bias


def _signed_limit(a: np.ndarray) -> float:
    finite = a[np.isfinite(a)]
    lim = float(np.abs(finite).max()) if finite.size else 1.0
    return lim if lim > 0 else 1.0


def step_panel(
    x: ArrayLike,
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    *,
    mask: ArrayLike | None = None,
    tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    title: str | None = None,
    x_title: str = "x (token vectors)",
    cross: bool = False,
) -> Plot:
    """One head of attention, step by step, in seven panels (Vaswani et al. 2017, §3.2.1).

    Top row: the input ``x`` and the head's ``Q = x W^Q``, ``K = x W^K``, ``V = x W^V``. Bottom
    row: the scaled scores, the weights and the output,

        S = Q Kᵀ / √d_head (+ B),    A = softmax_rows(S),    Z = A V,

    where masked cells (``mask`` False, or a hidden entry of an additive mask ``B``) are grey and
    ``-inf`` in ``S``; a row that may see no key has zero weights. The values are computed here in
    float64 from ``q``, ``k``, ``v``. Every panel has its own colour bar, token labels on the rows
    (and on the columns of ``S`` and ``A``), and numbers in the cells when the panel is small
    (at most 120 cells, at most 16 per side).

    Args:
        x: the layer's (query) input, ``(T_q, d_model)``.
        q: one head's queries ``(T_q, d_head)``.
        k: that head's keys ``(T_k, d_head)``.
        v: that head's values ``(T_k, d_v)``.
        mask: boolean ``(T_q, T_k)`` (``True = may attend``) or an additive float bias (ALiBi;
            ``-inf``/the dtype's minimum hide a key), added to the scores.
        tokens: query labels.
        key_tokens: key labels (default ``tokens`` when ``T_q == T_k`` and not ``cross``).
        title: figure title.
        x_title: title of the ``x`` panel. Default ``"x (token vectors)"``.
        cross: keys and values come from another sequence (the encoder memory ``m``): the panels
            say ``K = m W^K``, ``V = m W^V``.

    Returns:
        :class:`Plot` with ``data`` ``x``, ``q``, ``k``, ``v``, ``scores`` (masked entries
        ``-inf``; the bias included), ``weights``, ``output``, ``mask`` (boolean, True = may
        attend) and, for an additive mask, ``bias``.
    """
    xa = _to_numpy("x", x, 2).astype(np.float64)
    qa = _to_numpy("q", q, 2).astype(np.float64)
    ka = _to_numpy("k", k, 2).astype(np.float64)
    va = _to_numpy("v", v, 2).astype(np.float64)
    if qa.shape[0] != xa.shape[0]:
        raise ArgumentError(
            f"q must have one row per row of x ({xa.shape[0]}), got {shape_str(qa.shape)}"
        )
    if ka.shape[1] != qa.shape[1] or va.shape[0] != ka.shape[0]:
        raise ArgumentError(
            f"k must be (T_k, d_head={qa.shape[1]}) and v (T_k, d_v), got {shape_str(ka.shape)} and {shape_str(va.shape)}"
        )
    t_q, d_head = qa.shape
    t_k = ka.shape[0]
    m, bias = _split_mask(mask, (t_q, t_k))
    rows = _labels("tokens", tokens, t_q)
    cols = _labels(
        "key_tokens",
        key_tokens if key_tokens is not None else (tokens if t_q == t_k and not cross else None),
        t_k,
    )

    # S = Q Kᵀ / √d_head + B, masked entries -inf
    raw = qa @ ka.T / math.sqrt(d_head)
    if bias is not None:
        raw = raw + bias
    scores = np.where(m, raw, -np.inf)
    # A = softmax(S) row-wise; a row with no visible key is all zeros
    row_max = np.max(scores, axis=1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.where(m, np.exp(np.where(m, scores, 0.0) - row_max), 0.0)
    denom = e.sum(axis=1, keepdims=True)
    weights = np.divide(e, denom, out=np.zeros_like(e), where=denom > 0)
    # Z = A V
    output = weights @ va

    src = "m" if cross else "x"
    s_title = rf"$S = QK^\top/\sqrt{{{d_head}}}$" + (r" $+$ bias" if bias is not None else "")
    titles = (
        f"1  {x_title}   ({t_q} × {xa.shape[1]})",
        rf"2  $Q = x\,W^Q$   ({t_q} × {d_head})",
        rf"3  $K = {src}\,W^K$   ({t_k} × {d_head})",
        rf"4  $V = {src}\,W^V$   ({t_k} × {va.shape[1]})",
        f"5  {s_title}   ({t_q} × {t_k})",
        r"6  $A = \mathrm{softmax}(S)$, rows sum to 1",
        rf"7  $Z = A\,V$   ({t_q} × {va.shape[1]})",
    )
    data = {
        "x": xa,
        "q": qa,
        "k": ka,
        "v": va,
        "scores": scores,
        "weights": weights,
        "output": output,
        "mask": m,
    }
    if bias is not None:
        data["bias"] = bias
    return _figure(data, titles, rows, cols, title)


def _figure(
    data: dict[str, np.ndarray],
    titles: Sequence[str],
    rows: list[str],
    cols: list[str],
    title: str | None,
) -> Plot:
    """Draw the seven panels (x, Q, K, V over S, A, Z) of ``data`` with the given titles."""
    xa, qa, ka, va = data["x"], data["q"], data["k"], data["v"]
    scores, weights, output, m = data["scores"], data["weights"], data["output"], data["mask"]
    d_head = qa.shape[1]
    dims = [f"d{i}" for i in range(d_head)]
    dims_v = [f"d{i}" for i in range(va.shape[1])]
    dims_x = [f"d{i}" for i in range(xa.shape[1])]
    top = [
        (titles[0], xa, rows, dims_x, None),
        (titles[1], qa, rows, dims, None),
        (titles[2], ka, cols, dims, None),
        (titles[3], va, cols, dims_v, None),
    ]
    bottom = [
        (titles[4], scores, rows, cols, m),
        (titles[5], weights, rows, cols, m),
        (titles[6], output, rows, dims_v, None),
    ]
    # numbers in the cells of small panels; when a row of panels would be too wide to view,
    # the widest group of numbered panels (x, then Q/K/V/Z) is drawn without numbers
    numbered = {id(p[1]): _readable(*p[1].shape) for p in (*top, *bottom)}
    cell_w = 0.38  # inches per numbered column

    def width(a: np.ndarray) -> float:
        c = a.shape[1]
        return cell_w * c if numbered[id(a)] else min(5.0, max(1.6, 0.14 * c))

    def height(panels: list) -> float:
        h = [p[1].shape[0] * (0.3 if numbered[id(p[1])] else 0.14) for p in panels]
        return min(7.0, max(1.6, *h))

    overhead = 1.6  # row labels, colour bar, padding (inches per panel)
    max_width = 24.0
    for group in ((xa,), (qa, ka, va, output)):
        if max(sum(width(p[1]) + overhead for p in row) for row in (top, bottom)) <= max_width:
            break
        for a in group:
            numbered[id(a)] = False
    w_top = [width(p[1]) + overhead for p in top]
    w_bot = [width(p[1]) + overhead for p in bottom]
    h_top, h_bot = height(top) + 1.0, height(bottom) + 1.0
    fig = _new_figure(max(sum(w_top), sum(w_bot), 8.0), h_top + h_bot + (0.5 if title else 0.2))
    fig_width = fig.get_figwidth()
    subs: Any = fig.subfigures(2, 1, height_ratios=[h_top, h_bot])  # an array of two
    for sub, panels, widths in ((subs[0], top, w_top), (subs[1], bottom, w_bot)):
        spare = fig_width - sum(widths)  # an empty slot on the right keeps each panel's width
        axes = sub.subplots(
            1, len(panels) + (spare > 0.3), width_ratios=widths + ([spare] if spare > 0.3 else [])
        )
        if spare > 0.3:
            axes[-1].axis("off")
        for ax, (name, a, r_lab, c_lab, pm) in zip(axes, panels):
            is_weights = a is weights
            square = a is scores or a is weights  # T_q × T_k: tokens on both axes
            lim = _signed_limit(a)
            img = _draw_matrix(
                ax,
                np.where(pm, a, 0.0) if pm is not None else a,
                r_lab,
                c_lab,
                mask=pm,
                title=name,
                vmin=0.0 if is_weights else -lim,
                vmax=1.0 if is_weights else lim,
                cmap=CMAP if is_weights else DIVERGING,
                annotate=numbered[id(a)],
                max_labels=_labels_that_fit(max(1.6, 0.14 * a.shape[0]), 0.12),
                max_col_labels=_labels_that_fit(width(a), 0.12),
                masked_text="−∞" if a is scores else None,
                numbered=(True, square),
            )
            ax.set_ylabel("key" if a is ka or a is va else "query", fontsize=8)
            sub.colorbar(
                img,
                ax=ax,
                shrink=0.9,
                pad=0.02,
                label="weight" if is_weights else ("score" if a is scores else "value"),
            )
    if title:
        fig.suptitle(title, fontsize=11)
    return Plot(fig, data)


def _check_head(head: object, num_heads: int) -> int:
    if isinstance(head, bool) or not isinstance(head, int):
        raise ArgumentTypeError(f"head must be an int, got {type(head).__name__}")
    if not 0 <= head < num_heads:
        raise ArgumentError(f"head must be in [0, {num_heads}), got {head}")
    return head


@dataclass
class _Drawn:
    """One head of one resolved call, in float64, taken when the call ran."""

    name: str
    data: dict[str, np.ndarray]
    method: str
    cross: bool
    kv_head: int
    group: int
    rotated: bool = False
    sources: dict[str, str] = field(default_factory=dict)  # "query"/"key" -> producing module


def _one_head(call: ResolvedCall, name: str, head: int, batch_index: int) -> _Drawn:
    """What the panel draws of ``head`` of ``call`` (row ``batch_index``): x, Q, K, V as scored,
    ``S = call.scores()``, the weights and the per-head output the layer computed."""
    _check_head(head, call.num_heads)
    b = call.q.shape[0]
    if not 0 <= batch_index < b:
        raise ArgumentError(f"batch_index must be in [0, {b}), got {batch_index}")
    if call.weights is None or call.output is None:  # unreachable: hook_weights listens
        raise ArgumentError(f"{name} computed no weights to draw")
    kv = call.kv_head(head)
    f64 = torch.float64

    def row(t: torch.Tensor, i: int) -> np.ndarray:
        return t[batch_index, i].detach().to("cpu", f64).numpy()

    scores = call.scores()  # (B, H, T_q, T_k), hidden −∞
    data = {
        "x": call.query_input[batch_index].detach().to("cpu", f64).numpy(),
        "q": row(call.q, head),
        "k": row(call.k, kv),
        "v": row(call.v, kv),
        "scores": row(scores, head),
        "weights": row(call.weights, head),
        "output": row(call.output, head),
        "mask": call.visible()[batch_index, head].cpu().numpy(),  # bool, True = may attend
    }
    bias, shift = call.masking.bias, call.masking.shift
    if bias is not None and call.method != "favor":  # as given: each row's shift restored
        full = bias.to(f64) + (0.0 if shift is None else shift.to(f64))
        data["bias"] = row(torch.broadcast_to(full, scores.shape), head)
    return _Drawn(name, data, call.method, call.cross, kv, call.group)


def _panel(
    drawn: _Drawn,
    *,
    head: int,
    tokens: Sequence[str] | None,
    key_tokens: Sequence[str] | None,
    title: str | None,
    x_title: str,
) -> Plot:
    """Draw one head of a resolved call with the titles of its method."""
    data = drawn.data
    t_q, d_head = data["q"].shape
    t_k, d_v = data["v"].shape
    rows = _labels("tokens", tokens, t_q)
    if drawn.method == "linformer":  # the key axis: the k rows of E K, never tokens
        cols = [f"E·K row {j}" for j in range(t_k)]
    else:
        own = key_tokens if key_tokens is not None else (tokens if t_q == t_k else None)
        cols = _labels("key_tokens", None if drawn.cross and key_tokens is None else own, t_k)
    src = "m" if drawn.cross else "x"
    shared = f", kv head {drawn.kv_head}" if drawn.group > 1 else ""
    turned = r", rotated" if drawn.rotated else ""
    k_title, v_title = rf"$K = {src}\,W^K${turned}", rf"$V = {src}\,W^V$"
    if drawn.method == "linformer":
        k_title, v_title = rf"$E\,K$, $K = {src}\,W^K$", rf"$F\,V$, $V = {src}\,W^V$"
    if drawn.method == "favor":
        s_title = r"$S = \log\,\varphi(q)\varphi(k)^\top$ (FAVOR+)"
        a_title = r"6  $A = D^{-1}\varphi(q)\varphi(k)^\top = \mathrm{softmax}(S)$"
    else:
        keys = "(EK)" if drawn.method == "linformer" else "K"
        s_title = rf"$S = Q{keys}^\top/\sqrt{{{d_head}}}$" + (
            r" $+$ bias" if "bias" in data else ""
        )
        a_title = r"6  $A = \mathrm{softmax}(S)$, rows sum to 1"
    titles = (
        f"1  {x_title}   ({t_q} × {data['x'].shape[1]})",
        rf"2  $Q = x\,W^Q$   ({t_q} × {d_head})",
        f"3  {k_title}   ({t_k} × {d_head}{shared})",
        f"4  {v_title}   ({t_k} × {d_v}{shared})",
        f"5  {s_title}   ({t_q} × {t_k})",
        a_title,
        rf"7  $Z = A\,V$   ({t_q} × {d_v})",
    )
    return _figure(data, titles, rows, cols, title)


def _run_watched(
    watched: dict[str, MultiHeadAttention],
    run: Callable[[], object],
    head: int,
    batch_index: int,
    model: torch.nn.Module | None = None,
) -> _Drawn | None:
    """Run ``run()`` once listening to the watched layers' ``hook_call`` (and ``hook_weights``,
    so the call carries its exact weights); the first call is taken. With ``model``, forward
    hooks name the module that produced each tensor (the ``x`` of the figure's provenance)."""
    from attnlab.nn.hooks import HookPoint

    taken: list[_Drawn] = []
    produced: dict[int, tuple[str, weakref.ref[torch.Tensor]]] = {}
    handles: list[torch.utils.hooks.RemovableHandle] = []

    def producer(t: object) -> str | None:
        if not isinstance(t, torch.Tensor):
            return None
        hit = produced.get(id(t))
        return hit[0] if hit is not None and hit[1]() is t else None

    def on_call(name: str) -> Callable[..., None]:
        def hook(mod: torch.nn.Module, args: Any, call: ResolvedCall) -> None:
            if taken:
                return  # the first call of the first watched layer is the one drawn
            if call.past:
                raise ArgumentError(
                    f"{name} was first called with a KV cache already holding {call.past} "
                    "positions; run the model once over the whole sequence without a cache"
                )
            drawn = _one_head(call, name, head, batch_index)
            drawn.rotated = watched[name].rotary is not None and not call.cross
            for side, t in (("query", call.query_input), ("key", call.key_input)):
                if (src := producer(t)) is not None:
                    drawn.sources[side] = src
            taken.append(drawn)

        return hook

    def post(name: str) -> Callable[..., None]:
        def hook(mod: torch.nn.Module, args: Any, out: Any) -> None:
            if isinstance(out, torch.Tensor):
                old = produced.get(id(out))
                if old is None or old[1]() is not out:  # the first module to return it names it
                    produced[id(out)] = (name, weakref.ref(out))

        return hook

    try:
        if model is not None:
            for name, sub in model.named_modules():
                if name and not isinstance(sub, HookPoint):
                    handles.append(sub.register_forward_hook(post(name)))
        for name, mod in watched.items():
            handles.append(mod.hook_call.register_forward_hook(on_call(name)))
            handles.append(mod.hook_weights.register_forward_hook(lambda m, a, out: None))
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return taken[0] if taken else None


def step_panel_from_module(
    module: torch.nn.Module,
    x: torch.Tensor,
    *,
    head: int = 0,
    memory: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    positions: torch.Tensor | None = None,
    tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    batch_index: int = 0,
) -> Plot:
    """:func:`step_panel` for one head of a :class:`~attnlab.MultiHeadAttention`.

    Runs the module once on the call and draws the call it resolved (its ``hook_call``): the
    queries and keys as scored (rotated, grouped heads), the scores with its mask, window and
    layout, and the weights and per-head output it computed — so the drawn weights are what the
    module computes with ``need_weights=True`` for the same call.

    Args:
        module: a ``MultiHeadAttention`` (any kind: Linformer's key axis is its projected rows,
            Performer's scores are ``log φ(q) φ(k)ᵀ``).
        x: its query input ``(B, T_q, d_model)``.
        head: the query head to draw. Default 0.
        memory: keys/values input for cross-attention ``(B, T_k, d_model)`` (default: ``x``).
        mask: boolean (``True = may attend``) or additive float, broadcastable to
            ``(B, H, T_q, T_k)``.
        is_causal: bottom-right look-ahead mask.
        positions: rotary position ids ``(T_q,)`` or ``(B, T_q)`` (default ``arange(T_q)``).
        tokens: query labels.
        key_tokens: key labels (default ``tokens`` for self-attention).
        batch_index: which sequence. Default 0.

    Returns:
        See :func:`step_panel`.

    Shape:
        x ``(B, T_q, d_model)``; memory ``(B, T_k, d_model)``; mask broadcastable to
        ``(B, H, T_q, T_k)``; positions ``(T_q,)`` or ``(B, T_q)``.
    """
    from attnlab.nn.multihead import MultiHeadAttention

    if not isinstance(module, MultiHeadAttention):
        raise ArgumentTypeError(
            f"module must be an attnlab.MultiHeadAttention, got {type(module).__name__}"
        )
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        got = shape_str(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ArgumentError(f"x must be a tensor (B, T_q, d_model), got {got}")
    _check_head(head, module.num_heads)
    if not 0 <= batch_index < x.shape[0]:
        raise ArgumentError(f"batch_index must be in [0, {x.shape[0]}), got {batch_index}")
    kwargs: dict[str, Any] = {"mask": mask, "is_causal": is_causal}
    if positions is not None:
        kwargs["positions"] = positions
    drawn = _run_watched(
        {"": module}, lambda: module(x, memory, memory, **kwargs), head, batch_index
    )
    if drawn is None:  # unreachable: every MultiHeadAttention emits its call
        raise ArgumentError(f"{type(module).__name__} emitted no call through hook_call")
    return _panel(
        drawn,
        head=head,
        tokens=tokens,
        key_tokens=key_tokens,
        title=f"head {head}",
        x_title="x (layer input)",
    )


def step_panel_from_model(
    model: torch.nn.Module,
    run: Callable[[], object],
    *,
    layer: str | None = None,
    head: int = 0,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    batch_index: int = 0,
) -> Plot:
    """:func:`step_panel` of one head of an attention layer inside a model, as the model ran it.

    ``run()`` runs the model's forward once (e.g. ``lambda: model(src, tgt_in)``). The layer's
    resolved call (its ``hook_call``, :class:`~attnlab.nn.resolved_call.ResolvedCall`) is drawn:
    the input ``x`` it received (the query; the key/value memory of a cross-attention), the
    queries and keys as its scores saw them (rotated; a grouped-query head's shared key/value
    head), ``S = call.scores()`` with what its mask, causal rule, sliding window and block layout
    hide (an additive bias such as ALiBi included), and the weights ``A`` and per-head output
    ``Z`` the layer computed — nothing is recomputed from the forward's arguments, so the drawn
    weights are what :func:`attnlab.inspect.capture` records for that layer and head. A
    Linformer layer's key axis is its ``k`` projected rows (``"E·K row j"``); a Performer
    layer's scores are ``log φ(q) φ(k)ᵀ``, whose softmax is FAVOR+'s ``D⁻¹ φ(q) φ(k)ᵀ``. The
    hooks are removed when ``run`` returns or raises. For a GPT the input of
    ``transformer.h.0.attn`` is ``ln_1`` of the embeddings: the figure names the module that
    produced ``x``.

    Args:
        model: a module containing :class:`~attnlab.nn.multihead.MultiHeadAttention` layers.
        run: a zero-argument callable that runs the model once (called under ``no_grad``).
        layer: the attention module's path (e.g. ``"decoder.layers.0.cross_attn"``); default the
            first attention layer in execution order.
        head: the query head to draw. Default 0.
        query_tokens: query labels.
        key_tokens: key labels (defaults to ``query_tokens`` for self-attention).
        batch_index: which sequence of the batch. Default 0.

    Returns:
        See :func:`step_panel`; the title names the layer, the head and where ``x`` came from.

    Raises:
        ValueError: no such layer, the layer never ran, or it ran with a filled KV cache (the
            panel shows one forward over the whole sequence).

    Examples:
        >>> plot = step_panel_from_model(model, lambda: model(ids), head=1, query_tokens=words)
        >>> plot.save("steps.png")
    """
    drawn = _drawn_from_model(model, run, layer, head, batch_index)
    q_src, k_src = drawn.sources.get("query"), drawn.sources.get("key")
    origin = f"x = output of {q_src}" if q_src else "x = the layer's input"
    if drawn.cross:
        origin += f"; keys/values from {k_src}" if k_src else "; keys/values from the memory"
    return _panel(
        drawn,
        head=head,
        tokens=query_tokens,
        key_tokens=key_tokens,
        title=f"{drawn.name} · head {head}   ({origin})",
        x_title="x (layer input)",
    )


def _drawn_from_model(
    model: torch.nn.Module,
    run: Callable[[], object],
    layer: str | None,
    head: int,
    batch_index: int,
) -> _Drawn:
    """The resolved call of ``layer`` (default: the first to run) when ``run()`` runs, one head."""
    from attnlab.inspect.capture import attention_modules

    if not callable(run):
        raise ArgumentTypeError(f"run must be a zero-argument callable, got {type(run).__name__}")
    modules = attention_modules(model)
    if not modules:
        raise ArgumentError(f"model ({type(model).__name__}) has no MultiHeadAttention layer")
    if layer is not None and layer not in modules:
        known = ", ".join(list(modules)[:8])
        raise ArgumentError(
            f"layer must be an attention module path of the model ({known}), got {layer!r}"
        )
    watched = modules if layer is None else {layer: modules[layer]}
    drawn = _run_watched(watched, run, head, batch_index, model)
    if drawn is None:
        raise ArgumentError(
            f"run() did not call layer {layer!r}" if layer else "run() called no attention layer"
        )
    return drawn


def step_data_from_model(
    model: torch.nn.Module,
    run: Callable[[], object],
    *,
    layer: str | None = None,
    head: int = 0,
    batch_index: int = 0,
) -> dict[str, np.ndarray]:
    """What :func:`step_panel_from_model` draws, without drawing it (``attnlab serve``'s live
    step panel): the layer's resolved call, one head, in float64.

    Args:
        model: a module containing :class:`~attnlab.nn.multihead.MultiHeadAttention` layers.
        run: a zero-argument callable that runs the model once (called under ``no_grad``).
        layer: the attention module's path; default the first attention layer to run.
        head: the query head. Default 0.
        batch_index: which sequence of the batch. Default 0.

    Returns:
        ``x``, ``q``, ``k``, ``v`` (as scored: rotated, a grouped head's shared key/value head),
        ``scores`` (``-inf`` where hidden), ``weights``, ``output``, ``mask`` (True = may
        attend) and, for an additive bias, ``bias`` — the arrays of the panel's ``Plot.data``.

    Raises:
        ValueError: as :func:`step_panel_from_model`.

    Shape:
        ``x`` ``(T_q, d_model)``, ``q`` ``(T_q, d_head)``, ``k``/``v`` ``(T_k, d_head)``,
        ``scores``/``weights``/``mask`` ``(T_q, T_k)``, ``output`` ``(T_q, d_head)``.
    """
    return dict(_drawn_from_model(model, run, layer, head, batch_index).data)
