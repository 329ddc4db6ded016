"""GGML tensor types to float32: the block layouts of llama.cpp's quantisation, in torch.

A GGUF tensor is stored row by row (its innermost dimension first in the file's shape list);
a quantised row is a run of fixed-size *blocks*, each holding ``block_size`` weights. The
layouts read here natively, vectorised over every block of a tensor at once (all little-endian):

```
F32    4 bytes per weight                                  w = x
F16    2 bytes per weight (IEEE half)                       w = float(x)
BF16   2 bytes per weight (the high half of a float32)      w = float(x)

Q8_0   34 bytes → 32 weights
       ┌─────────┬────────────────────────────┐
       │ d : f16 │ q[0..31] : int8            │         w[i] = d · q[i]
       └─────────┴────────────────────────────┘

Q4_0   18 bytes → 32 weights
       ┌─────────┬────────────────────────────┐
       │ d : f16 │ b[0..15] : uint8           │         q[i]      = b[i] & 0x0F   (i < 16)
       └─────────┴────────────────────────────┘         q[i + 16] = b[i] >> 4
                                                        w[i] = d · (q[i] − 8)

Q4_1   20 bytes → 32 weights
       ┌─────────┬─────────┬──────────────────┐
       │ d : f16 │ m : f16 │ b[0..15] : uint8 │         q as in Q4_0
       └─────────┴─────────┴──────────────────┘         w[i] = d · q[i] + m
```

The arithmetic is float32, in the order of the equations (``d · q`` rounded, then ``+ m``), so
the result equals llama.cpp's ``gguf.quants.dequantize`` bit for bit. Every other type that
``gguf.quants`` can dequantise (the K-quants ``Q2_K``…``Q6_K``, ``Q5_0``, ``Q5_1``, the
``IQ*`` types, …) goes through it (numpy) — slower, still exact; a type it cannot read either
(``Q8_1``, ``Q8_K``, the integer types) is an :class:`~attnlab.errors.ArgumentError` naming the
tensor and the type.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from attnlab.errors import ArgumentError

__all__ = ["NATIVE_TYPES", "dequantize", "ggml_type_name", "tensor_nbytes"]

# ggml type ids (ggml.h, enum ggml_type) → (name, weights per block, bytes per block)
_LAYOUTS: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34),
    30: ("BF16", 1, 2),
}
NATIVE_TYPES = tuple(name for name, _, _ in _LAYOUTS.values())
"""The type names :func:`dequantize` reads in torch (the others go through ``gguf.quants``)."""


def ggml_type_name(ggml_type: int) -> str:
    """The name of a ggml type id (``8`` → ``"Q8_0"``), or ``"type N"`` when unknown.

    Args:
        ggml_type: the type id a GGUF tensor records.

    Returns:
        The type's name.
    """
    try:
        import gguf

        return str(gguf.GGMLQuantizationType(int(ggml_type)).name)
    except (ImportError, ValueError):
        layout = _LAYOUTS.get(int(ggml_type))
        return layout[0] if layout else f"type {int(ggml_type)}"


def _block_layout(ggml_type: int, what: str) -> tuple[int, int]:
    """``(weights per block, bytes per block)`` of a type, from this table or ``gguf``'s."""
    layout = _LAYOUTS.get(int(ggml_type))
    if layout is not None:
        return layout[1], layout[2]
    try:
        import gguf

        block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(ggml_type))]
    except (ImportError, ValueError, KeyError):
        raise ArgumentError(f"{what}: unknown ggml type id {int(ggml_type)}") from None
    return int(block), int(nbytes)


def tensor_nbytes(ggml_type: int, shape: Sequence[int], what: str = "tensor") -> int:
    """Bytes a tensor of ``shape`` (PyTorch order, innermost last) takes in ``ggml_type``.

    Args:
        ggml_type: the ggml type id (``gguf.GGMLQuantizationType``).
        shape: the tensor's shape, outermost first.
        what: how error messages name the tensor.

    Returns:
        The byte count.

    Raises:
        ArgumentError: the innermost dimension is not a whole number of blocks.
    """
    block, nbytes = _block_layout(ggml_type, what)
    inner = int(shape[-1]) if len(shape) else 1
    if inner % block:
        raise ArgumentError(
            f"{what}: a {ggml_type_name(ggml_type)} row must hold a multiple of {block} "
            f"weights, got shape {tuple(int(s) for s in shape)}"
        )
    return int(np.prod([int(s) for s in shape], dtype=np.int64)) // block * nbytes


