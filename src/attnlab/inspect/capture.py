"""Capture attention weights (and other hook-point activations) while a model runs.

Every attention layer of attnlab is a :class:`~attnlab.nn.multihead.MultiHeadAttention` with a
``hook_weights`` :class:`~attnlab.nn.hooks.HookPoint`. The layer asks its backend for the exact
softmax weights only while something listens there, so capturing registers forward hooks on those
points, runs the model, and removes the hooks again — also when the forward raises. The forward
result is the same with and without capture (the layer keeps the kernel it would use anyway).

    with attnlab.inspect.capture(model) as cache:
        out = model(input_ids)
    cache.attentions["transformer.h.0.attn"]        # (B, H, T_q, T_k)

Weights are named by the path of their attention module in ``model.named_modules()``, e.g.
``"transformer.h.3.attn"`` (GPT), ``"encoder.layers.0.self_attn"``,
``"decoder.layers.1.cross_attn"`` (encoder-decoder).

Capture reads each layer's resolved call (its ``hook_call``,
:class:`~attnlab.nn.resolved_call.ResolvedCall`): the kind of attention (self or cross),
Linformer's projections and the statistics come from what the layer ran, never from its forward
arguments. For long sequences, ``capture(model, weights=False, stats=True)`` records per-row
entropy, max weight and log-sum-exp instead (``cache.stats``), computed blockwise from each
call's queries, keys and normalised mask by :func:`attnlab.inspect.stats.call_stats` — no
``T × T`` matrix is ever formed.

**Projected keys (Linformer).** A :class:`~attnlab.nn.linformer.LinformerAttention` layer
(Wang et al. 2020, eq. 7) attends over ``k`` rows of ``E K`` — each a learned mix of *every* key
position — so its weights are ``(B, H, T_q, k)`` and their columns are not tokens. The capture
keeps them as they are and says so: ``cache.projected[path]`` is a :class:`ProjectedKeys` (the
method, ``k``, the labels ``"E·K row j"``, and the layer's ``E`` and ``F`` cut to the ``T_k`` keys
of the call, with the key mask), and :meth:`ActivationCache.effective_weights` gives what the
layer took from each *token*: ``A · F`` (``T_q × T_k``, may be negative), because the layer's
output is exactly ``(A F) V``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnlab._checks import shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.stats import AttentionStats, call_stats
from attnlab.nn.hooks import hook_points
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.resolved_call import ResolvedCall

__all__ = [
    "ActivationCache",
    "ProjectedKeys",
    "attention_modules",
    "capture",
    "capture_attention",
    "run_with_cache",
]


@dataclass(frozen=True)
class ProjectedKeys:
    """The key axis of a layer whose keys are projected along the sequence (Linformer).

    :class:`~attnlab.nn.linformer.LinformerAttention` computes (Wang et al. 2020, §4, eq. 7)

        A = softmax(Q (E K)ᵀ / √d_head)   (T_q × k),      output = A · (F V)

    so column ``j`` of its weights ``A`` is row ``j`` of ``E K`` — a learned mix of *all* key
    positions (weights ``E[j, :]``, of either sign) — not a token. Keys and values at masked
    positions are zeroed before the projection (padding contributes nothing).

    **What the layer took from each token.** Since ``output_i = Σ_j A_ij (F V)_j =
    Σ_t (A F)_it V_t``, the matrix ``A · F`` (``T_q × T_k``) plays exactly the role ``A`` plays in
    softmax attention (``output = A V``): :meth:`effective_weights`. It is not a distribution:
    entries may be negative (``F`` has entries of both signs) and rows need not sum to 1.
    ``A · E`` is *not* offered: ``E`` acts inside the softmax (on the scores), so ``A E`` has no
    such identity; only with key-value sharing (``E = F``) are the two the same.

    Attributes:
        method: the projection's name, ``"linformer"``.
        k: the projected length (columns of the weights).
        key_length: ``T_k``, the key positions mixed into each projected row in this call.
        key_projection: ``E`` cut to its first ``T_k`` columns, one per query head (grouped-query
            or shared projections repeated).
        value_projection: ``F`` likewise (``E`` itself with key-value sharing).
        key_mask: the keys the call could see (``True``; hidden keys were zeroed before the
            projection), or ``None`` when no mask was given.

    Shape:
        - key_projection, value_projection ``(H, k, T_k)``
        - key_mask ``(B or 1, H or 1, T_k)``
    """

    method: str
    k: int
    key_length: int
    key_projection: torch.Tensor
    value_projection: torch.Tensor
    key_mask: torch.Tensor | None = None

    @classmethod
    def of(
        cls, call: ResolvedCall, keep: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> ProjectedKeys:
        """The projected key axis of one Linformer call, from its resolved call: ``E``, ``F``
        per query head cut to the call's ``T_k`` keys, and the key mask the projection applied.

        Args:
            call: a resolved call with ``method == "linformer"``.
            keep: applied to each stored tensor (capture's detach and move); default none.

        Returns:
            The :class:`ProjectedKeys`.

        Raises:
            ValueError: the call carries no projections (not a Linformer call).

        Shape:
            ``E``, ``F`` ``(H, k, T_k)``; the key mask ``(B or 1, H or 1, T_k)``.
        """
        e, f = call.key_projection, call.value_projection
        if e is None or f is None:
            raise ArgumentError(f"a {call.method} call carries no sequence projections")
        keep = keep or (lambda t: t)
        return cls(
            method="linformer",
            k=e.shape[-2],
            key_length=e.shape[-1],
            key_projection=keep(e),
            value_projection=keep(f),
            key_mask=None if call.key_mask is None else keep(call.key_mask),
        )

    @property
    def labels(self) -> list[str]:
        """One label per projected row, ``"E·K row 0"`` … ``"E·K row {k-1}"``: the columns of
        the weights (each a mix of every key position, never a token)."""
        return [f"E·K row {j}" for j in range(self.k)]

    def effective_weights(self, weights: torch.Tensor) -> torch.Tensor:
        """``A · F``: the weight each query gives each key *token* through the value projection.

        The layer's output before ``W^O`` is ``A (F V) = (A F) V`` exactly, so this is what the
        head read from each position (masked positions: 0). Computed in float64 and returned in
        the dtype of ``weights``.

        Args:
            weights: the layer's captured weights ``A`` over the ``k`` projected rows.

        Returns:
            ``A · F``, possibly negative; rows need not sum to 1.

        Raises:
            ValueError: ``weights`` does not have ``k`` columns or the layer's heads.

        Shape:
            weights ``(B, H, T_q, k)`` (or ``(H, T_q, k)``) → ``(B, H, T_q, T_k)``
            (or ``(H, T_q, T_k)``).
        """
        heads = self.value_projection.shape[0]
        if weights.dim() not in (3, 4) or weights.shape[-1] != self.k or weights.shape[-3] != heads:
            raise ArgumentError(
                f"weights must be (B, H, T_q, k) or (H, T_q, k) with H = {heads}, k = {self.k}, "
                f"got {shape_str(weights.shape)}"
            )
        f = self.value_projection.to(device=weights.device, dtype=torch.float64)  # (H, k, T_k)
        if self.key_mask is not None:
            m = self.key_mask.to(weights.device)  # (B or 1, H or 1, T_k)
            if weights.dim() == 3 and m.shape[0] != 1:
                raise ArgumentError(
                    f"weights of one sequence (H, T_q, k) but the call had a mask of {m.shape[0]} "
                    f"sequences; pass the (B, H, T_q, k) weights"
                )
            f = f * m[:, :, None, :]  # hidden keys and values were zeroed: (B or 1, H, k, T_k)
            if weights.dim() == 3:
                f = f[0]
        out = weights.detach().to(torch.float64) @ f  # Σ_j A_ij F_jt   (…, H, T_q, T_k)
        return out.to(weights.dtype)


@dataclass
class ActivationCache:
    """What one capture recorded.

    Attributes:
        attentions: module path → attention weights ``(B, H, T_q, T_k)`` of the latest call, in
            the order the layers first ran.
        kinds: module path → ``"self"`` or ``"cross"`` attention.
        history: module path → the weights of every call (one per decoding step with a KV cache).
        activations: hook-point path → the latest output of other hook points asked for with
            ``hooks=`` (e.g. ``"transformer.h.0.attn.hook_q"``).
        stats: module path → :class:`~attnlab.inspect.stats.AttentionStats` of the latest call
            (entropy, max weight, log-sum-exp per row), filled with ``stats=True``.
        projected: module path → :class:`ProjectedKeys` for the layers whose key axis is
            projected (Linformer): their weights are ``(B, H, T_q, k)`` over the rows of
            ``E K``, not over key tokens. Other layers are absent.

    Shape:
        each weights tensor ``(B, H, T_q, T_k)`` — ``(B, H, T_q, k)`` for a layer in
        ``projected``; an activation has its hook point's shape, e.g. ``(B, H, T_q, d_head)`` for
        ``hook_q``.
    """

    attentions: dict[str, torch.Tensor] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    history: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    activations: dict[str, torch.Tensor] = field(default_factory=dict)
    stats: dict[str, AttentionStats] = field(default_factory=dict)
    projected: dict[str, ProjectedKeys] = field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        """``cache[path]``: the attention weights of one layer, else a captured activation."""
        if name in self.attentions:
            return self.attentions[name]
        if name in self.activations:
            return self.activations[name]
        known = ", ".join(list(self.attentions)[:6]) or "nothing was captured"
        raise KeyError(f"no attention layer or hook point named {name!r}; captured: {known}")

    def __len__(self) -> int:
        return len(self.attentions)

    def names(self, kind: str | None = None) -> list[str]:
        """The captured layers.

        Args:
            kind: ``"self"``, ``"cross"`` or ``None`` (default) for all.

        Returns:
            Module paths, in the order the layers first ran.

        Raises:
            ValueError: ``kind`` is another value.
        """
        if kind not in (None, "self", "cross"):
            raise ArgumentError(f"kind must be 'self', 'cross' or None, got {kind!r}")
        return [n for n in self.attentions if kind is None or self.kinds.get(n) == kind]

    def layers_heads(self, kind: str | None = None) -> list[tuple[str, int]]:
        """Every head of the captured layers.

        Args:
            kind: ``"self"``, ``"cross"`` or ``None`` (default) for all.

        Returns:
            ``(layer path, head index)`` pairs, layers in execution order.
        """
        return [(n, h) for n in self.names(kind) for h in range(self.attentions[n].shape[1])]

    def stack(self, kind: str | None = None) -> torch.Tensor:
        """The weights of all layers of one kind, stacked.

        Args:
            kind: ``"self"``, ``"cross"`` or ``None`` (default) for all.

        Returns:
            One tensor with the layers in execution order along the first dimension.

        Raises:
            ValueError: the layers' weights have different shapes (e.g. self- and cross-attention
                mixed with ``kind=None`` and different source/target lengths), or none was
                captured.

        Shape:
            ``(L, B, H, T_q, T_k)``, ``L`` the number of layers of that kind.
        """
        names = self.names(kind)
        if not names:
            raise ArgumentError(f"no attention weights of kind {kind!r} were captured")
        shapes = {tuple(self.attentions[n].shape) for n in names}
        if len(shapes) > 1:
            raise ArgumentError(
                f"cannot stack weights of different shapes {sorted(shapes)}; pass kind='self' or 'cross'"
            )
        return torch.stack([self.attentions[n] for n in names])

    def head(self, name: str, head: int, batch: int = 0) -> torch.Tensor:
        """One head's weights for one batch row.

        Args:
            name: the layer's module path (or a captured hook point's name).
            head: the head index, in ``[0, H)``.
            batch: the batch row, in ``[0, B)``; default 0.

        Returns:
            The weights (a view of the captured tensor).

        Raises:
            KeyError: nothing was captured under ``name``.
            ValueError: ``head`` or ``batch`` is out of range.

        Shape:
            ``(T_q, T_k)``.
        """
        w = self[name]
        if not 0 <= head < w.shape[1]:
            raise ArgumentError(f"head must lie in [0, {w.shape[1]}) for {name!r}, got {head}")
        if not 0 <= batch < w.shape[0]:
            raise ArgumentError(f"batch must lie in [0, {w.shape[0]}), got {batch}")
        return w[batch, head]

    def key_labels(self, name: str) -> list[str] | None:
        """The labels of a layer's key axis when it is not the key tokens.

        Args:
            name: the layer's module path.

        Returns:
            ``["E·K row 0", …]`` for a layer with projected keys (:attr:`projected`), ``None``
            for a layer whose columns are the key tokens.
        """
        info = self.projected.get(name)
        return None if info is None else info.labels

    def effective_weights(self, name: str) -> torch.Tensor:
        """What a projected-key layer took from each key token: ``A · F``
        (:meth:`ProjectedKeys.effective_weights`).

        Args:
            name: the module path of a layer in :attr:`projected`.

        Returns:
            The effective weights of the latest call, possibly negative, in the weights' dtype.

        Raises:
            KeyError: nothing was captured under ``name``.
            ValueError: the layer's keys are not projected (its weights already are per token).

        Shape:
            ``(B, H, T_q, T_k)``.
        """
        w = self[name]
        info = self.projected.get(name)
        if info is None:
            raise ArgumentError(
                f"layer {name!r} attends to its key tokens directly; effective weights exist only "
                f"for layers with projected keys: {list(self.projected) or 'none captured'}"
            )
        return info.effective_weights(w)


def attention_modules(model: nn.Module) -> dict[str, MultiHeadAttention]:
    """The attention layers of a model.

    Args:
        model: any module.

    Returns:
        Module path → :class:`~attnlab.nn.multihead.MultiHeadAttention`, in ``named_modules()``
        order (path ``""`` when ``model`` is itself an attention layer).

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return {n: m for n, m in model.named_modules() if isinstance(m, MultiHeadAttention)}


