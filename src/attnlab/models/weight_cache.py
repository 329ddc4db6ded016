"""A GGUF file's dequantised weights, cached on disk once: :func:`read_gguf_cached`.

Reading a GGUF file costs seconds every time: ``gguf.GGUFReader`` parses the header (a 49k-token
vocabulary for SmolLM2) and every tensor is dequantised (:func:`attnlab.models.gguf.read_gguf`).
The first read therefore also writes what it produced — the state dict under Hugging Face's
names, in the dtype asked for, its ``config.json``, the file's tokenizer metadata and its display
metadata — into one ``.safetensors`` file of the cache folder; a later read of the same file
loads that instead and never opens the GGUF file's reader.

Where: ``$ATTNLAB_CACHE`` if set, else ``$XDG_CACHE_HOME/attnlab``, else ``~/.cache/attnlab``
(:func:`cache_dir`), in its ``weights/`` folder.

An entry is the file's identity, and nothing else is trusted: its key (:func:`cache_key`) is the
resolved path, size and modification time (ns) of the GGUF file, a BLAKE2b of its first 4 MiB
(the header: metadata and tensor list), the cache format version and the dtype; the key's fields
are also stored in the entry and compared on reading. A changed file gets another key; its old
entry is deleted when the new one is written, and so is the temporary file of a writer killed
more than an hour before.

An entry is written atomically (a uniquely named temporary file in the same folder, fsynced,
``os.replace``-d over the entry, the folder fsynced): two processes writing the same entry leave
one valid entry, a reader sees a whole entry or none. It is verified on reading — the
safetensors header (which must cover the file exactly), the file's size against the header
and the tensor bytes recorded in its metadata, and a CRC-32 of every tensor's bytes and the
other metadata (config, tokenizer) recorded there too — and a truncated or damaged entry is deleted and
rebuilt, with one line logged, never loaded. A cache folder that cannot be written (read-only,
full) costs one logged warning and the weights are read from the GGUF file as without a cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import torch

from attnlab._files import fsync_dir, fsync_file
from attnlab.errors import ArgumentTypeError
from attnlab.models.gguf import GGUFModel, read_gguf, read_gguf_metadata

__all__ = ["CACHE_VERSION", "cache_dir", "cache_key", "cache_path", "read_gguf_cached"]

logger = logging.getLogger(__name__)

#: the format of an entry; a change makes every older entry a miss
CACHE_VERSION = 1

#: the bytes of the GGUF file hashed into the key (its header: metadata and tensor list)
_HEADER_BYTES = 4 * 2**20
_FORMAT = "attnlab-gguf-weights"


def cache_dir() -> Path:
    """The folder of attnlab's caches: ``$ATTNLAB_CACHE``, else ``$XDG_CACHE_HOME/attnlab``,
    else ``~/.cache/attnlab`` (not created here).

    Returns:
        The folder's path.
    """
    own = os.environ.get("ATTNLAB_CACHE")
    if own:
        return Path(own).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "attnlab"


def _identity(path: Path, dtype: torch.dtype) -> dict[str, str]:
    """The fields of the key: what makes two reads of a GGUF file the same."""
    resolved = path.resolve()
    stat = resolved.stat()
    with resolved.open("rb") as handle:
        header = hashlib.blake2b(handle.read(_HEADER_BYTES), digest_size=16).hexdigest()
    return {
        "format": _FORMAT,
        "version": str(CACHE_VERSION),
        "source": str(resolved),
        "size": str(stat.st_size),
        "mtime_ns": str(stat.st_mtime_ns),
        "header_blake2b": header,
        "dtype": str(dtype).removeprefix("torch."),
    }


def cache_key(path: str | Path, dtype: torch.dtype = torch.float32) -> str:
    """The cache key of a GGUF file read in ``dtype`` (see the module docstring).

    Args:
        path: the ``.gguf`` file.
        dtype: the weights' dtype.

    Returns:
        32 hex digits.
    """
    fields = _identity(Path(path), dtype)
    return hashlib.blake2b(json.dumps(fields, sort_keys=True).encode(), digest_size=16).hexdigest()


def _slot(source: str, dtype: str) -> str:
    """The part of an entry's name shared by every version of one file in one dtype."""
    return hashlib.blake2b(f"{source}\0{dtype}".encode(), digest_size=4).hexdigest()


