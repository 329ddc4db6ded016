"""Graceful stop: signals set a flag while entered, the previous handlers come back after."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from types import FrameType

import pytest

from attnlab.training import stop as stop_module
from attnlab.training.stop import GracefulStop


def _mine(signum: int, frame: FrameType | None) -> None:
    raise AssertionError(f"the previous handler ran for signal {signum}")


@pytest.fixture
def previous_handlers() -> Iterator[None]:
    """SIGINT and SIGTERM handled by ``_mine`` during the test, the real handlers after."""
    saved = {s: signal.getsignal(s) for s in GracefulStop.SIGNALS}
    for s in saved:
        signal.signal(s, _mine)
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


@pytest.mark.usefixtures("previous_handlers")
def test_handlers_installed_while_entered_and_restored_after() -> None:
    stop = GracefulStop()
    with stop:
        assert all(signal.getsignal(s) is not _mine for s in GracefulStop.SIGNALS)
    assert all(signal.getsignal(s) is _mine for s in GracefulStop.SIGNALS)


@pytest.mark.usefixtures("previous_handlers")
def test_handlers_restored_after_an_exception() -> None:
    with pytest.raises(RuntimeError, match="boom"), GracefulStop():
        raise RuntimeError("boom")
    assert all(signal.getsignal(s) is _mine for s in GracefulStop.SIGNALS)


@pytest.mark.usefixtures("previous_handlers")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_requests_a_stop(signum: int) -> None:
    stop = GracefulStop()
    with stop:
        assert not stop.requested
        signal.raise_signal(signum)
        assert stop.requested


@pytest.mark.usefixtures("previous_handlers")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_aborts_unless_it_is_the_first_delivered_twice(
    signum: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 32: a second SIGTERM only logged again, so a SIGTERM'd run waited for its step
    now = [100.0]
    monkeypatch.setattr(stop_module.time, "monotonic", lambda: now[0])
    with GracefulStop() as stop:
        try:
            signal.raise_signal(signum)
            now[0] += 0.5  # the same signal, forwarded by torchrun
            signal.raise_signal(signum)
        except KeyboardInterrupt:
            pytest.fail("a first signal, or the same one delivered twice, must not abort")
        assert stop.requested
        now[0] += 1.0
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signum)


def test_request_outside_the_main_thread_installs_nothing() -> None:
    before = {s: signal.getsignal(s) for s in GracefulStop.SIGNALS}
    seen: dict[int, object] = {}
    stop = GracefulStop()

    def run() -> None:
        with stop:
            seen.update({s: signal.getsignal(s) for s in GracefulStop.SIGNALS})
            stop.request()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert stop.requested
    assert seen == before
    assert {s: signal.getsignal(s) for s in GracefulStop.SIGNALS} == before
