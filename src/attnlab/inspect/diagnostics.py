"""Health checks of captured attention weights, per layer and head.

For each head, over every query row ``p = (p_1 … p_T_k)`` of every sequence in the batch:

    entropy      H(p) = −Σ_j p_j log p_j            (nats; 0 = all weight on one key)
    max weight   max_j p_j
    first token  p_0, the weight on key 0 (an "attention sink", Xiao et al. 2024)
    row sum      |Σ_j p_j − 1|                      (should be ~0: softmax rows sum to one)
    masked row   p = 0                              (the query may see no key; attnlab's
                                                      convention gives a zero row, never NaN)
    non-finite   NaN / ±inf entries, and the first one in execution order located to
                 (layer, head, batch, query, key)

**Broken** — what makes a report not :attr:`HealthReport.ok` (and ``attnlab inspect`` exit 1):

- a non-finite weight, or a module output holding a NaN/inf (:attr:`HealthReport.origin`);
- an unmasked row whose sum is off 1 by more than ``atol``;
- a **collapsed** model: every head that has an informative row (below) is uniform or a sink,
  and there is at least one such head. Both patterns are fixed points that do not depend on the
  tokens — a uniform head averages whatever it sees (``p_j = 1/n``), a sink head returns the
  first token's value (``p_0 ≈ 1``) — so when no head escapes them the attention routes nothing
  by content: the state of a freshly initialised model (weights of std 0.02 give scores ≈ 0),
  of query/key weights that did not load, or of a softmax temperature gone wrong. Trained models
  have some heads of either kind, never only those. A sharp head on another key (one token but
  not the first: a previous-token head) depends on positions or tokens and is no sign of
  collapse. The rule reads the heads of the report, so a capture of chosen layers (``names=``,
  ``inspect --layer``) is judged on those layers.

**Patterns** — reported per head (:attr:`HeadHealth.status`), never failures on their own. Call
a query row *informative* when it sees at least two keys. The keys a row sees are those with
weight ``p_j > 0`` in that row — in any head of the layer, since the heads of a layer share one
mask: a head that puts everything on one key drives the others to exactly 0 by underflow, and
they must still count as seen (``n = |{j : ∃ head h, p^h_j > 0}|``). A row that sees one key is
trivially every pattern and does not count:

    uniform      every informative row has  H(p) ≥ (1 − uniform_tol) · log n     (uniform_tol = 1%)
                 — the head averages its visible keys and selects nothing
    one token    every informative row has  max_j p_j ≥ one_token_weight          (0.99)
                 — the head copies a single key (a sharp previous-token head, say)
    sink         every informative row has  p_0 ≥ one_token_weight
                 — a one-token head whose key is the first: an *attention sink* (Xiao et al.
                 2024; notebook 11), where a pretrained head parks the weight it has no use for

A head without an informative row has no pattern. (A freshly initialised model has uniform
heads only: collapsed. SmolLM2-135M has a few sink heads among its 270: healthy.)

:func:`diagnose_model` also runs :func:`~attnlab.inspect.nonfinite.watch_nonfinite` during the
same forward, so its report names the first module whose output held a NaN/inf.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.capture import ActivationCache, capture
from attnlab.inspect.nonfinite import NonFiniteOrigin, watch_nonfinite
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
        raise ArgumentTypeError(f"weights must be a torch.Tensor, got {type(weights).__name__}")
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
        """The location as plain data, for JSON.

        Returns:
            The attributes by name.
        """
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
        entropy_mean: mean row entropy in nats, over unmasked finite rows (``nan`` when there are
            none).
        entropy_min: smallest row entropy in nats, over the same rows.
        entropy_max: largest row entropy in nats, over the same rows.
        max_weight_mean: the largest weight of each row, averaged over the rows.
        max_weight_max: the largest weight of each row, maximised over the rows.
        first_token_share: the weight on key 0 (the first token), averaged over the same rows
            (``nan`` when there are none).
        row_sum_error: ``max |Σ_j p_j − 1|`` over unmasked finite rows (``nan``: not measured,
            for a report built from blockwise statistics).
        nonfinite: NaN/inf entries (rows, for a report from blockwise statistics).
        atol: the row-sum tolerance used for :attr:`ok`.
        uniform: every informative row (one that sees ≥ 2 keys, ``p_j > 0``) has entropy within
            ``uniform_tol`` (1%) of ``log(visible keys)``, and there is at least one such row.
            A key counts as seen when any head of the layer gives it weight > 0 in that row (see
            the module docstring). Not measured (``False``) in a report from blockwise
            statistics, which do not record how many keys a row sees.
        one_token: every informative row puts at least ``one_token_weight`` (0.99) on one key,
            and there is at least one such row. From blockwise statistics a row counts as
            informative when its max weight is below 1 in some head of the layer.
        sink: every informative row puts at least ``one_token_weight`` on key 0 (the first
            token), and there is at least one such row: a one-token head whose key is the first.
        informative_rows: the rows that see at least two keys (by the rules above).
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
    first_token_share: float
    row_sum_error: float
    nonfinite: int
    atol: float
    uniform: bool = False
    one_token: bool = False
    sink: bool = False
    informative_rows: int = 0

    @property
    def ok(self) -> bool:
        """The head's numbers are sound: no non-finite weight, and every unmasked row sums to one
        within ``atol``. A pattern (sink, uniform, one token) does not make a head not ok."""
        return self.nonfinite == 0 and not (self.row_sum_error > self.atol)

    @property
    def status(self) -> str:
        """One word for the head: ``"fail"`` (not :attr:`ok`), else its pattern — ``"sink"``,
        ``"one_token"`` (on a key other than the first), ``"uniform"`` — else ``"ok"``."""
        if not self.ok:
            return "fail"
        if self.sink:
            return "sink"
        if self.one_token:
            return "one_token"
        return "uniform" if self.uniform else "ok"

    def to_dict(self) -> dict[str, Any]:
        """The head's statistics as plain data, for JSON.

        Returns:
            The attributes by name, plus ``ok`` and ``status``; ``nan`` becomes ``None``.
        """
        extra = {"ok": self.ok, "status": self.status}
        return {k: _json_float(v) for k, v in asdict(self).items()} | extra


@dataclass(frozen=True)
class HealthReport:
    """The health of every captured head.

    Attributes:
        heads: one :class:`HeadHealth` per (layer, head), layers in execution order.
        first_nonfinite: the first NaN/inf weight (layers in execution order, then head, batch,
            query, key), or ``None``.
        origin: the first module whose output held a NaN/inf (any module, not only attention;
            see :func:`~attnlab.inspect.nonfinite.find_nonfinite`), or ``None`` — set by
            :func:`diagnose_model`, or by ``diagnose(..., origin=...)``.
    """

    heads: tuple[HeadHealth, ...]
    first_nonfinite: NonFiniteLocation | None = None
    origin: NonFiniteOrigin | None = None

    @property
    def collapsed(self) -> bool:
        """Every head with an informative row is uniform or a sink, and there is one such head
        at least (the module docstring says why): the attention routes nothing by content."""
        seen = [h for h in self.heads if h.informative_rows > 0]
        return bool(seen) and all(h.uniform or h.sink for h in seen)

    @property
    def ok(self) -> bool:
        """Nothing is broken: every head is :attr:`HeadHealth.ok`, no module output held a
        NaN/inf, and the heads have not :attr:`collapsed`. Sink, uniform and one-token heads
        alone do not make a report not ok."""
        return self.origin is None and all(h.ok for h in self.heads) and not self.collapsed

    def counts(self) -> dict[str, int]:
        """How many heads have each :attr:`HeadHealth.status`.

        Returns:
            ``{"ok", "sink", "one_token", "uniform", "fail"}`` → number of heads.
        """
        out = dict.fromkeys(("ok", "sink", "one_token", "uniform", "fail"), 0)
        for h in self.heads:
            out[h.status] += 1
        return out

    def layers(self) -> list[str]:
        """The layers of the report.

        Returns:
            The layer paths, in execution order, each once.
        """
        return list(dict.fromkeys(h.layer for h in self.heads))

    def for_layer(self, layer: str) -> list[HeadHealth]:
        """The heads of one layer.

        Args:
            layer: the layer's module path, as in :meth:`layers`.

        Returns:
            Its :class:`HeadHealth` entries, by head index.

        Raises:
            KeyError: no such layer in the report (the message lists them).
        """
        heads = [h for h in self.heads if h.layer == layer]
        if not heads:
            raise KeyError(f"no layer {layer!r} in the report; layers: {', '.join(self.layers())}")
        return heads

    def problems(self) -> list[str]:
        """What is broken, in words: the reasons the report is not :attr:`ok`.

        Returns:
            One line per problem: the first non-finite output and weight, then per head
            non-finite weights and rows that do not sum to one, then a collapse (empty when
            nothing is broken).
        """
        out = []
        if self.origin is not None:
            out.append(f"first non-finite output: {self.origin}")
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
        if self.collapsed:
            c = self.counts()
            out.append(
                f"collapsed: every head is uniform ({c['uniform']}) or a sink ({c['sink']}) — "
                "no head's weights depend on the tokens (an untrained model, or query/key "
                "weights that did not load?)"
            )
        return out

    def notes(self) -> list[str]:
        """The heads' patterns, in words: reported, not failures (see :attr:`HeadHealth.status`).

        Returns:
            One line per sink, one-token or uniform head that is otherwise ok.
        """
        words = {
            "sink": "sink — every row puts almost all its weight on the first token "
            "(an attention sink, normal in a pretrained model)",
            "one_token": "one token — every row puts almost all its weight on a single key",
            "uniform": "uniform — every row spreads its weight evenly over the keys it sees "
            "(entropy ≈ log of their number)",
        }
        return [f"{h.layer} head {h.head}: {words[h.status]}" for h in self.heads
                if h.status in words]  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data, for JSON.

        Returns:
            ``{"ok", "collapsed", "counts", "first_nonfinite", "origin", "problems", "notes",
            "heads"}``, the nested objects as their own ``to_dict()``.
        """
        return {
            "ok": self.ok,
            "collapsed": self.collapsed,
            "counts": self.counts(),
            "first_nonfinite": None
            if self.first_nonfinite is None
            else self.first_nonfinite.to_dict(),
            "origin": None if self.origin is None else self.origin.to_dict(),
            "problems": self.problems(),
            "notes": self.notes(),
            "heads": [h.to_dict() for h in self.heads],
        }


