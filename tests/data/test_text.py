"""Reading text files, the 90/10 split and resumable language-model batches."""

from __future__ import annotations

import pytest
import torch

from attnlab.data.text import LMBatchSource, read_text_file, split_train_val


def test_read_text_file_errors_name_the_path(tmp_path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(ValueError, match=f"data file not found: {missing}"):
        read_text_file(missing)
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(ValueError, match=f"data file is empty: {empty}"):
        read_text_file(empty)
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("café au lait".encode("latin-1"))
    with pytest.raises(
        ValueError, match=r"not UTF-8 text: .*latin1.txt \(invalid continuation byte at byte 3\)"
    ):
        read_text_file(latin)
    with pytest.raises(ValueError, match="not a regular file"):
        read_text_file(tmp_path)


def test_read_text_file_reads_utf8_and_drops_bom(tmp_path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbfna\xc3\xafve\n")
    assert read_text_file(path) == "naïve\n"


def test_split_is_first_90_last_10() -> None:
    train, val = split_train_val(torch.arange(100))
    assert train.tolist() == list(range(90)) and val.tolist() == list(range(90, 100))
    with pytest.raises(ValueError, match="train_fraction must be in"):
        split_train_val(torch.arange(10), 1.0)
    with pytest.raises(ValueError, match="too short"):
        split_train_val(torch.arange(1))


def test_batches_are_windows_with_shifted_targets() -> None:
    data = torch.arange(1000)
    src = LMBatchSource(data, block_size=16, batch_size=4, seed=3)
    b = src.batch(7)
    assert b.input_ids.shape == (4, 16) and b.targets.shape == (4, 16)
    assert torch.equal(b.targets, b.input_ids + 1)  # data is 0, 1, 2, … so the next token is +1
    assert int(b.targets.max()) <= 999


def test_batches_depend_only_on_seed_and_step() -> None:
    data = torch.randint(50, (500,))
    a = LMBatchSource(data, block_size=8, batch_size=3, seed=1)
    b = LMBatchSource(data, block_size=8, batch_size=3, seed=1)
    # b is asked out of order, as a resumed run would be
    assert torch.equal(b.batch(5).input_ids, a.batch(5).input_ids)
    assert torch.equal(b.batch(0).input_ids, a.batch(0).input_ids)
    assert not torch.equal(a.batch(0).input_ids, a.batch(1).input_ids)
    other = LMBatchSource(data, block_size=8, batch_size=3, seed=2)
    assert not torch.equal(other.batch(0).input_ids, a.batch(0).input_ids)
    val = LMBatchSource(data, block_size=8, batch_size=3, seed=1, stream=1)
    assert not torch.equal(val.batch(0).input_ids, a.batch(0).input_ids)


def test_batch_source_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="block_size=8 needs at least 9"):
        LMBatchSource(torch.arange(8), block_size=8, batch_size=1, seed=0)
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        LMBatchSource(torch.arange(100), block_size=8, batch_size=0, seed=0)
