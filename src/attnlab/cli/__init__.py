"""The ``attnlab`` command line.

Each command lives in its own module of this package and exposes ``register(subparsers)``, which
adds its parser and sets ``func`` (a callable taking the parsed ``argparse.Namespace`` and returning
an exit code). Errors a user can cause end as one line on stderr and exit code 2, no traceback;
a bug (an exception attnlab did not raise on purpose) prints its traceback and exits with 1.
:mod:`attnlab.cli.errors` holds the rule; ``-v/--verbose`` prints every error's traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from attnlab.cli.errors import CLIError, report

__all__ = ["INTERRUPTED_EXIT", "CLIError", "interrupted", "main"]

# command modules, in the order `attnlab --help` lists them
COMMANDS = (
    "demo",
    "train",
    "generate",
    "translate",
    "view",
    "inspect",
    "patch",
    "plot",
    "flops",
    "bench",
    "checkpoint",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # one line, not argparse's usage block
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="attnlab",
        description="Transformer attention from the equations up: train, generate, look inside.",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log at INFO level and print the traceback of every error",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"attnlab.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"attnlab.cli.{name}":
                raise
            continue
        module.register(sub)
    return parser


INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a process that Ctrl-C ended


def interrupted() -> int:
    """Report Ctrl-C (``attnlab: interrupted``) and return its exit code, 130."""
    sys.stderr.write("attnlab: interrupted\n")
    return INTERRUPTED_EXIT


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``) and return the exit code.

    Ctrl-C at any point — while the commands' modules are imported, while the options are
    parsed, or while a command runs — prints ``attnlab: interrupted`` and returns 130, never a
    traceback (``attnlab train`` saves a checkpoint first).
    """
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return interrupted()


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()  # imports every command's module (torch, rich, …)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except Exception as exc:
        # a user's mistake: one line, exit 2; a bug: its traceback, exit 1 (see cli/errors.py)
        return report(exc, verbose=args.verbose)
