"""Padding and length bucketing for sequence-to-sequence batches.

Sentences of similar length are batched together so that little compute goes to padding. The
batches of epoch ``e`` are a pure function of ``(seed, e)``, and optimizer step ``s`` takes
batch ``s mod n`` of epoch ``s div n``: the data position of a run is its step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnlab.data.text import step_generator
from attnlab.errors import ArgumentError

__all__ = [
    "BucketedBatchSource",
    "Seq2SeqBatch",
    "bucket_batches",
    "make_seq2seq_batch",
    "pad_batch",
]


def pad_batch(
    seqs: Sequence[Sequence[int]], pad_id: int, *, length: int | None = None
) -> torch.Tensor:
    """Right-pad token lists into one tensor.

    Args:
        seqs: ``B`` token lists (non-empty batch).
        pad_id: the padding id.
        length: pad to this length (default: the longest sequence).

    Returns:
        A ``torch.long`` tensor.

    Shape:
        ``(B, length)``.

    Examples:
        >>> pad_batch([[5, 6, 7], [8]], pad_id=0)
        tensor([[5, 6, 7],
                [8, 0, 0]])
    """
    if len(seqs) == 0:
        raise ArgumentError("seqs must hold at least one sequence, got 0")
    longest = max(len(s) for s in seqs)
    length = longest if length is None else length
    if length < longest:
        raise ArgumentError(f"length must be >= the longest sequence ({longest}), got {length}")
    lengths = torch.tensor([len(s) for s in seqs])
    # one tensor of every token, placed where column < the row's length: row b holds seqs[b]
    tokens = torch.tensor([int(t) for s in seqs for t in s], dtype=torch.long)
    out = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    out[torch.arange(length) < lengths[:, None]] = tokens
    return out


@dataclass(frozen=True)
class Seq2SeqBatch:
    """One encoder-decoder batch (teacher forcing).

    Attributes:
        src: ``(B, S)`` source ids, right-padded.
        tgt_in: ``(B, T)`` decoder input ``<bos> y_1 … y_n``.
        targets: ``(B, T)`` what each decoder position predicts ``y_1 … y_n <eos>``; padding is
            ``pad_id`` (the loss ignores it).

    Shape:
        src ``(B, S)``; tgt_in and targets ``(B, T)``.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    targets: torch.Tensor


def make_seq2seq_batch(
    src: Sequence[Sequence[int]],
    tgt: Sequence[Sequence[int]],
    *,
    pad_id: int,
    bos_id: int,
    eos_id: int,
) -> Seq2SeqBatch:
    """Pad sources, and turn targets ``y`` into ``<bos> y`` (input) and ``y <eos>`` (targets).

    Args:
        src: ``B`` source token lists.
        tgt: ``B`` target token lists (without ``<bos>``/``<eos>``).
        pad_id: the padding id.
        bos_id: the begin-of-sequence id that starts the decoder input.
        eos_id: the end-of-sequence id that ends the targets.

    Returns:
        A :class:`Seq2SeqBatch`.
    """
    if len(src) != len(tgt):
        raise ArgumentError(
            f"src and tgt must hold as many sequences, got {len(src)} and {len(tgt)}"
        )
    return Seq2SeqBatch(
        src=pad_batch(src, pad_id),
        tgt_in=pad_batch([[bos_id, *t] for t in tgt], pad_id),
        targets=pad_batch([[*t, eos_id] for t in tgt], pad_id),
    )


