"""Find the module where a NaN or inf first appears.

A non-finite value spreads: one ``inf`` in one projection weight turns the attention scores of
its layer into ``nan``, then every later activation and the loss. What is worth knowing is where
it *started*. :func:`find_nonfinite` runs the model once with a forward hook on every submodule
and reports the first module, in the order the modules *finish*, whose output holds a value
that is not finite:

    origin = first module m (post-order: a child finishes before its parent)
             with  ∃ i : ¬isfinite(output(m)_i)

Post-order is what locates the cause: a ``Linear`` inside an attention layer finishes before the
layer, so an ``inf`` planted in ``transformer.h.3.attn.c_attn.weight`` is reported at
``transformer.h.3.attn.c_attn``, not at the block around it. For that module the report also says

- where: module path, module type, layer index (the first integer of the path:
  ``"transformer.h.3.attn.c_attn"`` → layer 3, ``"decoder.layers.1.cross_attn"`` → decoder layer 1);
- what: the first non-finite element in row-major order (``(batch, position, …)`` for a
  ``(B, T, …)`` activation) and its value, ``nan``, ``inf`` or ``-inf``;
- whether the module *produced* it (its inputs were all finite) or *inherited* it from the
  model's inputs;
- the first non-finite parameter or buffer of the module, if any.

A value can also be made by a module's own code between its submodules (attnlab's attention
projects ``Q, K, V`` with its own ``in_proj_weight`` before calling ``out_proj``). Then the first
module seen holding it is a submodule whose *input* was already non-finite although no module
had output one; the origin is the innermost running module whose inputs were still finite:

    maker = innermost m on the call stack with  ∀ inputs x of m : isfinite(x)

and the report locates the value in the input where it was seen (``NonFiniteOrigin.tensor``).

Outputs may be tensors, tuples/lists/dicts of them, or output dataclasses such as
:class:`~attnlab.models.outputs.CausalLMOutput`; all are looked into. Hook points
(:class:`~attnlab.nn.hooks.HookPoint`, identities) are not hooked: a listener there would make an
attention layer form its weights and so change the kernel it runs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnlab.errors import ArgumentTypeError
from attnlab.nn.hooks import HookPoint

__all__ = ["NonFiniteOrigin", "NonFiniteWatch", "find_nonfinite", "watch_nonfinite"]

# how deep to look into nested outputs/inputs (tuple of dataclass of tuple …)
_MAX_DEPTH = 4


@dataclass(frozen=True)
class NonFiniteOrigin:
    """The first module whose output holds a NaN or inf.

    Attributes:
        module: module path in ``model.named_modules()`` (``""``: the model itself).
        module_type: the module's class name, e.g. ``"Linear"``.
        layer: the layer index parsed from the path (its first integer component), or ``None``.
        stack: the path of the layer list that index belongs to (``"transformer.h"``,
            ``"decoder.layers"``), or ``None``.
        tensor: which tensor holds it: ``"output"`` (the output is a tensor), ``"output[0]"``,
            ``"output.logits"``, ``"output['key']"``; of :attr:`seen_in` when that is set, else of
            the module itself.
        seen_in: ``None`` when the value was seen in the module's own output; else the path of
            the submodule where the value the module made in its own code was first seen (its
            ``"input[0]"``, say, e.g. of ``"decoder.layers.1.cross_attn.out_proj"``).
        shape: the shape of that tensor.
        index: its first non-finite element (row-major), e.g. ``(batch, position, channel)``.
        value: ``"nan"``, ``"inf"`` or ``"-inf"``.
        count: how many elements of that tensor are non-finite.
        produced: ``True`` when the module's inputs were all finite, so the module made the value;
            ``False`` when even the model's inputs held one.
        parameter: full name of the module's first non-finite parameter or buffer, or ``None``.
        parameter_index: the first non-finite element of that parameter, or ``None``.
        parameter_value: its value (``"nan"``, ``"inf"``, ``"-inf"``), or ``None``.
    """

    module: str
    module_type: str
    layer: int | None
    stack: str | None
    tensor: str
    seen_in: str | None
    shape: tuple[int, ...]
    index: tuple[int, ...]
    value: str
    count: int
    produced: bool
    parameter: str | None = None
    parameter_index: tuple[int, ...] | None = None
    parameter_value: str | None = None

    @property
    def layer_name(self) -> str | None:
        """``"layer 3"``, ``"decoder layer 1"``, ``"encoder layer 0"``; ``None`` outside layers."""
        if self.layer is None:
            return None
        side = [w for w in (self.stack or "").split(".") if w in ("encoder", "decoder")]
        return f"{side[-1]} layer {self.layer}" if side else f"layer {self.layer}"

    def __str__(self) -> str:
        name = self.module or "the model itself"
        kind = self.module_type
        if self.layer_name is not None:
            kind += f", {self.layer_name}"
        at = f"at index {_index_str(self.index)}"
        if self.seen_in is None:
            text = f"{self.value} first appears in the {self.tensor} of {name} ({kind}) {at}"
            if self.produced:
                text += "; made there (its inputs were finite)"
            else:
                text += "; inherited from the model's inputs"
        else:
            text = (
                f"{self.value} first appears in {name} ({kind}), made by its own forward "
                f"(its inputs were finite): seen in the {self.tensor} of "
                f"{self.seen_in or 'the model itself'} {at}"
            )
        if self.parameter is not None:
            text += (
                f"; its parameter {self.parameter} holds {self.parameter_value} "
                f"at {_index_str(self.parameter_index or ())}"
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        """The origin as plain data, for JSON.

        Returns:
            The fields by name (tuples become lists), with ``layer_name`` added.
        """
        out = dataclasses.asdict(self)
        for key in ("shape", "index", "parameter_index"):
            if out[key] is not None:
                out[key] = list(out[key])
        out["layer_name"] = self.layer_name
        return out


class NonFiniteWatch:
    """What :func:`watch_nonfinite` found: :attr:`origin` (``None`` while all is finite)."""

    def __init__(self) -> None:
        self.origin: NonFiniteOrigin | None = None


@dataclass
class _Frame:
    path: str
    module: nn.Module
    inputs_finite: bool


@contextmanager
def watch_nonfinite(model: nn.Module) -> Iterator[NonFiniteWatch]:
    """Watch every forward of ``model`` inside the ``with`` block for the first NaN/inf.

    Registers a forward pre-hook and a forward hook on every submodule (hook points excepted)
    and removes them all when the block ends, also when it raises. Nothing the model computes
    changes; checking costs one pass over each module's inputs and outputs, until an origin is
    found.

    Args:
        model: any module.

    Yields:
        A :class:`NonFiniteWatch`; its ``origin`` is set when the first non-finite output appears.

    Examples:
        >>> with capture(model) as cache, watch_nonfinite(model) as watch:
        ...     model(input_ids)
        >>> report = diagnose(cache, origin=watch.origin)
    """
    if not isinstance(model, nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    watch = NonFiniteWatch()
    running: list[_Frame] = []  # the modules whose forward is running, outermost first
    handles: list[torch.utils.hooks.RemovableHandle] = []

    def pre(path: str, mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # checked before forward: an in-place op may overwrite the inputs
        finite = True if watch.origin is not None else _all_finite((args, kwargs))
        running.append(_Frame(path, mod, finite))

    def post(
        path: str, mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
    ) -> None:
        # a forward that raised and was caught inside the model left its frame behind
        while running and running[-1].module is not mod:
            running.pop()
        frame = running.pop() if running else _Frame(path, mod, True)
        if watch.origin is not None:
            return
        for label, t in _tensors(out):
            bad = ~torch.isfinite(t)
            if not bool(bad.any()):
                continue
            if frame.inputs_finite:  # made by this module (or a submodule we cannot see)
                watch.origin = _origin(path, mod, f"output{label}", t, bad, produced=True)
                return
            # An input was already non-finite, but no module finished earlier with a non-finite
            # output: the innermost running module whose inputs were finite made it in its own
            # forward. Locate it in the input where it was first seen.
            maker = next((f for f in reversed(running) if f.inputs_finite), None)
            if maker is None:  # even the model's inputs held it
                watch.origin = _origin(path, mod, f"output{label}", t, bad, produced=False)
                return
            seen = [(f"input{lab}", x) for lab, x in _inputs(args, kwargs)]
            for where, x in [*seen, (f"output{label}", t)]:
                x_bad = ~torch.isfinite(x)
                if bool(x_bad.any()):
                    watch.origin = _origin(
                        maker.path, maker.module, where, x, x_bad, produced=True, seen_in=path
                    )
                    return

    try:
        for path, module in model.named_modules():
            if isinstance(module, HookPoint):
                continue
            handles.append(
                module.register_forward_pre_hook(functools.partial(pre, path), with_kwargs=True)
            )
            handles.append(
                module.register_forward_hook(functools.partial(post, path), with_kwargs=True)
            )
        yield watch
    finally:
        for handle in handles:
            handle.remove()


def find_nonfinite(model: nn.Module, *args: Any, **kwargs: Any) -> NonFiniteOrigin | None:
    """Run ``model(*args, **kwargs)`` once under ``torch.no_grad`` and locate the first NaN/inf.

    The model runs in the mode it is in (call ``model.eval()`` first to switch dropout off).

    Args:
        model: any module (``attnlab.GPT``, ``attnlab.Transformer``, …).
        *args: positional arguments of the model's forward.
        **kwargs: keyword arguments of the model's forward.

    Returns:
        The :class:`NonFiniteOrigin` of the first module (in the order modules finish) whose
        output holds a non-finite value, or ``None`` when every output is finite.

    Examples:
        >>> with torch.no_grad():
        ...     model.transformer.h[1].attn.c_attn.weight[0, 0] = float("inf")
        >>> origin = find_nonfinite(model, input_ids)
        >>> origin.module, origin.layer
        ('transformer.h.1.attn.c_attn', 1)
    """
    with torch.no_grad(), watch_nonfinite(model) as watch:
        model(*args, **kwargs)
    return watch.origin


# ---------------------------------------------------------------------------- helpers


def _tensors(obj: Any, label: str = "", depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """The floating/complex tensors inside ``obj``, with where they sit (``"[0]"``, ``".logits"``)."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            yield label, obj
        return
    if depth >= _MAX_DEPTH:
        return
    if isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{label}[{i}]", depth + 1)
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _tensors(v, f"{label}[{k!r}]", depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name, None), f"{label}.{f.name}", depth + 1)