def diagnose(
    attentions: ActivationCache | Mapping[str, torch.Tensor] | torch.Tensor,
    *,
    atol: float | None = None,
    kinds: Mapping[str, str] | None = None,
    uniform_tol: float = 0.01,
    one_token_weight: float = 0.99,
    origin: NonFiniteOrigin | None = None,
) -> HealthReport:
    """Check captured attention weights head by head.

    Args:
        attentions: an :class:`~attnlab.inspect.capture.ActivationCache`; a mapping from layer
            name to weights ``(B, H, T_q, T_k)`` in execution order; or one tensor of weights
            ``(B, H, T_q, T_k)``, ``(H, T_q, T_k)`` or ``(T_q, T_k)`` (reported as layer
            ``"attention"``). A cache captured with ``weights=False, stats=True`` is checked from
            its blockwise row statistics (no row sums, no uniformity check then).
        atol: tolerance of the row-sum check; default ``1e-4`` for fp32/fp64 weights and ``2e-2``
            for fp16/bf16.
        kinds: layer name → ``"self"``/``"cross"`` (taken from the cache when one is given).
        uniform_tol: a row is uniform when its entropy is at least ``(1 − uniform_tol) · log n``
            (``n`` keys with weight > 0). Default ``0.01``.
        one_token_weight: a row attends to one token when its largest weight is at least this,
            to the first token (a sink row) when its weight on key 0 is. Default ``0.99``.
        origin: a :class:`~attnlab.inspect.nonfinite.NonFiniteOrigin` found during the same run
            (see :func:`~attnlab.inspect.nonfinite.watch_nonfinite`), put into the report.

    Returns:
        A :class:`HealthReport`: its :attr:`~HealthReport.ok` is false only for what is broken
        (non-finite values, row sums off by more than ``atol``, a collapsed model); sink,
        uniform and one-token heads are reported in :attr:`HeadHealth.status` and
        :meth:`HealthReport.notes` (the rules are in the module docstring).

    Raises:
        ValueError: ``atol`` negative or not finite, a threshold out of its range, or a tensor
            of the wrong shape.
        TypeError: an argument of the wrong type.

    Shape:
        weights ``(B, H, T_q, T_k)``: ``B`` sequences, ``H`` heads, ``T_q`` queries (rows),
        ``T_k`` keys (columns); each row sums to 1, or is all zero when it may see no key.

    Examples:
        >>> out, cache = run_with_cache(model, input_ids)
        >>> report = diagnose(cache)
        >>> report.ok, report.heads[0].entropy_mean, report.heads[0].status
    """
    if atol is not None:
        if isinstance(atol, bool) or not isinstance(atol, (int, float)):
            raise ArgumentTypeError(f"atol must be a float or None, got {type(atol).__name__}")
        if not 0 <= atol < math.inf:  # nan and inf would pass every row: no check at all
            raise ArgumentError(f"atol must be a finite non-negative float, got {atol!r}")
    if isinstance(uniform_tol, bool) or not isinstance(uniform_tol, (int, float)):
        raise ArgumentTypeError(f"uniform_tol must be a float, got {type(uniform_tol).__name__}")
    if not 0 <= uniform_tol < 1:
        raise ArgumentError(f"uniform_tol must lie in [0, 1), got {uniform_tol!r}")
    if isinstance(one_token_weight, bool) or not isinstance(one_token_weight, (int, float)):
        raise ArgumentTypeError(
            f"one_token_weight must be a float, got {type(one_token_weight).__name__}"
        )
    if not 0 < one_token_weight <= 1:
        raise ArgumentError(f"one_token_weight must lie in (0, 1], got {one_token_weight!r}")
    if origin is not None and not isinstance(origin, NonFiniteOrigin):
        raise ArgumentTypeError(
            f"origin must be a NonFiniteOrigin or None, got {type(origin).__name__}"
        )
    rules = (float(uniform_tol), float(one_token_weight))
    if isinstance(attentions, torch.Tensor):
        attentions = {"attention": _as_4d(attentions)}
    if isinstance(attentions, ActivationCache):
        kinds = attentions.kinds if kinds is None else kinds
        if not attentions.attentions and attentions.stats:
            report = _from_stats(attentions.stats, kinds, rules[1])
            return dataclasses.replace(report, origin=origin)
        attentions = attentions.attentions
    if not isinstance(attentions, Mapping):
        raise ArgumentTypeError(
            f"attentions must be an ActivationCache or a mapping of name to tensor, or a tensor, "
            f"got {type(attentions).__name__}"
        )
    heads: list[HeadHealth] = []
    first: NonFiniteLocation | None = None
    for name, w in attentions.items():
        if not isinstance(w, torch.Tensor) or w.dim() != 4:
            got = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
            raise ArgumentError(
                f"attentions[{name!r}] must be a (B, H, T_q, T_k) tensor, got {got}"
            )
        tol = (
            atol
            if atol is not None
            else (2e-2 if w.dtype in (torch.float16, torch.bfloat16) else 1e-4)
        )
        kind = (kinds or {}).get(name, "self")
        heads.extend(_layer_health(name, kind, w.detach(), float(tol), rules))
        if first is None:
            first = _first_nonfinite(name, w.detach())
    return HealthReport(heads=tuple(heads), first_nonfinite=first, origin=origin)


