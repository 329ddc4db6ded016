"""Path patching: the effect of one head on the metric *through* another head's queries, keys
or values only (Wang et al. 2022, "Interpretability in the Wild", §3.1; Goldowsky-Dill et al.
2023, "Localizing Model Behavior with Path Patching").

Activation patching (:func:`~attnlab.inspect.patching.patch_heads`) measures a head's total
effect: everything downstream of it sees the patch. Path patching keeps one path. In the
direction of :func:`~attnlab.inspect.patching.patch_heads` (clean into corrupted), for a sender
head ``s`` and receiver heads ``R``, input ``x ∈ {q, k, v}``:

1. run the corrupted prompt with the sender's output ``z_s`` ← the clean run's and every other
   head's output frozen to its value in the corrupted run (MLPs and norms recompute); record
   each receiver's ``x`` (its queries, keys or values, what the layer projected from the
   residual stream that now carries the sender's change through the MLPs only);
2. run the corrupted prompt with only each receiver's ``x`` ← the value recorded in 1, and
   measure the metric. Everything downstream of the receivers recomputes.

    m_path(s → R.x) = m( corrupted | x_r ← x_r(step 1) for r ∈ R )

reported like patching, normalised ``(m_path − m_corrupted) / (m_clean − m_corrupted)``. A
sender in the receivers' layer or later cannot reach them: its path effect is 0.

Under grouped-query attention a receiver's keys and values are its key-value head's, shared by
its group: patching ``k`` or ``v`` of a receiver patches what every head of its group reads.
Queries are per head.

The runs are batched like :mod:`attnlab.inspect.patching`'s scans (every forward of one shape,
sender ``i`` in row ``i``, each row paired with the corrupted run's same row), so a sender that
changes nothing scores ``m_corrupted`` exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.patching import (
    Metric,
    PatchResult,
    _batch,
    _evaluating,
    _logits,
    _number,
    _prompts,
    _record,
    _replaced,
    _values,
)

__all__ = ["PathPatch", "path_patch", "path_patch_heads"]

Head = tuple[int, int]
Via = Literal["q", "k", "v"]
VIAS: tuple[Via, ...] = ("q", "k", "v")


@dataclass(frozen=True)
class PathPatch:
    """One sender's effect through the receivers' queries, keys or values.

    Attributes:
        sender: ``(layer, head)``.
        receivers: the ``(layer, head)`` receivers.
        via: ``"q"``, ``"k"`` or ``"v"``.
        patched: the metric with the path patched, ``m_path``.
        clean: ``m_clean``.
        corrupted: ``m_corrupted``.
    """

    sender: Head
    receivers: tuple[Head, ...]
    via: Via
    patched: float
    clean: float
    corrupted: float

    @property
    def normalized(self) -> float:
        """``(m_path − m_corrupted) / (m_clean − m_corrupted)`` (inf or NaN when the baselines
        are equal)."""
        # score = (m_path − m_corrupted) / (m_clean − m_corrupted)
        diff = self.clean - self.corrupted
        num = self.patched - self.corrupted
        return num / diff if diff else (math.nan if num == 0 else math.copysign(math.inf, num))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values (NaN and inf as ``None``).

        Returns:
            ``sender``, ``receivers``, ``via``, ``patched``, ``normalized``, ``clean``,
            ``corrupted``.
        """
        return {
            "sender": list(self.sender),
            "receivers": [list(r) for r in self.receivers],
            "via": self.via,
            "patched": self.patched,
            "normalized": _number(self.normalized),
            "clean": self.clean,
            "corrupted": self.corrupted,
        }


def _head(name: str, head: object, model: nn.Module) -> Head:
    blocks: Any = model.transformer.h  # type: ignore[union-attr]
    if (
        not isinstance(head, Sequence)
        or isinstance(head, (str, bytes))
        or len(head) != 2
        or any(isinstance(x, bool) or not isinstance(x, int) for x in head)
    ):
        raise ArgumentTypeError(f"{name} must be a (layer, head) pair of ints, got {head!r}")
    layer, h = head
    if not -len(blocks) <= layer < len(blocks):
        raise ArgumentError(f"{name}: layer {layer} is not one of the model's {len(blocks)} layers")
    layer %= len(blocks)
    heads = blocks[layer].attn.num_heads
    if not -heads <= h < heads:
        raise ArgumentError(f"{name}: head {h} is not one of layer {layer}'s {heads} heads")
    return layer, h % heads


