"""The frequencies of rotary position embeddings, and their scalings for longer contexts.

    θ_i = base^{-2i / r},   i = 0 … r/2 − 1          (Su et al. 2021; ``r`` the rotated dimensions)

A scaling stretches the wavelengths ``λ_i = 2π / θ_i`` so that a model reads positions beyond
the context it was trained on:

* ``linear`` (position interpolation, Chen et al. 2023): ``θ_i / factor``;
* ``llama3`` (Meta's Llama 3.1): long wavelengths ``λ_i > L / low_freq_factor`` are divided by
  ``factor``, short ones ``λ_i < L / high_freq_factor`` kept, and the band between interpolated
  with ``s = (L / λ_i − low_freq_factor) / (high_freq_factor − low_freq_factor)``:
  ``θ'_i = (1 − s) · θ_i / factor + s · θ_i``, ``L`` the original context.

They are computed in float32, in the order Hugging Face's ``modeling_rope_utils`` computes them,
so that a converted model turns its queries and keys by the same numbers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, cast

import torch

from attnlab.errors import ArgumentError, ArgumentTypeError

__all__ = ["PAIRINGS", "ROPE_TYPES", "RopeScaling", "rope_frequencies"]

#: how dimensions are paired for the rotation (see :class:`~attnlab.nn.positional.RotaryEmbedding`)
PAIRINGS = ("interleaved", "halves")
#: the scalings attnlab implements (Hugging Face's ``rope_type``)
ROPE_TYPES = ("linear", "llama3")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """A scaling of the rotary frequencies (Hugging Face's ``rope_scaling`` / ``rope_parameters``).

    Args:
        rope_type: ``"linear"`` or ``"llama3"``.
        factor: the stretch of the wavelengths (> 0).
        low_freq_factor: ``llama3`` only: wavelengths above ``L / low_freq_factor`` are scaled.
        high_freq_factor: ``llama3`` only: wavelengths below ``L / high_freq_factor`` are kept.
        original_max_position_embeddings: ``llama3`` only: ``L``, the context trained on.

    Examples:
        >>> RopeScaling("linear", 2.0).to_dict()
        {'rope_type': 'linear', 'factor': 2.0}
    """

    rope_type: str
    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ArgumentError(
                f"rope_type must be one of {ROPE_TYPES} (or 'default', no scaling), got "
                f"{self.rope_type!r}"
            )
        _positive("factor", self.factor)
        llama3 = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        for name in llama3:
            value = getattr(self, name)
            if self.rope_type == "llama3":
                _positive(name, value)
            elif value is not None:
                raise ArgumentError(f"{name} is for rope_type 'llama3', got it with 'linear'")
        if self.rope_type == "llama3" and self.high_freq_factor == self.low_freq_factor:
            raise ArgumentError(
                f"high_freq_factor must differ from low_freq_factor, got both {self.low_freq_factor}"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RopeScaling | None:
        """A scaling from Hugging Face's dict (``rope_scaling`` or ``rope_parameters``).

        Args:
            data: ``{"rope_type": ..., "factor": ...}`` (the old key ``"type"`` is read too;
                ``rope_theta`` and ``partial_rotary_factor`` are ignored), or ``None``.

        Returns:
            The scaling, or ``None`` for ``None`` and ``rope_type == "default"``.

        Raises:
            ValueError: an unknown ``rope_type`` or a missing or bad parameter.
        """
        if data is None:
            return None
        if not isinstance(data, Mapping):
            raise ArgumentTypeError(f"rope_scaling must be a dict, got {type(data).__name__}")
        kind = data.get("rope_type", data.get("type", "default"))
        if kind == "default":
            return None
        names = [f.name for f in dataclasses.fields(cls)][1:]
        if "factor" not in data:
            raise ArgumentError(f"rope_scaling of type {kind!r} needs a 'factor', got {dict(data)}")
        return cls(kind, **{n: data[n] for n in names if data.get(n) is not None})

    def to_dict(self) -> dict[str, Any]:
        """Hugging Face's dict: ``rope_type`` and the parameters that are set.

        Returns:
            ``{"rope_type": ..., "factor": ..., ...}``.
        """
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def _positive(name: str, value: object) -> None:
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if not number or not 0 < value < math.inf:  # type: ignore[operator]
        raise ArgumentError(f"{name} must be a finite positive number, got {value!r}")
    if name == "original_max_position_embeddings" and not isinstance(value, int):
        raise ArgumentError(f"{name} must be an integer (a context length), got {value!r}")


def rope_frequencies(
    rotary_dim: int, base: float, scaling: RopeScaling | None = None
) -> torch.Tensor:
    """The rotary frequencies ``θ_i`` (see the module docstring), in float32.

    Args:
        rotary_dim: the rotated dimensions ``r`` (even).
        base: the base (Hugging Face's ``rope_theta``).
        scaling: a :class:`RopeScaling`, or ``None``.

    Returns:
        ``θ_0 … θ_{r/2 − 1}``.

    Shape:
        ``(rotary_dim / 2,)``.
    """
    # θ_i = 1 / base^{2i / r}, float32 as Hugging Face computes it
    inv_freq = 1.0 / (
        base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim)
    )
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    # llama3: λ_i = 2π / θ_i, scaled by band
    factor = scaling.factor
    # set for llama3 (checked in __post_init__)
    low, high = cast(float, scaling.low_freq_factor), cast(float, scaling.high_freq_factor)
    old = cast(int, scaling.original_max_position_embeddings)
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    s = (old / wavelen - low) / (high - low)
    smoothed = (1 - s) * scaled / factor + s * scaled
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)
