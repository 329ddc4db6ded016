"""Chat templates rendered as ``transformers`` renders them, and bounded: a template is untrusted.

A model's chat template comes from its file (a GGUF key, ``chat_template.jinja``,
``tokenizer_config.json``) and is code: it runs in jinja2's ``ImmutableSandboxedEnvironment``
(no attribute escapes, no mutation of the messages) with ``transformers``' settings —
``trim_blocks``, ``lstrip_blocks``, the ``loopcontrols`` extension, ``raise_exception``, a
``tojson`` that keeps non-ASCII text, ``strftime_now``. On top of the sandbox, what would only
exhaust the machine is bounded:

- ``range`` gives at most :data:`MAX_TEMPLATE_RANGE` items;
- ``*`` makes a string or list of at most :data:`MAX_TEMPLATE_REPEAT` items, and ``**`` a number
  of at most ``2 ** 65536``; a call (a method such as ``ljust``, a filter such as ``indent``)
  takes no integer argument above :data:`MAX_TEMPLATE_REPEAT`;
- no string or list that ``+``, ``%``, ``~``, a call or a filter makes is longer than
  :data:`MAX_CHAT_PROMPT_CHARS` (a loop that doubles a string stops there), and the output is at
  most :data:`MAX_CHAT_PROMPT_CHARS` characters (it is read as it is written).

Whatever goes wrong — a syntax error, a division by zero, a bound passed, a ``MemoryError``, the
template's own ``raise_exception`` — is one :class:`~attnlab.errors.ArgumentError` line that
names where the template comes from.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from attnlab.errors import ArgumentError

__all__ = [
    "MAX_CHAT_PROMPT_CHARS",
    "MAX_TEMPLATE_RANGE",
    "MAX_TEMPLATE_REPEAT",
    "render_chat_template",
]

#: the longest prompt a chat template may write out (characters): far past any model's context
MAX_CHAT_PROMPT_CHARS = 1 << 24
#: the most items a template's ``range`` may give (a chat template loops over the messages)
MAX_TEMPLATE_RANGE = 10_000
#: the longest string or list a template's ``*`` may make (``'-' * 80`` is what templates do)
MAX_TEMPLATE_REPEAT = 1 << 20
_MAX_POWER_BITS = 1 << 16


class _Refused(Exception):
    """The template's own ``raise_exception``: it refuses the conversation."""


class _Bound(Exception):
    """The template passed one of the bounds."""


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (jinja2 may append the template's source lines)."""
    text = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    line = getattr(exc, "lineno", None)
    text = " ".join(text.split())
    return f"{text} (line {line})" if line else text


def _bounded_range(*args: Any) -> range:
    items = range(*args)
    try:
        count = len(items)
    except OverflowError:  # more items than a Py_ssize_t
        count = MAX_TEMPLATE_RANGE + 1
    if count > MAX_TEMPLATE_RANGE:
        raise _Bound(f"range{args} gives more than {MAX_TEMPLATE_RANGE} items")
    return items


def _check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse a ``*`` or ``**`` whose result would pass the bounds, before it is computed."""
    if operator == "*":
        for seq, count in ((left, right), (right, left)):
            if (
                isinstance(seq, (str, list, tuple))
                and isinstance(count, int)
                and len(seq) * count > MAX_TEMPLATE_REPEAT
            ):
                raise _Bound(
                    f"'*' would make a {type(seq).__name__} of {len(seq) * count} items, more "
                    f"than {MAX_TEMPLATE_REPEAT}"
                )
    elif (
        operator == "**"
        and isinstance(left, int)
        and isinstance(right, int)
        and abs(left) > 1
        and abs(left).bit_length() * right > _MAX_POWER_BITS
    ):
        raise _Bound(f"{left} ** {right} has more than {_MAX_POWER_BITS} bits")


def _sized(value: Any) -> Any:
    """``value``, unless it is a string or list longer than any prompt may be."""
    if isinstance(value, (str, list, tuple)) and len(value) > MAX_CHAT_PROMPT_CHARS:
        raise _Bound(
            f"it made a {type(value).__name__} of {len(value)} items, more than "
            f"{MAX_CHAT_PROMPT_CHARS}"
        )
    return value


def _check_arguments(args: Any, kwargs: Any) -> None:
    """Refuse a call with an integer argument no chat template needs (``ljust(10**10)``)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and abs(value) > MAX_TEMPLATE_REPEAT:
            raise _Bound(f"a call with the argument {value} (more than {MAX_TEMPLATE_REPEAT})")


def _bounded_filter(function: Any) -> Any:
    """A filter whose integer arguments and result are bounded (its jinja2 marks kept)."""

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_arguments(args, kwargs)
        return _sized(function(*args, **kwargs))

    return bounded


def _environment() -> Any:
    """transformers' sandboxed environment, with the bounds of this module."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):  # type: ignore[misc]
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_binop(operator, left, right)
            return _sized(super().call_binop(context, operator, left, right))

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            if __obj is not _bounded_range:
                _check_arguments(args, kwargs)
            return _sized(super().call(__context, __obj, *args, **kwargs))

    def raise_exception(message: str) -> None:
        raise _Refused(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["range"] = _bounded_range
    env.filters = {name: _bounded_filter(f) for name, f in env.filters.items()}
    return env


def _bound_concatenation(compiled: Any) -> None:
    """Bound ``~``: the compiled template joins its operands with ``str_join``, a global of its
    module (shared by its blocks and macros), replaced here by a join whose result is sized."""
    namespace = compiled.root_render_func.__globals__
    join = namespace.get("str_join")
    if join is not None:
        namespace["str_join"] = lambda parts: _sized(join(parts))


def render_chat_template(template: str, where: str, **variables: Any) -> str:
    """A chat template rendered in the bounded sandbox (see the module's description).

    Args:
        template: the jinja2 source.
        where: where it comes from, for the messages (``"model.gguf's tokenizer.chat_template"``,
            a file's path).
        **variables: what the template sees (``messages``, ``add_generation_prompt``,
            ``bos_token``, …).

    Returns:
        The rendered text.

    Raises:
        ArgumentError: the template is not valid jinja2, refuses the conversation (its
            ``raise_exception``), passes a bound, or fails in any other way (one line naming
            ``where``).
    """
    import jinja2

    env = _environment()
    try:
        compiled = env.from_string(template)
        _bound_concatenation(compiled)
    except jinja2.TemplateSyntaxError as exc:
        raise ArgumentError(f"{where} is not valid jinja2: {_one_line(exc)}") from None
    except Exception as exc:  # an untrusted template: e.g. a RecursionError of deep nesting
        raise ArgumentError(
            f"{where} cannot be compiled: {type(exc).__name__}: {_one_line(exc)}"
        ) from None
    chunks: list[str] = []
    size = 0
    try:
        for chunk in compiled.generate(**variables):
            size += len(chunk)
            if size > MAX_CHAT_PROMPT_CHARS:
                raise _Bound(f"its output passed {MAX_CHAT_PROMPT_CHARS} characters")
            chunks.append(chunk)
    except _Refused as exc:
        raise ArgumentError(f"{where} refused the conversation: {_one_line(exc)}") from None
    except _Bound as exc:
        raise ArgumentError(f"{where} failed: {_one_line(exc)}") from None
    except Exception as exc:  # an untrusted template: any failure is the template's, one line
        raise ArgumentError(f"{where} failed: {type(exc).__name__}: {_one_line(exc)}") from None
    return "".join(chunks)
