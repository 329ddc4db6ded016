"""Shared bits of the tutorial scripts: the ``--small`` switch and the output folder."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def parse_args(description: str) -> argparse.Namespace:
    """``--small`` (or env ``ATTNLAB_EXAMPLES_SMALL=1``) for quick runs; ``--out`` for figures."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--small",
        action="store_true",
        default=os.environ.get("ATTNLAB_EXAMPLES_SMALL") == "1",
        help="tiny sizes (the test suite uses this)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("ATTNLAB_EXAMPLES_OUT", "examples_out")),
        help="where figures are written",
    )
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    return args
