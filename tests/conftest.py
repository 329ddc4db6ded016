"""Shared test set-up."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# `make test` runs two pytest workers on a 2-core machine: one thread each avoids oversubscription
# (a tiny op can take 1000x longer when OpenMP threads of two processes fight for the cores).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
