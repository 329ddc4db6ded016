"""copy / reverse / sort."""

from __future__ import annotations

import pytest

from attnlab.data.toy_sequences import SequenceTask, SequenceTaskConfig, task_target


@pytest.mark.parametrize(
    ("name", "expected"), [("copy", [5, 4, 6]), ("reverse", [6, 4, 5]), ("sort", [4, 5, 6])]
)
def test_targets(name: str, expected: list[int]) -> None:
    assert task_target(name, [5, 4, 6]) == expected


@pytest.mark.parametrize("name", ["copy", "reverse", "sort"])
def test_batches_teach_the_task(name: str) -> None:
    task = SequenceTask(SequenceTaskConfig(name, num_symbols=6, min_len=2, max_len=9), seed=0)
    b = task.batch(3, batch_size=16)
    tok = task.tokenizer
    for src_row, tgt_row in zip(b.src.tolist(), b.targets.tolist()):
        src = [t for t in src_row if t != tok.pad_id]
        assert src[-1] == tok.eos_id
        src = src[:-1]
        tgt = [t for t in tgt_row if t != tok.pad_id]
        assert 2 <= len(src) <= 9
        assert tgt == [*task_target(name, src), tok.eos_id]
    assert (b.tgt_in[:, 0] == tok.bos_id).all()


def test_lengths_vary_and_strings_read_as_letters() -> None:
    task = SequenceTask(SequenceTaskConfig("reverse", num_symbols=4, min_len=1, max_len=12), seed=0)
    lengths = {len(s) for s in task.heldout()}
    assert len(lengths) > 6
    text = task.tokenizer.decode(task.heldout()[0])
    assert set(text) <= set("abcd")


def test_heldout_never_appears_in_training() -> None:
    cfg = SequenceTaskConfig("copy", num_symbols=3, min_len=1, max_len=6, num_heldout=20)
    task = SequenceTask(cfg, seed=0)
    heldout = {tuple(s) for s in task.heldout()}
    assert len(heldout) == 20  # distinct
    assert all(task.is_heldout(s) for s in heldout)
    for step in range(30):
        b = task.batch(step, batch_size=32)
        for row in b.src.tolist():
            assert tuple(t for t in row if t not in (0, 3)) not in heldout


def test_same_seed_same_data_other_seed_other_data() -> None:
    cfg = SequenceTaskConfig("sort")
    a, b, c = SequenceTask(cfg, 1), SequenceTask(cfg, 1), SequenceTask(cfg, 2)
    assert a.batch(4, 8).src.tolist() == b.batch(4, 8).src.tolist()
    assert a.batch(4, 8).src.tolist() != c.batch(4, 8).src.tolist()
    assert a.heldout() == b.heldout() != c.heldout()


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="name must be one of copy, reverse, sort, got 'rot13'"):
        SequenceTaskConfig("rot13")
    with pytest.raises(ValueError, match=r"max_len must be >= min_len \(5\), got 3"):
        SequenceTaskConfig(min_len=5, max_len=3)
    with pytest.raises(ValueError, match="num_symbols must be in"):
        SequenceTaskConfig(num_symbols=1)
    with pytest.raises(ValueError, match="num_heldout must leave most strings"):
        SequenceTaskConfig(num_symbols=2, min_len=1, max_len=3, num_heldout=10)