def _receivers(receivers: object, model: nn.Module) -> tuple[Head, ...]:
    if isinstance(receivers, (str, bytes)) or not isinstance(receivers, Sequence):
        raise ArgumentTypeError(
            f"receivers must be a sequence of (layer, head) pairs, got {type(receivers).__name__}"
        )
    if receivers and isinstance(receivers[0], int):  # one (layer, head) pair
        receivers = [receivers]
    out = tuple(dict.fromkeys(_head("receivers", r, model) for r in receivers))
    if not out:
        raise ArgumentError("receivers must name at least one (layer, head)")
    return out


def _via(via: object) -> Via:
    if via not in VIAS:
        raise ArgumentError(f"via must be one of {', '.join(VIAS)}, got {via!r}")
    return via  # type: ignore[return-value]


def _path_scan(
    model: nn.Module,
    clean: torch.Tensor,
    corrupted: torch.Tensor,
    metric: Metric,
    senders: Sequence[Head],
    receivers: tuple[Head, ...],
    via: Via,
    rows: int,
) -> tuple[torch.Tensor, float, float]:
    """``m_path`` of each sender, ``rows`` senders a forward (sender ``i`` in row ``i mod rows``,
    paired with the corrupted run's row), and ``m_clean``, ``m_corrupted``."""
    blocks: Any = model.transformer.h  # type: ignore[union-attr]
    z_names = [f"transformer.h.{i}.attn.hook_z" for i in range(len(blocks))]
    x_names = {layer: f"transformer.h.{layer}.attn.hook_{via}" for layer, _ in receivers}
    every = list(x_names.values())

    def whole(x: torch.Tensor) -> torch.Tensor:
        return x

    clean_logits, z_clean = _record(model, clean, z_names, rows, whole)
    m_clean = float(_values(metric, clean_logits)[0])
    base_logits, z_corrupted = _record(model, corrupted, z_names, rows, whole)
    base = _values(metric, base_logits)
    out = torch.empty(len(senders), dtype=torch.float64)
    by_layer: dict[int, list[int]] = {}
    for layer, h in receivers:
        attn = blocks[layer].attn
        group = attn.num_heads // attn.num_kv_heads
        # the receiver's own slice: its query head, or the key-value head its group shares
        by_layer.setdefault(layer, []).append(h if via == "q" else h // group)
    for start in range(0, len(senders), rows):
        chunk = senders[start : start + rows]

        def frozen(
            layer: int, chunk: Sequence[Head] = chunk
        ) -> Callable[[torch.Tensor], torch.Tensor]:
            def fn(z: torch.Tensor) -> torch.Tensor:
                # z ← z_corrupted, except z[i, h_i] ← z_clean[i, h_i] for sender i in this layer
                z = z_corrupted[z_names[layer]].clone().to(z.dtype)
                for i, (sl, sh) in enumerate(chunk):
                    if sl == layer:
                        z[i, sh] = z_clean[z_names[layer]][i, sh].to(z.dtype)
                return z

            return fn

        # 1. the sender's change reaches the receivers' inputs through the MLPs only
        patches = {name: frozen(layer) for layer, name in enumerate(z_names)}
        with _replaced(model, patches):
            _, seen = _record(model, corrupted, every, rows, whole)

        # 2. only the receivers' inputs see it
        def receive(
            layer: int, seen: dict[str, torch.Tensor] = seen
        ) -> Callable[[torch.Tensor], torch.Tensor]:
            def fn(x: torch.Tensor) -> torch.Tensor:
                x = x.clone()
                # x[:, r] ← x_step1[:, r] for each receiver r of this layer   (B, H(_kv), T, d)
                for r in by_layer[layer]:
                    x[:, r] = seen[x_names[layer]][:, r].to(x.dtype)
                return x

            return fn

        receiving = {x_names[layer]: receive(layer) for layer in by_layer}
        with _replaced(model, receiving), torch.no_grad():
            values = _values(metric, _logits(model, corrupted.expand(rows, -1)))
        # m_path = m_corrupted + (m_j(path) − m_j(corrupted))
        n = len(chunk)
        out[start : start + n] = base[0] + (values[:n] - base[:n])
    return out, m_clean, float(base[0])


def path_patch(
    model: nn.Module,
    clean_ids: torch.Tensor,
    corrupted_ids: torch.Tensor,
    sender: Head,
    receivers: Sequence[Head] | Head,
    metric: Metric,
    *,
    via: Via = "v",
) -> PathPatch:
    """The effect of the sender head's clean output on the metric through the receivers' queries,
    keys or values only (the two steps of the module docstring: two forwards).

        m_path(s → R.x) = m( corrupted | x_r ← x_r(corrupted, z_s ← z_s^clean,
                                                     every other head frozen) for r ∈ R )

    Args:
        model: an :class:`attnlab.GPT` (any family); run in eval mode (restored after).
        clean_ids: the clean prompt's ids (where the sender's output comes from).
        corrupted_ids: the corrupted prompt's ids (the run patched into), as many.
        sender: ``(layer, head)``.
        receivers: one ``(layer, head)`` or several; all are patched together.
        metric: logits ``(B, T, vocab)`` → ``(B,)``.
        via: ``"q"``, ``"k"`` or ``"v"`` (default): which input of the receivers sees the change.

    Returns:
        :class:`PathPatch`.

    Raises:
        ValueError: a layer or head out of range, ``via`` not one of ``q k v``, prompts of
            different lengths, a metric that does not return ``(B,)``.
        TypeError: a sender or receiver that is not a ``(layer, head)`` pair of ints.

    Shape:
        clean_ids, corrupted_ids ``(T,)`` or ``(1, T)``.

    Examples:
        >>> path_patch(model, clean, corrupted, (3, 0), [(9, 6), (9, 9)], metric, via="q")
    """
    clean, corrupted = _prompts(model, clean_ids, corrupted_ids)
    s = _head("sender", sender, model)
    rs = _receivers(receivers, model)
    x = _via(via)
    with _evaluating(model):
        patched, m_clean, m_corrupted = _path_scan(model, clean, corrupted, metric, [s], rs, x, 1)
    return PathPatch(s, rs, x, float(patched[0]), m_clean, m_corrupted)


def path_patch_heads(
    model: nn.Module,
    clean_ids: torch.Tensor,
    corrupted_ids: torch.Tensor,
    receivers: Sequence[Head] | Head,
    metric: Metric,
    *,
    via: Via = "v",
    batch_size: int | None = None,
) -> PatchResult:
    """:func:`path_patch` from every head before the last receiver's layer: which heads feed the
    receivers' queries, keys or values (Wang et al. 2022's Figures 3 and 5).

    Args:
        model: an :class:`attnlab.GPT`; run in eval mode (restored after).
        clean_ids: the clean prompt's ids.
        corrupted_ids: the corrupted prompt's ids, as many.
        receivers: one ``(layer, head)`` or several.
        metric: logits ``(B, T, vocab)`` → ``(B,)``.
        via: ``"q"``, ``"k"`` or ``"v"`` (default).
        batch_size: senders a forward (default: a layer's heads); two forwards a batch.

    Returns:
        :class:`~attnlab.inspect.patching.PatchResult` of kind ``"heads"``, rows the layers
        before the last receiver's (a sender at or after every receiver's layer scores
        ``m_corrupted``).

    Raises:
        ValueError: as :func:`path_patch`; a receiver in layer 0 (no head comes before it).

    Shape:
        result ``(max receiver layer, H)``.

    Examples:
        >>> result = path_patch_heads(model, clean, corrupted, [(9, 6)], metric, via="q")
        >>> patching_figure(result).save("senders.png")
    """
    clean, corrupted = _prompts(model, clean_ids, corrupted_ids)
    rs = _receivers(receivers, model)
    x = _via(via)
    last = max(layer for layer, _ in rs)
    if last == 0:
        raise ArgumentError("receivers are all in layer 0: no head comes before them")
    blocks: Any = model.transformer.h  # type: ignore[union-attr]
    senders = [(layer, h) for layer in range(last) for h in range(blocks[layer].attn.num_heads)]
    width = max(blocks[layer].attn.num_heads for layer in range(last))
    rows = _batch(batch_size, width)
    with _evaluating(model):
        values, m_clean, m_corrupted = _path_scan(
            model, clean, corrupted, metric, senders, rs, x, rows
        )
    patched = torch.full((last, width), math.nan, dtype=torch.float64)
    for (layer, h), value in zip(senders, values, strict=True):
        patched[layer, h] = value
    return PatchResult(
        "heads", patched, m_clean, m_corrupted, tuple(str(layer) for layer in range(last))
    )
