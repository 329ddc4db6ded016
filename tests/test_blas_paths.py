"""The tests that assert bit-identity hold on another machine's BLAS.

On an AMD EPYC, MKL takes other code paths than on an Intel Xeon: a product of 21 rows may be
blocked differently from one of 7, and the last rows of one product computed differently from the
first. ``MKL_CBWR=COMPATIBLE`` (MKL's conditional numerical reproducibility switch: the
instruction-set-neutral path) shows the same differences on any x86-64 machine, so the tests
whose claim is "bit for bit" run here again under it, in a fresh process (MKL reads it at load).
Before the batch-invariant patching scan and the layout test's two kernels told apart, this
failed on an Intel Xeon as `make test` had on an AMD EPYC. Where torch is not built with MKL the
variable changes nothing and the tests pass as they do in the main run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: the bit-identity claims that a BLAS's blocking could break (docs/design.md, "Bit for bit")
BIT_FOR_BIT = [
    "tests/inspect/test_patching.py::test_patching_a_run_into_itself_changes_nothing",
    "tests/inspect/test_patching.py::test_one_position_and_layers",
    "tests/decoding/test_decode_step.py::test_decoding_lays_the_matrices_out_and_nothing_else_changes",
]


@pytest.mark.parametrize("path", ["COMPATIBLE"])
def test_bit_identity_holds_on_another_blas_path(path: str) -> None:
    env = {**os.environ, "MKL_CBWR": path}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            *BIT_FOR_BIT,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
