"""Shared test set-up."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# `make test` runs two pytest workers on a 2-core machine: one thread each avoids oversubscription
# (a tiny op can take 1000x longer when OpenMP threads of two processes fight for the cores).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def shared_data(*parts: str) -> Path:
    """A file of ../shared/data, or skip the test with the reason when it is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data not found: {path} (tests read it from ../shared/data)")
    return path
