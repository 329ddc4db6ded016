"""The metrics log: one JSON line per record, records past a step dropped on resume."""

from __future__ import annotations

import json
from pathlib import Path

from attnlab.training.metrics_log import METRICS_FILE, MetricsLog


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_append_writes_one_json_line_per_record(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "run" / METRICS_FILE)  # the folder does not exist yet
    log.append({"kind": "train", "step": 1, "loss": 2.5})
    log.append({"kind": "eval", "step": 1, "accuracy": 0.5})
    assert _records(log.path) == [
        {"kind": "train", "step": 1, "loss": 2.5},
        {"kind": "eval", "step": 1, "accuracy": 0.5},
    ]


def test_truncate_after_drops_later_steps_and_unreadable_lines(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / METRICS_FILE)
    for step in (1, 2, 3, 4):
        log.append({"kind": "train", "step": step})
    log.append({"kind": "eval", "step": 2})
    log.append({"kind": "note"})  # no step: counts as step 0
    with open(log.path, "a", encoding="utf-8") as f:
        f.write('{"kind": "train", "st\n')  # a line cut short by a crash
        f.write('{"kind": "train", "step": null}\n')
        f.write("[1, 2]\n")
    log.truncate_after(2)
    assert _records(log.path) == [
        {"kind": "train", "step": 1},
        {"kind": "train", "step": 2},
        {"kind": "eval", "step": 2},
        {"kind": "note"},
    ]
    assert not log.path.with_name(METRICS_FILE + ".tmp").exists()


def test_truncate_after_leaves_the_file_alone_when_every_line_stays(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / METRICS_FILE)
    log.append({"kind": "train", "step": 1})
    log.append({"kind": "train", "step": 2})
    before = log.path.stat()
    log.truncate_after(2)
    after = log.path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_truncate_after_without_a_file_creates_none(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / METRICS_FILE)
    log.truncate_after(3)
    assert list(tmp_path.iterdir()) == []
