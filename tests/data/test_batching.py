"""Padding and length bucketing."""

from __future__ import annotations

import pytest
import torch

from attnlab.data.batching import BucketedBatchSource, bucket_batches, make_seq2seq_batch, pad_batch


def test_pad_batch() -> None:
    out = pad_batch([[5, 6, 7], [8], []], pad_id=0)
    assert out.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert pad_batch([[1]], pad_id=9, length=3).tolist() == [[1, 9, 9]]
    with pytest.raises(ValueError, match=r"length must be >= the longest sequence \(3\), got 2"):
        pad_batch([[1, 2, 3]], pad_id=0, length=2)
    with pytest.raises(ValueError, match="at least one sequence"):
        pad_batch([], pad_id=0)


def test_seq2seq_batch_adds_bos_and_eos() -> None:
    b = make_seq2seq_batch([[4, 5], [6]], [[7, 8, 9], [10]], pad_id=0, bos_id=2, eos_id=3)
    assert b.src.tolist() == [[4, 5], [6, 0]]
    assert b.tgt_in.tolist() == [[2, 7, 8, 9], [2, 10, 0, 0]]
    assert b.targets.tolist() == [[7, 8, 9, 3], [10, 3, 0, 0]]


def test_bucket_batches_cover_every_index_once_within_budget() -> None:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 30, (200,), generator=gen).tolist()
    batches = bucket_batches(lengths, max_tokens=64, generator=gen)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(200))
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 64
    # similar lengths together: the spread inside a batch is small
    spreads = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches]
    assert max(spreads) <= 3


def test_bucket_batches_oversized_example_gets_its_own_batch() -> None:
    assert bucket_batches([100, 1, 1], max_tokens=10) == [[1, 2], [0]]


def test_bucketed_source_is_a_pure_function_of_the_step() -> None:
    src = [[4] * n for n in range(1, 41)]
    tgt = [[5] * n for n in range(1, 41)]
    kwargs = dict(max_tokens=40, pad_id=0, bos_id=2, eos_id=3, seed=7)
    a, b = BucketedBatchSource(src, tgt, **kwargs), BucketedBatchSource(src, tgt, **kwargs)
    n = a.batches_per_epoch
    assert n > 1
    seen = sorted(
        int((a.batch(s).src != 0).sum(1)[i])
        for s in range(n)
        for i in range(a.batch(s).src.shape[0])
    )
    assert seen == list(range(1, 41))  # one epoch visits every pair once
    for step in (n + 1, 3, 0, 2 * n):  # out of order, as after a resume
        assert torch.equal(a.batch(step).src, b.batch(step).src)
    epoch0 = [a.batch(s).src.shape for s in range(n)]
    epoch1 = [a.batch(n + s).src.shape for s in range(n)]
    assert epoch0 != epoch1  # a new shuffle each epoch


def test_pad_batch_places_each_row_like_a_loop() -> None:
    # the one-scatter padding against row-by-row assignment, over ragged rows (empty ones too)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        lengths = torch.randint(0, 6, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g)
        seqs = [torch.randint(1, 50, (int(n),), generator=g).tolist() for n in lengths]
        length = int(lengths.max()) + int(torch.randint(0, 3, (1,), generator=g))
        expected = torch.full((len(seqs), length), 0, dtype=torch.long)
        for row, seq in enumerate(seqs):
            expected[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        assert torch.equal(pad_batch(seqs, 0, length=length), expected)
