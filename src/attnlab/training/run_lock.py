"""One training per run folder: an exclusive lock held for the whole run.

Two trainings writing the same folder would each overwrite the other's checkpoints and
interleave their ``metrics.jsonl``. :class:`RunLock` takes an exclusive ``flock`` on the file
``RUN/attnlab.lock`` and writes the holder's process id into it::

    with RunLock(run_dir):      # RunFolderBusyError when another process holds it
        train(...)

The operating system releases a ``flock`` when its process ends, however it ends, so a lock can
never outlive its holder. A run that ended normally empties the file; a file that still names a
process when the lock is taken was left by a process that died (killed, or its machine went
down): the lock is taken over, with a warning naming that process. The file stays in the folder
(deleting it would race with a process about to lock it); it also marks the folder as an attnlab
run (:mod:`attnlab.training.run_dir`).

On platforms without ``fcntl`` (Windows), the lock is a file created with ``O_EXCL`` and removed
on release; a lock file whose process is gone is taken over.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from types import TracebackType

from attnlab.errors import ArgumentError
from attnlab.training.files import naming

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_FILE", "RunFolderBusyError", "RunLock"]

logger = logging.getLogger(__name__)

#: the lock file's name inside the run folder
LOCK_FILE = "attnlab.lock"


class RunFolderBusyError(ArgumentError):
    """Another live process holds the run folder's lock."""


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - another user's process
        return True
    except OSError:  # pragma: no cover
        return False
    return True


def _read_pid(fd: int) -> int | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 64).decode("ascii", errors="replace").strip()
    return int(text) if text.isdigit() else None


class RunLock:
    """An exclusive lock on a run folder (see the module docstring).

    Args:
        run_dir: the run folder (created if missing).

    Attributes:
        path: the lock file.
        previous: the process id a stale lock named when it was taken over, else ``None``.
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.previous: int | None = None
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Take the lock, or raise at once.

        Returns:
            ``self``, holding the lock.

        Raises:
            RunFolderBusyError: another live process holds it (one line naming its pid).
            OSError: the folder cannot be created or written (read-only, full disk…).
        """
        if self._fd is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fcntl is None:  # pragma: no cover - Windows
            self._acquire_exclusive_create()
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise RunFolderBusyError(self._busy_message(holder)) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            stale = _read_pid(fd)
            if stale is not None and stale != os.getpid():
                self.previous = stale
                logger.warning(
                    "taking over the stale lock %s of process %d, which ended without releasing it",
                    self.path,
                    stale,
                )
            with naming(self.path):  # a full disk: the errno alone would name no file
                self._write_pid(fd)
        except BaseException:
            os.close(fd)  # closing releases the flock
            raise
        self._fd = fd
        return self

    def _busy_message(self, holder: int | None) -> str:
        who = f"process {holder}" if holder is not None else "another process"
        return (
            f"run folder {self.path.parent} is in use by another training ({who} holds "
            f"{self.path}); wait for it to end or choose another --out"
        )

    @staticmethod
    def _write_pid(fd: int) -> None:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        os.fsync(fd)

    def _acquire_exclusive_create(self) -> None:  # pragma: no cover - Windows
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                with open(self.path, "rb") as f:
                    text = f.read(64).decode("ascii", errors="replace").strip()
                holder = int(text) if text.isdigit() else None
                if holder is not None and _pid_alive(holder):
                    raise RunFolderBusyError(self._busy_message(holder)) from None
                logger.warning("taking over the stale lock %s of process %s", self.path, holder)
                self.previous = holder
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
                continue
            self._write_pid(fd)
            self._fd = fd
            return
        raise RunFolderBusyError(self._busy_message(None))

    def release(self) -> None:
        """Give the lock back (the file stays, emptied). Releasing twice is harmless."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:  # pragma: no cover - a read-only or full disk: the lock goes all the same
            pass
        finally:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            if fcntl is None:  # pragma: no cover - Windows
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