def _inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    for i, a in enumerate(args):
        yield from _tensors(a, f"[{i}]", 1)
    for k, v in kwargs.items():
        yield from _tensors(v, f"[{k!r}]", 1)


def _all_finite(obj: Any) -> bool:
    return all(bool(torch.isfinite(t).all()) for _, t in _tensors(obj))


def _value_name(x: float) -> str:
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _first_bad(t: torch.Tensor, bad: torch.Tensor) -> tuple[tuple[int, ...], str]:
    index = tuple(int(i) for i in bad.nonzero()[0].tolist()) if bad.dim() else ()
    x = t[index] if index else t
    if x.is_complex():
        x = x.real if not bool(torch.isfinite(x.real)) else x.imag
    return index, _value_name(float(x))


def _layer_of(path: str) -> tuple[int | None, str | None]:
    """The first integer component of a module path and the path before it."""
    parts = path.split(".") if path else []
    for i, part in enumerate(parts):
        if part.isdigit():
            return int(part), ".".join(parts[:i])
    return None, None


def _origin(
    path: str,
    mod: nn.Module,
    where: str,
    t: torch.Tensor,
    bad: torch.Tensor,
    *,
    produced: bool,
    seen_in: str | None = None,
) -> NonFiniteOrigin:
    index, value = _first_bad(t.detach(), bad)
    layer, stack = _layer_of(path)
    param: tuple[str, tuple[int, ...], str] | None = None
    # the module's own parameters first (its own code uses them), then its submodules'
    named: dict[str, torch.Tensor] = dict(mod.named_parameters(prefix=path, recurse=False))
    named.update(mod.named_buffers(prefix=path, recurse=False))
    named.update(mod.named_parameters(prefix=path))
    named.update(mod.named_buffers(prefix=path))
    for name, p in named.items():
        if not (p.is_floating_point() or p.is_complex()):
            continue
        p_bad = ~torch.isfinite(p.detach())
        if bool(p_bad.any()):
            p_index, p_value = _first_bad(p.detach(), p_bad)
            param = (name, p_index, p_value)
            break
    return NonFiniteOrigin(
        module=path,
        module_type=type(mod).__name__,
        layer=layer,
        stack=stack,
        tensor=where,
        seen_in=seen_in,
        shape=tuple(int(d) for d in t.shape),
        index=index,
        value=value,
        count=int(bad.sum()),
        produced=produced,
        parameter=None if param is None else param[0],
        parameter_index=None if param is None else param[1],
        parameter_value=None if param is None else param[2],
    )


def _index_str(index: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(i) for i in index) + ("," if len(index) == 1 else "") + ")"
