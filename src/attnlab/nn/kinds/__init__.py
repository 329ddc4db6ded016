# isort: skip_file
"""Attention kinds: one spec object per kind (full, sliding window, BigBird, Linformer,
Performer), and the registry a new kind joins (:func:`register_attention`).

See :mod:`attnlab.nn.kinds.base` for what a spec does.
"""

from attnlab.nn.kinds.base import (
    AttentionSite,
    AttentionSpec,
    CliOption,
    attention_kinds,
    cli_dests,
    register_attention,
    spec_class,
    spec_from_cli,
    spec_from_dict,
    spec_from_legacy,
    spec_to_cli,
    unregister_attention,
)

# registered in this order (the order of --attention's choices)
from attnlab.nn.kinds.full import FullSpec
from attnlab.nn.kinds.sliding import SlidingSpec, window_pairs
from attnlab.nn.kinds.linformer import LinformerSpec
from attnlab.nn.kinds.performer import PerformerSpec
from attnlab.nn.kinds.bigbird import BigBirdSpec, block_pairs

__all__ = [
    "AttentionSite",
    "AttentionSpec",
    "BigBirdSpec",
    "CliOption",
    "FullSpec",
    "LinformerSpec",
    "PerformerSpec",
    "SlidingSpec",
    "attention_kinds",
    "block_pairs",
    "cli_dests",
    "register_attention",
    "spec_class",
    "spec_from_cli",
    "spec_from_dict",
    "spec_from_legacy",
    "spec_to_cli",
    "unregister_attention",
    "window_pairs",
]