@contextmanager
def capture(
    model: nn.Module,
    *,
    names: Sequence[str] | Callable[[str], bool] | None = None,
    hooks: Sequence[str] = (),
    weights: bool = True,
    stats: bool = False,
    detach: bool = True,
    device: torch.device | str | None = None,
) -> Iterator[ActivationCache]:
    """Record attention weights while ``model`` runs inside the ``with`` block.

    Args:
        model: any module containing :class:`~attnlab.nn.multihead.MultiHeadAttention` layers
            (``attnlab.GPT``, ``attnlab.Transformer``, a GPT-2 loaded with ``GPT.from_hf``, or a
            single attention layer).
        names: which layers to record: module paths (exact, or a prefix such as ``"decoder."``),
            or a predicate on the path. Default all.
        hooks: other hook points of the selected layers to record too, by their name within the
            layer (``"hook_q"``, ``"hook_k"``, ``"hook_v"``, ``"hook_z"``, and ``"hook_rot_q"``,
            ``"hook_rot_k"`` for rotary layers); stored under the full name
            (:func:`attnlab.nn.hooks.hook_points`).
        weights: record the ``(B, H, T_q, T_k)`` weights (default). ``False`` leaves the layers
            on their fast path, which never forms them.
        stats: record per-row entropy, max weight and log-sum-exp in ``cache.stats``, computed
            blockwise from the queries, keys and normalised mask of the call the layer resolved
            (:func:`~attnlab.inspect.stats.call_stats`) — with ``weights=False`` nothing of
            size ``T × T`` is formed, so long sequences can be checked. The statistics are
            those of the weights the layer computes (a Linformer layer's over its projected
            rows, a Performer layer's ``D⁻¹ φ(q) φ(k)ᵀ``).
        detach: store detached tensors (default); ``False`` keeps them in the autograd graph.
        device: move the stored tensors there (e.g. ``"cpu"``); default leave them in place.

    Yields:
        An :class:`ActivationCache`, filled while the block runs.

    Raises:
        ValueError: ``model`` has no attention layer, or ``names`` selects none.

    Examples:
        >>> model = attnlab.GPT(attnlab.GPTConfig(n_layer=2, n_embd=64, n_head=4, vocab_size=100))
        >>> with capture(model) as cache:
        ...     out = model(torch.randint(0, 100, (1, 8)))
        >>> cache.attentions["transformer.h.1.attn"].shape
        torch.Size([1, 4, 8, 8])
    """
    modules = attention_modules(model)
    if not modules:
        raise ArgumentError(
            f"model ({type(model).__name__}) has no MultiHeadAttention layer to capture"
        )
    selected = {n: m for n, m in modules.items() if _selected(n, names)}
    if not selected:
        raise ArgumentError(
            f"names selects no attention layer; the model has {', '.join(list(modules)[:8])}"
        )
    if not (weights or stats or hooks):
        raise ArgumentError("nothing to capture: weights=False, stats=False and no hooks")
    points = hook_points(model)
    for hook_name in hooks:
        if not any(_path(name, hook_name) in points for name in selected):
            raise ArgumentError(
                f"hooks must name hook points of the attention layers, got {hook_name!r}"
            )

    cache = ActivationCache()

    def keep(t: torch.Tensor) -> torch.Tensor:
        if detach:
            t = t.detach()
        return t if device is None else t.to(device)

    handles: list[torch.utils.hooks.RemovableHandle] = []
    try:
        for name, module in selected.items():

            def on_call(mod: nn.Module, args: Any, call: ResolvedCall, name: str = name) -> None:
                # what the layer ran: its kind, Linformer's projections, the statistics
                cache.kinds[name] = "cross" if call.cross else "self"
                if call.method == "linformer" and call.key_projection is not None:
                    cache.projected[name] = ProjectedKeys.of(call, keep)
                if stats:  # from q, k and the masking as scored: never a T × T weight matrix
                    result = call_stats(call)
                    cache.stats[name] = AttentionStats(*(keep(t) for t in (
                        result.entropy, result.max_weight, result.logsumexp, result.first_weight
                    )))  # fmt: skip

            def on_weights(mod: nn.Module, args: Any, out: torch.Tensor, name: str = name) -> None:
                w = keep(out)
                cache.attentions[name] = w  # a dict keeps the first call's position
                cache.history.setdefault(name, []).append(w)

            handles.append(module.hook_call.register_forward_hook(on_call))
            if weights:
                handles.append(module.hook_weights.register_forward_hook(on_weights))
            for hook_name in hooks:
                path = _path(name, hook_name)

                def on_act(mod: nn.Module, args: Any, out: torch.Tensor, path: str = path) -> None:
                    cache.activations[path] = keep(out)

                if path in points:
                    handles.append(points[path].register_forward_hook(on_act))
        yield cache
    finally:
        for handle in handles:
            handle.remove()


