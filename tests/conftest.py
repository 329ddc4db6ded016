"""Shared test set-up."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.nn.backends.flex import allow_recompiles

REPO = Path(__file__).resolve().parents[1]

_RUN_FOLDER = pytest.StashKey[str]()
_RUN_OWNED = pytest.StashKey[bool]()
_CACHE_PREVIOUS = pytest.StashKey[str | None]()

# the devices a device-clean test runs on: the CPU always, CUDA when there is one (its cases carry
# the `cuda` marker, so `pytest -m cuda` is the GPU suite); without CUDA they are not generated
CUDA = torch.cuda.is_available()
DEVICES = [pytest.param("cpu", id="cpu")] + (
    [pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)] if CUDA else []
)

# inductor's first compile in a process with an empty cache folder (a fresh clone, CI) checks
# that the compiler builds and loads AVX2/AVX-512 code: a g++ build of ATen's vector headers and a
# child Python per instruction set, ~11 s of CPU before the first kernel. The suite tells inductor
# that this machine's instruction set works (as TORCHINDUCTOR_VEC_ISA_OK=1 does; it still picks
# the set by what the CPU reports), so the same kernels compile without the probe. Set before
# torch._inductor is first imported (lazily, by the first compile); the environment's own value wins.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

# `make test` runs two pytest workers on a 2-core machine: one thread each avoids oversubscription
# (a tiny op can take 1000x longer when OpenMP threads of two processes fight for the cores).
torch.set_num_threads(1)

# the flex backend compiles FlexAttention once per shape, mask and dtype; the suite asks for far more
# than PyTorch's default of 8 recompiles before it runs the function eagerly, which would test
# the unfused fallback instead (pyproject turns its warning into an error)
allow_recompiles(256)


def _group(item: pytest.Item) -> str | None:
    """The unit of scheduling a test belongs to beyond itself: its module when it uses a fixture
    of module scope (a model, a trained run, a parsed file), else ``None``."""
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if defs and defs[-1].scope == "module":
            return item.nodeid.split("::")[0]
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order in which ``make test`` hands the tests out: the ``slow`` ones first (the
    notebooks above all), so that they spread over the two workers; then the tests that share a
    fixture of module scope; then the many short tests, one at a time, to even out the end.

    Under ``--dist loadgroup`` each module's tests that share such a fixture go to one worker as
    one unit (:class:`_ModuleFixtureScheduling`), so that one worker builds the fixture rather
    than each (SmolLM2 against transformers, its tokenizer, the compiled models, …). The worker
    writes its groups into the run's folder, where the controller's scheduler reads them."""
    groups = {item.nodeid: g for item in items if (g := _group(item)) is not None}
    items.sort(key=lambda i: (i.get_closest_marker("slow") is None, i.nodeid not in groups))
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        out = Path(worker["attnlab_run"]) / "groups" / f"{worker['workerid']}.json"
        out.parent.mkdir(exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups), encoding="utf-8")
        tmp.replace(out)  # whole before the worker reports its collection to the controller


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, in the controller
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: pytest-xdist's own grouping (an ``@group`` suffix written into the
    node id) no longer takes effect under pytest 9 (pytest-xdist issue 1386); this scheduler
    groups by what the workers wrote instead."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    run = Path(config.stash[_RUN_FOLDER])

    class _ModuleFixtureScheduling(LoadScopeScheduling):  # type: ignore[misc]
        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # first asked once every worker has collected
                self._groups = {}
                for path in sorted((run / "groups").glob("*.json")):
                    self._groups.update(json.loads(path.read_text(encoding="utf-8")))
            return self._groups.get(nodeid, nodeid)

    return _ModuleFixtureScheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """This run's folder (deleted at its end), made by the controller under pytest-xdist and
    shared by its workers (:func:`pytest_configure_node`): the scheduling groups, and the cache
    of dequantised GGUF weights (``attnlab.models.weight_cache``, ``$ATTNLAB_CACHE``). The suite
    never writes into the user's ``~/.cache`` (SmolLM2's entry is 540 MB) and no run relies on
    what an earlier run left; the bundled model is dequantised once per run rather than once per
    worker: the loads after the first, in any worker, notebook kernel or command the tests
    start, read the entry (the cache writes an entry whole: ``os.replace``)."""
    run = getattr(config, "workerinput", {}).get("attnlab_run")
    if run is None:  # the controller, or a run without xdist
        run = tempfile.mkdtemp(prefix="attnlab-test-run-")
        config.stash[_RUN_OWNED] = True
    config.stash[_RUN_FOLDER] = run
    config.stash[_CACHE_PREVIOUS] = os.environ.get("ATTNLAB_CACHE")
    os.environ["ATTNLAB_CACHE"] = str(Path(run) / "cache")


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's: the controller sets up each worker
def pytest_configure_node(node: Any) -> None:
    node.workerinput["attnlab_run"] = node.config.stash[_RUN_FOLDER]


def pytest_unconfigure(config: pytest.Config) -> None:
    previous = config.stash.get(_CACHE_PREVIOUS, None)
    if previous is None:
        os.environ.pop("ATTNLAB_CACHE", None)
    else:
        os.environ["ATTNLAB_CACHE"] = previous
    if config.stash.get(_RUN_OWNED, False):  # the controller ends after its workers
        shutil.rmtree(config.stash[_RUN_FOLDER], ignore_errors=True)


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
