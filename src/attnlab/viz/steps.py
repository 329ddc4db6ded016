"""The step panel: one head of attention computed and drawn step by step, from x to Z.

:func:`step_panel` draws given ``x``, ``Q``, ``K``, ``V`` (Vaswani et al. 2017, §3.2.1);
:func:`step_panel_from_module` takes them from a :class:`~attnlab.MultiHeadAttention` and an input;
:func:`step_panel_from_model` from an attention layer inside a model, exactly as the model called it.
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

__all__ = ["step_panel", "step_panel_from_model", "step_panel_from_module"]


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
    dims = [f"d{i}" for i in range(d_head)]
    dims_v = [f"d{i}" for i in range(va.shape[1])]
    dims_x = [f"d{i}" for i in range(xa.shape[1])]
    s_title = rf"$S = QK^\top/\sqrt{{{d_head}}}$" + (r" $+$ bias" if bias is not None else "")
    top = [
        (f"1  {x_title}   ({t_q} × {xa.shape[1]})", xa, rows, dims_x, None),
        (rf"2  $Q = x\,W^Q$   ({t_q} × {d_head})", qa, rows, dims, None),
        (rf"3  $K = {src}\,W^K$   ({t_k} × {d_head})", ka, cols, dims, None),
        (rf"4  $V = {src}\,W^V$   ({t_k} × {va.shape[1]})", va, cols, dims_v, None),
    ]
    bottom = [
        (f"5  {s_title}   ({t_q} × {t_k})", scores, rows, cols, m),
        (r"6  $A = \mathrm{softmax}(S)$, rows sum to 1", weights, rows, cols, m),
        (rf"7  $Z = A\,V$   ({t_q} × {va.shape[1]})", output, rows, dims_v, None),
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
    return Plot(fig, data)


def _check_head_and_batch(module: MultiHeadAttention, head: int, batch_index: int, b: int) -> None:
    num_heads = module.num_heads
    if isinstance(head, bool) or not isinstance(head, int):
        raise ArgumentTypeError(f"head must be an int, got {type(head).__name__}")
    if not 0 <= head < num_heads:
        raise ArgumentError(f"head must be in [0, {num_heads}), got {head}")
    if not 0 <= batch_index < b:
        raise ArgumentError(f"batch_index must be in [0, {b}), got {batch_index}")


def _panel_from_call(
    module: MultiHeadAttention,
    query: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    *,
    mask: torch.Tensor | None,
    is_causal: bool,
    positions: torch.Tensor | None,
    head: int,
    batch_index: int,
    tokens: Sequence[str] | None,
    key_tokens: Sequence[str] | None,
    title: str | None,
    x_title: str,
) -> Plot:
    """Recompute one call of ``module`` (as its ``forward`` does) and draw one head of it."""
    from attnlab.nn.masks import causal_mask

    _check_head_and_batch(module, head, batch_index, query.shape[0])
    cross = key is not None and key is not query
    with torch.no_grad():
        q, k_m, v_m = module.project_qkv(query, key if cross else None, value if cross else None)
        if k_m is None or v_m is None:
            raise ArgumentError(
                "module.project_qkv returned no keys/values; cannot draw the step panel"
            )
        dh = module.d_head
        q = q.unflatten(-1, (module.num_heads, dh)).transpose(1, 2)  # (B, H, T_q, d_head)
        k = k_m.unflatten(-1, (module.num_kv_heads, dh)).transpose(1, 2)  # (B, H_kv, T_k, d_head)
        v = v_m.unflatten(-1, (module.num_kv_heads, dh)).transpose(1, 2)  # (B, H_kv, T_k, d_head)
        if module.rotary is not None and not cross:
            pos = positions if positions is not None else torch.arange(q.shape[2], device=q.device)
            q, k = module.rotary(q, pos), module.rotary(k, pos)
    kv_head = head // (module.num_heads // module.num_kv_heads)
    b, t_q, t_k = q.shape[0], q.shape[2], k.shape[2]
    head_mask: torch.Tensor | None = None
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise ArgumentTypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
        try:
            full = torch.broadcast_to(mask, (b, module.num_heads, t_q, t_k))
        except RuntimeError:
            raise ArgumentError(
                f"mask has shape {shape_str(mask.shape)} but must broadcast to (B, H, T_q, T_k) = "
                f"{shape_str((b, module.num_heads, t_q, t_k))}"
            ) from None
        head_mask = full[batch_index, head].detach().cpu()
    if is_causal:
        look_ahead = causal_mask(t_q, t_k)
        if head_mask is None:
            head_mask = look_ahead
        elif head_mask.dtype == torch.bool:
            head_mask = head_mask & look_ahead
        else:  # an additive bias: hide the future with the dtype's minimum
            head_mask = head_mask.masked_fill(~look_ahead, torch.finfo(head_mask.dtype).min)
    return step_panel(
        query[batch_index],
        q[batch_index, head],
        k[batch_index, kv_head],
        v[batch_index, kv_head],
        mask=head_mask,
        tokens=tokens,
        key_tokens=key_tokens,
        title=title,
        x_title=x_title,
        cross=cross,
    )


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

    Uses the module's own projections (``project_qkv``, rotary embeddings, grouped heads), so the
    drawn weights equal what the module computes with ``need_weights=True`` for the same call.

    Args:
        module: a ``MultiHeadAttention``.
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
    return _panel_from_call(
        module,
        x,
        memory,
        memory,
        mask=mask,
        is_causal=is_causal,
        positions=positions,
        head=head,
        batch_index=batch_index,
        tokens=tokens,
        key_tokens=key_tokens,
        title=f"head {head}",
        x_title="x (layer input)",
    )


@dataclass
class _Call:
    """What one attention layer was called with (cloned, detached)."""

    name: str
    query: torch.Tensor
    key: torch.Tensor | None
    value: torch.Tensor | None
    mask: torch.Tensor | None
    is_causal: bool
    positions: torch.Tensor | None
    sources: dict[str, str] = field(default_factory=dict)  # "query"/"key" -> producing module


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

    ``run()`` runs the model's forward once (e.g. ``lambda: model(src, tgt_in)``). A forward
    pre-hook on the layer records the exact input ``x`` it received (the query; the key/value
    memory of a cross-attention), the ``mask`` and ``is_causal`` it was called with and its rotary
    ``positions``; the panel is then computed from the layer's own projections, so the drawn
    weights equal what :func:`attnlab.inspect.capture` records for that layer and head. Boolean
    and additive (ALiBi) masks both work; an additive mask is drawn as part of the scores. The
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
    from attnlab.inspect.capture import attention_modules
    from attnlab.nn.hooks import HookPoint

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

    calls: list[_Call] = []
    produced: dict[int, tuple[str, weakref.ref[torch.Tensor]]] = {}
    handles: list[torch.utils.hooks.RemovableHandle] = []

    def producer(t: object) -> str | None:
        if not isinstance(t, torch.Tensor):
            return None
        hit = produced.get(id(t))
        return hit[0] if hit is not None and hit[1]() is t else None

    def make_pre(name: str) -> Callable[..., None]:
        def pre(mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if calls:
                return  # the first call of the first watched layer is the one drawn
            bound = dict(zip(("query", "key", "value"), args))
            bound.update({k: v for k, v in kwargs.items() if k in ("query", "key", "value")})
            query, key, value = bound.get("query"), bound.get("key"), bound.get("value")
            cache = kwargs.get("cache")
            if cache is not None and (
                getattr(cache, "static", False) or getattr(cache, "length", 0)
            ):
                raise ArgumentError(
                    f"{name} was first called with a KV cache already holding {cache.length} "
                    "positions; run the model once over the whole sequence without a cache"
                )
            if key is query:
                key = value = None

            def keep(t: object) -> Any:
                return t.detach().clone() if isinstance(t, torch.Tensor) else t

            calls.append(
                _Call(
                    name,
                    keep(query),
                    keep(key),
                    keep(value),
                    keep(kwargs.get("mask")),
                    bool(kwargs.get("is_causal", False)),
                    keep(kwargs.get("positions")),
                    {
                        side: src
                        for side, t in (("query", query), ("key", key))
                        if (src := producer(t)) is not None
                    },
                )
            )

        return pre

    def post(name: str) -> Callable[..., None]:
        def hook(mod: torch.nn.Module, args: Any, out: Any) -> None:
            if isinstance(out, torch.Tensor):
                old = produced.get(id(out))
                if old is None or old[1]() is not out:  # the first module to return it names it
                    produced[id(out)] = (name, weakref.ref(out))

        return hook

    try:
        for name, sub in model.named_modules():
            if name and not isinstance(sub, HookPoint):
                handles.append(sub.register_forward_hook(post(name)))
        for name, mod in watched.items():
            handles.append(mod.register_forward_pre_hook(make_pre(name), with_kwargs=True))
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    if not calls:
        raise ArgumentError(
            f"run() did not call layer {layer!r}" if layer else "run() called no attention layer"
        )
    call = calls[0]
    module = modules[call.name]
    q_src = call.sources.get("query")
    k_src = call.sources.get("key")
    origin = f"x = output of {q_src}" if q_src else "x = the layer's input"
    if call.key is not None:
        origin += f"; keys/values from {k_src}" if k_src else "; keys/values from the memory"
    return _panel_from_call(
        module,
        call.query,
        call.key,
        call.value if call.value is not None else call.key,
        mask=call.mask,
        is_causal=call.is_causal,
        positions=call.positions,
        head=head,
        batch_index=batch_index,
        tokens=query_tokens,
        key_tokens=key_tokens,
        title=f"{call.name} · head {head}   ({origin})",
        x_title="x (layer input)",
    )