def _as_bytes(data: Any) -> torch.Tensor:
    """``data`` (numpy array, memmap, torch tensor or bytes) as a flat uint8 tensor, no copy."""
    if isinstance(data, torch.Tensor):
        return data.detach().contiguous().reshape(-1).view(torch.uint8)
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = np.frombuffer(data, dtype=np.uint8)
    array = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    with warnings.catch_warnings():
        # a memory-mapped GGUF is read-only; these bytes are only read, never written
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def _half(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The f16 at byte ``start`` of each block, as a float32 column ``(n_blocks, 1)``."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """16 packed bytes per block → 32 values 0..15: low nibbles first, then high nibbles.

    Shape:
        packed: ``(n_blocks, 16)`` uint8 → ``(n_blocks, 32)`` uint8.
    """
    return torch.cat((packed & 0x0F, packed >> 4), dim=1)  # (n_blocks, 32)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    # w = d · q, q int8
    q = blocks[:, 2:].contiguous().view(torch.int8).float()  # (n_blocks, 32)
    return q.mul_(_half(blocks, 0))


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    # w = d · (q − 8), q the nibbles (low: elements 0..15, high: 16..31)
    q = _nibbles(blocks[:, 2:]).to(torch.int8).sub_(8).float()  # (n_blocks, 32)
    return q.mul_(_half(blocks, 0))


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    # w = d · q + m (two roundings, as llama.cpp: no fused multiply-add)
    q = _nibbles(blocks[:, 4:]).float()  # (n_blocks, 32)
    return q.mul_(_half(blocks, 0)).add_(_half(blocks, 2))


_BLOCK_DECODERS = {2: _q4_0, 3: _q4_1, 8: _q8_0}


def dequantize(
    data: Any, ggml_type: int, shape: Sequence[int], *, name: str = "tensor"
) -> torch.Tensor:
    """A GGUF tensor's stored bytes as a float32 tensor of PyTorch shape ``shape``.

    Args:
        data: the stored bytes (a numpy array or memmap of any dtype, a torch tensor, or
            ``bytes``), exactly ``tensor_nbytes(ggml_type, shape)`` of them.
        ggml_type: the ggml type id (``int(gguf.GGMLQuantizationType.Q4_1)`` …).
        shape: the shape to return, **outermost first** (PyTorch's order: ``(out, in)`` for a
            linear weight). GGUF lists dimensions innermost first: pass them reversed.
        name: how error messages name the tensor.

    Returns:
        A new float32 tensor (it never shares memory with ``data``).

    Raises:
        ArgumentError: the byte count does not match ``shape``, or neither this module nor
            ``gguf.quants`` can dequantise the type.

    Shape:
        ``shape``; ``data`` is one row of blocks per innermost row, rows in C order.
    """
    shape = tuple(int(s) for s in shape)
    ggml_type = int(ggml_type)
    nbytes = tensor_nbytes(ggml_type, shape, name)
    raw = _as_bytes(data)
    if raw.numel() != nbytes:
        raise ArgumentError(
            f"{name}: {ggml_type_name(ggml_type)} of shape {shape} takes {nbytes} bytes, "
            f"got {raw.numel()}"
        )
    if ggml_type == 0:  # F32
        return raw.view(torch.float32).clone().reshape(shape)
    if ggml_type == 1:  # F16
        return raw.view(torch.float16).float().reshape(shape)
    if ggml_type == 30:  # BF16
        return raw.view(torch.bfloat16).float().reshape(shape)
    decoder = _BLOCK_DECODERS.get(ggml_type)
    if decoder is not None:
        _, block_bytes = _LAYOUTS[ggml_type][1:]
        return decoder(raw.view(-1, block_bytes)).reshape(shape)
    return _dequantize_with_gguf(raw, ggml_type, shape, name)


def _dequantize_with_gguf(
    raw: torch.Tensor, ggml_type: int, shape: tuple[int, ...], name: str
) -> torch.Tensor:
    """The types this module does not decode itself, through ``gguf.quants`` (numpy)."""
    try:
        import gguf
        from gguf import quants
    except ImportError:  # pragma: no cover - a dev dependency
        raise ArgumentError(
            f"{name}: {ggml_type_name(ggml_type)} needs the gguf package: pip install 'attnlab[gguf]'"
        ) from None
    qtype = gguf.GGMLQuantizationType(ggml_type)
    if qtype not in quants._type_traits:
        raise ArgumentError(
            f"{name}: cannot dequantise ggml type {qtype.name}; attnlab reads "
            f"{', '.join(NATIVE_TYPES)} and what gguf.quants supports "
            f"({', '.join(sorted(t.name for t in quants._type_traits))})"
        )
    _, block_bytes = _block_layout(ggml_type, name)
    rows = raw.numpy().reshape(-1, shape[-1] // _block_layout(ggml_type, name)[0] * block_bytes)
    with np.errstate(invalid="ignore", over="ignore"):  # inf/NaN scales stay inf/NaN, silently
        values = quants.dequantize(rows, qtype)  # (rows, inner) float32
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(shape)
