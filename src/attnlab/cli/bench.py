"""``attnlab bench [NAMES...] [--quick]`` — run the scripts of the repository's ``benchmarks/``.

Each benchmark is a standalone script (``benchmarks/attention.py``, ``long_attention.py``,
``generate.py``, …) that prints its own table of ratios; this command finds the folder next to
the installed package (a source checkout, ``pip install -e .``), runs the named scripts one after
the other in fresh Python processes, and passes ``--quick`` (small sizes) and the options in
``--args`` through.

Examples::

    attnlab bench                      # every benchmark, full sizes (minutes)
    attnlab bench attention --quick    # one benchmark, small sizes
    attnlab bench attention --args "--lengths 4096 --dtypes fp32"
    attnlab bench long_attention --args "--lengths 4096 16384 --figure build/long.png"
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from attnlab.cli import CLIError
from attnlab.cli._help import plain

__all__ = ["benchmarks_dir", "find_benchmarks", "register", "run"]


def benchmarks_dir() -> Path:
    """The ``benchmarks/`` folder of the source checkout this package was installed from.

    Raises:
        CLIError: when the package does not sit in a checkout (a plain wheel install).
    """
    import attnlab

    root = Path(attnlab.__file__).resolve().parents[2]  # <root>/src/attnlab/__init__.py
    folder = root / "benchmarks"
    if not folder.is_dir():
        raise CLIError(
            f"benchmarks folder not found at {folder}; `attnlab bench` runs from a source checkout "
            "(pip install -e .)"
        )
    return folder


def find_benchmarks(folder: Path) -> dict[str, Path]:
    """Benchmark name → script: every ``*.py`` of the folder except private ones."""
    return {p.stem: p for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "bench",
        help="run the benchmarks (attention backends, long-context attention, generation, "
        "training step)",
        description=plain(__doc__),
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help="benchmarks to run (default: all), e.g. attention"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: seconds, not minutes")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument(
        "--args",
        default="",
        metavar="OPTIONS",
        help='options passed to each script, quoted, e.g. --args "--lengths 4096 --dtypes fp32"',
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    console = Console()
    available = find_benchmarks(benchmarks_dir())
    if args.list:
        for name, path in available.items():
            console.print(f"{name}  [dim]{path}[/]")
        return 0
    names = list(args.names) or list(available)
    unknown = [n for n in names if n.removesuffix(".py") not in available]
    if unknown:
        raise CLIError(
            f"unknown benchmark {unknown[0]!r}; expected one of: {', '.join(available) or '(none)'}"
        )
    try:
        extra = shlex.split(args.args)
    except ValueError:  # shlex's error for an unclosed quote or a trailing escape
        raise CLIError(
            f"--args must be options as a shell would split them, got {args.args!r}"
        ) from None
    failed = []
    for name in names:
        script = available[name.removesuffix(".py")]
        cmd = [sys.executable, str(script), *(["--quick"] if args.quick else []), *extra]
        console.rule(f"[bold]{script.stem}[/]")
        code = subprocess.run(cmd, check=False).returncode
        if code != 0:
            failed.append(f"{script.stem} (exit {code})")
    if failed:
        raise CLIError(f"benchmarks failed: {', '.join(failed)}")
    return 0
