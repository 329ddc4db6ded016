"""Files with one job each (issue 20): no library file over 750 lines.

A file that grows past the limit holds more than one idea; split it along its ideas (as
``distributed/ring*.py``, ``nn/masks.py`` and ``nn/block_layout.py``, ``viz/probe_history.py``
and ``viz/evolution*.py`` were) rather than raise the limit.
"""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "attnlab"
MAX_LINES = 750


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _too_long() -> dict[str, int]:
    return {
        path.relative_to(SRC).as_posix(): n
        for path in sorted(SRC.rglob("*.py"))
        if (n := _lines(path)) > MAX_LINES
    }


def test_no_library_file_is_over_the_limit() -> None:
    over = _too_long()
    assert not over, f"files over {MAX_LINES} lines (split them along their ideas): {over}"
