"""``attnlab bench``: finds the repository's benchmarks and runs them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.cli.bench import benchmarks_dir, find_benchmarks
from attnlab.nn.backends import ATTENTION_BACKENDS
from tests.conftest import REPO


def test_lists_the_attention_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    assert "attention" in find_benchmarks(benchmarks_dir())
    assert main(["bench", "--list"]) == 0
    assert "attention" in capsys.readouterr().out


def test_unknown_name_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "no-such-benchmark"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error: unknown benchmark 'no-such-benchmark'; expected one of:")
    assert "attention" in err and len(err.strip().splitlines()) == 1


def test_runs_the_attention_benchmark_quickly(capfd: pytest.CaptureFixture[str]) -> None:
    options = (
        "--lengths 64 --dtypes fp32 --causal yes --no-memory --repeats 1 "
        "--impls torch.sdpa sdpa blockwise math"
    )
    assert main(["bench", "attention", "--quick", "--args", options]) == 0
    out = capfd.readouterr().out
    assert "blockwise" in out and "fp32, causal" in out and "sdpa / torch SDPA forward" in out


def test_runs_the_long_attention_benchmark_quickly(capfd: pytest.CaptureFixture[str]) -> None:
    assert "long_attention" in find_benchmarks(benchmarks_dir())
    options = "--lengths 128 --no-memory"
    assert main(["bench", "long_attention", "--quick", "--args", options]) == 0
    out = capfd.readouterr().out
    for row in (
        "torch.sdpa, full causal (peer)",
        "attnlab blockwise, full causal",
        "sliding window w=256, causal",
        "BigBird block-sparse b=64, causal",
        "Linformer k=256, NON-causal",
        "Performer m=256, causal",
    ):
        assert row in out, row
    assert "1.000x" in out  # the peer against itself
    assert "target (time, forward): not measured at T=16384" in out


def test_long_attention_skips_from_predictions(capfd: pytest.CaptureFixture[str]) -> None:
    options = "--lengths 256 --no-memory --max-seconds 0.001 --methods sliding"
    assert main(["bench", "long_attention", "--quick", "--args", options]) == 0
    out = capfd.readouterr().out
    assert "skip torch.sdpa at T=256: predicted" in out and "> --max-seconds 0.001" in out
    assert "skipped" in out


def test_a_failing_benchmark_fails_the_command(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "attention", "--args", "--dtypes fp8"]) == 2
    assert "benchmarks failed: attention (exit 2)" in capfd.readouterr().err


def test_unbalanced_quotes_in_args_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "attention", "--args", '--dtypes "fp32']) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error: --args must be options as a shell would split them")
    assert err.count("\n") == 1


def test_runs_the_long_quality_benchmark_quickly(capfd: pytest.CaptureFixture[str]) -> None:
    """The selective-copy table of every attention (4 steps: the script works, not the result)."""
    assert main(["bench", "long_quality", "--quick", "--args", "copy"]) == 0
    out = capfd.readouterr().out
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["attention"] for r in rows] == [
        "full",
        "sliding (w=16)",
        "bigbird (b=16, 1 global)",
        "bigbird, no global block",
        "performer",
    ]
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["chance"] == 1 / 16 for r in rows)
    assert "selective copy, T = 64" in out


@pytest.mark.distributed
def test_runs_the_context_parallel_benchmark_quickly(capfd: pytest.CaptureFixture[str]) -> None:
    options = "--length 256 --worlds 1 2"
    assert main(["bench", "context_parallel", "--quick", "--args", options]) == 0
    out = capfd.readouterr().out
    rows = [line.split("│")[1:-1] for line in out.splitlines() if line.startswith("│")]
    assert [r[0].strip() for r in rows] == ["1", "2"] and rows[0][3].strip() == "1.00", out
    assert float(rows[1][3]) > 0 and "x" in rows[1][5], out  # measured, not an error text


def test_gpu_benchmark_smoke_runs_on_the_cpu(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """benchmarks/gpu.py --quick: every section at tiny sizes, JSON and markdown in --out."""
    out = tmp_path / "gpu"
    assert main(["bench", "gpu", "--quick", "--args", f"--device cpu --out {out}"]) == 0
    results = json.loads((out / "gpu.json").read_text())
    kernels = {r["what"] for r in results["attention"]}
    assert {"sdpa backend, causal", "flex, window 256"} <= kernels
    assert all(r["ratio"] > 0 for r in results["attention"])
    hf, ours = results["train"]
    assert abs(hf["first_loss"] - ours["first_loss"]) < 1e-3  # the same weights, the same loss
    decoded = [r for r in results["decode"] if "skipped" not in r]
    assert decoded and all(r["same_tokens"] for r in decoded)
    table = (out / "gpu.md").read_text()
    assert "| attnlab GPT |" in table and "| HF GPT2LMHeadModel (sdpa), eager |" in table
    assert re.search(r"attnlab GPT / HF GPT2LMHeadModel \(sdpa\), eager: [0-9.]+x tokens/s", table)
    assert "## Host work per attention call" in table and "## Greedy decoding" in table
    assert "## Greedy decoding" in capfd.readouterr().out


def test_gpu_benchmark_keeps_what_it_measured_when_a_part_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One failing kernel is one failed row, one failing section a line; the rest is measured,
    saved, and the exit status is 1 (the one prepared GPU run must not lose its other results)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gpu

    def broken(*args: object, **kwargs: object) -> object:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

    monkeypatch.setitem(ATTENTION_BACKENDS, "flex", broken)
    monkeypatch.setattr(gpu, "train_rows", lambda *a: broken())
    out = tmp_path / "gpu"
    code = gpu.main(
        [
            "--quick",
            "--device",
            "cpu",
            "--sections",
            "attention",
            "train",
            "decode",
            "--out",
            str(out),
        ]
    )
    assert code == 1
    results = json.loads((out / "gpu.json").read_text())
    failed = [r for r in results["attention"] if "error" in r]
    assert failed and all(r["what"].startswith("flex") for r in failed)
    assert "OutOfMemoryError: CUDA out of memory" in failed[0]["error"]
    assert all(r["ratio"] > 0 for r in results["attention"] if "error" not in r)
    assert "OutOfMemoryError" in results["errors"]["train"]
    assert [r for r in results["decode"] if "same_tokens" in r]  # the section after still ran
    table = (out / "gpu.md").read_text()
    assert "train failed: OutOfMemoryError" in table and "| flex, window 256 | failed:" in table
