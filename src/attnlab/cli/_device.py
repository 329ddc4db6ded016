"""``--device``: a torch device this machine has, checked when the options are parsed."""

from __future__ import annotations

import argparse

import torch

__all__ = ["device"]


def device(text: str) -> str:
    """An argparse ``type``: ``text`` when it names a device of this machine.

    ``cpu``, ``cuda`` / ``cuda:N`` (when CUDA is available and has GPU N), ``mps`` (when
    available); other device types torch knows are passed on as they are.

    Raises:
        argparse.ArgumentTypeError: torch knows no such device, or this machine lacks it.
    """
    try:
        dev = torch.device(text)
    except RuntimeError:  # torch's error for a string that names no device type
        raise argparse.ArgumentTypeError(
            f"expected a torch device such as 'cpu', 'cuda' or 'cuda:1', got {text!r}"
        ) from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text!r}: CUDA is not available on this machine")
        if dev.index is not None and dev.index >= count:
            raise argparse.ArgumentTypeError(
                f"{text!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
            )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: MPS is not available on this machine")
    return text
