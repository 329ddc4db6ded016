"""The command-line option types and option groups the tasks share."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any, TypeVar

from attnlab.errors import ArgumentError
from attnlab.models.config import ATTENTIONS

Number = TypeVar("Number", int, float)

__all__ = [
    "ATTENTION_DESTS",
    "add_attention_arguments",
    "add_transformer_arguments",
    "attention_options",
    "non_negative_float",
    "non_negative_int",
    "positive_float",
    "positive_int",
    "probability",
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
        warmup: default of ``--warmup`` (Noam warm-up steps).
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
        "--warmup", type=positive_int, default=warmup, help=f"Noam warm-up steps (default {warmup})"
    )
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


#: the attention options' argparse dests; left out of a run's ``config.json`` while unset (``None``),
#: so that runs saved before the options existed compare equal when resumed
ATTENTION_DESTS: tuple[str, ...] = (
    "attention", "window", "linformer_k", "num_features", "bigbird_block", "global_blocks",
    "window_blocks", "random_blocks", "bigbird_seed",
)  # fmt: skip

# each pattern parameter's option: dest -> (flag, the --attention it belongs to, config field);
# ``--block-size`` is the context length of ``train lm``, so BigBird's block is --bigbird-block
_PARAMETERS: dict[str, tuple[str, str, str]] = {
    "window": ("--window", "sliding", "window"),
    "linformer_k": ("--linformer-k", "linformer", "linformer_k"),
    "num_features": ("--num-features", "performer", "num_features"),
    "bigbird_block": ("--bigbird-block", "bigbird", "block_size"),
    "global_blocks": ("--global-blocks", "bigbird", "global_blocks"),
    "window_blocks": ("--window-blocks", "bigbird", "window_blocks"),
    "random_blocks": ("--random-blocks", "bigbird", "num_random_blocks"),
    "bigbird_seed": ("--bigbird-seed", "bigbird", "bigbird_seed"),
}
# the options an --attention cannot do without
_REQUIRED = ("window", "linformer_k", "bigbird_block")


def add_attention_arguments(parser: argparse.ArgumentParser, *, what: str) -> None:
    """The attention pattern options: ``--attention``, ``--window``, ``--linformer-k``,
    ``--num-features``, and BigBird's ``--bigbird-block``, ``--global-blocks``,
    ``--window-blocks``, ``--random-blocks``, ``--bigbird-seed`` (group "attention"); all
    default ``None`` (full attention; BigBird's unset ones take the config's defaults).

    Args:
        parser: the task's (or command's) parser.
        what: where the pattern applies, for the help text (e.g. ``"self-attention"``).
    """
    g = parser.add_argument_group("attention")
    g.add_argument(
        "--attention",
        choices=ATTENTIONS,
        default=None,
        help=f"the {what} pattern (default full)",
    )
    g.add_argument(
        "--window", type=positive_int, default=None,
        help="sliding window w: a token sees the w tokens before it (with --attention sliding)",
    )  # fmt: skip
    g.add_argument(
        "--linformer-k", type=positive_int, default=None,
        help="Linformer's projected length k (with --attention linformer)",
    )  # fmt: skip
    g.add_argument(
        "--num-features", type=positive_int, default=None,
        help="Performer's random features m (with --attention performer; default d_head·ln d_head)",
    )  # fmt: skip
    g.add_argument(
        "--bigbird-block", type=positive_int, default=None, metavar="B",
        help="BigBird's block of B tokens (with --attention bigbird; not --block-size, the context)",
    )  # fmt: skip
    g.add_argument(
        "--global-blocks", type=non_negative_int, default=None, metavar="G",
        help="BigBird's global blocks, the first G (with --attention bigbird; default 1)",
    )  # fmt: skip
    g.add_argument(
        "--window-blocks", type=non_negative_int, default=None, metavar="W",
        help="BigBird's band of W blocks, 0 or odd (with --attention bigbird; default 3)",
    )  # fmt: skip
    g.add_argument(
        "--random-blocks", type=non_negative_int, default=None, metavar="R",
        help="BigBird's random key blocks per block (with --attention bigbird; default 2)",
    )  # fmt: skip
    g.add_argument(
        "--bigbird-seed", type=non_negative_int, default=None, metavar="S",
        help="the seed of BigBird's random blocks, kept in the model's config (default 0)",
    )  # fmt: skip


def attention_options(args: argparse.Namespace, *, causal_only: bool) -> dict[str, Any]:
    """The config fields of :func:`add_attention_arguments`'s options, checked together.

    Args:
        args: the parsed command line.
        causal_only: the model's attention is all causal (a GPT): ``--attention linformer`` is
            refused.

    Returns:
        ``{"attention", "window", "linformer_k", "num_features", "block_size",
        "global_blocks", "window_blocks", "num_random_blocks", "bigbird_seed"}`` for the model
        config (``None`` for the options not given).

    Raises:
        ValueError: a parameter without its ``--attention`` (``--window`` needs ``sliding``,
            ``--linformer-k`` ``linformer``, ``--num-features`` ``performer``, the BigBird
            options ``bigbird``), a missing ``--window``/``--linformer-k``/``--bigbird-block``,
            an even ``--window-blocks``, or ``--attention linformer`` for a causal model.
    """
    attention = getattr(args, "attention", None) or "full"
    out: dict[str, Any] = {"attention": attention}
    for dest, (flag, owner, field) in _PARAMETERS.items():
        value = getattr(args, dest, None)
        if value is not None and attention != owner:
            raise ArgumentError(
                f"{flag} applies to --attention {owner}, got --attention {attention}"
            )
        if value is None and attention == owner and dest in _REQUIRED:
            raise ArgumentError(f"--attention {owner} needs {flag}")
        out[field] = value
    blocks = out["window_blocks"]
    if blocks is not None and blocks % 2 == 0 and blocks != 0:
        raise ArgumentError(
            f"--window-blocks must be 0 or odd (a band around the block), got {blocks}"
        )
    if attention == "bigbird" and out["global_blocks"] == out["window_blocks"] == 0:
        if out["num_random_blocks"] == 0:
            raise ArgumentError(
                "--attention bigbird needs some visible blocks: --global-blocks, "
                "--window-blocks and --random-blocks are all 0"
            )
    if causal_only and attention == "linformer":
        raise ArgumentError(
            "--attention linformer does not fit a GPT: its attention is causal, and "
            "Linformer's projected keys mix future positions; use --attention sliding or performer"
        )
    return out