def diagnose_model(
    model: nn.Module, *args: Any, atol: float | None = None, **kwargs: Any
) -> tuple[Any, HealthReport]:
    """Run ``model(*args, **kwargs)`` once with capture, check every head, and locate the first
    module whose output holds a NaN/inf (:attr:`HealthReport.origin`).

    Args:
        model: a model with :class:`~attnlab.nn.multihead.MultiHeadAttention` layers.
        *args: positional arguments of the model's forward.
        atol: the row-sum tolerance (see :func:`diagnose`).
        **kwargs: keyword arguments of the model's forward.

    Returns:
        ``(output, report)``.
    """
    with capture(model) as cache, watch_nonfinite(model) as watch:
        out = model(*args, **kwargs)
    return out, diagnose(cache, atol=atol, origin=watch.origin)


def _as_4d(w: torch.Tensor) -> torch.Tensor:
    """``(T_q, T_k)`` / ``(H, T_q, T_k)`` / ``(B, H, T_q, T_k)`` → ``(B, H, T_q, T_k)``."""
    if w.dim() == 2:
        return w[None, None]
    if w.dim() == 3:
        return w[None]
    if w.dim() == 4:
        return w
    raise ArgumentError(
        f"attentions must have shape (B, H, T_q, T_k), (H, T_q, T_k) or (T_q, T_k), "
        f"got {tuple(w.shape)}"
    )


