"""Argument checks shared by the public entry points.

Every check raises a ``ValueError`` or ``TypeError`` that names the argument and says what was
expected and what was got, so that bad input never travels deep into torch.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab.errors import ArgumentError, ArgumentTypeError


def shape_str(shape: Sequence[int]) -> str:
    """``(2, 8, 5)`` — a shape as users write it (``torch.Size`` prints noisily)."""
    dims = tuple(int(d) for d in shape)
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def check_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_floating(name: str, value: torch.Tensor) -> None:
    if not value.is_floating_point():
        raise ArgumentTypeError(f"{name} must have a floating dtype, got {value.dtype}")


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ArgumentError(f"{name} must be a positive int, got {value}")
    return value


def find_device(value: str | int | torch.device) -> torch.device | str:
    """The device ``value`` names on this machine, or why there is none.

    ``cpu``, ``cuda`` / ``cuda:N`` or a CUDA index (when CUDA is available and has GPU N),
    ``mps`` (when available); other device types torch knows (``meta``, …) are passed on.

    Returns:
        The ``torch.device``, or the reason as text (e.g. ``"CUDA is not available on this
        machine"``) for the caller to put in its own error.
    """
    try:
        dev = torch.device("cuda", value) if isinstance(value, int) else torch.device(value)
    except RuntimeError:  # torch's error for a string that names no device type
        return "torch knows no such device (expected e.g. 'cpu', 'cuda' or 'cuda:1')"
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            return "CUDA is not available on this machine"
        if dev.index is not None and dev.index >= count:
            return f"this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
    if dev.type == "mps" and not torch.backends.mps.is_available():
        return "MPS is not available on this machine"
    return dev


def check_device(name: str, value: object) -> torch.device:
    """A device this machine has (:func:`find_device`), from a ``torch.device``, its name or a
    CUDA index.

    Raises:
        ArgumentTypeError: ``value`` is not a ``torch.device``, a str or an int.
        ArgumentError: torch knows no such device, or this machine lacks it.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, torch.device)):
        raise ArgumentTypeError(
            f"{name} must be a torch.device, a str such as 'cpu' or 'cuda:1', or a CUDA index, "
            f"got {type(value).__name__}"
        )
    found = find_device(value)
    if isinstance(found, str):
        raise ArgumentError(f"{name} {value!r}: {found}")
    return found


#: seeds are 32-bit: python's, numpy's and torch's generators all take them
SEED_LIMIT = 2**32


def check_seed(name: str, value: object) -> int:
    """A seed: an int in ``[0, 2**32)`` (larger ones overflow torch's and numpy's generators)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value < SEED_LIMIT:
        raise ArgumentError(f"{name} must be in [0, 2**32), got {value}")
    return value


def check_sink_rows(value: object, batch: int) -> list[int]:
    """A cache's ``sinks``: a non-negative int for every row, or one per row of ``batch``."""
    rows = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value]
    ints = [s for s in rows if isinstance(s, int) and not isinstance(s, bool) and s >= 0]
    if not rows or len(ints) != len(rows) or len(rows) not in (1, batch):
        raise ArgumentError(
            f"sinks must be a non-negative int, or one per batch row ({batch}), got {value!r}"
        )
    return ints


def check_probability(name: str, value: object) -> float:
    """A dropout-like probability in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"{name} must be a float in [0, 1), got {type(value).__name__}")
    if not 0.0 <= float(value) < 1.0:
        raise ArgumentError(f"{name} must be in [0, 1), got {value}")
    return float(value)


def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        options = ", ".join(repr(c) for c in choices)
        raise ArgumentError(f"{name} must be one of {options}, got {value!r}")
    return value


def broadcast_or_raise(name: str, shape: Sequence[int], target: Sequence[int], legend: str) -> None:
    """Raise unless ``shape`` broadcasts to ``target`` (without growing the target)."""
    ok = len(shape) <= len(target) and all(
        s == 1 or s == t for s, t in zip(reversed(tuple(shape)), reversed(tuple(target)))
    )
    if not ok:
        raise ArgumentError(
            f"{name} has shape {shape_str(shape)} but must broadcast to {legend} = {shape_str(target)}"
        )


def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether every element of every floating tensor is finite (one device sync).

    Args:
        tensors: any tensors; integer and boolean ones are skipped.

    Returns:
        ``True`` when no floating tensor holds a NaN or an infinity (also when there is none).

    Shape:
        any.
    """
    floating = [t.detach() for t in tensors if t.is_floating_point()]
    if not floating:
        return True
    # a NaN or an infinity makes its tensor's sum non-finite (inf − inf = NaN), so finite sums
    # prove every entry finite: one read of each tensor (11x faster than isfinite's passes on
    # the CPU, 23 ms for SmolLM2-135M), summed in float32, where half types cannot overflow.
    # A sum that overflows on finite values is only sent to the exact check below.
    sums = torch.stack([t.sum(dtype=torch.float32) for t in floating])
    if bool(torch.isfinite(sums).all()):
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in floating]).all())


