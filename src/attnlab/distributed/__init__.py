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

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# each name is imported from its module when first used: the modules pull in
# torch.distributed.checkpoint and DTensor (about a second of CPU), which `import attnlab.tasks`
# (for ring_schedule's LAYOUTS) on one device never needs
_WHERE = {
    "ContextParallelModel": "context_parallel",
    "FSDPStrategy": "fsdp",
    "HeadParallel": "tensor_parallel",
    "MeshStrategy": "mesh",
    "ReplicateParallel": "tensor_parallel",
    "RingPiece": "ring_schedule",
    "consolidate": "checkpoint",
    "context_parallelize": "context_parallel",
    "qkv_row_order": "tensor_parallel",
    "ring_attention": "ring",
    "ring_pieces": "ring_schedule",
    "sequence_positions": "ring_schedule",
    "shard_model": "fsdp",
    "shard_sequence": "ring_schedule",
    "tp_plan": "tensor_parallel",
    "transformer_blocks": "fsdp",
    "unshard_sequence": "ring",
    "zigzag_visibility": "ring_schedule",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        if importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f"{__name__}.{name}")  # a submodule, e.g. .fsdp
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


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
