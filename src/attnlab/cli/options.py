"""The command-line option types and option groups the tasks share."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any, TypeVar

from attnlab._checks import SEED_LIMIT
from attnlab.nn.kinds import AttentionSpec, attention_kinds, cli_dests, spec_class, spec_from_cli
from attnlab.tasks.train_options import CAPS

Number = TypeVar("Number", int, float)

__all__ = [
    "add_attention_arguments",
    "add_cache_argument",
    "add_transformer_arguments",
    "attention_spec",
    "beams",
    "non_negative_float",
    "non_negative_int",
    "positive_float",
    "positive_int",
    "probability",
    "seed",
]


def _parse(
    text: str, kind: Callable[[str], Number], what: str, accept: Callable[[Number], bool]
) -> Number:
    """``text`` read by ``kind`` and accepted, or argparse's error: what was expected, what came."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not accept(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def add_cache_argument(parser: argparse.ArgumentParser) -> None:
    """``--no-cache``, for a command that loads a pretrained model: ``args.no_cache``."""
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="a GGUF model (smollm2-135m, a .gguf file): dequantise it again instead of reading "
        "the cached weights, and write no cache ($ATTNLAB_CACHE, else $XDG_CACHE_HOME/attnlab, "
        "else ~/.cache/attnlab)",
    )


def positive_int(text: str) -> int:
    """argparse type: an int >= 1.

    Args:
        text: the command-line value.

    Returns:
        The value as an ``int``.

    Raises:
        argparse.ArgumentTypeError: not an int, or below 1;
            argparse prints it as a one-line usage error.
    """
    return _parse(text, int, "a positive int", lambda v: v >= 1)


def non_negative_int(text: str) -> int:
    """argparse type: an int >= 0.

    Args:
        text: the command-line value.

    Returns:
        The value as an ``int``.

    Raises:
        argparse.ArgumentTypeError: not an int, or negative;
            argparse prints it as a one-line usage error.
    """
    return _parse(text, int, "a non-negative int", lambda v: v >= 0)


def seed(text: str) -> int:
    """argparse type: a seed, an int in ``[0, 2**32)``.

    Args:
        text: the command-line value.

    Returns:
        The value as an ``int``.

    Raises:
        argparse.ArgumentTypeError: not an int, negative, or ``2**32`` or more;
            argparse prints it as a one-line usage error.
    """
    return _parse(text, int, "an int in [0, 2**32)", lambda v: 0 <= v < SEED_LIMIT)


#: the most beams any command decodes with (:data:`attnlab.tasks.train_options.CAPS`)
MAX_BEAMS = CAPS["beams"][0]


