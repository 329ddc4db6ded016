"""Switching heads off: head masks, head importance and pruning curves.

After Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?". Every head's
output is multiplied by a mask variable ``ξ_h`` before the output projection (§2.2),

    MultiHead(x) = Σ_h ξ_h · Att_h(x) W^O_h,

so ``ξ_h = 0`` removes head ``h``. Two ways to score how much a trained model needs a head:

- **ablation** (§3): the loss with that head alone removed, minus the loss of the full model;
- **gradient** (§4.1): the expected sensitivity of the loss to the mask variable at ``ξ = 1``,

      I_h = E_x | ∂L(x) / ∂ξ_h |,

  one backward pass for all heads instead of one forward pass per head.

Heads are then pruned least important first, cumulatively, and the loss (and any metric, e.g.
exact-match accuracy of greedy decoding) is measured after each step (§4.2, Figure 3). The order
comes from one estimate on the full model (:meth:`HeadImportance.order`), or from
:func:`pruning_order`, which estimates again after every few heads with those removed, as the
authors' code and Hugging Face's ``run_bertology.py`` do: heads that are each redundant given the
others are not all removed together.

    importance = head_importance(model, batches)
    curve = pruning_curve(model, batches, importance.order("gradient"), metric=accuracy)
    with masked_heads(model, importance.masks(importance.order()[:6])):
        ids = attnlab.generate(model, src, max_new_tokens=10)     # KV cache, heads removed

Heads are named ``(path, head)`` with ``path`` the attention module's name in
``model.named_modules()`` (``"transformer.h.0.attn"``, ``"encoder.layers.1.self_attn"``,
``"decoder.layers.0.cross_attn"``), as in :func:`attnlab.inspect.capture`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from attnlab._checks import check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.capture import attention_modules
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.resolved_call import ResolvedCall

__all__ = [
    "HeadImportance",
    "PruningCurve",
    "head_importance",
    "masked_heads",
    "pruning_curve",
    "pruning_order",
]

LossFn = Callable[[nn.Module, Any], torch.Tensor]
Head = tuple[str, int]
ImportanceKind = Literal["ablation", "gradient"]


# ----------------------------------------------------------------------------- masked_heads


@contextmanager
def masked_heads(model: nn.Module, masks: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """Run ``model`` with some heads switched off (or scaled) inside the ``with`` block.

    Every call of a named attention module multiplies its mask into the call's ``head_mask``
    (:attr:`~attnlab.nn.multihead.MultiHeadAttention.head_ablations`, the layer's own state: no
    forward argument is rewritten), until the block exits — also when it raises. Because the hook acts on each call, decoding with a KV cache
    (:func:`attnlab.generate`) runs with the heads removed at every step.

    Args:
        model: any module with :class:`~attnlab.nn.multihead.MultiHeadAttention` layers.
        masks: attention module path (as in ``model.named_modules()``, e.g.
            ``"decoder.layers.1.cross_attn"``) → ``ξ`` of shape ``(H,)``, floating or bool;
            1 keeps a head, 0 removes its output.

    Raises:
        ValueError: a path that is not an attention module (the known ones are listed), a mask
            of the wrong shape, or a NaN/inf entry.
        TypeError: a mask that is not a floating or boolean tensor.

    Shape:
        each mask ``(H,)``, ``H`` the heads of that layer.

    Examples:
        >>> off = torch.tensor([1.0, 0.0, 1.0, 1.0])
        >>> with masked_heads(model, {"decoder.layers.0.cross_attn": off}):
        ...     out = model(src, tgt_in)
    """
    checked = _check_masks(model, masks)
    saved: list[tuple[MultiHeadAttention, tuple[torch.Tensor, ...] | None]] = []
    try:
        for module, xi in checked.values():
            saved.append((module, module.__dict__.get("head_ablations")))
            module.head_ablations = (*module.head_ablations, xi)  # every call multiplies it in
        yield
    finally:
        for module, before in reversed(saved):
            if before is None:
                del module.head_ablations  # back to the class's: none
            else:
                module.head_ablations = before


def _check_masks(
    model: nn.Module, masks: object
) -> dict[str, tuple[MultiHeadAttention, torch.Tensor]]:
    if not isinstance(masks, Mapping):
        raise ArgumentTypeError(
            f"masks must map attention module paths to (H,) tensors, got {type(masks).__name__}"
        )
    modules = attention_modules(model)
    checked: dict[str, tuple[MultiHeadAttention, torch.Tensor]] = {}
    for path, mask in masks.items():
        if path not in modules:
            known = ", ".join(repr(n) for n in modules) or "none"
            raise ArgumentError(
                f"masks names {path!r}, which is not an attention module of "
                f"{type(model).__name__}; known: {known}"
            )
        name = f"masks[{path!r}]"
        m = check_tensor(name, mask)
        if m.dtype != torch.bool and not m.is_floating_point():
            raise ArgumentTypeError(
                f"{name} must be floating (1.0 keeps a head, 0.0 removes it) or bool, got dtype "
                f"{m.dtype}; convert it with .float()"
            )
        h = modules[path].num_heads
        if m.shape != (h,):
            raise ArgumentError(f"{name} must have shape (H,) = ({h},), got {shape_str(m.shape)}")
        if m.is_floating_point() and not bool(torch.isfinite(m.detach()).all()):
            raise ArgumentError(f"{name} must be finite, got NaN or inf entries")
        checked[path] = (modules[path], m)
    return checked


# ----------------------------------------------------------------------------- default losses


def default_loss_fn(model: nn.Module) -> LossFn:
    """The loss :func:`head_importance` uses when none is given.

    - :class:`attnlab.Transformer`: a batch with ``.src``, ``.tgt_in``, ``.targets`` (an
      :class:`attnlab.data.batching.Seq2SeqBatch`) → ``model(src, tgt_in, targets=targets).loss``
      (the training loss, label smoothing included).
    - :class:`attnlab.GPT`: a ``(B, T)`` tensor of ids, or a mapping / object with ``input_ids``
      (and optionally ``attention_mask``) → ``model(ids, attention_mask, labels=ids).loss``,
      padding ignored.

    Raises:
        TypeError: any other model (pass ``loss_fn``).
    """
    from attnlab.models.gpt import GPT
    from attnlab.models.transformer import Transformer

    if isinstance(model, Transformer):
        return _seq2seq_loss
    if isinstance(model, GPT):
        return _lm_loss
    raise ArgumentTypeError(
        f"loss_fn must be given for a {type(model).__name__} (a default exists for "
        f"attnlab.Transformer and attnlab.GPT only)"
    )


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _seq2seq_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    if not all(hasattr(batch, a) for a in ("src", "tgt_in", "targets")):
        raise ArgumentTypeError(
            "batches must have .src, .tgt_in and .targets (a Seq2SeqBatch) for the default loss "
            f"of a Transformer, got {type(batch).__name__}; pass loss_fn for other batches"
        )
    dev = _device(model)
    out = model(batch.src.to(dev), batch.tgt_in.to(dev), targets=batch.targets.to(dev))
    return out.loss  # type: ignore[no-any-return]


def _lm_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    mask = None
    if isinstance(batch, torch.Tensor):
        ids = batch
    elif isinstance(batch, Mapping) and "input_ids" in batch:
        ids, mask = batch["input_ids"], batch.get("attention_mask")
    elif hasattr(batch, "input_ids"):
        ids, mask = batch.input_ids, getattr(batch, "attention_mask", None)
    else:
        raise ArgumentTypeError(
            "batches must be (B, T) token-id tensors, or have input_ids, for the default loss "
            f"of a GPT, got {type(batch).__name__}; pass loss_fn for other batches"
        )
    dev = _device(model)
    ids = ids.to(dev)
    labels = ids
    if mask is not None:
        mask = mask.to(dev)
        labels = ids.masked_fill(~mask.bool(), -100)  # padding predicts nothing
    return model(ids, mask, labels=labels).loss  # type: ignore[no-any-return]


def _scalar(value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ArgumentTypeError(f"loss_fn must return a scalar tensor, got {type(value).__name__}")
    if value.numel() != 1:
        raise ArgumentError(
            f"loss_fn must return a scalar tensor, got shape {shape_str(value.shape)}"
        )
    return value.reshape(())


# ----------------------------------------------------------------------------- helpers


@contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode inside; every submodule's own training flag restored afterwards."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


def _batches(batches: Iterable[Any]) -> list[Any]:
    if isinstance(batches, torch.Tensor):
        raise ArgumentTypeError(
            "batches must be an iterable of batches (e.g. a list of tensors), got one tensor; "
            "wrap it: [ids]"
        )
    items = list(batches)
    if not items:
        raise ArgumentError("batches must hold at least one batch, got none")
    return items


def _mean_loss(model: nn.Module, loss_fn: LossFn, batches: list[Any]) -> float:
    return math.fsum(float(_scalar(loss_fn(model, b))) for b in batches) / len(batches)


def _trace(
    model: nn.Module, loss_fn: LossFn, batch: Any
) -> tuple[list[str], list[str], torch.Tensor]:
    """The attention layers that run, in execution order, their kinds, and the batch's loss."""
    modules = attention_modules(model)
    if not modules:
        raise ArgumentError(f"model ({type(model).__name__}) has no MultiHeadAttention layer")
    order: dict[str, str] = {}
    handles = []
    try:
        for path, module in modules.items():

            def on_call(mod: nn.Module, args: Any, call: ResolvedCall, path: str = path) -> None:
                order.setdefault(path, "cross" if call.cross else "self")  # as the layer ran it

            handles.append(module.hook_call.register_forward_hook(on_call))
        loss = _scalar(loss_fn(model, batch))
    finally:
        for handle in handles:
            handle.remove()
    if not order:
        raise ArgumentError("loss_fn ran no attention layer of the model")
    return list(order), list(order.values()), loss


