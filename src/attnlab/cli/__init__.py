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
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from attnlab.cli.errors import CLIError, report

__all__ = ["INTERRUPTED_EXIT", "CLIError", "interrupted", "main"]

# command modules, in the order `attnlab --help` lists them
COMMANDS = (
    "demo",
    "train",
    "generate",
    "translate",
    "view",
    "serve",
    "inspect",
    "patch",
    "embed",
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


def _exit_interrupted(signum: int, frame: object) -> None:
    os.write(2, b"attnlab: interrupted\n")
    os._exit(INTERRUPTED_EXIT)


@contextmanager
def _exit_at_once_on_ctrl_c() -> Iterator[None]:
    """Ctrl-C while the commands' modules import ends the process at once with 130.

    Not as a ``KeyboardInterrupt``: one raised inside a library's import can leave it half
    initialised, and the library may turn it into another error (numpy answers the retry with
    ``ImportError: cannot load module more than once per process``, a traceback). Nothing has
    been done yet, so there is nothing to save. Only where Python's own handler is installed
    (an embedding program's handler is left alone) and in the main thread.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    signal.signal(signal.SIGINT, _exit_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
    with _exit_at_once_on_ctrl_c():
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
