"""The run's metrics log, ``metrics.jsonl``: one JSON record a line, appended as training goes.

The trainer writes ``{"kind": "train", "step": ...}`` after optimizer steps and
``{"kind": "eval", "step": ...}`` after evaluations (see :mod:`attnlab.training.trainer`). A
resumed run first drops the records written after the checkpoint it resumes from
(:meth:`MetricsLog.truncate_after`), so that the log reads as if the run had never stopped.
Every line is strict JSON: a NaN or infinite value (a diverged loss) is written as ``null``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnlab.training.files import replace_file
from attnlab.training.jsonio import finite_or_none

__all__ = ["METRICS_FILE", "MetricsLog"]

#: the log's file name inside the run folder
METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    """Append-only JSON lines, truncated on resume.

    Args:
        path: the ``.jsonl`` file (it and its folder are created on the first :meth:`append`).

    Example::

        log = MetricsLog(run_dir / METRICS_FILE)
        log.append({"kind": "train", "step": 1, "loss": 2.3})
        log.truncate_after(0)  # resuming from step 0: the line of step 1 goes
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def append(self, record: Mapping[str, Any]) -> None:
        """Write ``record`` as one JSON line at the end of the file (NaN and infinities as null).

        Args:
            record: a JSON-able mapping, usually with ``"kind"`` and ``"step"``.
        """
        line = json.dumps(finite_or_none(dict(record)), allow_nan=False)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop the records of steps after ``step``, and lines that are not such a record.

        A record without ``"step"`` counts as step 0. The file is replaced atomically, and only
        when a line goes; a missing file stays missing.

        Args:
            step: the last step to keep (the step a run resumes from).
        """
        if not self.path.exists():
            return
        lines = self.path.read_text(encoding="utf-8").splitlines()
        keep = [line for line in lines if (s := _step_of(line)) is not None and s <= step]
        if len(keep) == len(lines):
            return
        replace_file(self.path, "".join(line + "\n" for line in keep).encode("utf-8"))


def _step_of(line: str) -> int | None:
    """The ``"step"`` of a JSON record line (0 when absent), or None when unreadable."""
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError, TypeError):
        return None
