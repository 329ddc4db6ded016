"""Activation patching: which activations carry the difference between two prompts.

Run a *clean* prompt (``"The capital of France is"``) and a *corrupted* one of the same length
(``"The capital of Italy is"``), put one activation of the clean run into the corrupted run, and
measure how much of the clean behaviour it brings back (Meng et al. 2022, "Locating and Editing
Factual Associations in GPT", causal tracing; Wang et al. 2023, "Interpretability in the Wild";
Heimersheim & Nanda 2024, "How to use and interpret activation patching"). The behaviour is a
metric of the logits, usually a logit difference at the last position,

    m(x) = logit_x[t, good] − logit_x[t, bad]                               (logit_difference)

and each patched run is reported as it is and normalised between the two baselines,

    score = (m_patched − m_corrupted) / (m_clean − m_corrupted),

so 1 means the activation alone restores the clean answer and 0 that it changes nothing.

- :func:`patch_heads`: every ``(layer, head)`` — the head's output ``z_h`` (its slice of the
  attention's ``hook_z``, before the output projection) at every position, or at one.
- :func:`patch_residual`: every ``(layer, position)`` — the residual stream entering the layer
  (``hook_resid_pre``), and optionally the one leaving the last layer.
- :func:`run_with_patches`: one forward with any hook points' activations replaced.

The clean activations are recorded once; the patched runs are batched (all heads of a layer, or
all positions, in one batch of rows of the corrupted prompt, row ``i`` patched at site ``i``), so
a layer costs one forward. Nothing else changes between a row and the corrupted run, so patching
an activation with its own value gives the corrupted metric bit for bit, on every machine: the
scan is *batch-invariant*. A CPU BLAS may block a product of 21 rows differently from one of 7,
and even compute the last rows of one product differently from the first (the last bit of a
float64 differs on an AMD EPYC, or under ``MKL_CBWR=COMPATIBLE``, not on an Intel Xeon), so no
two rows are compared unless the kernels computed them alike: the clean run, the corrupted run
and every patched chunk are forwards of one shape ``(n, T)`` (``n`` the chunk size, a last chunk
filled up with unpatched rows), a site patched into row ``j`` takes the clean value of row ``j``,
and its effect is measured against the corrupted run's row ``j``:

    m_patched(site) = m_corrupted + (m_j(patched) − m_j(corrupted))     (j = the site's row)

— the paired difference is exactly 0 for a patch that changes nothing, and within rounding of
the row's own metric otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from attnlab._checks import check_positive_int, check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.nn.hooks import hook_points

__all__ = [
    "Metric",
    "PatchResult",
    "logit_difference",
    "patch_heads",
    "patch_residual",
    "run_with_patches",
]

#: logits ``(B, T, vocab)`` → one value per row ``(B,)``, e.g. :func:`logit_difference`
Metric = Callable[[torch.Tensor], torch.Tensor]


def logit_difference(logits: torch.Tensor, good: int, bad: int, position: int = -1) -> torch.Tensor:
    """The logit difference of two tokens at one position, the usual patching metric.

        m = logits[t, good] − logits[t, bad]

    Positive when the model prefers ``good``; the difference of the log-probabilities too (the
    softmax's normaliser cancels).

    Args:
        logits: a model's logits.
        good: the id of the right answer (``" Paris"``).
        bad: the id of the wrong one (``" Rome"``).
        position: the position ``t`` read (default ``-1``, the prediction of the next token).

    Returns:
        One difference per sequence (a 0-dim tensor for ``(T, vocab)`` logits).

    Raises:
        ValueError: a token id outside the vocabulary or a position outside the sequence.

    Shape:
        logits ``(..., T, vocab)`` → ``(...)``.

    Examples:
        >>> metric = lambda lg: logit_difference(lg, paris, rome)
        >>> result = patch_heads(model, clean, corrupted, metric)
    """
    check_tensor("logits", logits)
    if logits.dim() < 2:
        raise ArgumentError(f"logits must be (..., T, vocab), got shape {shape_str(logits.shape)}")
    t, vocab = logits.shape[-2:]
    for name, token in (("good", good), ("bad", bad)):
        if isinstance(token, bool) or not isinstance(token, int):
            raise ArgumentTypeError(f"{name} must be a token id (int), got {type(token).__name__}")
        if not 0 <= token < vocab:
            raise ArgumentError(f"{name} = {token} is not a token id of a {vocab}-token vocabulary")
    p = _position("position", position, t)
    # m = logit[t, good] − logit[t, bad]
    return logits[..., p, good] - logits[..., p, bad]


@dataclass(frozen=True)
class PatchResult:
    """The metric of every patched run, and the two runs it is measured between.

    Attributes:
        kind: ``"heads"`` (rows are layers, columns heads) or ``"positions"`` (rows are the
            residual streams entering each layer, columns positions).
        patched: the metric of each patched run, float64 on the CPU (NaN for a site not run).
        clean: the metric of the clean run, ``m_clean``.
        corrupted: the metric of the corrupted run, ``m_corrupted``.
        rows: the label of each row: the layer index as text, and ``"final"`` for the residual
            stream after the last layer.
        position: ``"heads"``: the one position each head was patched at, or ``None`` for every
            position; ``"positions"``: ``None``.

    Shape:
        patched ``(rows, H)`` or ``(rows, T)``.
    """

    kind: Literal["heads", "positions"]
    patched: torch.Tensor
    clean: float
    corrupted: float
    rows: tuple[str, ...]
    position: int | None = None

    @property
    def normalized(self) -> torch.Tensor:
        """``(m_patched − m_corrupted) / (m_clean − m_corrupted)``: 1 restores the clean run,
        0 changes nothing (inf or NaN when the two baselines are equal: nothing to restore).

        Shape:
            that of :attr:`patched`.
        """
        # score = (m_patched − m_corrupted) / (m_clean − m_corrupted)
        return (self.patched - self.corrupted) / (self.clean - self.corrupted)

    def top(self, k: int = 10) -> list[dict[str, Any]]:
        """The ``k`` sites whose patching moves the metric most, by ``|normalized|``.

        Args:
            k: how many (default 10).

        Returns:
            One dict a site, largest first: ``layer`` (a row label), ``head`` or ``position``,
            ``patched`` and ``normalized``.
        """
        check_positive_int("k", k)
        norm = self.normalized
        order = torch.nan_to_num(norm.abs(), nan=-1.0).flatten().argsort(descending=True)
        column = "head" if self.kind == "heads" else "position"
        out = []
        for flat in order[:k].tolist():
            r, c = divmod(flat, norm.shape[1])
            out.append(
                {
                    "layer": self.rows[r],
                    column: c,
                    "patched": _number(self.patched[r, c]),
                    "normalized": _number(norm[r, c]),
                }
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready Python values (NaN and inf as ``None``).

        Returns:
            ``kind``, ``clean``, ``corrupted``, ``position``, ``rows``, ``patched`` and
            ``normalized`` (lists of rows).
        """
        return {
            "kind": self.kind,
            "clean": self.clean,
            "corrupted": self.corrupted,
            "position": self.position,
            "rows": list(self.rows),
            "patched": [[_number(v) for v in row] for row in self.patched],
            "normalized": [[_number(v) for v in row] for row in self.normalized],
        }


def _number(v: torch.Tensor | float) -> float | None:
    x = float(v)
    return x if math.isfinite(x) else None


# ----------------------------------------------------------------------------- running


@contextmanager
def _replaced(
    model: nn.Module, patches: Mapping[str, Callable[[torch.Tensor], torch.Tensor]]
) -> Iterator[None]:
    """Forward hooks that replace each named hook point's output by ``patch(output)``."""
    points = hook_points(model)
    handles = []
    try:
        for name, patch in patches.items():
            if name not in points:
                raise ArgumentError(
                    f"{name!r} is not a hook point of {type(model).__name__} "
                    f"(e.g. {next(iter(points), 'none')!r}; attnlab.nn.hooks.hook_points lists them)"
                )
            if not callable(patch):
                raise ArgumentTypeError(
                    f"patches[{name!r}] must be a function of the activation, got "
                    f"{type(patch).__name__}"
                )
            handles.append(
                points[name].register_forward_hook(lambda _m, _a, out, fn=patch: fn(out))
            )
        yield
    finally:
        for handle in handles:
            handle.remove()


def run_with_patches(
    model: nn.Module,
    input_ids: torch.Tensor,
    patches: Mapping[str, Callable[[torch.Tensor], torch.Tensor]],
) -> torch.Tensor:
    """The logits of one forward in which each named hook point's activation ``x`` is replaced
    by ``patches[name](x)`` (without gradients).

    Args:
        model: an :class:`attnlab.GPT` (any family).
        input_ids: the tokens.
        patches: hook point path (``"transformer.h.3.attn.hook_z"``,
            ``"transformer.h.0.hook_resid_pre"``, see :func:`attnlab.nn.hooks.hook_points`) →
            a function returning the activation to use instead (same shape).

    Returns:
        The logits.

    Raises:
        ValueError: a name that is not a hook point of the model.

    Shape:
        input_ids ``(B, T)`` → logits ``(B, T, vocab)``.

    Examples:
        >>> clean_out = ...  # a recorded (B, T, d_model) activation
        >>> logits = run_with_patches(model, ids, {"transformer.h.2.hook_attn_out": lambda x: clean_out})
    """
    _check_model(model)
    check_tensor("input_ids", input_ids)
    with _replaced(model, patches), torch.no_grad():
        return _logits(model, input_ids)


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids)
    return out.logits if hasattr(out, "logits") else out  # type: ignore[no-any-return]