def _masks_without(heads: Iterable[Head], num_heads: Mapping[str, int]) -> dict[str, torch.Tensor]:
    """``(H,)`` masks with the given heads set to 0, for the layers they touch."""
    masks: dict[str, torch.Tensor] = {}
    for path, h in heads:
        if path not in masks:
            masks[path] = torch.ones(num_heads[path])
        masks[path][h] = 0.0
    return masks


# ----------------------------------------------------------------------------- importance


@dataclass(frozen=True, eq=False)
class HeadImportance:
    """How much a model needs each head (Michel et al. 2019).

    Attributes:
        layers: attention module paths, in the order the layers run.
        kinds: ``"self"`` or ``"cross"`` for each layer.
        base_loss: the mean loss over the batches with every head kept (but ``pruned``).
        ablation: ``(L, H)`` float64: the mean loss with that one head removed, minus
            ``base_loss`` (larger = more important; negative = the model is better without it).
        gradient: ``(L, H)`` float64: ``I_h = E_x |∂L(x)/∂ξ_h|`` at ``ξ = 1``, with ``x`` one
            batch (the absolute value is taken per batch, then averaged over the batches). When
            ``normalized``, each layer's row is divided by its L2 norm, as the paper does (§4.1,
            after Molchanov et al. 2017) so that scores compare across layers.
        normalized: whether ``gradient`` is normalised per layer.
        num_batches: how many batches the estimates average.
        pruned: heads that were already removed while measuring (``base_loss`` is the loss
            without them); their scores are NaN and :meth:`order` leaves them out.

    Shape:
        ablation and gradient ``(L, H)``: ``L`` attention layers (in ``layers`` order), ``H`` heads.
    """

    layers: tuple[str, ...]
    kinds: tuple[str, ...]
    base_loss: float
    ablation: torch.Tensor
    gradient: torch.Tensor
    normalized: bool
    num_batches: int
    pruned: tuple[Head, ...] = ()

    @property
    def num_heads(self) -> int:
        """Heads per layer ``H``."""
        return int(self.ablation.shape[1])

    def heads(self) -> list[Head]:
        """Every head of the model.

        Returns:
            ``(layer path, head index)`` pairs, layers in execution order (``pruned`` included).
        """
        return [(path, h) for path in self.layers for h in range(self.num_heads)]

    def scores(self, by: ImportanceKind = "ablation") -> torch.Tensor:
        """The scores of one kind.

        Args:
            by: ``"ablation"`` (default) or ``"gradient"``.

        Returns:
            :attr:`ablation` or :attr:`gradient` (float64; NaN for pruned heads).

        Raises:
            ValueError: ``by`` is another string.

        Shape:
            ``(L, H)``.
        """
        if by not in ("ablation", "gradient"):
            raise ArgumentError(f"by must be 'ablation' or 'gradient', got {by!r}")
        return self.ablation if by == "ablation" else self.gradient

    def order(self, by: ImportanceKind = "ablation") -> list[Head]:
        """Every head not yet ``pruned``, least important first.

        Args:
            by: the scores to sort by, ``"ablation"`` (default) or ``"gradient"``.

        Returns:
            ``(layer path, head index)`` pairs by increasing score (ties: earlier layer, then lower
            head index).
        """
        s = self.scores(by).tolist()
        keyed = [
            (s[li][h], li, h)
            for li in range(len(self.layers))
            for h in range(self.num_heads)
            if not math.isnan(s[li][h])
        ]
        return [(self.layers[li], h) for _, li, h in sorted(keyed)]

    def masks(self, pruned: Iterable[Head]) -> dict[str, torch.Tensor]:
        """Masks for :func:`masked_heads` that remove the ``pruned`` heads and keep the others.

        Args:
            pruned: ``(layer path, head index)`` pairs to remove.

        Returns:
            Layer path → ``ξ`` (1.0 keeps a head, 0.0 removes it), for each layer ``pruned``
            touches.

        Raises:
            ValueError: a layer path that is not in :attr:`layers` or a head index out of range.

        Shape:
            each mask ``(H,)``.
        """
        heads = _check_heads(list(pruned), dict.fromkeys(self.layers, self.num_heads), "pruned")
        return _masks_without(heads, dict.fromkeys(self.layers, self.num_heads))

    def to_dict(self) -> dict[str, Any]:
        """The result as plain data, for JSON.

        Returns:
            The attributes (and ``num_heads``) with the scores as nested lists of floats, ``None``
            for the NaN scores of pruned heads, and heads as ``[path, head]`` lists.
        """

        def rows(t: torch.Tensor) -> list[list[float | None]]:
            return [[None if math.isnan(v) else v for v in row] for row in t.tolist()]

        return {
            "layers": list(self.layers),
            "kinds": list(self.kinds),
            "num_heads": self.num_heads,
            "base_loss": self.base_loss,
            "ablation": rows(self.ablation),
            "gradient": rows(self.gradient),
            "normalized": self.normalized,
            "num_batches": self.num_batches,
            "pruned": [[path, h] for path, h in self.pruned],
        }