def _path(layer: str, hook_name: str) -> str:
    """The full name of a layer's hook point (``layer`` is ``""`` for the model itself)."""
    return f"{layer}.{hook_name}" if layer else hook_name


def _selected(name: str, names: Sequence[str] | Callable[[str], bool] | None) -> bool:
    if names is None:
        return True
    if callable(names):
        return bool(names(name))
    if isinstance(names, str):
        names = [names]
    return any(
        name == n or (n.endswith(".") and name.startswith(n)) or name.startswith(n + ".")
        for n in names
    )


def run_with_cache(
    model: nn.Module,
    *args: Any,
    names: Sequence[str] | Callable[[str], bool] | None = None,
    hooks: Sequence[str] = (),
    **kwargs: Any,
) -> tuple[Any, ActivationCache]:
    """Run ``model(*args, **kwargs)`` once while capturing; returns ``(output, cache)``.

    Args:
        model: as for :func:`capture`.
        *args: positional arguments of the model's forward.
        names: which layers to record (see :func:`capture`).
        hooks: other hook points to record (see :func:`capture`).
        **kwargs: keyword arguments of the model's forward.

    Returns:
        The model's output, unchanged by the capture, and the :class:`ActivationCache`.

    Examples:
        >>> out, cache = run_with_cache(model, input_ids)
        >>> list(cache.attentions)[:2]
        ['transformer.h.0.attn', 'transformer.h.1.attn']
    """
    with capture(model, names=names, hooks=hooks) as cache:
        out = model(*args, **kwargs)
    return out, cache


