"""What a request to ``attnlab serve`` may ask, checked field by field before the model runs.

Every check raises :class:`FieldError` (an :class:`~attnlab.errors.ArgumentError`) naming the
JSON field, what it must be and what it got; the app answers it with a 4xx JSON message. The
numbers of the sampler are checked by the same rules :func:`attnlab.generate` applies (a
temperature ``> 0`` and finite, ``top_k ≥ 1``, ``top_p`` in ``(0, 1]``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from attnlab.errors import ArgumentError

__all__ = ["MAX_TEXT_CHARS", "FieldError", "Sampling", "check_ids", "check_index", "sampling"]

#: the longest text read at all (characters): a longer one is refused before it is tokenized
MAX_TEXT_CHARS = 20_000


class FieldError(ArgumentError):
    """A request field out of range or of the wrong type.

    Args:
        field: the JSON field, e.g. ``"temperature"``.
        message: what it must be and what it got (starts with the field's name).
        status: the HTTP status to answer with (422 by default; 413 for a text too long).
    """

    def __init__(self, field: str, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(body: Mapping[str, Any], name: str, default: float | None) -> float | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(name, f"{name} must be a number, got {_shown(value)}")
    return float(value)


def check_index(body: Mapping[str, Any], name: str, size: int, default: int | None = None) -> int:
    """The integer field ``name`` of ``body``, in ``[0, size)``.

    Args:
        body: the request's JSON object.
        name: the field.
        size: the number of valid values.
        default: the value when the field is absent; ``None``: it is required.

    Returns:
        The index.

    Raises:
        FieldError: absent (without a default), not an int, or out of range.
    """
    value = body.get(name, default)
    if value is None:
        raise FieldError(name, f"{name} is required (an int in [0, {size}))")
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(name, f"{name} must be an int in [0, {size}), got {_shown(value)}")
    if not 0 <= value < size:
        raise FieldError(name, f"{name} must be in [0, {size}), got {value}")
    return value


def check_count(body: Mapping[str, Any], name: str, low: int, high: int, default: int) -> int:
    """The integer field ``name`` of ``body`` in ``[low, high]`` (``default`` when absent).

    Args:
        body: the request's JSON object.
        name: the field.
        low: the smallest value allowed.
        high: the largest value allowed.
        default: the value when the field is absent.

    Returns:
        The count.

    Raises:
        FieldError: not an int, or out of range.
    """
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(name, f"{name} must be an int in [{low}, {high}], got {_shown(value)}")
    if not low <= value <= high:
        raise FieldError(name, f"{name} must be in [{low}, {high}], got {value}")
    return value


def check_ids(value: object, vocab_size: int, name: str = "ids") -> list[int]:
    """Token ids a request sends verbatim.

    Args:
        value: the field's JSON value.
        vocab_size: the model's vocabulary size.
        name: the field's name.

    Returns:
        The ids.

    Raises:
        FieldError: not a non-empty list of ints in ``[0, vocab_size)``.
    """
    if not isinstance(value, list) or not value:
        raise FieldError(name, f"{name} must be a non-empty list of token ids, got {_shown(value)}")
    for i in value:
        if isinstance(i, bool) or not isinstance(i, int):
            raise FieldError(name, f"{name} must hold ints, got {_shown(i)}")
        if not 0 <= i < vocab_size:
            raise FieldError(
                name, f"{name} must be token ids in [0, {vocab_size}) (the vocabulary), got {i}"
            )
    return list(value)


def check_text(value: object, name: str = "text") -> str:
    """A text a request sends: a non-empty string of at most :data:`MAX_TEXT_CHARS` characters
    that UTF-8 can encode (no lone surrogate such as ``"\\ud800"``).

    Args:
        value: the field's JSON value.
        name: the field's name.

    Returns:
        The text.

    Raises:
        FieldError: not a string, empty, too long (status 413) or not encodable.
    """
    if not isinstance(value, str):
        raise FieldError(name, f"{name} must be a string, got {type(value).__name__}")
    if not value:
        raise FieldError(name, f"{name} is empty; type some text")
    if len(value) > MAX_TEXT_CHARS:
        raise FieldError(
            name,
            f"{name} has {len(value)} characters, more than the {MAX_TEXT_CHARS} the server reads",
            413,
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FieldError(
            name, f"{name} is not valid Unicode at character {exc.start} (a lone surrogate)"
        ) from None
    return value


@dataclass(frozen=True)
class Sampling:
    """The sampler's numbers of a request, as :func:`attnlab.generate` takes them.

    Attributes:
        temperature: ``τ > 0``, finite.
        top_k: keep the ``k`` likeliest tokens, or ``None`` (all).
        top_p: keep the nucleus of mass ``p`` in ``(0, 1]``, or ``None``.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None


def sampling(body: Mapping[str, Any], vocab_size: int) -> Sampling:
    """The ``temperature``, ``top_k`` and ``top_p`` fields of a request, checked.

    ``top_k`` 0 or ``null`` means no top-k filter, ``top_p`` ``null`` no nucleus; the numbers
    go to the sampler as they are.

    Args:
        body: the request's JSON object.
        vocab_size: the model's vocabulary size (``top_k`` at most this).

    Returns:
        A :class:`Sampling`.

    Raises:
        FieldError: a temperature ``≤ 0`` or not finite, ``top_k`` not an int in
            ``[0, vocab_size]``, ``top_p`` outside ``(0, 1]``.
    """
    t = _number(body, "temperature", 1.0)
    if t is None or not (t > 0 and math.isfinite(t)):
        raise FieldError("temperature", f"temperature must be > 0 and finite, got {t}")
    k = body.get("top_k")
    if k is not None:
        k = check_count(body, "top_k", 0, vocab_size, 0) or None
    p = _number(body, "top_p", None)
    if p is not None and not 0 < p <= 1:
        raise FieldError("top_p", f"top_p must lie in (0, 1], got {p}")
    return Sampling(t, k, p)
