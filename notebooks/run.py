"""Execute the learning-path notebooks: jupytext sources in, executed ``.ipynb`` out.

Each notebook is a plain-text jupytext "percent" file (``notebooks/NN_name.py``) whose first code
cell holds ``FULL = False``. This script runs it in a fresh Jupyter kernel and writes the executed
notebook, outputs included, to ``build/notebooks/NN_name.ipynb``: the documentation site renders
those, and the test suite runs every notebook through :func:`execute` at the small size.

An executed notebook records a key, the SHA-256 of its source, the size it ran at and every file of
``src/attnlab``; a notebook whose key is unchanged is not run again (``--force`` runs it anyway)::

    python notebooks/run.py                 # every notebook, small size, two at a time
    python notebooks/run.py 03 05 --full    # notebooks 03 and 05 at full size
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SOURCE = REPO / "src" / "attnlab"
BUILD = REPO / "build" / "notebooks"
SWITCH = re.compile(r"^FULL = False\b", re.MULTILINE)


@dataclass(frozen=True)
class Executed:
    """One notebook run: its executed form, where it was written and how long the kernel took."""

    name: str
    notebook: nbformat.NotebookNode
    path: Path
    seconds: float
    reused: bool


def sources() -> list[Path]:
    """The notebooks of the learning path, in order (``NN_name.py``)."""
    return sorted(HERE.glob("[0-9][0-9]_*.py"))


def _library_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(SOURCE.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(SOURCE)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def cache_key(source: Path, *, full: bool, library: str | None = None) -> str:
    """What an executed notebook depends on: its text, its size and the library's code."""
    h = hashlib.sha256()
    h.update(source.read_bytes())
    h.update(b"full" if full else b"small")
    h.update((library or _library_digest()).encode())
    return h.hexdigest()


def load(source: Path, *, full: bool) -> nbformat.NotebookNode:
    """Read a jupytext source; with ``full`` its ``FULL = False`` switch is turned on."""
    nb = jupytext.read(source)
    code = [c for c in nb.cells if c.cell_type == "code"]
    if not code or not SWITCH.search(code[0].source):
        raise ValueError(f"{source.name}: the first code cell must hold the line 'FULL = False'")
    if full:
        code[0].source = SWITCH.sub("FULL = True", code[0].source)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def execute(
    source: Path,
    *,
    full: bool = False,
    out_dir: Path = BUILD,
    force: bool = False,
    threads: int | None = None,
    timeout: int = 600,
    library: str | None = None,
) -> Executed:
    """Run one notebook in a fresh kernel (working folder: ``notebooks/``) and write it executed.

    Args:
        source: the jupytext file.
        full: run at full size (``FULL = True``).
        out_dir: where the executed ``.ipynb`` goes.
        force: run even when the stored key matches.
        threads: ``OMP_NUM_THREADS`` for the kernel (the tests give each of their two workers one).
        timeout: seconds one cell may take.
        library: the digest of ``src/attnlab`` when the caller has it already.

    Returns:
        The :class:`Executed` run. A failing cell raises ``nbclient``'s ``CellExecutionError``
        naming the cell and the error; nothing is written then.
    """
    key = cache_key(source, full=full, library=library)
    out = out_dir / (source.stem + ".ipynb")
    if not force and out.exists():
        old = nbformat.read(out, as_version=4)
        meta = old.metadata.get("attnlab", {})
        if meta.get("key") == key:
            return Executed(source.stem, old, out, float(meta.get("seconds", 0.0)), True)
    nb = load(source, full=full)
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(HERE)}},
    )
    start = time.perf_counter()
    client.execute(env=env)
    seconds = time.perf_counter() - start
    nb.metadata["attnlab"] = {"key": key, "seconds": round(seconds, 1), "full": full}
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    nbformat.write(nb, tmp)
    tmp.replace(out)
    return Executed(source.stem, nb, out, seconds, False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="notebook numbers or names (default: all)")
    p.add_argument("--full", action="store_true", help="full size (FULL = True)")
    p.add_argument("--force", action="store_true", help="run even when the output is current")
    p.add_argument("--jobs", type=int, default=2, help="notebooks run at once (default 2)")
    p.add_argument(
        "--timeout", type=int, default=600, help="seconds one cell may take (default 600)"
    )
    p.add_argument("--out", type=Path, default=BUILD, help=f"default {BUILD.relative_to(REPO)}")
    args = p.parse_args(argv)
    chosen = [
        s for s in sources() if not args.names or any(s.stem.startswith(n) for n in args.names)
    ]
    if not chosen:
        p.error(f"no notebook matches {args.names}")
    library = _library_digest()
    threads = max(1, (os.cpu_count() or 1) // max(1, args.jobs))

    def one(source: Path) -> Executed:
        run = execute(
            source, full=args.full, out_dir=args.out, force=args.force, threads=threads,
            timeout=args.timeout, library=library,
        )  # fmt: skip
        state = "current" if run.reused else f"ran in {run.seconds:.1f} s"
        sys.stderr.write(f"{run.name}: {state} → {run.path}\n")
        return run

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