def bucket_batches(
    lengths: Sequence[int],
    max_tokens: int,
    *,
    generator: torch.Generator | None = None,
    max_batch_size: int | None = None,
) -> list[list[int]]:
    """Group example indices into batches of similar length.

    Examples are sorted by length (ties broken at random), then cut into consecutive batches
    whose padded size ``batch_size * longest`` stays within ``max_tokens``; the batch order is
    shuffled. Every index appears in exactly one batch.

    Args:
        lengths: the length of each example (e.g. ``max(len(src), len(tgt))``).
        max_tokens: the padded-token budget of one batch (an example longer than it still gets
            a batch of its own).
        generator: the randomness (ties and batch order); ``None`` keeps the sorted order.
        max_batch_size: an upper bound on examples per batch.

    Returns:
        Lists of indices into ``lengths``.
    """
    if max_tokens <= 0:
        raise ArgumentError(f"max_tokens must be positive, got {max_tokens}")
    n = len(lengths)
    if n == 0:
        return []
    lens = torch.as_tensor(list(lengths), dtype=torch.long)
    if generator is not None:
        perm = torch.randperm(n, generator=generator)
        order = perm[torch.sort(lens[perm], stable=True).indices]
    else:
        order = torch.sort(lens, stable=True).indices
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order.tolist():
        new_longest = max(longest, int(lens[i]))
        too_many = max_batch_size is not None and len(current) >= max_batch_size
        if current and (new_longest * (len(current) + 1) > max_tokens or too_many):
            batches.append(current)
            current, new_longest = [], int(lens[i])
        current.append(i)
        longest = new_longest
    batches.append(current)
    if generator is not None:
        batches = [batches[j] for j in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


class BucketedBatchSource:
    """Length-bucketed teacher-forcing batches of a parallel corpus, a pure function of the step.

    Args:
        src: source token lists.
        tgt: target token lists (same count).
        max_tokens: padded-token budget per batch (see :func:`bucket_batches`).
        pad_id: the padding id.
        bos_id: the begin-of-sequence id that starts the decoder input.
        eos_id: the end-of-sequence id that ends the targets.
        seed: the data seed; epoch ``e`` is bucketed and shuffled with ``(seed, e)``.

    Examples:
        >>> source = BucketedBatchSource([[4, 5], [6]], [[7], [8, 9]], max_tokens=8,
        ...                              pad_id=0, bos_id=2, eos_id=3, seed=0)
        >>> source.batch(0).src.shape[0] <= 2
        True
    """

    def __init__(
        self,
        src: Sequence[Sequence[int]],
        tgt: Sequence[Sequence[int]],
        *,
        max_tokens: int,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        seed: int,
    ) -> None:
        if len(src) != len(tgt):
            raise ArgumentError(
                f"src and tgt must hold as many sequences, got {len(src)} and {len(tgt)}"
            )
        if len(src) == 0:
            raise ArgumentError("the corpus must hold at least one sentence pair, got 0")
        self.src, self.tgt = list(src), list(tgt)
        self.max_tokens = max_tokens
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.seed = seed
        # + 1 for <bos>/<eos>; the padded size is decided by the longer side
        self.lengths = [max(len(s), len(t) + 1) for s, t in zip(self.src, self.tgt)]
        self._epoch: tuple[int, list[list[int]]] | None = None
        # the grouping depends only on the sorted lengths, so every epoch has as many batches
        self.batches_per_epoch = len(bucket_batches(self.lengths, max_tokens))

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """The batches of one epoch, bucketed by length and shuffled with ``(seed, epoch)``.

        Args:
            epoch: the epoch, counted from 0.

        Returns:
            The batches, each a list of example indices.
        """
        if self._epoch is None or self._epoch[0] != epoch:
            gen = step_generator(self.seed, epoch, stream=2)
            self._epoch = (epoch, bucket_batches(self.lengths, self.max_tokens, generator=gen))
        return self._epoch[1]

    def batch(self, step: int) -> Seq2SeqBatch:
        """The batch of one optimizer step (epochs follow each other, each bucketed anew).

        Args:
            step: the optimizer step, counted from 0.

        Returns:
            The padded teacher-forcing batch.
        """
        epoch, index = divmod(step, self.batches_per_epoch)
        ids = self.epoch_batches(epoch)[index]
        return make_seq2seq_batch(
            [self.src[i] for i in ids],
            [self.tgt[i] for i in ids],
            pad_id=self.pad_id,
            bos_id=self.bos_id,
            eos_id=self.eos_id,
        )
