"""What spans processes: data, sequence (ring attention), tensor and FSDP parallelism.

- :func:`ring_attention` — attention over a sequence spread across the ranks of a process group,
  key/value chunks passed around the ring (``ring``)
- :func:`shard_sequence`, :func:`unshard_sequence`, :func:`sequence_positions` — which tokens a
  rank holds in the ``"contiguous"`` and the load-balanced ``"zigzag"`` layout
  (``ring_schedule``, ``ring``)
- :func:`ring_pieces`, :func:`zigzag_visibility`, :class:`RingPiece` — the ring's schedule: the
  kernel calls of each step (``ring_schedule``)
- :func:`tp_plan`, :class:`HeadParallel`, :class:`ReplicateParallel`, :func:`qkv_row_order` —
  Megatron-style tensor parallelism with DTensor: heads and feed-forward units split over a
  device mesh; ``tensor_parallel.parallelize(model, mesh)`` applies the plan, and
  ``tensor_parallel.full_state_dict``/``load_full_state_dict`` move whole tensors in and out
  (``tensor_parallel``)
- :func:`context_parallelize`, :class:`ContextParallelModel` — a GPT context parallel: its
  attention layers as ring attention over a group, its tokens fed at their global positions
  (``context_parallel``)
- :class:`MeshStrategy` — data × context × tensor parallelism on one ``(dp, cp, tp)`` device mesh
  for the trainer: ``attnlab train ... --context-parallel C --tensor-parallel N`` (``mesh``)
- :class:`FSDPStrategy`, :func:`shard_model`, :func:`transformer_blocks` — fully sharded data
  parallelism (FSDP2) for the trainer: ``attnlab train ... --parallel fsdp`` (``fsdp``)
- :func:`consolidate` — a sharded checkpoint into attnlab's single folder
  (``attnlab checkpoint convert``; ``checkpoint``)
"""

from attnlab.distributed.checkpoint import consolidate
from attnlab.distributed.context_parallel import ContextParallelModel, context_parallelize
from attnlab.distributed.fsdp import FSDPStrategy, shard_model, transformer_blocks
from attnlab.distributed.mesh import MeshStrategy
from attnlab.distributed.ring import ring_attention, unshard_sequence
from attnlab.distributed.ring_schedule import (
    RingPiece,
    ring_pieces,
    sequence_positions,
    shard_sequence,
    zigzag_visibility,
)
from attnlab.distributed.tensor_parallel import (
    HeadParallel,
    ReplicateParallel,
    qkv_row_order,
    tp_plan,
)

__all__ = [
    "ContextParallelModel",
    "FSDPStrategy",
    "HeadParallel",
    "MeshStrategy",
    "ReplicateParallel",
    "RingPiece",
    "consolidate",
    "context_parallelize",
    "qkv_row_order",
    "ring_attention",
    "ring_pieces",
    "sequence_positions",
    "shard_model",
    "shard_sequence",
    "tp_plan",
    "transformer_blocks",
    "unshard_sequence",
    "zigzag_visibility",
]
