"""Bound what a checkpoint's ``config.json`` asks to allocate by the tensors actually stored.

A model is built from the sizes in ``config.json`` *before* its weights are loaded, so a crafted
config (a vocabulary of 10¹², a billion positions) would have the process allocate terabytes, or
die in the allocator, before the weights could say otherwise. The caller builds the model on the
``meta`` device (shapes, no memory) and :func:`check_model_fits` compares it with the header of
``model.safetensors`` (names, shapes; no tensor is read):

- every tensor the model stores must be in the file with the same shape (tied tensors once), and
  the file holds no other;
- the buffers the model *computes* instead of storing (sinusoidal and rotary position tables) may
  take at most as many bytes as the stored weights, or :data:`COMPUTED_BYTES_FLOOR`, whichever is
  more — no stored tensor bounds their length.

Only then is the model built for real.
"""

from __future__ import annotations

from pathlib import Path

from safetensors import SafetensorError, safe_open
from torch import nn

from attnlab._checks import shape_str
from attnlab.training.manifest import CheckpointError

__all__ = ["COMPUTED_BYTES_FLOOR", "check_model_fits", "read_tensor_shapes"]

#: computed buffers may always take this many bytes, however small the stored weights
COMPUTED_BYTES_FLOOR = 64 << 20


def read_tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The name and shape of every tensor of a safetensors file, from its header alone.

    Args:
        path: the ``.safetensors`` file.

    Returns:
        Tensor name → shape.

    Raises:
        CheckpointError: the file is missing or its header is unreadable.
    """
    try:
        with safe_open(str(path), framework="pt") as f:  # type: ignore[no-untyped-call]
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"cannot read the tensor shapes of {path} ({first})") from None


def check_model_fits(skeleton: nn.Module, weights: Path, *, where: str) -> None:
    """Refuse a model whose sizes the stored tensors do not bear out (see the module docstring).

    Args:
        skeleton: the model built from the config on the ``meta`` device.
        weights: the ``.safetensors`` file its weights would be loaded from.
        where: how messages name the checkpoint (``"checkpoint runs/x/checkpoints/step-…"``).

    Raises:
        CheckpointError: one line naming the first tensor that does not fit.
    """
    stored = read_tensor_shapes(weights)
    tensors = skeleton.state_dict(keep_vars=True)
    aliases: dict[int, list[str]] = {}
    for name, t in tensors.items():
        aliases.setdefault(id(t), []).append(name)
    for names in aliases.values():
        expected = tuple(tensors[names[0]].shape)
        held = [n for n in names if n in stored]
        if not held:
            raise CheckpointError(
                f"{where}: config.json describes {names[0]} of shape {shape_str(expected)}, "
                f"which {weights.name} does not hold"
            )
        for n in held:
            if stored[n] != expected:
                raise CheckpointError(
                    f"{where}: config.json gives {n} the shape {shape_str(expected)} but "
                    f"{weights.name} stores {shape_str(stored[n])}"
                )
    extra = sorted(set(stored) - set(tensors))
    if extra:
        raise CheckpointError(
            f"{where}: {weights.name} holds tensors the model of config.json lacks: "
            f"{', '.join(extra[:5])}"
        )
    computed = sum(
        b.numel() * b.element_size() for n, b in skeleton.named_buffers() if n not in tensors
    )
    limit = max(weights.stat().st_size, COMPUTED_BYTES_FLOOR)
    if computed > limit:
        raise CheckpointError(
            f"{where}: config.json asks for {computed / 2**20:.0f} MiB of computed position "
            f"tables, more than the {limit / 2**20:.0f} MiB its stored weights allow"
        )