class _AttentionDone(Exception):
    """Raised inside a forward once every selected attention layer has run (see
    :func:`capture_attention`); never leaves this module."""


@torch.no_grad()
def capture_attention(
    model: nn.Module, forward: Callable[[], Any], **options: Any
) -> ActivationCache:
    """Run ``forward()`` (a call of ``model``) while capturing, and stop it as soon as every
    selected attention layer has run once.

    What follows the last attention layer (its MLP, the final norm, a language model's
    ``T × vocab_size`` logits — 1.6 GB at ``T = 8192`` with a 49k vocabulary) is never computed,
    so with ``weights=False, stats=True`` the memory of the call is that of the residual stream
    and one layer's queries and keys: ``O(T)``. The forward's output is not returned (it was
    never finished). The way TransformerLens' ``stop_at_layer`` stops a model early.

    Args:
        model: as for :func:`capture`.
        forward: runs ``model`` once, e.g. ``lambda: model(input_ids)``.
        **options: :func:`capture`'s options (``names``, ``weights``, ``stats``, ``hooks``, …).

    Returns:
        The :class:`ActivationCache` of the call.

    Shape:
        as :func:`capture`: weights ``(B, H, T_q, T_k)``, statistics ``(B, H, T_q)``.

    Examples:
        >>> cache = capture_attention(model, lambda: model(ids), weights=False, stats=True)
        >>> cache.stats["transformer.h.0.attn"].entropy.shape
        torch.Size([1, 12, 8192])
    """
    if not callable(forward):
        raise ArgumentTypeError(f"forward must be callable, got {type(forward).__name__}")
    names = options.get("names")
    selected = {n: m for n, m in attention_modules(model).items() if _selected(n, names)}
    pending = set(selected)
    handles = []

    def done(mod: nn.Module, args: Any, out: Any, name: str = "") -> None:
        pending.discard(name)
        if not pending:
            raise _AttentionDone

    with capture(model, **options) as cache:
        try:
            # registered after capture's own hooks, so they run (and record) first
            for name, module in selected.items():
                handles.append(
                    module.register_forward_hook(lambda m, a, o, name=name: done(m, a, o, name))
                )
            forward()
        except _AttentionDone:
            pass
        finally:
            for handle in handles:
                handle.remove()
    return cache
