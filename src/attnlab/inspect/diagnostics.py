"""Health checks of captured attention weights, per layer and head.

For each head, over every query row ``p = (p_1 … p_T_k)`` of every sequence in the batch:

    entropy      H(p) = −Σ_j p_j log p_j            (nats; 0 = all weight on one key)
    max weight   max_j p_j
    row sum      |Σ_j p_j − 1|                      (should be ~0: softmax rows sum to one)
    masked row   p = 0                              (the query may see no key; attnlab's
                                                      convention gives a zero row, never NaN)
    non-finite   NaN / ±inf entries, and the first one in execution order located to
                 (layer, head, batch, query, key)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from attnlab.inspect.capture import ActivationCache, run_with_cache
from attnlab.inspect.stats import AttentionStats

__all__ = [
    "HeadHealth",
    "HealthReport",
    "NonFiniteLocation",
    "attention_entropy",
    "diagnose",
    "diagnose_model",
]


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Entropy of each attention row, ``−Σ_j p_j log p_j`` in nats (``0 · log 0 = 0``).

    Args:
        weights: attention weights, rows along the last dim.

    Returns:
        The entropies, in fp32 (fp64 for fp64 input).

    Shape:
        ``(..., T_q, T_k)`` → ``(..., T_q)``.
    """
    if not isinstance(weights, torch.Tensor):
        raise TypeError(f"weights must be a torch.Tensor, got {type(weights).__name__}")
    w = weights if weights.dtype == torch.float64 else weights.float()
    return -torch.special.xlogy(w, w).sum(dim=-1) + 0.0  # + 0.0: no "-0.0" for one-hot rows


@dataclass(frozen=True)
class NonFiniteLocation:
    """Where the first NaN/inf attention weight sits.

    Attributes:
        layer: module path of the attention layer.
        head: head index.
        batch: sequence index in the batch.
        query: query position (row).
        key: key position (column); ``-1`` when only row statistics were captured.
        value: ``"nan"``, ``"inf"`` or ``"-inf"``.
    """

    layer: str
    head: int
    batch: int
    query: int
    key: int
    value: str

    def __str__(self) -> str:
        where = f"{self.value} in {self.layer} head {self.head} at batch {self.batch}, query {self.query}"
        return where if self.key < 0 else f"{where}, key {self.key}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class HeadHealth:
    """Statistics of one head's weights over all rows of the batch.

    Attributes:
        layer: module path of the attention layer.
        kind: ``"self"`` or ``"cross"``.
        head: head index.
        rows: query rows checked (batch × T_q).
        masked_rows: rows that are all zero (the query may see no key).
        entropy_mean, entropy_min, entropy_max: row entropies in nats, over unmasked finite rows
            (``nan`` when there are none).
        max_weight_mean, max_weight_max: the largest weight of each row, averaged / maximised.
        row_sum_error: ``max |Σ_j p_j − 1|`` over unmasked finite rows (``nan``: not measured,
            for a report built from blockwise statistics).
        nonfinite: NaN/inf entries (rows, for a report from blockwise statistics).
        atol: the row-sum tolerance used for :attr:`ok`.
    """

    layer: str
    kind: str
    head: int
    rows: int
    masked_rows: int
    entropy_mean: float
    entropy_min: float
    entropy_max: float
    max_weight_mean: float
    max_weight_max: float
    row_sum_error: float
    nonfinite: int
    atol: float

    @property
    def ok(self) -> bool:
        """No non-finite weight and every unmasked row sums to one within ``atol``."""
        return self.nonfinite == 0 and not (self.row_sum_error > self.atol)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``nan`` becomes ``None``)."""
        return {k: _json_float(v) for k, v in asdict(self).items()} | {"ok": self.ok}


@dataclass(frozen=True)
class HealthReport:
    """The health of every captured head.

    Attributes:
        heads: one :class:`HeadHealth` per (layer, head), layers in execution order.
        first_nonfinite: the first NaN/inf weight (layers in execution order, then head, batch,
            query, key), or ``None``.
    """

    heads: tuple[HeadHealth, ...]
    first_nonfinite: NonFiniteLocation | None = None

    @property
    def ok(self) -> bool:
        """Every head is :attr:`HeadHealth.ok`."""
        return all(h.ok for h in self.heads)

    def layers(self) -> list[str]:
        """The layer paths, in execution order."""
        return list(dict.fromkeys(h.layer for h in self.heads))

    def for_layer(self, layer: str) -> list[HeadHealth]:
        """The heads of one layer."""
        heads = [h for h in self.heads if h.layer == layer]
        if not heads:
            raise KeyError(f"no layer {layer!r} in the report; layers: {', '.join(self.layers())}")
        return heads

    def problems(self) -> list[str]:
        """One line per unhealthy head (empty when all is well)."""
        out = []
        if self.first_nonfinite is not None:
            out.append(f"first non-finite weight: {self.first_nonfinite}")
        for h in self.heads:
            if h.nonfinite:
                what = "rows" if math.isnan(h.row_sum_error) else "weights"
                out.append(f"{h.layer} head {h.head}: {h.nonfinite} non-finite {what}")
            elif h.row_sum_error > h.atol:
                out.append(
                    f"{h.layer} head {h.head}: rows sum to 1 ± {h.row_sum_error:.2e} "
                    f"(tolerance {h.atol:.0e})"
                )
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``ok``, ``first_nonfinite``, ``problems`` and the ``heads``."""
        return {
            "ok": self.ok,
            "first_nonfinite": None
            if self.first_nonfinite is None
            else self.first_nonfinite.to_dict(),
            "problems": self.problems(),
            "heads": [h.to_dict() for h in self.heads],
        }


