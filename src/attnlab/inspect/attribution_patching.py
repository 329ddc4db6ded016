"""Attribution patching: every site's patching effect from one forward of each prompt and one
backward (Nanda 2023, "Attribution Patching"; Syed et al. 2023, "Attribution Patching
Outperforms Automated Circuit Discovery").

Exact activation patching (:func:`~attnlab.inspect.patching.patch_heads`) runs the corrupted
prompt once per site with the clean activation ``a_clean`` put in place of ``a_corrupted``. Its
first-order Taylor expansion around the corrupted run needs only the gradient of the metric
there:

    m(a ← a_clean) ≈ m_corrupted + ∇_a m|_corrupted · (a_clean − a_corrupted)

— the direction of :func:`~attnlab.inspect.patching.patch_heads` (clean into corrupted), so the
two are reported alike, as :class:`~attnlab.inspect.patching.PatchResult` with the same
normalised score. The estimate is exact where the metric is linear in the activation (a head's
output read by the logits through no later nonlinearity, a head's values with its weights fixed)
and breaks down where the patch moves a nonlinearity far (a softmax that saturates, a norm).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from attnlab.errors import ArgumentError
from attnlab.inspect.patching import (
    Metric,
    PatchResult,
    _evaluating,
    _logits,
    _number,
    _position,
    _prompts,
    _record,
    _replaced,
    _values,
)

__all__ = ["Attribution", "attribution_patch"]

Site = Literal["z", "q", "k", "v"]
SITES: tuple[Site, ...] = ("z", "q", "k", "v")


@dataclass(frozen=True)
class Attribution:
    """Attribution patching's estimate of every site's effect, ``∇m · (a_clean − a_corrupted)``
    summed over the activation's features, one value a position.

    Attributes:
        clean: the metric of the clean run, ``m_clean``.
        corrupted: the metric of the corrupted run, ``m_corrupted`` (where the gradient is).
        z: each head's output (``hook_z``), float64 (NaN past a layer's heads).
        q: each query head's queries (``hook_q``, before any rotation).
        k: each key-value head's keys (``hook_k``; ``H_kv`` of them under grouped-query
            attention).
        v: each key-value head's values (``hook_v``).
        resid: the residual stream entering each layer (``hook_resid_pre``) and, last, the one
            leaving the last layer (row ``"final"``).
        rows: the label of each row of ``resid``: the layer index as text, then ``"final"``.

    Shape:
        z, q ``(L, H, T)``; k, v ``(L, H_kv, T)``; resid ``(L + 1, T)``.
    """

    clean: float
    corrupted: float
    z: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    resid: torch.Tensor
    rows: tuple[str, ...]

    def heads(self, position: int | None = None, *, site: Site = "z") -> PatchResult:
        """The estimate of :func:`~attnlab.inspect.patching.patch_heads` (``site="z"``), or of
        patching each head's queries, keys or values alone.

            m_patched ≈ m_corrupted + Σ_t ∇m · (a_clean − a_corrupted)[t]   (t = every position,
                                                                             or the one given)

        Args:
            position: one position (negative counts from the end); ``None`` (default) every
                position, as ``patch_heads(position=None)`` patches.
            site: ``"z"`` (the head's output, default), ``"q"``, ``"k"`` or ``"v"`` (columns are
                the key-value heads).

        Returns:
            :class:`~attnlab.inspect.patching.PatchResult` of kind ``"heads"``, one row a layer.

        Raises:
            ValueError: a site that is not one of ``z q k v``, a position outside the prompt.

        Shape:
            result ``(L, H)`` (``(L, H_kv)`` for ``k``, ``v``).
        """
        if site not in SITES:
            raise ArgumentError(f"site must be one of {', '.join(SITES)}, got {site!r}")
        per_position = getattr(self, site)
        if position is None:
            pos, effect = None, per_position.sum(-1)
        else:
            pos = _position("position", position, per_position.shape[-1])
            effect = per_position[..., pos]
        return PatchResult(
            "heads", self.corrupted + effect, self.clean, self.corrupted, self.rows[:-1], pos
        )

    def residual(self) -> PatchResult:
        """The estimate of :func:`~attnlab.inspect.patching.patch_residual` (with ``final``):
        the residual stream at one position of one layer patched.

        Returns:
            :class:`~attnlab.inspect.patching.PatchResult` of kind ``"positions"``.

        Shape:
            result ``(L + 1, T)``.
        """
        return PatchResult(
            "positions", self.corrupted + self.resid, self.clean, self.corrupted, self.rows
        )

    def to_dict(self) -> dict[str, Any]:
        """The estimates as JSON-ready Python values (NaN as ``None``).

        Returns:
            ``clean``, ``corrupted``, ``rows`` and, for each of ``z q k v resid``, the effect
            ``m_patched − m_corrupted`` of every site, ``[layer][head][position]`` (``resid``:
            ``[row][position]``).
        """

        def nested(x: torch.Tensor) -> Any:
            return [nested(r) for r in x] if x.dim() else _number(x)

        out: dict[str, Any] = {
            "clean": self.clean,
            "corrupted": self.corrupted,
            "rows": list(self.rows),
        }
        for name in (*SITES, "resid"):
            out[name] = nested(getattr(self, name))
        return out


def attribution_patch(
    model: torch.nn.Module,
    clean_ids: torch.Tensor,
    corrupted_ids: torch.Tensor,
    metric: Metric,
) -> Attribution:
    """Estimate the effect of patching every head's output, queries, keys and values and the
    residual stream at every position, from **one forward of each prompt and one backward**.

    The clean prompt runs once (no gradient) and its activations are kept; the corrupted prompt
    runs once with the gradient on, and one backward pass from its metric gives ``∇_a m`` at
    every hook point at once:

        m(a ← a_clean) − m_corrupted ≈ ∇_a m|_corrupted · (a_clean − a_corrupted)

    summed over each activation's features (``d_head`` of a head, ``d_model`` of the residual
    stream), kept per position. Exact — to the precision of the dtype — wherever the metric is
    linear in the activation; compare with the exact scans
    (:func:`~attnlab.inspect.patching.patch_heads`,
    :func:`~attnlab.inspect.patching.patch_residual`) before trusting it where it is not.

    Args:
        model: an :class:`attnlab.GPT` (any family); run in eval mode (restored after). Its
            parameters' gradients are not touched.
        clean_ids: the clean prompt's ids.
        corrupted_ids: the corrupted prompt's ids, as many as the clean one's.
        metric: logits ``(B, T, vocab)`` → ``(B,)``, differentiable, e.g.
            ``lambda lg: logit_difference(lg, good, bad)``.

    Returns:
        :class:`Attribution`; :meth:`Attribution.heads` and :meth:`Attribution.residual` give
        it as the :class:`~attnlab.inspect.patching.PatchResult` the exact scans return.

    Raises:
        ValueError: prompts of different lengths, a metric that does not return ``(B,)``.
        TypeError: a model that is not an :class:`attnlab.GPT`, ids that are not integer.

    Shape:
        clean_ids, corrupted_ids ``(T,)`` or ``(1, T)``; see :class:`Attribution`.

    Examples:
        >>> metric = lambda lg: logit_difference(lg, paris, berlin)
        >>> est = attribution_patch(model, clean, corrupted, metric)
        >>> est.heads().top(3)  # what patch_heads would find, at the cost of one backward
    """
    clean, corrupted = _prompts(model, clean_ids, corrupted_ids)
    n = len(model.transformer.h)  # type: ignore[union-attr,arg-type]
    names: dict[str, list[str]] = {
        s: [f"transformer.h.{i}.attn.hook_{s}" for i in range(n)] for s in SITES
    }
    names["resid"] = [f"transformer.h.{i}.hook_resid_pre" for i in range(n)]
    names["resid"].append(f"transformer.h.{n - 1}.hook_resid_post")
    every = [name for group in names.values() for name in group]
    root = names["resid"][0]  # the embedding: where the gradient starts
    with _evaluating(model):
        clean_logits, clean_acts = _record(model, clean, every)
        m_clean = float(_values(metric, clean_logits)[0])
        seen: dict[str, torch.Tensor] = {}

        def keep(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
            def fn(x: torch.Tensor) -> torch.Tensor:
                if name == root:  # a leaf, so the gradient flows whether or not weights want it
                    x = x.detach().requires_grad_(True)
                seen[name] = x
                return x

            return fn

        kept: list[torch.Tensor] = []

        def tracked(logits: torch.Tensor) -> torch.Tensor:
            kept.append(metric(logits))
            return kept[-1]

        with _replaced(model, {name: keep(name) for name in every}), torch.enable_grad():
            logits = _logits(model, corrupted)
            m_corrupted = float(_values(tracked, logits)[0])
            # one backward: ∇_a m at every hook point at once
            grads = torch.autograd.grad(
                kept[-1].sum(), [seen[name] for name in every], allow_unused=True
            )
    grad = dict(zip(every, grads, strict=True))

    def effect(name: str) -> torch.Tensor:
        """Σ over features of ∇m · (a_clean − a_corrupted), float64   ((…, T))"""
        a = seen[name].detach()
        g = grad[name]
        if g is None:  # the metric does not read this activation
            return torch.zeros(a.shape[1:-1], dtype=torch.float64)
        delta = clean_acts[name].to(torch.float64) - a.to(torch.float64)
        return (g.to(torch.float64) * delta).sum(-1)[0].cpu()

    def stacked(site: str) -> torch.Tensor:
        per_layer = [effect(name) for name in names[site]]
        width = max(e.shape[0] for e in per_layer)
        out = torch.full((n, width, per_layer[0].shape[-1]), math.nan, dtype=torch.float64)
        for i, e in enumerate(per_layer):
            out[i, : e.shape[0]] = e
        return out

    return Attribution(
        clean=m_clean,
        corrupted=m_corrupted,
        z=stacked("z"),
        q=stacked("q"),
        k=stacked("k"),
        v=stacked("v"),
        resid=torch.stack([effect(name) for name in names["resid"]]),
        rows=(*(str(i) for i in range(n)), "final"),
    )
