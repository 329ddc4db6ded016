"""Weights laid out in memory for fast decoding: the step :func:`attnlab.generate` takes first.

At batch 1 a decoding step is a chain of matrix-vector products, each bound by reading its
matrix once, and PyTorch's CPU kernels stream one memory layout of a matrix faster than the other,
by dtype. In fp32, ``x @ W`` over a contiguous ``(in, out)`` matrix reads the 50257 × 768 tied
embedding of GPT-2 at 27 GB/s against 16 GB/s for the rows of an ``(out, in)`` one; in bf16 the
``(out, in)`` kernel is the faster (24 against 19 GB/s), and GPT-2 small decodes at 78 against
54 tok/s (``benchmarks/generate.py``). Training matmuls run at the same speed either way.

:func:`lay_out_for_decoding` changes only the strides of each ``nn.Linear`` weight: its shape
``(out, in)``, its name, its values and the tensor objects stay, so state dicts, checkpoints
(written contiguous), optimisers and tied weights are unaffected. It is explicit — nothing
overrides ``nn.Module`` internals — and idempotent: :func:`attnlab.generate` calls it on every
call, so a model moved or cast since (``.to()``, ``.half()``) is laid out again.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["decoding_layout", "lay_out_for_decoding"]


def decoding_layout(dtype: torch.dtype) -> str:
    """The layout a dtype's matrix-vector kernel streams fastest on the CPU.

    Args:
        dtype: the weights' dtype.

    Returns:
        ``"in_out"`` (fp32, fp64: stored as GPT-2's ``Conv1D`` stores it) or ``"out_in"``
        (half types: ``nn.Linear``'s own).
    """
    return "in_out" if dtype in (torch.float32, torch.float64) else "out_in"


@torch.no_grad()
def lay_out_for_decoding(model: nn.Module) -> nn.Module:
    """Lay every ``nn.Linear`` weight of ``model`` out for decoding on the CPU (see the module's
    docstring); other devices keep their layout.

    Args:
        model: any module (a :class:`~attnlab.GPT`, a :class:`~attnlab.Transformer`).

    Returns:
        ``model``, changed in place.
    """
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            continue
        w = module.weight
        if w.device.type != "cpu" or type(w.data) is not torch.Tensor or w.dim() != 2:
            continue  # a GPU, or a tensor subclass (a DTensor shard) with its own storage
        in_out = decoding_layout(w.dtype) == "in_out"
        if in_out and w.is_contiguous():  # (a tied weight is seen twice: laid out once)
            w.data = w.data.t().contiguous().t()
        elif not in_out and not w.is_contiguous():
            w.data = w.data.contiguous()
    return model