def diagnose(
    attentions: ActivationCache | Mapping[str, torch.Tensor],
    *,
    atol: float | None = None,
    kinds: Mapping[str, str] | None = None,
) -> HealthReport:
    """Check captured attention weights head by head.

    Args:
        attentions: an :class:`~attnlab.inspect.capture.ActivationCache`, or a mapping from layer
            name to weights ``(B, H, T_q, T_k)`` in execution order. A cache captured with
            ``weights=False, stats=True`` is checked from its blockwise row statistics
            (no row sums then).
        atol: tolerance of the row-sum check; default ``1e-4`` for fp32/fp64 weights and ``2e-2``
            for fp16/bf16.
        kinds: layer name → ``"self"``/``"cross"`` (taken from the cache when one is given).

    Returns:
        A :class:`HealthReport`.

    Example:
        >>> out, cache = run_with_cache(model, input_ids)
        >>> report = diagnose(cache)
        >>> report.ok, report.heads[0].entropy_mean
    """
    if isinstance(attentions, ActivationCache):
        kinds = attentions.kinds if kinds is None else kinds
        if not attentions.attentions and attentions.stats:
            return _from_stats(attentions.stats, kinds)
        attentions = attentions.attentions
    if not isinstance(attentions, Mapping):
        raise TypeError(
            f"attentions must be an ActivationCache or a mapping of name to tensor, "
            f"got {type(attentions).__name__}"
        )
    if atol is not None and (
        isinstance(atol, bool) or not isinstance(atol, (int, float)) or atol < 0
    ):
        raise ValueError(f"atol must be a non-negative float, got {atol!r}")
    heads: list[HeadHealth] = []
    first: NonFiniteLocation | None = None
    for name, w in attentions.items():
        if not isinstance(w, torch.Tensor) or w.dim() != 4:
            got = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
            raise ValueError(f"attentions[{name!r}] must be a (B, H, T_q, T_k) tensor, got {got}")
        tol = (
            atol
            if atol is not None
            else (2e-2 if w.dtype in (torch.float16, torch.bfloat16) else 1e-4)
        )
        kind = (kinds or {}).get(name, "self")
        heads.extend(_layer_health(name, kind, w.detach(), float(tol)))
        if first is None:
            first = _first_nonfinite(name, w.detach())
    return HealthReport(heads=tuple(heads), first_nonfinite=first)


def diagnose_model(
    model: nn.Module, *args: Any, atol: float | None = None, **kwargs: Any
) -> tuple[Any, HealthReport]:
    """Run ``model(*args, **kwargs)`` with capture and check every head.

    Returns:
        ``(output, report)``.
    """
    out, cache = run_with_cache(model, *args, **kwargs)
    return out, diagnose(cache, atol=atol)