def _entry(folder: Path, fields: dict[str, str]) -> Path:
    key = hashlib.blake2b(json.dumps(fields, sort_keys=True).encode(), digest_size=16).hexdigest()
    stem = Path(fields["source"]).stem[:60]
    slot = _slot(fields["source"], fields["dtype"])
    return folder / f"{stem}-{slot}-{fields['dtype']}-{key[:16]}.safetensors"


def cache_path(path: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Where the cached weights of a GGUF file read in ``dtype`` are (or would be) stored.

    Args:
        path: the ``.gguf`` file.
        dtype: the weights' dtype.

    Returns:
        The entry's path under :func:`cache_dir`.
    """
    return _entry(cache_dir() / "weights", _identity(Path(path), dtype))


def read_gguf_cached(
    path: str | Path, *, dtype: torch.dtype = torch.float32, cache: bool = True
) -> GGUFModel:
    """:func:`~attnlab.models.gguf.read_gguf`, through the cache of dequantised weights.

    The first read of a file writes its entry (one line logged: where, and how large); a later
    read loads it — bit-identical weights, the same config, tokenizer and metadata — without
    opening the GGUF file's reader. A damaged entry is rebuilt, a cache folder that cannot be
    written is passed by (one logged line each).

    Args:
        path: the ``.gguf`` file.
        dtype: the floating dtype of the weights.
        cache: ``False`` reads the file as :func:`~attnlab.models.gguf.read_gguf` does, and
            neither reads nor writes the cache.

    Returns:
        The :class:`~attnlab.models.gguf.GGUFModel`.

    Raises:
        FileNotFoundError: no such file.
        ArgumentError: the file cannot be read (see :func:`~attnlab.models.gguf.read_gguf`).
        ArgumentTypeError: ``cache`` is not a bool.

    Shape:
        ``state[name]``: the PyTorch shape, ``(out, in)`` for a linear weight.
    """
    if not isinstance(cache, bool):
        raise ArgumentTypeError(f"cache must be a bool, got {type(cache).__name__}")
    path = Path(path)
    if not cache:
        return read_gguf(path, dtype=dtype)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    fields = _identity(path, dtype)
    entry = _entry(cache_dir() / "weights", fields)
    if entry.exists():
        found = _load(entry, fields, path)
        if found is not None:
            return found
    read = read_gguf(path, dtype=dtype)
    _store(entry, fields, read, read_gguf_metadata(path))
    return read


# ----------------------------------------------------------------------------------------------
# reading an entry
# ----------------------------------------------------------------------------------------------


def _crc32(state: dict[str, torch.Tensor], header: dict[str, str]) -> str:
    """CRC-32 of the header's other fields and every tensor's bytes (by sorted names)."""
    fields = {k: v for k, v in header.items() if k != "crc32"}
    crc = zlib.crc32(json.dumps(fields, sort_keys=True).encode())
    for name in sorted(state):
        data: Any = state[name].reshape(-1).view(torch.uint8).numpy()  # a buffer, not copied
        crc = zlib.crc32(data, crc)
    return f"{crc:08x}"


def _load(entry: Path, fields: dict[str, str], path: Path) -> GGUFModel | None:
    """The entry's model, or ``None`` after deleting a damaged or foreign entry."""
    from safetensors import safe_open

    from attnlab.data.pretrained_tokenizer import tokenizer_from_gguf

    found = None
    try:
        size = entry.stat().st_size
        with safe_open(str(entry), framework="pt") as handle:
            meta = handle.metadata() or {}
            why = _mismatch(entry, meta, fields, size)
            state = {} if why else {name: handle.get_tensor(name) for name in handle.keys()}
        if why is None and _crc32(state, meta) != meta.get("crc32"):
            why = "its CRC-32 differs from the one recorded"
        if why is None:
            tokenizer_meta = json.loads(meta["tokenizer"])
            found = GGUFModel(
                path=path,
                hf_config=json.loads(meta["config"]),
                state=state,
                tokenizer=(
                    tokenizer_from_gguf(tokenizer_meta, source=str(path))
                    if tokenizer_meta
                    else None
                ),
                metadata=json.loads(meta["info"]),
            )
    except FileNotFoundError:  # removed meanwhile (another process rebuilding it)
        return None
    except Exception as exc:  # safetensors, json, a missing key: a damaged entry, never loaded
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        why = f"{type(exc).__name__}: {reason[:120]}"
    if why is not None:
        logger.warning(
            "attnlab: the cached weights %s are damaged (%s); rebuilding them", entry, why
        )
        with contextlib.suppress(OSError):
            entry.unlink()
    return found


def _mismatch(entry: Path, meta: dict[str, str], fields: dict[str, str], size: int) -> str | None:
    """Why the entry's header does not fit the file read and its own size, or ``None``."""
    if any(meta.get(k) != v for k, v in fields.items()):
        return "written for another file, version or dtype"
    expected = _header_end(entry) + int(meta["data_bytes"])
    if size != expected:
        return f"{size} bytes, its header and tensors make {expected}"
    return None


def _header_end(entry: Path) -> int:
    """Where a safetensors file's tensor data begins: 8 bytes of header length, the header."""
    with entry.open("rb") as handle:
        return 8 + int.from_bytes(handle.read(8), "little")


# ----------------------------------------------------------------------------------------------
# writing an entry
# ----------------------------------------------------------------------------------------------


def _store(entry: Path, fields: dict[str, str], read: GGUFModel, meta: dict[str, Any]) -> None:
    """Write ``read`` as ``entry``, atomically; a folder that cannot be written: a warning."""
    tokenizer_meta = {k: v for k, v in meta.items() if k.startswith("tokenizer.")}
    state = {name: t.contiguous() for name, t in read.state.items()}
    tmp = entry.with_name(f".{entry.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        header = {
            **fields,
            "data_bytes": str(sum(t.numel() * t.element_size() for t in state.values())),
            "config": json.dumps(read.hf_config),
            "tokenizer": json.dumps(tokenizer_meta if read.tokenizer is not None else {}),
            "info": json.dumps(read.metadata),
        }
        header["crc32"] = _crc32(state, header)
        entry.parent.mkdir(parents=True, exist_ok=True)
        _write(tmp, state, header)
        size = tmp.stat().st_size
        os.replace(tmp, entry)
        fsync_dir(entry.parent)
    except (OSError, TypeError, ValueError) as exc:  # ValueError, TypeError: metadata not JSON
        with contextlib.suppress(OSError):
            tmp.unlink()
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        logger.warning(
            "attnlab: warning: cannot cache the weights in %s (%s); reading the GGUF file each "
            "time (--no-cache skips the cache)",
            entry.parent,
            reason,
        )
        return
    _prune(entry, fields)
    logger.warning(
        "attnlab: cached the dequantised weights of %s in %s (%.0f MB, once; later loads read "
        "them; --no-cache skips the cache)",
        Path(fields["source"]).name,
        entry,
        size / 1e6,
    )


def _write(tmp: Path, state: dict[str, torch.Tensor], header: dict[str, str]) -> None:
    """The entry into ``tmp`` (a new file), fsynced."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(state, str(tmp), metadata=header)
    except SafetensorError as exc:  # its writer's I/O errors (a full disk) are no OSError
        raise OSError(
            0, str(exc).splitlines()[0] if str(exc) else "cannot write", str(tmp)
        ) from exc
    fsync_file(tmp)


def _prune(entry: Path, fields: dict[str, str]) -> None:
    """Delete the entries of older versions of the same file in the same dtype, and the
    temporary files of writers killed more than an hour ago."""
    prefix = entry.name.rsplit("-", 1)[0] + "-"
    old = time.time() - 3600
    for other in entry.parent.iterdir():
        name = other.name
        stale = name.startswith(prefix) and name.endswith(".safetensors") and other != entry
        with contextlib.suppress(OSError):
            if stale or (name.startswith("." + prefix) and name.endswith(".tmp")
                         and other.stat().st_mtime < old):  # fmt: skip
                other.unlink()
