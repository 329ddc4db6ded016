"""``attnlab demo``: the main job end to end, with a tiny step count."""

from __future__ import annotations

import json
import re

import pytest

from attnlab.cli import main


def test_demo_trains_reports_and_writes_a_run_folder(tmp_path, capsys) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--steps", "3"]) == 0
    captured = capsys.readouterr()
    assert re.search(r"^exact-match accuracy: \d{1,3}\.\d%", captured.out, re.M), captured.out
    assert "→" in captured.out  # decoded examples
    assert f"run folder: {out}" in captured.out
    assert (out / "checkpoints" / "step-00000003" / "model.safetensors").is_file()
    assert (out / "checkpoints" / "step-00000003" / "tokenizer.json").is_file()
    config = json.loads((out / "checkpoints" / "step-00000003" / "config.json").read_text())
    assert config["task"] == "reverse"
    assert (config["args"]["cooldown"], config["args"]["cooldown_end"]) == (1, 3)
    png = (out / "attention.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    html = (out / "attention.html").read_text()
    assert "decoder.layers.1.cross_attn" in html and "<script" in html
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["kind"] == "train"] == [1, 2, 3]
    evals = [x for x in lines if x["kind"] == "eval"]
    assert evals and 0.0 <= evals[-1]["exact_match"] <= 1.0


def test_demo_refuses_a_non_empty_out_and_changes_nothing(tmp_path, capsys) -> None:
    (tmp_path / "keep.txt").write_text("precious")
    assert main(["demo", "--out", str(tmp_path), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists and is not empty" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_walkthrough_still_available(capsys) -> None:
    assert main(["demo", "--walkthrough"]) == 0
    out = capsys.readouterr().out
    assert "softmax" in out and "agrees: max |difference|" in out
    assert "V = x W_V" in out  # the value vectors, which the output averages


@pytest.mark.parametrize("flag", ["--bogus", "--steps=x"])
def test_bad_flags_are_one_line(flag: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["demo", flag])
    assert info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