def _layer_health(name: str, kind: str, w: torch.Tensor, atol: float) -> list[HeadHealth]:
    b, h, t_q, _ = w.shape
    finite_rows = torch.isfinite(w).all(dim=-1)  # (B, H, T_q)
    nonfinite = (~torch.isfinite(w)).sum(dim=(0, 2, 3))  # (H,)
    w = w.double() if w.dtype == torch.float64 else w.float()
    safe = torch.where(finite_rows.unsqueeze(-1), w, torch.zeros((), dtype=w.dtype))
    sums = safe.double().sum(dim=-1)  # (B, H, T_q)
    masked = finite_rows & (safe == 0).all(dim=-1)
    valid = finite_rows & ~masked
    entropy = attention_entropy(safe)
    max_w = safe.amax(dim=-1)
    err = (sums - 1).abs()
    out = []
    for head in range(h):
        v = valid[:, head]
        n = int(v.sum())
        ent = entropy[:, head][v]
        mw = max_w[:, head][v]
        out.append(
            HeadHealth(
                layer=name,
                kind=kind,
                head=head,
                rows=b * t_q,
                masked_rows=int(masked[:, head].sum()),
                entropy_mean=float(ent.mean()) if n else math.nan,
                entropy_min=float(ent.min()) if n else math.nan,
                entropy_max=float(ent.max()) if n else math.nan,
                max_weight_mean=float(mw.mean()) if n else math.nan,
                max_weight_max=float(mw.max()) if n else math.nan,
                row_sum_error=float(err[:, head][v].max()) if n else 0.0,
                nonfinite=int(nonfinite[head]),
                atol=atol,
            )
        )
    return out


def _from_stats(stats: Mapping[str, AttentionStats], kinds: Mapping[str, str]) -> HealthReport:
    """Health from blockwise row statistics (``capture(stats=True, weights=False)``).

    Row sums are not measured there (``row_sum_error`` is ``nan``) and a non-finite value is
    located to its row only (``key = -1``).
    """
    heads: list[HeadHealth] = []
    first: NonFiniteLocation | None = None
    for name, st in stats.items():
        bad_rows = ~(torch.isfinite(st.entropy) & torch.isfinite(st.max_weight))  # (B, H, T_q)
        masked = torch.isneginf(st.logsumexp) & ~bad_rows
        valid = ~bad_rows & ~masked
        b, h, t_q = st.entropy.shape
        for head in range(h):
            v = valid[:, head]
            n = int(v.sum())
            ent, mw = st.entropy[:, head][v], st.max_weight[:, head][v]
            heads.append(
                HeadHealth(
                    layer=name, kind=kinds.get(name, "self"), head=head, rows=b * t_q,
                    masked_rows=int(masked[:, head].sum()),
                    entropy_mean=float(ent.mean()) if n else math.nan,
                    entropy_min=float(ent.min()) if n else math.nan,
                    entropy_max=float(ent.max()) if n else math.nan,
                    max_weight_mean=float(mw.mean()) if n else math.nan,
                    max_weight_max=float(mw.max()) if n else math.nan,
                    row_sum_error=math.nan, nonfinite=int(bad_rows[:, head].sum()), atol=math.nan,
                )
            )  # fmt: skip
        if first is None and bool(bad_rows.any()):
            head, batch, query = bad_rows.transpose(0, 1).nonzero()[0].tolist()
            x = float(st.entropy[batch, head, query])
            value = "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
            first = NonFiniteLocation(name, head, batch, query, -1, value)
    return HealthReport(heads=tuple(heads), first_nonfinite=first)


def _first_nonfinite(name: str, w: torch.Tensor) -> NonFiniteLocation | None:
    bad = ~torch.isfinite(w)
    if not bool(bad.any()):
        return None
    # order: head, then batch, query, key
    idx = bad.transpose(0, 1).nonzero()[0].tolist()
    head, batch, query, key = idx
    x = float(w[batch, head, query, key])
    value = "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return NonFiniteLocation(layer=name, head=head, batch=batch, query=query, key=key, value=value)


def _json_float(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
