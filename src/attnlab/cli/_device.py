"""``--device``: a torch device this machine has, checked when the options are parsed."""

from __future__ import annotations

import argparse

from attnlab._checks import find_device

__all__ = ["device"]


def device(text: str) -> str:
    """An argparse ``type``: ``text`` when it names a device of this machine that holds values.

    ``cpu``, ``cuda`` / ``cuda:N`` (when CUDA is available and has GPU N), ``mps`` (when
    available), other device types torch knows except ``meta`` (:func:`attnlab._checks.find_device`).

    Raises:
        argparse.ArgumentTypeError: torch knows no such device, this machine lacks it, or it is
            ``meta`` (tensors without values: nothing a command could compute or show).
    """
    dev = find_device(text)
    if isinstance(dev, str):
        raise argparse.ArgumentTypeError(f"{text!r}: {dev}")
    if dev.type == "meta":
        raise argparse.ArgumentTypeError(
            "'meta' holds shapes without values, so no command can run there; use cpu, cuda or mps"
        )
    return text