def first_non_finite(named: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """The name of the first floating tensor holding a NaN or an infinity.

    Args:
        named: ``(name, tensor)`` pairs, e.g. ``model.named_parameters()``.

    Returns:
        That name, or ``None`` when every floating tensor is finite.

    Shape:
        any.
    """
    for name, t in named:
        if t.is_floating_point() and not bool(torch.isfinite(t.detach()).all()):
            return name
    return None


def check_finite_weights(model: torch.nn.Module) -> None:
    """Refuse to decode with a model whose weights hold NaN or infinities (a diverged run, or
    a pretrained file that holds them).

    Its logits would be NaN: sampling would fail deep in torch and greedy decoding would return
    token 0 over and over. One device sync when the weights are finite.

    Args:
        model: the model about to decode.

    Raises:
        ArgumentError: one line naming the first non-finite parameter.
    """
    if all_finite(model.parameters()):
        return
    name = first_non_finite(model.named_parameters())
    raise ArgumentError(
        f"the model's weights are not finite (NaN or infinity in {name}), so it cannot decode: "
        "the checkpoint or pretrained file it was loaded from holds them (a run that diverged: "
        "use a checkpoint from before it; a damaged file: use another copy)"
    )


#: the largest small file (a config, a tokenizer's config, a chat template, an index) read whole:
#: such files are kilobytes; a tokenizer's vocabulary (``tokenizer.json``) is given more
SMALL_FILE_BYTES = 64 * 2**20


def read_small_bytes(path: str | os.PathLike[str], limit: int = SMALL_FILE_BYTES) -> bytes:
    """The bytes of a small regular file, refused before it is opened when it is not one.

    A symbolic link to ``/dev/zero`` would be read until memory runs out, and opening a FIFO
    blocks forever: the file (its link followed) must be a regular file of at most ``limit``
    bytes, checked with ``os.stat`` before ``open``.

    Args:
        path: the file.
        limit: the most bytes accepted; default :data:`SMALL_FILE_BYTES`.

    Returns:
        The bytes.

    Raises:
        ArgumentError: one line naming the file: it is missing, not a regular file (a device,
            a FIFO, a folder) or larger than ``limit``.
    """
    try:
        info = os.stat(path)
    except OSError as exc:
        raise ArgumentError(f"{path} cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise ArgumentError(f"{path} must be a regular file, got {_file_kind(info.st_mode)}")
    if info.st_size > limit:
        raise ArgumentError(f"{path} must be at most {limit} bytes, got {info.st_size}")
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)  # a file that grew since the stat is still bounded
    except OSError as exc:
        raise ArgumentError(f"{path} cannot be read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise ArgumentError(f"{path} must be at most {limit} bytes, got more")
    return data


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
             (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def read_small_text(path: str | os.PathLike[str], limit: int = SMALL_FILE_BYTES) -> str:
    """The UTF-8 text of a small regular file (:func:`read_small_bytes`).

    Args:
        path: the file.
        limit: the most bytes accepted.

    Returns:
        The text.

    Raises:
        ArgumentError: as :func:`read_small_bytes`, or the file is not UTF-8 (one line).
    """
    try:
        return read_small_bytes(path, limit).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArgumentError(
            f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None


#: the deepest JSON tree :func:`read_small_json` accepts (configs nest a few levels)
JSON_MAX_DEPTH = 100


def json_depth(tree: Any, limit: int = JSON_MAX_DEPTH) -> int:
    """The nesting depth of a parsed JSON tree, counted iteratively (no recursion limit to hit).

    Args:
        tree: a parsed JSON document.
        limit: stop counting past this depth.

    Returns:
        The depth (a scalar: 0, ``[1]``: 1), at most ``limit + 1``.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest


def read_small_json(
    path: str | os.PathLike[str], limit: int = SMALL_FILE_BYTES, *, want_object: bool = True
) -> Any:
    """The JSON document of a small regular file (:func:`read_small_bytes`): ``config.json``,
    ``tokenizer_config.json``, ``generation_config.json``, a safetensors index.

    Args:
        path: the file.
        limit: the most bytes accepted.
        want_object: refuse a document that is not a JSON object (the default).

    Returns:
        The parsed document.

    Raises:
        ArgumentError: one line naming the file: not a small regular file, not UTF-8, not JSON,
            nested deeper than :data:`JSON_MAX_DEPTH` levels, or not an object.
    """
    text = read_small_text(path, limit)
    deep = ArgumentError(f"{path} is nested deeper than {JSON_MAX_DEPTH} levels")
    try:
        tree = json.loads(text)
    except RecursionError:
        raise deep from None
    except ValueError as exc:
        raise ArgumentError(f"{path} is not JSON ({str(exc).splitlines()[0]})") from None
    if json_depth(tree) > JSON_MAX_DEPTH:
        raise deep
    if want_object and not isinstance(tree, dict):
        raise ArgumentError(f"{path} must hold a JSON object, got {type(tree).__name__}")
    return tree


def is_path_inside(name: object) -> bool:
    """Whether ``name`` (a file name a folder's own file lists, like a safetensors index's
    shards) stays inside the folder: a relative path with no ``..`` part, no backslash and no
    drive; symbolic links are not followed (a Hugging Face cache links its files elsewhere).

    Args:
        name: the name as the file gives it.

    Returns:
        Whether it names a path below the folder.
    """
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name:
        return False
    parts = Path(name).parts
    return not Path(name).is_absolute() and ".." not in parts and ":" not in parts[0]


# ----------------------------------------------------------------------------------------------
# typed values of a JSON file (config.json, tokenizer_config.json): by key, never by truthiness
# ----------------------------------------------------------------------------------------------

#: the default of a key that must be present
REQUIRED: Any = object()


def _shown(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def _value(data: Any, key: str, default: Any, where: str) -> Any:
    value = data.get(key, default)
    if value is REQUIRED:
        raise ArgumentError(f"{where}'s {key} is missing")
    return value


def json_bool(data: Any, key: str, default: Any = REQUIRED, *, where: str = "config.json") -> bool:
    """A boolean key of a JSON file: only JSON ``true`` or ``false`` (``"false"``, ``0`` or
    ``"no"`` are refused, as ``transformers``' configs refuse them; read by truthiness they
    would silently give the opposite model).

    Args:
        data: the parsed file (a dict).
        key: the key.
        default: the value when the key is absent (:data:`REQUIRED`: it must be present).
        where: how the message names the file.

    Returns:
        The value.

    Raises:
        ArgumentTypeError: a value that is not a JSON boolean (its repr and type shown).
    """
    value = _value(data, key, default, where)
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{where}'s {key} must be true or false, got {_shown(value)}")
    return value


def json_int(
    data: Any,
    key: str,
    default: Any = REQUIRED,
    *,
    minimum: int = 1,
    cap: int | None = None,
    why: str = "",
    where: str = "config.json",
) -> int:
    """An integer key of a JSON file: a JSON integer only — not a boolean, not a float even when
    integral (``16.0``, as ``transformers``' configs refuse it; ``16.5`` would be truncated),
    not a string — in ``[minimum, cap]``.

    Args:
        data: the parsed file (a dict).
        key: the key.
        default: the value when the key is absent (:data:`REQUIRED`: it must be present).
        minimum: the smallest value accepted.
        cap: the largest value accepted (``None``: no bound), checked before anything is
            allocated from it.
        why: why values above ``cap`` are refused, for the message.
        where: how the message names the file.

    Returns:
        The value.

    Raises:
        ArgumentTypeError: a value that is not a JSON integer (its repr and type shown).
        ArgumentError: a value below ``minimum`` or above ``cap``.
    """
    value = _value(data, key, default, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{where}'s {key} must be an integer, got {_shown(value)}")
    if value < minimum:
        raise ArgumentError(f"{where}'s {key} must be at least {minimum}, got {value}")
    if cap is not None and value > cap:
        raise ArgumentError(f"{where}'s {key} must be at most {cap} ({why}), got {value}")
    return value


def json_optional_int(data: Any, key: str, **limits: Any) -> int | None:
    """An optional integer key of a JSON file: ``None`` when it is absent or ``null``, else as
    :func:`json_int` (with its ``minimum``, ``cap``, ``why`` and ``where``).

    Args:
        data: the parsed file (a dict).
        key: the key.
        **limits: :func:`json_int`'s keyword arguments.

    Returns:
        The value or ``None``.
    """
    return None if data.get(key) is None else json_int(data, key, **limits)


def json_float(
    data: Any,
    key: str,
    default: Any = REQUIRED,
    *,
    positive: bool = True,
    where: str = "config.json",
) -> float:
    """A real-number key of a JSON file: a finite JSON number (an integer is read as a float;
    a boolean, a string, ``NaN`` or ``Infinity`` — which Python's ``json`` reads — are refused).

    Args:
        data: the parsed file (a dict).
        key: the key.
        default: the value when the key is absent (:data:`REQUIRED`: it must be present).
        positive: refuse a value that is not ``> 0`` (the default); else ``>= 0``.
        where: how the message names the file.

    Returns:
        The value as a float.

    Raises:
        ArgumentTypeError: a value that is not a number (its repr and type shown).
        ArgumentError: a non-finite, non-positive (or negative) value.
    """
    value = _value(data, key, default, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"{where}'s {key} must be a number, got {_shown(value)}")
    ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        sign = "positive" if positive else "non-negative"
        raise ArgumentError(f"{where}'s {key} must be a finite {sign} number, got {value!r}")
    return float(value)