def head_importance(
    model: nn.Module,
    batches: Iterable[Any],
    loss_fn: LossFn | None = None,
    *,
    normalize: bool = True,
    pruned: Iterable[Head] = (),
) -> HeadImportance:
    """Score every attention head by ablation and by the gradient of its mask (Michel et al. 2019).

    Ablation (§3): for each head, the mean loss over ``batches`` with that head alone removed,
    minus the full model's — ``1 + (number of heads)`` passes over the batches, in eval mode under
    ``torch.no_grad``. Gradient (§4.1): ``I_h = E_x |∂L(x)/∂ξ_h|`` at ``ξ = 1``, one backward pass
    per batch (eval mode, no dropout), computed with ``torch.autograd.grad`` so the model's
    ``.grad`` fields are left alone. The model's training flags are restored afterwards.

    Args:
        model: an :class:`attnlab.Transformer`, an :class:`attnlab.GPT`, or any module with
            :class:`~attnlab.nn.multihead.MultiHeadAttention` layers (then give ``loss_fn``).
        batches: an iterable of batches (read into a list: it is passed over several times).
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``; default see :func:`default_loss_fn`.
        normalize: divide each layer's gradient scores by their L2 norm (the paper's choice).
            Default ``True``.
        pruned: ``(layer path, head)`` pairs removed during every measurement (the model as it
            is after pruning them); they score NaN. Default none.

    Returns:
        A :class:`HeadImportance`.

    Raises:
        ValueError: no batches, no attention layer ran, layers with different head counts, or a
            bad ``pruned`` entry.
        TypeError: no default loss for the model, or ``loss_fn`` returned no scalar tensor.

    Examples:
        >>> imp = head_importance(model, [task.batch(i, 64) for i in range(4)])
        >>> imp.order("gradient")[:3]
        [('encoder.layers.1.self_attn', 2), ('decoder.layers.0.self_attn', 0), ...]
    """
    return _importance(model, batches, loss_fn, normalize=normalize, pruned=pruned)


