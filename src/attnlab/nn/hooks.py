"""Hook points: named identity modules where activations can be captured (after TransformerLens).

A :class:`HookPoint` returns its input unchanged, so inspection never changes what forward
computes. Forward hooks and pre-hooks registered on the point itself run; global module hooks
(``torch.nn.modules.module.register_module_forward_hook``) are not called for hook points. Modules that can produce something expensive only for an observer (attention weights)
ask ``hook.active`` first.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["HookPoint", "hook_points"]


class HookPoint(nn.Module):
    """An identity module: ``hook(x) is x``. Register forward hooks on it to see ``x``.

    Examples:
        >>> hp = HookPoint()
        >>> seen = []
        >>> handle = hp.register_forward_hook(lambda mod, args, out: seen.append(out))
        >>> _ = hp(torch.ones(2)); handle.remove()
    """

    def forward(self, x: Any) -> Any:
        """Return ``x`` unchanged (what the hooks registered on this point see).

        Args:
            x: any tensor (an attention layer's ``hook_call`` passes its
                :class:`~attnlab.nn.resolved_call.ResolvedCall`).

        Returns:
            ``x`` itself, not a copy.

        Shape:
            any; the output has the input's shape.
        """
        return x

    def __call__(self, x: Any) -> Any:
        # what no one listens to costs one check, not nn.Module's call machinery: a model has
        # ~10 hook points a layer, and a decoding step passes every one of them
        if self._forward_hooks or self._forward_pre_hooks:
            return super().__call__(x)
        return x

    @property
    def active(self) -> bool:
        """Whether anything is listening (a forward hook is registered)."""
        return bool(self._forward_hooks) or bool(self._forward_pre_hooks)


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of ``model`` under its one name, the module path (TransformerLens's
    ``hook_dict``): ``"transformer.h.0.attn.hook_rot_q"``, ``"decoder.layers.1.cross_attn.hook_z"``, …

    Args:
        model: any module; its hook points are found by ``named_modules()``.

    Returns:
        ``{module path: hook point}``, in ``named_modules()`` order.

    Examples:
        >>> names = hook_points(attnlab.GPT(attnlab.GPTConfig(n_layer=1, n_embd=32, n_head=4)))
        >>> "transformer.h.0.attn.hook_weights" in names
        True
    """
    return {name: m for name, m in model.named_modules() if isinstance(m, HookPoint)}
