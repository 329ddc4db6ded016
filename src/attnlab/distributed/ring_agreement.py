"""Every rank of a ring must pass arguments of one shape: one small all-gather compares them.

A bad argument then raises the same error on every rank instead of leaving the others waiting
(:func:`~attnlab.distributed.ring.ring_attention`,
:func:`~attnlab.distributed.ring.unshard_sequence`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from attnlab._checks import shape_str
from attnlab.distributed.ring_schedule import LAYOUTS
from attnlab.distributed.ring_transfer import _Ring
from attnlab.errors import ArgumentError

# dtypes by code, for comparing the ranks' arguments
_DTYPES = (
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)
_MAX_DIMS = 8


@dataclass(frozen=True)
class _Field:
    name: str
    kind: str  # "shape" | "dtype" | "bool" | "layout" | "float" | "int"
    value: Any
    seq_dim: int = -2  # a shape's sequence dimension

    def encode(self) -> list[float]:
        if self.kind == "shape":
            dims = list(self.value)
            return [float(len(dims)), *map(float, dims), *[0.0] * (_MAX_DIMS - len(dims))]
        if self.kind == "dtype":
            return [float(_DTYPES.index(self.value) if self.value in _DTYPES else len(_DTYPES))]
        if self.kind == "layout":
            return [float(LAYOUTS.index(self.value))]
        if self.kind == "float":
            return [0.0, 0.0] if self.value is None else [1.0, float(self.value)]
        return [float(self.value)]

    def decode(self, values: list[float]) -> Any:
        if self.kind == "shape":
            return tuple(int(d) for d in values[1 : 1 + int(values[0])])
        if self.kind == "dtype":
            i = int(values[0])
            return _DTYPES[i] if i < len(_DTYPES) else "another dtype"
        if self.kind == "layout":
            return LAYOUTS[int(values[0])]
        if self.kind == "float":
            return None if values[0] == 0.0 else values[1]
        if self.kind == "bool":
            return bool(values[0])
        return int(values[0])

    @property
    def width(self) -> int:
        return {"shape": 1 + _MAX_DIMS, "float": 2}.get(self.kind, 1)


def _agree(
    ring: _Ring,
    what: str,
    kinds: list[tuple[str, str]],
    fields: list[_Field] | None,
    problem: Exception | None,
) -> None:
    """All-gather every rank's arguments (``None`` with ``problem`` where its own checks failed)
    and raise, on every rank alike, when a rank failed or the ranks disagree."""
    width = 1 + sum(_Field(n, k, None).width for n, k in kinds)
    mine = torch.zeros(width, dtype=torch.float64)
    if problem is None and fields is not None:
        mine[0] = 1.0
        mine[1:] = torch.tensor([x for f in fields for x in f.encode()], dtype=torch.float64)
    where = ring.collective_device()
    gathered = [
        torch.empty(width, dtype=torch.float64, device=where) for _ in range(ring.world_size)
    ]
    dist.all_gather(gathered, mine.to(where), group=ring.group)
    rows = [g.cpu().tolist() for g in gathered]
    if problem is not None:
        raise problem
    failed = [r for r, row in enumerate(rows) if row[0] != 1.0]
    if failed:
        ranks = ", ".join(map(str, failed))
        raise ArgumentError(
            f"{what}: rank {ranks} of {ring.world_size} rejected its arguments (see the error "
            "raised there); every rank raises, so that none waits on the ring"
        )
    if fields is None:  # every rank passed its checks, this one included, so it has fields
        raise RuntimeError(f"{what}: a rank that passed its checks sent no arguments")
    for r, row in enumerate(rows[1:], start=1):
        at = 1
        for f in fields:
            here, first = f.decode(row[at : at + f.width]), f.decode(rows[0][at : at + f.width])
            at += f.width
            if here == first:
                continue
            if f.kind == "shape":
                differ = [i for i, (a, b) in enumerate(zip(here, first)) if a != b]
                seq = f.seq_dim % max(len(here), 1)
                if len(here) == len(first) and differ == [seq]:
                    raise ArgumentError(
                        f"{what}: {f.name} holds T_local = {here[seq]} tokens on rank {r} but "
                        f"{first[seq]} on rank 0: every rank must hold a chunk of the same length "
                        "(T_local = T / world_size)"
                    )
                raise ArgumentError(
                    f"{what}: {f.name} has shape {shape_str(here)} on rank {r} but "
                    f"{shape_str(first)} on rank 0: every rank must hold a chunk of the same shape"
                )
            raise ArgumentError(
                f"{what}: {f.name} is {here!r} on rank {r} but {first!r} on rank 0: every rank "
                f"must pass the same {f.name}"
            )
