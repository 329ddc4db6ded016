"""Where the trainer's batches come from: a :class:`BatchSource` returns the next *global* batch
and saves and restores its position, so that a resumed run sees exactly the batches it would have
seen; :class:`IndexedBatches` turns a function ``index -> batch`` into one."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["BatchSource", "IndexedBatches"]


@runtime_checkable
class BatchSource(Protocol):
    """Where batches come from, with a position that checkpoints can save and restore."""

    def next_batch(self) -> Any:
        """Produce the next batch and advance the position.

        Returns:
            The next global batch (a tensor or a dict/tuple/dataclass of tensors).
        """
        ...

    def state_dict(self) -> dict[str, Any]:
        """The position, to resume from.

        Returns:
            JSON-able values and tensors that :meth:`load_state_dict` accepts.
        """
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go back to a position.

        Args:
            state: what :meth:`state_dict` returned.
        """
        ...


class IndexedBatches:
    """A :class:`BatchSource` from a function of the batch index (0, 1, 2, …).

    Args:
        make_batch: ``index -> batch``; must be deterministic (derive any randomness from the
            index, e.g. ``torch.Generator().manual_seed(seed * 1_000_003 + index)``).
        start: the first index. Default: 0.
    """

    def __init__(self, make_batch: Callable[[int], Any], start: int = 0) -> None:
        self.make_batch = make_batch
        self.index = int(start)

    def next_batch(self) -> Any:
        """``make_batch(index)``, then the index moves on by one.

        Returns:
            The batch of the current index.
        """
        batch = self.make_batch(self.index)
        self.index += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The position.

        Returns:
            ``{"index": the index of the next batch}``.
        """
        return {"index": self.index}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go back to a position.

        Args:
            state: what :meth:`state_dict` returned, ``{"index": ...}``.
        """
        self.index = int(state["index"])
