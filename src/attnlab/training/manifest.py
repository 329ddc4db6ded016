"""A checkpoint's ``manifest.json``: the size and SHA-256 of every file, checked before anything is read.

The manifest is the one file trusted to say what a checkpoint holds, so it is itself validated
before it is used — a crafted or damaged checkpoint gives one :class:`CheckpointError` line, never
a ``KeyError`` or a file read outside the checkpoint::

    {"format": "attnlab-checkpoint", "version": 1, "step": 40,
     "files": {"config.json": {"size": 412, "sha256": "9f86d0…"}, ...}}

- ``step`` is a non-negative int; ``files`` maps names to ``{"size": int >= 0, "sha256": 64 hex
  digits}``;
- every name is a relative path (``/``-separated, no ``..``) that stays inside the checkpoint
  folder once symbolic links are followed: nothing outside it is ever stat'ed or hashed;
- the files a loader reads must be listed (:func:`verify_files`'s ``required`` and ``covered``).

The manifest is also how a reader *holds* a checkpoint against rotation: :func:`hold_manifest`
takes a shared ``flock`` on it, and a writer pruning old checkpoints deletes a folder only under
an exclusive one (:func:`remove_unless_held`), so a folder a reader holds is left for a later
save to prune. (Without ``fcntl``, on Windows, nothing is held: readers rely on retrying.)
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from attnlab.errors import ArgumentError
from attnlab.training.jsonio import read_json

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "FORMAT",
    "MANIFEST",
    "CheckpointError",
    "Manifest",
    "ManifestEntry",
    "confined_path",
    "file_entry",
    "hold_manifest",
    "read_manifest",
    "remove_unless_held",
    "sha256_file",
    "verify_files",
]

MANIFEST = "manifest.json"
FORMAT = "attnlab-checkpoint"
VERSION = 1
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

logger = logging.getLogger(__name__)


class CheckpointError(ArgumentError):
    """A checkpoint is missing, truncated, corrupted or does not fit the model."""


@dataclass(frozen=True)
class ManifestEntry:
    """One file of a checkpoint.

    Attributes:
        size: its size in bytes.
        sha256: its SHA-256, as 64 lowercase hex digits.
    """

    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """A validated ``manifest.json``.

    Attributes:
        step: the training step the checkpoint holds.
        files: relative ``/``-separated name → :class:`ManifestEntry`, for every file it holds.
    """

    step: int
    files: dict[str, ManifestEntry]


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB chunks.

    Args:
        path: the file.

    Returns:
        The digest, as 64 lowercase hex digits.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_entry(path: Path) -> dict[str, Any]:
    """A file's manifest entry.

    Args:
        path: the file.

    Returns:
        ``{"size": bytes, "sha256": hex digest}``, as the manifest stores it.
    """
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def confined_path(ckpt: Path, name: object) -> Path:
    """The file ``name`` of the checkpoint folder ``ckpt``, refusing any name that leaves it.

    Args:
        ckpt: the checkpoint folder.
        name: a name read from a manifest (not trusted: checked here).

    Returns:
        ``ckpt / name``.

    Raises:
        CheckpointError: ``name`` is not a relative ``/``-separated path, holds ``..``, or points
            (through a symbolic link) outside ``ckpt``.
    """
    where = f"checkpoint {ckpt} is corrupted: {MANIFEST} names"
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        raise CheckpointError(f"{where} {name!r}, which is not a relative file name")
    rel = PurePosixPath(name)
    if rel.is_absolute() or ".." in rel.parts or rel.as_posix() != name:
        raise CheckpointError(f"{where} {name!r}, which lies outside the checkpoint")
    path = ckpt / rel
    try:
        inside = path.resolve().is_relative_to(ckpt.resolve())
    except (OSError, RuntimeError):  # a symbolic-link loop
        inside = False
    if not inside:
        raise CheckpointError(f"{where} {name!r}, which lies outside the checkpoint")
    return path


def _parse(tree: Any, ckpt: Path) -> Manifest:
    """The :class:`Manifest` of a parsed ``manifest.json``, its schema checked."""
    bad = f"checkpoint {ckpt} is corrupted: {MANIFEST}"
    if not isinstance(tree, dict) or tree.get("format") != FORMAT:
        raise CheckpointError(f"{bad} is unreadable (not an {FORMAT} manifest)")
    if tree.get("version") != VERSION:
        raise CheckpointError(f"{bad} has version {tree.get('version')!r}, expected {VERSION}")
    step = tree.get("step")
    if not isinstance(step, int) or not _is_count(step):
        raise CheckpointError(f"{bad} has step {step!r}, expected a non-negative int")
    files = tree.get("files")
    if not isinstance(files, dict):
        raise CheckpointError(f"{bad} has no 'files' mapping")
    entries = {}
    for name, entry in files.items():
        confined_path(ckpt, name)
        if (
            not isinstance(entry, dict)
            or not _is_count(entry.get("size"))
            or not isinstance(entry.get("sha256"), str)
            or not _SHA256.match(entry["sha256"])
        ):
            raise CheckpointError(
                f"{bad} entry {name!r} must be {{'size': int >= 0, 'sha256': 64 hex digits}}, "
                f"got {str(entry)[:80]}"
            )
        entries[name] = ManifestEntry(entry["size"], entry["sha256"])
    return Manifest(step, entries)


def read_manifest(ckpt: Path) -> Manifest:
    """The validated manifest of the checkpoint folder ``ckpt`` (the files are not checked).

    Args:
        ckpt: the checkpoint folder.

    Returns:
        The manifest.

    Raises:
        CheckpointError: the manifest is missing, unreadable or does not follow the schema.
    """
    path = ckpt / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"checkpoint {ckpt} is incomplete: {MANIFEST} is missing")
    try:
        tree = read_json(path)
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {ckpt} is corrupted: {MANIFEST} is unreadable ({exc})"
        ) from None
    return _parse(tree, ckpt)


def verify_files(
    ckpt: Path, manifest: Manifest, *, required: tuple[str, ...], covered: tuple[str, ...]
) -> None:
    """Check the checkpoint's files against ``manifest``: presence, size, then SHA-256.

    Args:
        ckpt: the checkpoint folder.
        manifest: its :func:`read_manifest`.
        required: names the manifest must list (the files every checkpoint has).
        covered: names that, when present in the folder, the manifest must list (a file a loader
            reads is never read unchecked).

    Raises:
        CheckpointError: one line naming the first problem.
    """
    for name in required:
        if name not in manifest.files:
            raise CheckpointError(
                f"checkpoint {ckpt} is corrupted: {MANIFEST} does not list {name}"
            )
    for name in covered:
        if (ckpt / name).exists() and name not in manifest.files:
            raise CheckpointError(
                f"checkpoint {ckpt} is corrupted: {name} is not listed in {MANIFEST}"
            )
    for name, entry in manifest.files.items():
        f = confined_path(ckpt, name)
        if not f.is_file():
            raise CheckpointError(f"checkpoint {ckpt} is incomplete: {name} is missing")
        size = f.stat().st_size
        if size != entry.size:
            raise CheckpointError(
                f"checkpoint {ckpt} is truncated or corrupted: {name} has {size} bytes, "
                f"expected {entry.size}"
            )
        if sha256_file(f) != entry.sha256:
            raise CheckpointError(
                f"checkpoint {ckpt} is corrupted: {name} does not match its SHA-256 checksum"
            )


def hold_manifest(ckpt: Path) -> int | None:
    """Hold the checkpoint folder ``ckpt`` against rotation: a shared lock on its manifest.

    Args:
        ckpt: a checkpoint folder.

    Returns:
        The open file descriptor that holds the lock (``os.close`` it to let go), or ``None``
        when ``ckpt`` has no manifest, is being deleted or was deleted meanwhile.
    """
    try:
        fd = os.open(ckpt / MANIFEST, os.O_RDONLY)
    except OSError:
        return None
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # fails while a writer deletes it
        if os.fstat(fd).st_nlink > 0:  # not deleted between the open and the lock
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def remove_unless_held(ckpt: Path) -> bool:
    """Delete the checkpoint folder ``ckpt`` unless a reader holds it (:func:`hold_manifest`).

    Args:
        ckpt: a checkpoint folder that no ``latest`` pointer names any more.

    Returns:
        ``True`` when the folder was deleted; ``False`` when a reader holds it (a later call
        deletes it).
    """
    fd = None
    with contextlib.suppress(OSError):
        fd = os.open(ckpt / MANIFEST, os.O_RDONLY)
    try:
        if fd is not None and fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                logger.info("checkpoint %s is being read; it is deleted by a later save", ckpt)
                return False
        shutil.rmtree(ckpt, ignore_errors=True)  # under the lock: no reader can take it now
        return True
    finally:
        if fd is not None:
            os.close(fd)
