"""Shared test set-up."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from attnlab.nn.backends.flex import allow_recompiles

REPO = Path(__file__).resolve().parents[1]

# the devices a device-clean test runs on: the CPU always, CUDA when there is one (its cases carry
# the `cuda` marker, so `pytest -m cuda` is the GPU suite); without CUDA they are not generated
CUDA = torch.cuda.is_available()
DEVICES = [pytest.param("cpu", id="cpu")] + (
    [pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)] if CUDA else []
)

# `make test` runs two pytest workers on a 2-core machine: one thread each avoids oversubscription
# (a tiny op can take 1000x longer when OpenMP threads of two processes fight for the cores).
torch.set_num_threads(1)

# the flex backend compiles FlexAttention once per shape, mask and dtype; the suite asks for far more
# than PyTorch's default of 8 recompiles before it runs the function eagerly, which would test
# the unfused fallback instead (pyproject turns its warning into an error)
allow_recompiles(256)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``slow`` tests (the notebooks above all) first. ``make test`` hands tests out one at a
    time (``--maxschedchunk 1``), so the slow ones spread over the workers while the many short
    tests are left to even out the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: else as found


@pytest.fixture(autouse=True, scope="session")
def _weight_cache() -> Iterator[None]:
    """The cache of dequantised GGUF weights (``attnlab.models.weight_cache``) in a folder of
    this session, deleted at its end: the suite never writes into the user's ``~/.cache``
    (SmolLM2's entry is 540 MB), the loads of the bundled model after the first one in a
    process read the entry, and no run relies on what an earlier run left."""
    folder = tempfile.mkdtemp(prefix="attnlab-test-cache-")
    previous = os.environ.get("ATTNLAB_CACHE")
    os.environ["ATTNLAB_CACHE"] = folder
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("ATTNLAB_CACHE", None)
        else:
            os.environ["ATTNLAB_CACHE"] = previous
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def concrete(device: str) -> torch.device:
    """The device as its tensors report it: ``cuda:0`` for ``"cuda"`` (``torch.device("cuda")``
    is not equal to a tensor's ``cuda:0``), ``cpu`` for ``"cpu"``."""
    return torch.empty(0, device=device).device


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    """Each device present, as its tensors report it (the CUDA case marked ``cuda``)."""
    return concrete(request.param)