def _record(
    model: nn.Module,
    ids: torch.Tensor,
    names: Sequence[str],
    rows: int = 1,
    select: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The logits of a forward of ``rows`` copies of ``ids`` (the shape a scan's chunks run at),
    and at each named hook point ``select(x)`` of its activation ``x`` (default: row 0)."""
    seen: dict[str, torch.Tensor] = {}
    pick = select or (lambda x: x[:1])

    def keep(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
        def fn(x: torch.Tensor) -> torch.Tensor:
            seen[name] = pick(x.detach()).clone()
            return x

        return fn

    with _replaced(model, {n: keep(n) for n in names}), torch.no_grad():
        logits = _logits(model, ids.expand(rows, -1))
    return logits, seen


def _per_row(model: nn.Module, ids: torch.Tensor, metric: Metric, rows: int) -> torch.Tensor:
    """``metric`` of the unpatched prompt in each row of a forward of ``rows`` copies of it."""
    with torch.no_grad():
        return _values(metric, _logits(model, ids.expand(rows, -1)))


def _check_model(model: object) -> None:
    from attnlab.models.gpt import GPT

    if not isinstance(model, GPT):
        raise ArgumentTypeError(
            f"model must be an attnlab.GPT (any family: GPT-2, Llama, Mistral, Qwen2, NeoX), got "
            f"{type(model).__name__}"
        )


def _position(name: str, position: object, t: int) -> int:
    if isinstance(position, bool) or not isinstance(position, int):
        raise ArgumentTypeError(f"{name} must be an int, got {type(position).__name__}")
    if not -t <= position < t:
        raise ArgumentError(f"{name} = {position} is outside a sequence of {t} tokens")
    return position % t


def _prompt(name: str, ids: object, model: nn.Module) -> torch.Tensor:
    x = check_tensor(name, ids)
    if x.dtype in (torch.bool,) or x.is_floating_point() or x.is_complex():
        raise ArgumentTypeError(f"{name} must hold integer token ids, got dtype {x.dtype}")
    if x.dim() == 2 and x.shape[0] == 1:
        x = x[0]
    if x.dim() != 1 or x.numel() == 0:
        raise ArgumentError(
            f"{name} must be one prompt, (T,) or (1, T), got shape {shape_str(x.shape)}"
        )
    device = next(model.parameters()).device
    return x.to(device=device, dtype=torch.long)[None]  # (1, T)


def _prompts(
    model: nn.Module, clean_ids: object, corrupted_ids: object
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_model(model)
    clean = _prompt("clean_ids", clean_ids, model)
    corrupted = _prompt("corrupted_ids", corrupted_ids, model)
    if clean.shape[1] != corrupted.shape[1]:
        raise ArgumentError(
            f"clean and corrupted prompts must have the same length to be patched position by "
            f"position, got {clean.shape[1]} and {corrupted.shape[1]} tokens"
        )
    return clean, corrupted


def _values(metric: Metric, logits: torch.Tensor) -> torch.Tensor:
    """``metric(logits)`` as ``(B,)`` float64 on the CPU, checked."""
    if not callable(metric):
        raise ArgumentTypeError(
            f"metric must be a function of the logits, got {type(metric).__name__}"
        )
    out = metric(logits)
    b = logits.shape[0]
    if not isinstance(out, torch.Tensor) or out.shape != (b,):
        got = shape_str(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ArgumentError(
            f"metric must return one value per row of the logits, shape ({b},), got {got} "
            f"(e.g. lambda logits: logit_difference(logits, good, bad))"
        )
    return out.detach().to("cpu", torch.float64)


def _layers(model: nn.Module, layers: Sequence[int] | None) -> list[int]:
    n = len(model.transformer.h)  # type: ignore[union-attr,arg-type]
    if layers is None:
        return list(range(n))
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
        raise ArgumentTypeError(f"layers must be a sequence of ints, got {type(layers).__name__}")
    out = []
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise ArgumentTypeError(f"layers must hold ints, got {type(layer).__name__}")
        if not -n <= layer < n:
            raise ArgumentError(f"layer {layer} is not one of the model's {n} layers")
        out.append(layer % n)
    if not out:
        raise ArgumentError("layers must name at least one layer")
    return out


def _batch(batch_size: int | None, n: int) -> int:
    """The rows of every forward of a scan of at most ``n`` sites a layer."""
    return n if batch_size is None else min(n, check_positive_int("batch_size", batch_size))


def _scan(
    model: nn.Module,
    corrupted: torch.Tensor,
    metric: Metric,
    hook: str,
    sites: int,
    base: torch.Tensor,
    patch_rows: Callable[[torch.Tensor, torch.Tensor], None],
) -> torch.Tensor:
    """The metric of ``sites`` patched runs of the corrupted prompt, ``n = len(base)`` rows a
    forward, site ``s`` in row ``s mod n``; ``patch_rows(x, sites)`` writes site ``sites[i]``'s
    clean value into row ``i`` of the activation ``x`` at ``hook`` (a copy). ``base[j]`` is the
    unpatched metric of row ``j``: each site is reported as ``base[0] + (m − base[j])``."""
    n = len(base)
    out = torch.empty(sites, dtype=torch.float64)
    for start in range(0, sites, n):
        chosen = torch.arange(start, min(sites, start + n), device=corrupted.device)

        def patch(x: torch.Tensor, chosen: torch.Tensor = chosen) -> torch.Tensor:
            x = x.clone()
            patch_rows(x, chosen)
            return x

        with _replaced(model, {hook: patch}), torch.no_grad():
            values = _values(metric, _logits(model, corrupted.expand(n, -1)))[: len(chosen)]
        # m_patched = m_corrupted + (m_j(patched) − m_j(corrupted))
        out[start : start + len(chosen)] = base[0] + (values - base[: len(chosen)])
    return out


@contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout: a patched run differs from the corrupted one only by the patch)."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


# ----------------------------------------------------------------------------- heads


def patch_heads(
    model: nn.Module,
    clean_ids: torch.Tensor,
    corrupted_ids: torch.Tensor,
    metric: Metric,
    *,
    layers: Sequence[int] | None = None,
    position: int | None = None,
    batch_size: int | None = None,
) -> PatchResult:
    """Patch each head's output from the clean run into the corrupted run, one head at a time.

    For layer ``l`` and head ``h``, the corrupted prompt runs with ``z_{l,h}`` — the head's
    output ``softmax(q kᵀ/√d) v`` before the output projection (the layer's ``hook_z``) —
    replaced by the clean run's, at every position or at ``position`` only:

        z_{l,h}[t] ← z^clean_{l,h}[t]          (t = every position, or the one given)

    Everything the head's output feeds (later heads' queries, keys and values included) sees the
    patched value. With grouped-query attention each query head is patched alone.

    Args:
        model: an :class:`attnlab.GPT` (any family); run in eval mode (restored after).
        clean_ids: the clean prompt's ids.
        corrupted_ids: the corrupted prompt's ids, as many as the clean one's.
        metric: logits ``(B, T, vocab)`` → ``(B,)``, e.g.
            ``lambda lg: logit_difference(lg, good, bad)``.
        layers: the layers to scan (default all).
        position: patch only this position (negative counts from the end); ``None`` (default)
            every position.
        batch_size: patched runs a forward (default: all the heads of a layer, one forward per
            layer).

    Returns:
        :class:`PatchResult` of kind ``"heads"``, one row per scanned layer.

    Raises:
        ValueError: prompts of different lengths (both named), a layer or position out of range,
            a metric that does not return ``(B,)``.
        TypeError: a model that is not an :class:`attnlab.GPT`, ids that are not integer.

    Shape:
        clean_ids, corrupted_ids ``(T,)`` or ``(1, T)``; result ``(len(layers), H)``.

    Examples:
        >>> metric = lambda lg: logit_difference(lg, paris, rome)
        >>> result = patch_heads(model, clean, corrupted, metric)
        >>> result.top(3)  # the heads that carry the country
    """
    clean, corrupted = _prompts(model, clean_ids, corrupted_ids)
    chosen = _layers(model, layers)
    t = clean.shape[1]
    pos = None if position is None else _position("position", position, t)
    blocks: Any = model.transformer.h  # type: ignore[union-attr]
    names = [f"transformer.h.{layer}.attn.hook_z" for layer in chosen]
    heads = max(blocks[layer].attn.num_heads for layer in chosen)
    rows = _batch(batch_size, heads)
    site = torch.arange(heads, device=clean.device)

    def own_row(z: torch.Tensor) -> torch.Tensor:  # head h's z from row h mod n  (H, T, d_head)
        return z[site[: z.shape[1]] % rows, site[: z.shape[1]]]

    with _evaluating(model):
        clean_logits, acts = _record(model, clean, names, rows, own_row)
        m_clean = float(_values(metric, clean_logits)[0])
        base = _per_row(model, corrupted, metric, rows)
        patched = torch.full((len(chosen), heads), math.nan, dtype=torch.float64)
        for i, name in enumerate(names):
            z_clean = acts[name]  # (H, T, d_head)
            n = z_clean.shape[0]

            def patch_rows(z: torch.Tensor, hs: torch.Tensor, src: torch.Tensor = z_clean) -> None:
                rows = torch.arange(len(hs), device=z.device)
                if pos is None:  # z[i, h_i, :] ← z_clean[h_i, :]       (B, H, T, d_head)
                    z[rows, hs] = src[hs].to(z.dtype)
                else:  # z[i, h_i, t] ← z_clean[h_i, t]
                    z[rows, hs, pos] = src[hs, pos].to(z.dtype)

            patched[i, :n] = _scan(model, corrupted, metric, name, n, base, patch_rows)
    return PatchResult(
        "heads", patched, m_clean, float(base[0]), tuple(str(layer) for layer in chosen), pos
    )


# ----------------------------------------------------------------------------- residual stream


def patch_residual(
    model: nn.Module,
    clean_ids: torch.Tensor,
    corrupted_ids: torch.Tensor,
    metric: Metric,
    *,
    layers: Sequence[int] | None = None,
    final: bool = False,
    batch_size: int | None = None,
) -> PatchResult:
    """Patch the residual stream at one position from the clean run into the corrupted run, for
    every layer and position.

    For layer ``l`` and position ``t``, the corrupted prompt runs with the residual stream
    entering layer ``l`` (its ``hook_resid_pre``; layer 0's is the embedding) replaced at ``t``
    by the clean run's:

        h_l[t] ← h^clean_l[t]

    Every later layer reads the patched stream. With ``final`` the stream leaving the last layer
    (its ``hook_resid_post``, what the final norm reads) is patched too, as one more row
    ``"final"``: only the position the metric reads matters there.

    Args:
        model: an :class:`attnlab.GPT` (any family); run in eval mode (restored after).
        clean_ids: the clean prompt's ids.
        corrupted_ids: the corrupted prompt's ids, as many as the clean one's.
        metric: logits ``(B, T, vocab)`` → ``(B,)``.
        layers: the layers whose input is patched (default all).
        final: also patch the stream after the last layer. Default ``False``.
        batch_size: patched runs a forward (default: all the positions of a layer).

    Returns:
        :class:`PatchResult` of kind ``"positions"``, one row per layer (and ``"final"``).

    Raises:
        ValueError: prompts of different lengths (both named), a layer out of range, a metric
            that does not return ``(B,)``.
        TypeError: a model that is not an :class:`attnlab.GPT`.

    Shape:
        clean_ids, corrupted_ids ``(T,)`` or ``(1, T)``; result ``(len(layers) [+ 1], T)``.

    Examples:
        >>> result = patch_residual(model, clean, corrupted, metric, final=True)
        >>> result.normalized[:, 3]  # the country's token, layer by layer
    """
    clean, corrupted = _prompts(model, clean_ids, corrupted_ids)
    chosen = _layers(model, layers)
    n_layer = len(model.transformer.h)  # type: ignore[union-attr,arg-type]
    if not isinstance(final, bool):
        raise ArgumentTypeError(f"final must be a bool, got {type(final).__name__}")
    names = [f"transformer.h.{layer}.hook_resid_pre" for layer in chosen]
    rows = [str(layer) for layer in chosen]
    if final:
        names.append(f"transformer.h.{n_layer - 1}.hook_resid_post")
        rows.append("final")
    t = clean.shape[1]
    n = _batch(batch_size, t)
    site = torch.arange(t, device=clean.device)

    def own_row(h: torch.Tensor) -> torch.Tensor:  # position t's stream from row t mod n  (T, d)
        return h[site % n, site]

    with _evaluating(model):
        clean_logits, acts = _record(model, clean, names, n, own_row)
        m_clean = float(_values(metric, clean_logits)[0])
        base = _per_row(model, corrupted, metric, n)
        patched = torch.empty(len(names), t, dtype=torch.float64)
        for i, name in enumerate(names):
            h_clean = acts[name]  # (T, d_model)

            def patch_rows(h: torch.Tensor, ts: torch.Tensor, src: torch.Tensor = h_clean) -> None:
                # h[i, t_i] ← h_clean[t_i]                              (B, T, d_model)
                h[torch.arange(len(ts), device=h.device), ts] = src[ts].to(h.dtype)

            patched[i] = _scan(model, corrupted, metric, name, t, base, patch_rows)
    return PatchResult("positions", patched, m_clean, float(base[0]), tuple(rows))
