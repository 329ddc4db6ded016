"""Graceful stop: SIGINT (Ctrl-C) and SIGTERM ask a run to stop after its current step.

::

    stop = GracefulStop()
    with stop:                      # handlers installed for the run
        while not done:
            train_one_step()
            if stop.requested:      # set by a signal or by stop.request()
                save_checkpoint()
                break
                                    # previous handlers back, also after an exception

The first signal only sets :attr:`GracefulStop.requested` and logs a warning. A second signal,
Ctrl-C or SIGTERM (a scheduler or ``kill`` asking again), aborts at once (``KeyboardInterrupt``:
``attnlab: interrupted``, exit 130, the last saved checkpoint kept), unless it comes within a
second of the first: that is the same signal delivered twice (the terminal, and ``torchrun``
forwarding it to its workers). A step is bounded (``--grad-accum`` is capped,
:data:`attnlab.tasks.train_options.CAPS`), so the first signal is answered within a step.
Python runs signal handlers in the main thread only, so in another thread entering installs
nothing and the object is a flag that :meth:`GracefulStop.request` sets.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType
from typing import Any

__all__ = ["GracefulStop"]

logger = logging.getLogger(__name__)

#: seconds within which a second signal is taken for the first one delivered again
SAME_SIGNAL_WINDOW = 1.0


class GracefulStop:
    """A stop flag that SIGINT/SIGTERM set while the object is entered (one object per run).

    Attributes:
        requested: a stop was asked for, by a signal or by :meth:`request`.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self._signals = 0
        self._first_signal = 0.0
        self._previous: dict[int, Any] = {}

    def request(self) -> None:
        """Ask for a stop, as a signal does (usable from any thread)."""
        self.requested = True

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.getsignal(s) for s in self.SIGNALS}
            for s in self._previous:
                signal.signal(s, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self._signals and now - self._first_signal > SAME_SIGNAL_WINDOW:
            raise KeyboardInterrupt  # asked twice: a SIGTERM as much as a Ctrl-C
        if not self._signals:
            self._first_signal = now
        self._signals += 1
        logger.warning(
            "stopping after this step and saving a checkpoint (Ctrl-C or SIGTERM again aborts)"
        )
        self.requested = True