def _flag(rows: torch.Tensor, informative: torch.Tensor) -> bool:
    """At least one informative row, and the row test holds in every one."""
    return bool(informative.any()) and bool(rows[informative].all())


def _layer_health(
    name: str, kind: str, w: torch.Tensor, atol: float, rules: tuple[float, float]
) -> list[HeadHealth]:
    uniform_tol, one_token_weight = rules
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
    sink = safe[..., 0]  # the weight on key 0      (B, H, T_q)
    err = (sums - 1).abs()
    # uniform:  H(p) ≥ (1 − tol) · log n,  n = |{j : p_j > 0 in some head}|, rows with n ≥ 2
    # one token: max_j p_j ≥ one_token_weight, over the same rows; sink: p_0 ≥ one_token_weight
    visible = (safe > 0).any(dim=1, keepdim=True).sum(dim=-1)  # (B, 1, T_q)
    informative = valid & (visible >= 2)
    uniform_row = entropy >= (1 - uniform_tol) * visible.clamp(min=1).to(entropy.dtype).log()
    one_row = max_w >= one_token_weight
    sink_row = sink >= one_token_weight
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
                first_token_share=float(sink[:, head][v].mean()) if n else math.nan,
                row_sum_error=float(err[:, head][v].max()) if n else 0.0,
                nonfinite=int(nonfinite[head]),
                atol=atol,
                uniform=_flag(uniform_row[:, head], informative[:, head]),
                one_token=_flag(one_row[:, head], informative[:, head]),
                sink=_flag(sink_row[:, head], informative[:, head]),
                informative_rows=int(informative[:, head].sum()),
            )
        )
    return out


