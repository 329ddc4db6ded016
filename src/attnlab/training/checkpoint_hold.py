"""Reading a checkpoint while a training rotates them: the reader holds the step it reads.

A training saving with ``keep_last`` deletes old checkpoints as it goes; a reader (``attnlab
translate RUN`` while ``RUN`` trains) that resolved ``latest`` could find that step deleted while
it reads it — with ``--save-every 1`` that is two saves away. The protocol:

* the writer moves ``latest`` to a new step before it deletes any, never deletes the step
  ``latest`` names, and deletes an older step only under an exclusive lock on its manifest, left
  for a later save when that fails (:func:`~attnlab.training.manifest.remove_unless_held`);
* the reader resolves the path, takes a shared lock on that step's manifest
  (:func:`~attnlab.training.manifest.hold_manifest`) and verifies and reads it while holding it.
  Between resolving and locking the step may vanish (the window is a few system calls): the
  reader then resolves again — ``latest`` has moved on to a complete step — a bounded number of
  times.

::

    with hold_checkpoint("runs/demo") as ckpt:   # verified, and not deleted until the block ends
        config = read_config(ckpt)
        read_model_weights(ckpt, model)
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from attnlab.training.checkpoint import resolve_checkpoint, verify_checkpoint
from attnlab.training.manifest import MANIFEST, CheckpointError, hold_manifest

__all__ = ["ATTEMPTS", "hold_checkpoint"]

#: how many times a reader resolves the path again when the step it resolved vanished
ATTEMPTS = 20


def _resolve(path: str | os.PathLike[str], last: bool) -> Path | None:
    """The resolved checkpoint, or ``None`` (to try again) when resolving failed and not ``last``."""
    try:
        return resolve_checkpoint(path)
    except CheckpointError:  # e.g. ``latest`` named a step deleted a moment later
        if last or not Path(path).exists():
            raise
        return None


@contextlib.contextmanager
def hold_checkpoint(path: str | os.PathLike[str], *, allow_sharded: bool = False) -> Iterator[Path]:
    """Resolve ``path``, hold that checkpoint against rotation and verify it.

    Args:
        path: anything :func:`~attnlab.training.checkpoint.resolve_checkpoint` accepts.
        allow_sharded: see :func:`~attnlab.training.checkpoint.verify_checkpoint`.

    Yields:
        The verified checkpoint directory; a training writing the run does not delete it before
        the block ends.

    Raises:
        CheckpointError: no checkpoint there, or its files do not match its manifest (one line).
    """
    for attempt in range(ATTEMPTS):
        last = attempt == ATTEMPTS - 1
        ckpt = _resolve(path, last)
        fd = None if ckpt is None else hold_manifest(ckpt)
        if ckpt is not None and fd is not None:
            try:
                yield verify_checkpoint(ckpt, allow_sharded=allow_sharded)
            finally:
                os.close(fd)
            return
        if ckpt is not None and (last or _stays(path, ckpt)):
            break  # not a step rotated away: a checkpoint without a manifest, say
        time.sleep(0.001 * (attempt + 1))  # 0.2 s in all at most
    # not held: verify what the path names now, which raises the reason in one line
    yield verify_checkpoint(path, allow_sharded=allow_sharded)


def _stays(path: str | os.PathLike[str], ckpt: Path) -> bool:
    """Whether ``path`` still names ``ckpt``, which still has no manifest (nothing rotated)."""
    with contextlib.suppress(CheckpointError):
        return resolve_checkpoint(path) == ckpt and not (ckpt / MANIFEST).is_file()
    return False
