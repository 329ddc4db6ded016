"""Typed reading of a GGUF file's key/value metadata: one error per wrong key.

A GGUF file is untrusted input: any key may hold any of the format's types (a ``block_count``
that is the string ``"abc"`` or the float ``2.5``, a ``bos_token_id`` that is a list). The
values come as ``gguf.GGUFReader`` gives them (``field.contents()``: ``int``, ``float``,
``bool``, ``str`` or a ``list`` of them); :class:`GGUFMetadata` reads each by the type the key
must have, within its bounds, and refuses anything else in one line naming the file, the key,
what was expected and what was got — never an ``int("abc")`` deep inside attnlab, never a
silent ``int(2.5) == 2``.

Examples:
    >>> meta = GGUFMetadata({"llama.block_count": "abc"}, where="m.gguf")
    >>> meta.integer("llama.block_count")
    Traceback (most recent call last):
    ...
    attnlab.errors.ArgumentTypeError: m.gguf: GGUF key 'llama.block_count' must be an integer, got the string 'abc'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from attnlab.errors import ArgumentError, ArgumentTypeError

__all__ = ["GGUFMetadata", "describe_value"]

_ABSENT = object()


def describe_value(value: Any) -> str:
    """A short description of a metadata value for a message (a long list is not printed).

    Args:
        value: the value.

    Returns:
        ``"the string 'abc'"``, ``"the float 2.5"``, ``"a list of 3 strings"``, …
    """
    if isinstance(value, bool):
        return f"the bool {value}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the float {value!r}"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:40] + "…"
        return f"the string {text!r}"
    if isinstance(value, list):
        kinds = sorted({_kind(v) for v in value})
        return f"a list of {len(value)} {'/'.join(kinds) or 'values'}"
    return f"a {type(value).__name__}"


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bools"
    if isinstance(value, int):
        return "integers"
    if isinstance(value, float):
        return "floats"
    if isinstance(value, str):
        return "strings"
    return "lists" if isinstance(value, list) else type(value).__name__


class GGUFMetadata:
    """A GGUF file's metadata, read key by key with its type and bounds checked.

    Args:
        values: the metadata, key → the value ``field.contents()`` gives.
        where: how messages name the file (its path); ``None`` for no prefix.
    """

    def __init__(self, values: Mapping[str, Any], where: str | None = None) -> None:
        self.values = values
        self.where = where

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def _say(self, key: str, text: str) -> str:
        prefix = f"{self.where}: " if self.where else ""
        return f"{prefix}GGUF key {key!r} {text}"

    def _typed(self, key: str, default: Any, fits: Callable[[Any], bool], wanted: str) -> Any:
        """The value of ``key`` if ``fits`` accepts it; ``_ABSENT`` replaced by ``default``."""
        if key not in self.values:
            if default is _ABSENT:
                raise ArgumentError(self._say(key, "is missing (the file's metadata lacks it)"))
            return _Default(default)
        value = self.values[key]
        if not fits(value):
            raise ArgumentTypeError(
                self._say(key, f"must be {wanted}, got {describe_value(value)}")
            )
        return value

    def integer(
        self,
        key: str,
        default: Any = _ABSENT,
        *,
        low: int | None = None,
        high: int | None = None,
        per_layer: bool = False,
    ) -> Any:
        """An integer value (not a bool, not a float, even ``2.0``) in ``[low, high]``.

        Args:
            key: the metadata key.
            default: returned when the key is absent (else it is an error).
            low: the smallest value accepted.
            high: the largest value accepted.
            per_layer: also accept a list of one value per layer, all equal (some files store
                ``head_count_kv`` so).

        Returns:
            The value, or ``default``.

        Raises:
            ArgumentTypeError: not an integer.
            ArgumentError: absent without a default, or out of bounds.
        """
        value = self._typed(key, default, lambda v: True, "")
        if isinstance(value, _Default):
            return value.value
        if per_layer and isinstance(value, list):
            if not value or len(set(map(repr, value))) != 1:
                raise ArgumentError(
                    self._say(
                        key, f"must be one value for every layer, got {describe_value(value)}"
                    )
                )
            value = value[0]
        if not _is_int(value):
            raise ArgumentTypeError(
                self._say(key, f"must be an integer, got {describe_value(value)}")
            )
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"in [{low}, {high}]" if low is not None and high is not None else ""
            bounds = bounds or (f"at least {low}" if low is not None else f"at most {high}")
            raise ArgumentError(self._say(key, f"must be {bounds}, got {value}"))
        return value

    def number(self, key: str, default: Any = _ABSENT, *, positive: bool = False) -> Any:
        """A finite number (an integer is accepted as a float).

        Args:
            key: the metadata key.
            default: returned when the key is absent (else it is an error).
            positive: refuse ``0`` and negative values too.

        Returns:
            The value as a float, or ``default``.

        Raises:
            ArgumentTypeError: not a number.
            ArgumentError: absent without a default, infinite, NaN, or not positive.
        """
        fits = _is_int_or_float
        value = self._typed(key, default, fits, "a number")
        if isinstance(value, _Default):
            return value.value
        number = float(value)
        if not math.isfinite(number) or (positive and number <= 0):
            wanted = "a finite positive number" if positive else "a finite number"
            raise ArgumentError(self._say(key, f"must be {wanted}, got {value!r}"))
        return number

    def string(self, key: str, default: Any = _ABSENT) -> Any:
        """A string value (``general.architecture``, ``tokenizer.chat_template``, …).

        Args:
            key: the metadata key.
            default: returned when the key is absent (else it is an error).

        Returns:
            The string, or ``default``.

        Raises:
            ArgumentTypeError: not a string.
            ArgumentError: absent without a default.
        """
        return self._plain(key, default, lambda v: isinstance(v, str), "a string")

    def flag(self, key: str, default: Any = _ABSENT) -> Any:
        """A bool value (``tokenizer.ggml.add_bos_token``); ``0`` and ``1`` are not bools.

        Args:
            key: the metadata key.
            default: returned when the key is absent (else it is an error).

        Returns:
            ``True`` or ``False``, or ``default``.

        Raises:
            ArgumentTypeError: not a bool.
            ArgumentError: absent without a default.
        """
        return self._plain(key, default, lambda v: isinstance(v, bool), "a bool")

    def array(self, key: str, of: str, default: Any = _ABSENT) -> Any:
        """An array whose items are all strings, all integers or all numbers
        (``tokenizer.ggml.tokens``, ``tokenizer.ggml.token_type``, ``tokenizer.ggml.scores``).

        Args:
            key: the metadata key.
            of: the items' kind: ``"string"``, ``"integer"`` or ``"number"`` (finite or not).
            default: returned when the key is absent (else it is an error).

        Returns:
            The list, or ``default``.

        Raises:
            ArgumentTypeError: not a list of such items.
            ArgumentError: absent without a default.
        """
        kinds = {"integer": _is_int, "number": _is_int_or_float}
        item = kinds.get(of, lambda v: isinstance(v, str))
        fits = _list_of(item)
        return self._plain(key, default, fits, f"an array of {of}s")

    def _plain(self, key: str, default: Any, fits: Callable[[Any], bool], wanted: str) -> Any:
        value = self._typed(key, default, fits, wanted)
        return value.value if isinstance(value, _Default) else value


class _Default:
    """A default given back for an absent key (so that no bound is applied to it)."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_int_or_float(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _list_of(fits: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(fits(v) for v in value)