def _importance(
    model: nn.Module,
    batches: Iterable[Any],
    loss_fn: LossFn | None,
    *,
    normalize: bool,
    pruned: Iterable[Head],
    ablation: bool = True,
    gradient: bool = True,
) -> HeadImportance:
    items = _batches(batches)
    loss = loss_fn if loss_fn is not None else default_loss_fn(model)
    if not callable(loss):
        raise ArgumentTypeError(f"loss_fn must be callable, got {type(loss).__name__}")
    modules = attention_modules(model)
    removed = _check_heads(list(pruned), {p: m.num_heads for p, m in modules.items()}, "pruned")
    with _evaluating(model):
        with torch.no_grad():
            layers, kinds, _ = _trace(model, loss, items[0])
            counts = {modules[p].num_heads for p in layers}
            if len(counts) > 1:
                raise ArgumentError(
                    f"the attention layers have different head counts {sorted(counts)}; "
                    "head_importance needs one H for all layers"
                )
            num_heads = counts.pop()
            per_layer = dict.fromkeys(layers, num_heads)
            off = [(p, h) for p, h in removed if p in per_layer]
            with masked_heads(model, _masks_without(off, per_layer)):
                base = _mean_loss(model, loss, items)
            ablated = torch.full((len(layers), num_heads), math.nan, dtype=torch.float64)
            for li, path in enumerate(layers):
                for h in range(num_heads):
                    if not ablation or (path, h) in off:
                        continue
                    with masked_heads(model, _masks_without([*off, (path, h)], per_layer)):
                        ablated[li, h] = _mean_loss(model, loss, items) - base
        if gradient:
            grads = _gradient_importance(model, loss, items, layers, num_heads, off)
        else:
            grads = torch.full((len(layers), num_heads), math.nan, dtype=torch.float64)
    for path, h in off:
        grads[layers.index(path), h] = math.nan
    if normalize:
        # Michel et al. §4.1: "we normalize the importance scores by layer (using the ℓ2 norm)"
        norm = grads.nan_to_num(0.0).norm(dim=1, keepdim=True)
        grads = grads / norm.clamp_min(1e-20)
    return HeadImportance(
        layers=tuple(layers),
        kinds=tuple(kinds),
        base_loss=base,
        ablation=ablated,
        gradient=grads,
        normalized=normalize,
        num_batches=len(items),
        pruned=tuple(removed),
    )


