"""How ``make test`` hands the tests to its two workers (``tests/conftest.py``): the tests that
share a fixture of module scope go to one worker together, so that the fixture (SmolLM2 against
transformers, a compiled model, a trained run) is built once rather than once per worker."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import conftest


@pytest.fixture(scope="module")
def shared() -> int:
    return 1


def test_uses_the_module_fixture(shared: int) -> None:
    assert shared == 1


def test_uses_nothing_shared(tmp_path: Path) -> None:
    assert tmp_path.is_dir()


def _items(request: pytest.FixtureRequest) -> dict[str, pytest.Item]:
    mine = {i.name: i for i in request.session.items if i.path == Path(__file__)}
    return {n: mine[n] for n in ("test_uses_the_module_fixture", "test_uses_nothing_shared")}


class _Node:
    """What the scheduler asks of a worker: take tests, shut down."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices

    def shutdown(self) -> None:
        self.shutting_down = True


def test_a_module_fixtures_tests_are_one_unit_on_one_worker(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = _items(request)
    module = "tests/test_scheduling.py"
    assert conftest._group(items["test_uses_the_module_fixture"]) == module
    assert conftest._group(items["test_uses_nothing_shared"]) is None

    # a worker's collection: the groups land in the run's folder, the grouped tests first
    worker = SimpleNamespace(workerinput={"attnlab_run": str(tmp_path), "workerid": "gw0"})
    order = [items["test_uses_nothing_shared"], items["test_uses_the_module_fixture"]]
    conftest.pytest_collection_modifyitems(worker, order)  # type: ignore[arg-type]
    assert order[0].name == "test_uses_the_module_fixture"
    written = json.loads((tmp_path / "groups" / "gw0.json").read_text(encoding="utf-8"))
    assert written == {order[0].nodeid: module}

    # the controller: two more tests of the group and two alone, over two workers
    group = [f"{module}::test_{i}" for i in range(3)]
    written.update({n: module for n in group})
    (tmp_path / "groups" / "gw0.json").write_text(json.dumps(written), encoding="utf-8")
    config = request.config
    monkeypatch.setattr(config.option, "dist", "loadgroup")
    monkeypatch.setattr(config.option, "tx", ["2*popen"])
    monkeypatch.setitem(config.stash, conftest._RUN_FOLDER, str(tmp_path))  # type: ignore[arg-type]
    scheduler: Any = conftest.pytest_xdist_make_scheduler(config, None)
    collection = [order[0].nodeid, "tests/x.py::test_a", *group, "tests/x.py::test_b"]
    nodes = [_Node("gw0"), _Node("gw1")]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    ran = [{collection[i] for i in node.sent} for node in nodes]
    together = {order[0].nodeid, *group}
    assert together <= ran[0] or together <= ran[1], ran
    assert set().union(*ran) == set(collection)
