"""Set-up of the attention tests: the blockwise backend's written-out tiles as a backend of their own.

``backend="blockwise"`` computes its tiles with PyTorch's fused CPU kernel where it can
(:mod:`attnlab.nn.backends.fused_tiles`); ``"blockwise_python"`` is the same backend with the
online softmax written out in PyTorch (``tile_kernel="python"``), so that every grid that runs
``"blockwise"`` can check both ways of computing a tile.
"""

from __future__ import annotations

import functools

import pytest

from attnlab.nn.backends import ATTENTION_BACKENDS
from attnlab.nn.backends.blockwise import blockwise_attention


@pytest.fixture(autouse=True)
def _python_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    python = functools.partial(blockwise_attention, tile_kernel="python")
    monkeypatch.setitem(ATTENTION_BACKENDS, "blockwise_python", python)