def _gradient_importance(
    model: nn.Module,
    loss_fn: LossFn,
    batches: list[Any],
    layers: list[str],
    num_heads: int,
    pruned: list[Head],
) -> torch.Tensor:
    # I_h = E_x |∂L(x)/∂ξ_h| at ξ = 1 (Michel et al. 2019, §4.1, their eq. for I_h); pruned heads
    # sit at ξ = 0
    p = next(model.parameters(), None)
    dtype = p.dtype if p is not None and p.is_floating_point() else torch.float32
    device = _device(model)
    total = torch.zeros(len(layers), num_heads, dtype=torch.float64)
    with torch.enable_grad():
        for batch in batches:
            xi = {path: torch.ones(num_heads, dtype=dtype, device=device) for path in layers}
            for path, h in pruned:
                xi[path][h] = 0.0
            for t in xi.values():
                t.requires_grad_(True)
            with masked_heads(model, xi):
                loss = _scalar(loss_fn(model, batch))
            if not loss.requires_grad:
                raise ArgumentError("loss_fn must return a loss that depends on the model's heads")
            grads = torch.autograd.grad(loss, list(xi.values()), allow_unused=True)
            for li, g in enumerate(grads):
                if g is not None:
                    total[li] += g.detach().abs().double().cpu()
    return total / len(batches)


