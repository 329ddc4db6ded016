"""What the families' conversions share: reading ``config.json`` fields, and taking tensors out of
a state dict so that nothing is left unread (a tensor the model does not use is an error, not a
silent drop)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from attnlab.errors import ArgumentError
from attnlab.nn.rope import RopeScaling

__all__ = ["TensorTaker", "activation_of", "hf_activation", "positive", "rope_fields"]

#: Hugging Face ``hidden_act`` → attnlab's ``activation``
_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
}
_BACK = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}


def positive(config: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """A positive number of ``config.json`` (or ``default`` when absent).

    Raises:
        ValueError: it is missing with no default, or not a positive number.
    """
    value = config.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ArgumentError(f"config.json's {name} must be a positive number, got {value!r}")
    return value


def activation_of(name: object) -> str:
    """attnlab's activation of Hugging Face's ``hidden_act``."""
    if name not in _ACTIVATIONS:
        raise ArgumentError(f"hidden_act must be one of {', '.join(_ACTIVATIONS)}, got {name!r}")
    return _ACTIVATIONS[str(name)]


def hf_activation(name: str) -> str:
    """Hugging Face's ``hidden_act`` of attnlab's activation."""
    return _BACK[name]


def rope_fields(config: Mapping[str, Any], d_head: int) -> dict[str, Any]:
    """The rotary fields of a :class:`~attnlab.models.config.GPTConfig` from ``config.json``:
    the base, the rotated dimensions and the scaling, read from the ``rope_parameters`` of
    ``transformers`` 5 or the ``rope_theta`` / ``rope_scaling`` / ``partial_rotary_factor`` /
    ``rotary_pct`` / ``rotary_emb_base`` keys of older files.

    Returns:
        ``rope_base``, ``rotary_dim`` (``None`` for the whole head), ``rope_scaling``,
        ``rope_pairing="halves"`` (Hugging Face's ``rotate_half``).
    """
    params = config.get("rope_parameters") or {}
    if not isinstance(params, Mapping):
        raise ArgumentError(f"config.json's rope_parameters must be a dict, got {params!r}")
    theta = params.get("rope_theta", config.get("rope_theta", config.get("rotary_emb_base")))
    base = 10000.0 if theta is None else positive({"rope_theta": theta}, "rope_theta")
    fraction = params.get(
        "partial_rotary_factor", config.get("partial_rotary_factor", config.get("rotary_pct", 1.0))
    )
    fraction = positive({"partial_rotary_factor": fraction}, "partial_rotary_factor", 1.0)
    rotary = int(d_head * fraction)
    if rotary % 2 or rotary > d_head:
        raise ArgumentError(
            f"partial_rotary_factor {fraction} of head_dim {d_head} gives {rotary} rotated "
            "dimensions; they must be even and at most head_dim"
        )
    scaling = RopeScaling.from_dict(config.get("rope_scaling") or params or None)
    return {
        "rope_base": float(base),
        "rotary_dim": None if rotary == d_head else rotary,
        "rope_scaling": scaling,
        "rope_pairing": "halves",
    }


def hf_rope(config: Any) -> dict[str, Any]:
    """``config.json``'s rotary keys of a config (both the old keys and ``rope_parameters``)."""
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_base}
    if config.rope_scaling is not None:
        params.update(config.rope_scaling.to_dict())
    if config.rotary_dim is not None:
        params["partial_rotary_factor"] = config.rotary_dim / config.d_head
    out: dict[str, Any] = {"rope_theta": config.rope_base, "rope_parameters": params}
    if config.rope_scaling is not None:
        out["rope_scaling"] = config.rope_scaling.to_dict()
    return out


class TensorTaker:
    """A state dict read once: :meth:`take` removes what it returns, :meth:`done` refuses what
    is left (other than the names ``ignore`` matches: buffers older ``transformers`` saved).

    Args:
        state: the state dict.
        where: how to name it in errors (a file, "the model").
        ignore: name endings that may be left.
    """

    def __init__(
        self, state: Mapping[str, torch.Tensor], where: str, ignore: Iterable[str] = ()
    ) -> None:
        self.left = dict(state)
        self.where = where
        self.ignore = tuple(ignore)

    def take(self, name: str) -> torch.Tensor:
        """The tensor ``name`` (an error naming it when absent)."""
        if name not in self.left:
            raise ArgumentError(f"{self.where} has no tensor {name!r}")
        return self.left.pop(name)

    def maybe(self, name: str) -> torch.Tensor | None:
        """The tensor ``name``, or ``None`` when absent."""
        return self.left.pop(name, None)

    def move(
        self,
        out: dict[str, torch.Tensor],
        pairs: Iterable[tuple[str, str]],
        source: str,
        target: str,
    ) -> None:
        """Rename each pair's weight and bias, those present: ``source + a + ".weight"`` becomes
        ``target + b + ".weight"`` in ``out`` for each ``(a, b)`` (a bias only where there is one).

        Args:
            out: the state dict being built.
            pairs: ``(name here, name there)``.
            source: the prefix here (a layer's).
            target: the prefix there.
        """
        for here, there in pairs:
            for kind in ("weight", "bias"):
                t = self.maybe(f"{source}{here}.{kind}")
                if t is not None:
                    out[f"{target}{there}.{kind}"] = t

    def done(self) -> None:
        """Refuse tensors nobody took."""
        left = sorted(n for n in self.left if not n.endswith(self.ignore))
        if left:
            more = f" and {len(left) - 5} more" if len(left) > 5 else ""
            raise ArgumentError(
                f"{self.where} has tensors this model does not use: {', '.join(left[:5])}{more}"
            )