def _from_stats(
    stats: Mapping[str, AttentionStats], kinds: Mapping[str, str], one_token_weight: float
) -> HealthReport:
    """Health from blockwise row statistics (``capture(stats=True, weights=False)``).

    Row sums are not measured there (``row_sum_error`` is ``nan``), nor is uniformity (the
    number of keys a row sees is not recorded), so only sinks can make a collapse; a row counts
    as seeing ≥ 2 keys for the one-token and sink tests when its max weight is below 1 in some
    head of the layer, and a non-finite value is located to its row only (``key = -1``).
    """
    heads: list[HeadHealth] = []
    first: NonFiniteLocation | None = None
    for name, st in stats.items():
        bad_rows = ~(torch.isfinite(st.entropy) & torch.isfinite(st.max_weight))  # (B, H, T_q)
        masked = torch.isneginf(st.logsumexp) & ~bad_rows
        valid = ~bad_rows & ~masked
        informative = valid & (st.max_weight < 1).any(dim=1, keepdim=True)
        one_row = st.max_weight >= one_token_weight
        sink_row = st.first_weight >= one_token_weight
        b, h, t_q = st.entropy.shape
        for head in range(h):
            v = valid[:, head]
            n = int(v.sum())
            ent, mw = st.entropy[:, head][v], st.max_weight[:, head][v]
            sink = st.first_weight[:, head][v]
            heads.append(
                HeadHealth(
                    layer=name, kind=kinds.get(name, "self"), head=head, rows=b * t_q,
                    masked_rows=int(masked[:, head].sum()),
                    entropy_mean=float(ent.mean()) if n else math.nan,
                    entropy_min=float(ent.min()) if n else math.nan,
                    entropy_max=float(ent.max()) if n else math.nan,
                    max_weight_mean=float(mw.mean()) if n else math.nan,
                    max_weight_max=float(mw.max()) if n else math.nan,
                    first_token_share=float(sink.mean()) if n else math.nan,
                    row_sum_error=math.nan, nonfinite=int(bad_rows[:, head].sum()), atol=math.nan,
                    one_token=_flag(one_row[:, head], informative[:, head]),
                    sink=_flag(sink_row[:, head], informative[:, head]),
                    informative_rows=int(informative[:, head].sum()),
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