def pruning_order(
    model: nn.Module,
    batches: Iterable[Any],
    loss_fn: LossFn | None = None,
    *,
    by: ImportanceKind = "ablation",
    heads_per_step: int = 1,
    max_heads: int | None = None,
    normalize: bool = True,
) -> list[Head]:
    """An order to prune heads in, estimating importance again as heads are removed.

    Repeatedly: score the remaining heads with :func:`head_importance` on the model with the
    heads chosen so far removed, and choose the ``heads_per_step`` least important (as the
    authors' code and Hugging Face's ``run_bertology.py`` prune). Unlike one estimate on the full
    model, this sees that heads which can each go while the others stay may not all go together.

    Args:
        model: as for :func:`head_importance`.
        batches: an iterable of batches (read into a list).
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``; default see :func:`default_loss_fn`.
        by: ``"ablation"`` (a pass over the batches per remaining head, each step) or
            ``"gradient"`` (one backward pass per batch, each step). Default ``"ablation"``.
        heads_per_step: heads chosen per estimate (more is faster, less adaptive). Default 1.
        max_heads: stop after this many heads. Default all of them.
        normalize: normalise gradient scores per layer (see :func:`head_importance`).

    Returns:
        ``(layer path, head)`` pairs, the first to prune first; feed it to :func:`pruning_curve`
        or take a prefix for :meth:`HeadImportance.masks`.
    """
    if by not in ("ablation", "gradient"):
        raise ArgumentError(f"by must be 'ablation' or 'gradient', got {by!r}")
    if (
        isinstance(heads_per_step, bool)
        or not isinstance(heads_per_step, int)
        or heads_per_step < 1
    ):
        raise ArgumentError(f"heads_per_step must be a positive int, got {heads_per_step!r}")
    if max_heads is not None and (
        isinstance(max_heads, bool) or not isinstance(max_heads, int) or max_heads < 0
    ):
        raise ArgumentError(f"max_heads must be a non-negative int, got {max_heads!r}")
    items = _batches(batches)
    chosen: list[Head] = []
    limit = max_heads
    while limit is None or len(chosen) < limit:
        imp = _importance(
            model, items, loss_fn, normalize=normalize, pruned=chosen,
            ablation=by == "ablation", gradient=by == "gradient",
        )  # fmt: skip
        remaining = imp.order(by)
        if limit is None or limit > len(chosen) + len(remaining):
            limit = len(chosen) + len(remaining)
        chosen += remaining[: min(heads_per_step, limit - len(chosen))]
    return chosen


# ----------------------------------------------------------------------------- pruning