def beams(text: str) -> int:
    """argparse type: a beam size, an int in ``[1, MAX_BEAMS]`` (beam search gains nothing from
    more, and each beam costs a decoding).

    Args:
        text: the command-line value.

    Returns:
        The value as an ``int``.

    Raises:
        argparse.ArgumentTypeError: not an int, below 1 or above :data:`MAX_BEAMS`;
            argparse prints it as a one-line usage error.
    """
    what = f"a positive int at most {MAX_BEAMS} (more beams only cost time)"
    return _parse(text, int, what, lambda v: 1 <= v <= MAX_BEAMS)


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0.

    Args:
        text: the command-line value.

    Returns:
        The value as a ``float``.

    Raises:
        argparse.ArgumentTypeError: not a finite float, or not above 0;
            argparse prints it as a one-line usage error.
    """
    return _parse(text, float, "a finite positive float", lambda v: 0 < v < math.inf)


def non_negative_float(text: str) -> float:
    """argparse type: a finite float >= 0.

    Args:
        text: the command-line value.

    Returns:
        The value as a ``float``.

    Raises:
        argparse.ArgumentTypeError: not a finite float, or negative;
            argparse prints it as a one-line usage error.
    """
    return _parse(text, float, "a finite non-negative float", lambda v: 0 <= v < math.inf)


def probability(text: str) -> float:
    """argparse type: a float in [0, 1).

    Args:
        text: the command-line value.

    Returns:
        The value as a ``float``.

    Raises:
        argparse.ArgumentTypeError: not a float in ``[0, 1)``;
            argparse prints it as a one-line usage error.
    """
    return _parse(text, float, "a float in [0, 1)", lambda v: 0.0 <= v < 1.0)


def add_transformer_arguments(
    parser: argparse.ArgumentParser,
    *,
    d_model: int,
    layers: int,
    heads: int,
    d_ff: int,
    dropout: float,
    warmup: int,
    batch_size: int | None,
    label_smoothing: float = 0.1,
    lr_factor: float = 1.0,
) -> None:
    """The encoder-decoder's size and optimisation options, with task-specific defaults.

    Adds ``--d-model``, ``--layers``, ``--heads``, ``--d-ff``, ``--dropout``,
    ``--label-smoothing`` (group "model") and ``--batch-size``, ``--warmup``, ``--cooldown``,
    ``--cooldown-end``, ``--lr-factor`` (group "optimisation").

    Args:
        parser: the task's sub-command parser.
        d_model: default of ``--d-model``.
        layers: default of ``--layers`` (encoder and decoder layers each).
        heads: default of ``--heads``.
        d_ff: default of ``--d-ff``.
        dropout: default of ``--dropout``.
        warmup: the default of ``--warmup`` (Noam warm-up steps) that its help names; the
            option's value is ``None`` unless given, resolved by
            :func:`~attnlab.tasks.train_options.warmup_steps` (a tenth of a shorter run).
        batch_size: default of ``--batch-size``; ``None`` adds no such option (the task
            batches by tokens instead).
        label_smoothing: default of ``--label-smoothing``; 0.1 (the paper's) unless given.
        lr_factor: default of ``--lr-factor`` (the Noam factor); 1.0 unless given.
    """
    g = parser.add_argument_group("model")
    g.add_argument("--d-model", type=positive_int, default=d_model, help=f"default {d_model}")
    g.add_argument(
        "--layers",
        type=positive_int,
        default=layers,
        help=f"encoder and decoder layers each (default {layers})",
    )
    g.add_argument("--heads", type=positive_int, default=heads, help=f"default {heads}")
    g.add_argument("--d-ff", type=positive_int, default=d_ff, help=f"default {d_ff}")
    g.add_argument("--dropout", type=probability, default=dropout, help=f"default {dropout}")
    g.add_argument(
        "--label-smoothing",
        type=probability,
        default=label_smoothing,
        help=f"default {label_smoothing}",
    )
    o = parser.add_argument_group("optimisation")
    if batch_size is not None:
        o.add_argument(
            "--batch-size", type=positive_int, default=batch_size, help=f"default {batch_size}"
        )
    o.add_argument(
        "--warmup", type=positive_int, default=None,
        help=f"Noam warm-up steps (default {warmup}, or a tenth of --steps when it is not above "
        f"{warmup})",
    )  # fmt: skip
    o.add_argument(
        "--cooldown",
        type=non_negative_int,
        default=0,
        help="anneal the rate linearly to 0 over this many steps (default 0: plain Noam)",
    )
    o.add_argument(
        "--cooldown-end",
        type=non_negative_int,
        default=0,
        help="the step at which the cool-down reaches 0 (needed with --cooldown)",
    )
    o.add_argument(
        "--lr-factor",
        type=positive_float,
        default=lr_factor,
        help=f"Noam factor (default {lr_factor})",
    )


_PARSERS: dict[str, Callable[[str], Any]] = {
    "positive_int": positive_int,
    "non_negative_int": non_negative_int,
    "float": float,
    "str": str,
}


def add_attention_arguments(parser: argparse.ArgumentParser, *, what: str) -> None:
    """The attention options (group "attention"): ``--attention NAME`` (every registered kind,
    :func:`~attnlab.nn.kinds.attention_kinds`) and each kind's own options, from its spec
    (:attr:`~attnlab.nn.kinds.AttentionSpec.cli_options`: ``--window``, ``--linformer-k``,
    ``--num-features``, BigBird's ``--bigbird-block``, …); all default ``None`` (full
    attention; a kind's unset options take the spec's defaults).

    Args:
        parser: the task's (or command's) parser.
        what: where the pattern applies, for the help text (e.g. ``"self-attention"``).
    """
    g = parser.add_argument_group("attention")
    g.add_argument(
        "--attention",
        choices=attention_kinds(),
        default=None,
        help=f"the {what} pattern (default full)",
    )
    for name in attention_kinds():
        for option in spec_class(name).cli_options:
            g.add_argument(
                option.flag,
                dest=option.dest,
                type=_PARSERS[option.kind],
                default=None,
                metavar=option.metavar,
                help=option.help,
            )


def attention_spec(args: argparse.Namespace) -> AttentionSpec | None:
    """The spec of ``--attention NAME`` and its kind's options, or ``None`` when no attention
    option was given (full attention).

    Args:
        args: the parsed command line (with :func:`add_attention_arguments`'s options).

    Returns:
        The spec, or ``None``.

    Raises:
        ValueError: an option of another kind, a required one missing, or a value the spec
            refuses (:func:`~attnlab.nn.kinds.spec_from_cli`).
    """
    given = {dest: getattr(args, dest, None) for dest in cli_dests()[1:]}
    name = getattr(args, "attention", None)
    if name is None and all(v is None for v in given.values()):
        return None
    return spec_from_cli(name, given)
