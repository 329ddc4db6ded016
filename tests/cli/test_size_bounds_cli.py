"""Issue 21, defects 2 and 3 on the command line: sizes beyond the machine and counts no run
needs are refused in one line (exit 2) naming the option and the bytes needed and available (or
the cap), at once — before the fix they ended in the allocator's error shown as a bug, an abort
inside the tokenizers library (exit 134), or ran until killed.

Each command runs in a child process whose address space is capped (so that a regression fails
here instead of taking the machine's memory) and which is killed after ``TIMEOUT`` seconds: a
``python -m attnlab`` forked from one server that imported the command line once
(``tests/cli/_forked.py``), not a fresh interpreter each.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.cli._forked import ForkedCLI

TIMEOUT = 60
ADDRESS_SPACE = 4 * 2**30

TEXT = "to be, or not to be, that is the question:\n" * 40


@pytest.fixture(scope="module")
def cli() -> Iterator[ForkedCLI]:
    server = ForkedCLI()
    yield server
    server.close()


def _attnlab(cli: ForkedCLI, *args: str) -> tuple[int, list[str], float]:
    start = time.perf_counter()
    code, _, err = cli.run(*args, timeout=TIMEOUT, address_space=ADDRESS_SPACE)
    if code is None:
        pytest.fail(f"attnlab {' '.join(args)} ran past {TIMEOUT} s")
    return code, err.splitlines(), time.perf_counter() - start


@pytest.fixture
def lm(tmp_path):
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    return ["train", "lm", "--data", str(data), "--out", str(tmp_path / "run"),
            "--steps", "2", "--warmup", "1"]  # fmt: skip


@pytest.fixture
def translate(tmp_path):
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("a b c d\n" * 10, encoding="utf-8")
    tgt.write_text("w x y z\n" * 10, encoding="utf-8")
    return ["train", "translate", "--src", str(src), "--tgt", str(tgt),
            "--out", str(tmp_path / "run"), "--steps", "2", "--warmup", "1"]  # fmt: skip


def _refused(cli: ForkedCLI, args: list[str], *fragments: str) -> str:
    code, lines, _ = _attnlab(cli, *args)
    assert code == 2, lines[-5:]
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


MEMORY = ("needs about ", " bytes) for ", "but the machine has ", " bytes) of memory")


@pytest.mark.parametrize(
    ("extra", "option"),
    [(["--batch-size", "1000000000"], "--batch-size 1000000000"),
     (["--n-embd", "1000000"], "--n-embd 1000000"),
     (["--attention", "performer", "--num-features", "1000000000"], "--num-features 1000000000")],
)  # fmt: skip
def test_lm_sizes_beyond_the_machine(cli, lm, extra, option) -> None:
    line = _refused(cli, [*lm, *extra], *MEMORY)
    assert line.startswith(f"attnlab: error: {option} ")


def test_translate_vocabulary_beyond_the_machine(cli, translate) -> None:
    line = _refused(cli, [*translate, "--src-vocab", "1000000000"], *MEMORY)
    assert line.startswith("attnlab: error: --src-vocab 1000000000 needs about ")


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--n-layer", "100000"], "--n-layer must be at most 1000 "),
     (["--eval-iters", "1000000000"], "--eval-iters must be at most 100000 "),
     (["--grad-accum", "1000000000"], "--grad-accum must be at most 10000 ")],  # issue 32
)  # fmt: skip
def test_lm_counts_are_capped(cli, lm, extra, message) -> None:
    _refused(cli, [*lm, *extra], message)


def test_generate_beams_are_capped(cli, tmp_path) -> None:
    # argparse refuses the value before the run is read
    _refused(
        cli,
        ["generate", str(tmp_path), "--prompt", "to", "--strategy", "beam", "--beams", "1000000"],
        "--beams",
        "at most 1000",
        "1000000",
    )


def test_generate_new_tokens_are_capped(cli, tmp_path) -> None:
    # issue 32: --max-new-tokens 10**12 slid past the context for days; refused before the run
    _refused(
        cli,
        ["generate", str(tmp_path / "missing"), "--prompt", "to", "--max-new-tokens", str(10**12)],
        "--max-new-tokens must be at most 1000000",
    )


@pytest.mark.parametrize(
    "extra",
    [["--attention", "bigbird", "--bigbird-block", "4", "--bigbird-seed", str(2**70)],
     ["--seed", str(2**70)]],
)  # fmt: skip
def test_seeds_are_bounded(cli, lm, extra) -> None:
    _refused(cli, [*lm, *extra], extra[-2], str(2**70))


def test_generate_seed_is_bounded(cli, tmp_path) -> None:
    _refused(cli, ["generate", str(tmp_path), "--prompt", "to", "--seed", str(2**70)], "--seed")


def test_a_run_that_fits_still_trains(cli, lm) -> None:
    code, lines, _ = _attnlab(cli, *lm, "--block-size", "16", "--n-embd", "16", "--n-layer", "1",
                              "--n-head", "2", "--batch-size", "2", "--eval-iters", "1")  # fmt: skip
    assert code == 0, lines[-5:]


def test_each_command_is_a_child_capped_and_killed_at_its_deadline(cli, lm) -> None:
    """What the tests above rely on (tests/cli/_forked.py): a child past its deadline is killed,
    and its address space is capped (below what it has mapped: its first allocation fails)."""
    assert cli.run(*lm, "--steps", "1000000", timeout=1.0)[0] is None
    code, _, err = cli.run(*lm, timeout=TIMEOUT, address_space=64 * 2**20)
    assert code not in (0, 2, None), err[-2000:]
