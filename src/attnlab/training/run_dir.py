"""Claiming a run folder before a training writes anything into it.

:func:`claim_run_dir` is what ``attnlab train`` does first with ``--out``:

1. a folder that is not empty and is not an attnlab run is refused unless ``force`` — a user's
   own ``metrics.jsonl`` or ``attention.html`` are never deleted or overwritten by surprise;
2. the folder's :class:`~attnlab.training.run_lock.RunLock` is taken (a second training on the
   same folder stops here, with one line);
3. under the lock, the folder is checked again: ``resume`` needs a checkpoint; a fresh run
   refuses a folder that already holds one.

An *attnlab run* is a folder with a ``checkpoints`` folder or the lock file (which every training
leaves, so a run killed before its first checkpoint is still recognised as one).
"""

from __future__ import annotations

import os
from pathlib import Path

from attnlab.errors import ArgumentError
from attnlab.training.checkpoint import CHECKPOINTS, list_checkpoints, resolve_checkpoint
from attnlab.training.run_lock import LOCK_FILE, RunLock

__all__ = ["NotARunFolderError", "check_run_dir", "claim_run_dir", "is_run_dir"]


class NotARunFolderError(ArgumentError):
    """The folder holds files and is not an attnlab run, or already holds a checkpoint."""


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an attnlab run folder.

    Args:
        path: any path.

    Returns:
        ``True`` when it is a folder holding a ``checkpoints`` folder or the run's lock file.
    """
    p = Path(path)
    return (p / CHECKPOINTS).is_dir() or (p / LOCK_FILE).is_file()


def _foreign_files(p: Path) -> list[str]:
    """The entries of a folder that is not an attnlab run, sorted (none for a run)."""
    if not p.is_dir() or is_run_dir(p):
        return []
    return sorted(e.name for e in p.iterdir())


def check_run_dir(run_dir: str | os.PathLike[str], *, force: bool = False) -> None:
    """Step 1 of :func:`claim_run_dir` alone, reading only: call it before any slow set-up.

    Args:
        run_dir: the run folder to check (it need not exist).
        force: accept a folder that holds files but is not an attnlab run. Default: False.

    Raises:
        NotARunFolderError: ``run_dir`` is a file, or it holds files and is not an attnlab run
            (without ``force``).
    """
    p = Path(run_dir)
    if p.exists() and not p.is_dir():
        raise NotARunFolderError(f"--out must be a folder, got the file {p}")
    foreign = _foreign_files(p)
    if foreign and not force:
        more = len(foreign) - 4
        shown = ", ".join(foreign[:4]) + (f" and {more} more" if more > 0 else "")
        raise NotARunFolderError(
            f"--out {p} is not empty and is not an attnlab run (it holds {shown}); choose a new "
            f"or empty folder, or pass --force to train there and overwrite files of the same names"
        )


def claim_run_dir(
    run_dir: str | os.PathLike[str], *, resume: bool = False, force: bool = False
) -> RunLock:
    """Check a run folder and lock it for one training (see the module docstring).

    Args:
        run_dir: the folder (created when missing).
        resume: the training continues the folder's checkpoint.
        force: train in a non-empty folder that is not an attnlab run (files of the same names
            are overwritten).

    Returns:
        The held :class:`~attnlab.training.run_lock.RunLock`; release it when the run ends.

    Raises:
        NotARunFolderError: ``run_dir`` is a file; or it holds files and is not an attnlab run
            (without ``force``); or a fresh run finds a checkpoint there.
        RunFolderBusyError: another training holds the folder.
        CheckpointError: ``resume`` and there is no checkpoint.
    """
    p = Path(run_dir)
    check_run_dir(p, force=force)
    lock = RunLock(p).acquire()
    try:
        if resume:
            resolve_checkpoint(p)  # a one-line CheckpointError when there is nothing to resume
        elif list_checkpoints(p) or (p / CHECKPOINTS / "latest").exists():
            raise NotARunFolderError(
                f"{p} already holds a checkpoint; pass --resume to continue it or choose another "
                f"--out"
            )
    except BaseException:
        lock.release()
        raise
    return lock