@dataclass(frozen=True)
class PruningCurve:
    """Loss (and a metric) after removing 0, 1, 2, … heads cumulatively (Michel et al. §4.2).

    Attributes:
        order: the heads, in the order they were removed.
        num_pruned: ``(0, 1, …, len(order))``.
        loss: the mean loss over the batches after removing the first ``num_pruned[i]`` heads.
        metric: ``metric(model)`` at each step, or ``None`` when no metric was given.
        total_heads: all heads of the model's attention layers (for the fraction pruned).
    """

    order: tuple[Head, ...]
    num_pruned: tuple[int, ...]
    loss: tuple[float, ...]
    metric: tuple[float, ...] | None
    total_heads: int

    def to_dict(self) -> dict[str, Any]:
        """The curve as plain data, for JSON.

        Returns:
            The attributes as lists (heads as ``[path, head]`` lists; ``metric`` may be ``None``).
        """
        return {
            "order": [[path, h] for path, h in self.order],
            "num_pruned": list(self.num_pruned),
            "loss": list(self.loss),
            "metric": None if self.metric is None else list(self.metric),
            "total_heads": self.total_heads,
        }


def pruning_curve(
    model: nn.Module,
    batches: Iterable[Any],
    order: Sequence[Head],
    *,
    loss_fn: LossFn | None = None,
    metric: Callable[[nn.Module], float] | None = None,
    max_heads: int | None = None,
) -> PruningCurve:
    """Remove heads one by one in ``order`` (cumulatively) and measure after each removal.

    Step ``n`` runs under :func:`masked_heads` with the first ``n`` heads of ``order`` removed,
    in eval mode: the mean loss over ``batches`` (under ``torch.no_grad``) and, when given,
    ``metric(model)`` (which may decode, e.g. exact-match accuracy of greedy decoding with
    :func:`attnlab.generate`). The model's training flags are restored afterwards.

    Args:
        model: as for :func:`head_importance`.
        batches: an iterable of batches (read into a list).
        order: ``(layer path, head)`` pairs, e.g. ``importance.order("gradient")``.
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``; default see :func:`default_loss_fn`.
        metric: ``metric(model) -> float``, measured at every step. Default none.
        max_heads: stop after removing this many heads. Default all of ``order``.

    Returns:
        A :class:`PruningCurve` with ``len(order) + 1`` points (or ``max_heads + 1``).

    Raises:
        ValueError: an unknown layer path, a head index out of range, a head named twice, or no
            batches.
    """
    items = _batches(batches)
    loss = loss_fn if loss_fn is not None else default_loss_fn(model)
    modules = attention_modules(model)
    num_heads = {path: m.num_heads for path, m in modules.items()}
    heads = _check_heads(list(order), num_heads)
    if max_heads is not None:
        if isinstance(max_heads, bool) or not isinstance(max_heads, int) or max_heads < 0:
            raise ArgumentError(f"max_heads must be a non-negative int, got {max_heads!r}")
        heads = heads[:max_heads]
    losses: list[float] = []
    metrics: list[float] = []
    with _evaluating(model):
        for n in range(len(heads) + 1):
            with masked_heads(model, _masks_without(heads[:n], num_heads)):
                with torch.no_grad():
                    losses.append(_mean_loss(model, loss, items))
                if metric is not None:
                    metrics.append(float(metric(model)))
    return PruningCurve(
        order=tuple(heads),
        num_pruned=tuple(range(len(heads) + 1)),
        loss=tuple(losses),
        metric=tuple(metrics) if metric is not None else None,
        total_heads=sum(num_heads.values()),
    )


def _check_heads(heads: list[Any], num_heads: Mapping[str, int], name: str = "order") -> list[Head]:
    out: list[Head] = []
    seen: set[Head] = set()
    for item in heads:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ArgumentTypeError(f"{name} must hold (layer path, head) pairs, got {item!r}")
        path, h = item[0], item[1]
        if path not in num_heads:
            known = ", ".join(repr(n) for n in num_heads)
            raise ArgumentError(f"{name} names {path!r}, not an attention module; known: {known}")
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < num_heads[path]:
            raise ArgumentError(
                f"{name} has head {h!r} for {path!r}, which must lie in [0, {num_heads[path]})"
            )
        if (path, h) in seen:
            raise ArgumentError(f"{name} names head {h} of {path!r} twice")
        seen.add((path, h))
        out.append((path, h))
    return out
