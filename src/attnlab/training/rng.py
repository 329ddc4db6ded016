"""Seeding and capturing the random number generators (python, numpy, torch, CUDA).

A resumed run restores these states, so dropout masks and any sampling continue exactly as in a
run that never stopped.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from attnlab._checks import check_seed

__all__ = ["get_rng_state", "seed_everything", "set_rng_state"]


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy's global generator and torch (CPU and CUDA).

    Args:
        seed: an int in [0, 2**32).
    """
    check_seed("seed", seed)
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - the global generator is what we seed
    torch.manual_seed(seed)


def get_rng_state() -> dict[str, Any]:
    """The states of every generator, as a tree :func:`save_checkpoint` can store.

    Returns:
        ``{"python", "numpy", "torch"}`` states, and ``"cuda"`` when CUDA is initialised.
    """
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the states returned by :func:`get_rng_state`.

    Args:
        state: what :func:`get_rng_state` returned (possibly through a checkpoint).
    """
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = state["numpy"]
    np.random.set_state(tuple(np_state))  # noqa: NPY002
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = list(state["cuda"])
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
