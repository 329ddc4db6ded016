"""``attnlab._budget``: the memory of the machine and the one-line refusals of sizes and counts."""

from __future__ import annotations

import os

import pytest

from attnlab._budget import (
    available_memory,
    bpe_training_bytes,
    check_at_most,
    check_fits,
    format_bytes,
)
from attnlab.data.tokenizers import train_bpe
from attnlab.errors import ArgumentError


def test_available_memory_is_at_most_the_physical_memory() -> None:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < available_memory() <= total
    assert available_memory("cpu") == available_memory(None)


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 bytes"), (1023, "1023 bytes"), (1536, "1.5 KiB"), (3 * 2**30, "3.0 GiB"),
     (2**50 * 5, "5.0 PiB"), (2**60, "1024.0 PiB")],
)  # fmt: skip
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_check_fits_names_the_option_and_both_sizes() -> None:
    check_fits("--batch-size 8", 100, what="a step", available=100)
    with pytest.raises(ArgumentError) as info:
        check_fits("--batch-size 9", 3 * 2**30, what="a step", available=2**30)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("--batch-size 9 needs about 3.0 GiB (3221225472 bytes) for a step")
    assert "the machine has 1.0 GiB (1073741824 bytes)" in message


def test_check_at_most() -> None:
    check_at_most("--eval-iters", 10, 10, "batches")
    with pytest.raises(
        ArgumentError, match=r"^--eval-iters must be at most 10 \(batches\), got 11$"
    ):
        check_at_most("--eval-iters", 11, 10, "batches")


def test_bpe_vocabulary_beyond_the_machine_is_refused_before_training() -> None:
    # the tokenizers library would abort the whole process (exit 134) reserving it
    too_many = available_memory() // bpe_training_bytes(1) + 1
    with pytest.raises(ArgumentError, match=f"^vocab_size {too_many} needs about"):
        train_bpe(["a b c a b"] * 3, too_many)
    # a vocabulary larger than the text allows but that fits trains (to what the text gives)
    assert train_bpe(["a b c a b"] * 3, 10**5).vocab_size < 100
