"""A text corpus for language modelling: read, split, and draw batches.

The batches follow nanoGPT's ``get_batch``: ``batch_size`` random windows of ``block_size + 1``
tokens; the input is the first ``block_size`` tokens and the target the last ``block_size``.
A batch is a pure function of ``(seed, step)``, so the data position of a run is just its step:
a resumed run draws exactly the batches the uninterrupted run would have drawn.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.errors import ArgumentError

__all__ = ["LMBatch", "LMBatchSource", "read_text_file", "split_train_val", "step_generator"]


def read_text_file(path: str | Path, *, what: str = "data file") -> str:
    """Read a whole UTF-8 text file.

    Args:
        path: the file.
        what: how error messages name the file (``"data file"``, ``"--src file"``…).

    Returns:
        The text (a leading byte-order mark is dropped).

    Raises:
        ValueError: one line naming the path — the file is missing, is a directory, is empty,
            or is not UTF-8 text.
    """
    path = Path(path)
    if not path.exists():
        raise ArgumentError(f"{what} not found: {path}")
    if not path.is_file():
        raise ArgumentError(f"{what} is not a regular file: {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ArgumentError(
            f"{what} is not UTF-8 text: {path} ({exc.reason} at byte {exc.start})"
        ) from exc
    if not text.strip():
        raise ArgumentError(f"{what} is empty: {path}")
    return text


def split_train_val(
    data: torch.Tensor, train_fraction: float = 0.9
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a token stream: the first ``train_fraction`` trains, the rest validates.

    Args:
        data: a 1-D token stream.
        train_fraction: in (0, 1).

    Returns:
        ``(train, val)``, views of ``data``; neither is empty.

    Shape:
        ``(N,)`` → ``(floor(f N),)`` and ``(N - floor(f N),)``.
    """
    if data.dim() != 1:
        raise ArgumentError(f"data must be a 1-D token stream, got {data.dim()} dimensions")
    if not 0.0 < train_fraction < 1.0:
        raise ArgumentError(f"train_fraction must be in (0, 1), got {train_fraction}")
    n = int(train_fraction * data.numel())
    if n == 0 or n == data.numel():
        raise ArgumentError(
            f"data of {data.numel()} tokens is too short to split {train_fraction:.0%} / "
            f"{1 - train_fraction:.0%}"
        )
    return data[:n], data[n:]


def step_generator(seed: int, step: int, stream: int = 0) -> torch.Generator:
    """A CPU generator determined by ``(seed, step, stream)`` only.

    Distinct ``stream`` values give independent sequences for the same step (e.g. training
    batches vs. evaluation batches).

    Args:
        seed: the data seed.
        step: the optimizer step.
        stream: tells apart sources that share a seed (default 0).

    Returns:
        A freshly seeded CPU ``torch.Generator``.
    """
    # a hash, not a sum: distinct (seed, step, stream) triples never share a generator state
    digest = hashlib.blake2b(f"{seed}:{step}:{stream}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


@dataclass(frozen=True)
class LMBatch:
    """Inputs and next-token targets.

    Attributes:
        input_ids: ``(B, T)`` token ids.
        targets: ``(B, T)``, ``targets[:, t]`` is the token after ``input_ids[:, t]``.

    Shape:
        input_ids and targets ``(B, T)``.
    """

    input_ids: torch.Tensor
    targets: torch.Tensor


class LMBatchSource:
    """Random windows of a token stream, a pure function of ``(seed, step)``.

    Args:
        data: the 1-D token stream (e.g. the training split).
        block_size: the context length ``T``.
        batch_size: windows per batch ``B``.
        seed: the data seed.
        stream: tells apart sources that share a seed (train 0, validation 1).

    Shape:
        ``batch(step)`` → :class:`LMBatch` of ``(B, T)`` tensors.

    Examples:
        >>> src = LMBatchSource(torch.arange(100), block_size=8, batch_size=2, seed=0)
        >>> b = src.batch(0)
        >>> bool((b.targets[:, :-1] == b.input_ids[:, 1:]).all())
        True
    """

    def __init__(
        self, data: torch.Tensor, block_size: int, batch_size: int, seed: int, stream: int = 0
    ) -> None:
        if data.dim() != 1:
            raise ArgumentError(f"data must be a 1-D token stream, got {data.dim()} dimensions")
        for name, value in (("block_size", block_size), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ArgumentError(f"{name} must be a positive int, got {value!r}")
        if data.numel() < block_size + 1:
            raise ArgumentError(
                f"data has {data.numel()} tokens but block_size={block_size} needs at least "
                f"{block_size + 1}"
            )
        self.data = data.long()
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self.stream = stream

    def batch(self, step: int) -> LMBatch:
        """The batch of one optimizer step: ``B`` random windows of ``T + 1`` tokens.

        Args:
            step: the optimizer step, counted from 0; the batch depends on ``(seed, stream, step)``.

        Returns:
            The inputs and their next-token targets.
        """
        gen = step_generator(self.seed, step, self.stream)
        # start offsets i ~ U{0, …, N - T - 1}; x = data[i : i+T], y = data[i+1 : i+T+1]
        starts = torch.randint(
            self.data.numel() - self.block_size, (self.batch_size,), generator=gen
        )
        index = starts[:, None] + torch.arange(self.block_size + 1)[None, :]  # (B, T+1)
        windows = self.data[index]
        return LMBatch(input_ids=windows[:, :-1], targets=windows[:, 1:])
