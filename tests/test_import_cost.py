"""What a one-device process imports: not ``torch.distributed.tensor`` or its checkpointing.

Importing them costs about a second of CPU in every notebook kernel, test worker and CLI call that
trains, inspects or draws on one device (and in every CLI call, ``--help`` included, whose parser
imported them); they are imported when a run shards (FSDP, tensor or
context parallelism) or converts a sharded checkpoint.
"""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

_HEAVY = ("torch.distributed.tensor", "torch.distributed.checkpoint")


def _imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": ""},
    ).stdout
    return set(out.split())


def test_one_device_imports_leave_distributed_tensors_out() -> None:
    mods = _imported_after("import attnlab.viz, attnlab.tasks, attnlab.inspect, attnlab.training")
    assert not {m for m in mods if m.startswith(_HEAVY)}


def test_every_command_line_parses_without_distributed_tensors() -> None:
    """``attnlab --help`` or any one-device command builds the whole parser: ``attnlab checkpoint
    convert`` imports its sharded-checkpoint reader when it runs, not when the parser is built."""
    mods = _imported_after("from attnlab.cli import build_parser; build_parser()")
    assert not {m for m in mods if m.startswith(_HEAVY)}


def test_distributed_names_still_resolve() -> None:
    import torch

    import attnlab.distributed as d
    from attnlab.distributed.fsdp import FSDPStrategy
    from attnlab.training.processes import is_dtensor, local_tensor

    assert d.FSDPStrategy is FSDPStrategy and d.fsdp.FSDPStrategy is FSDPStrategy
    assert all(getattr(d, name) is not None for name in d.__all__)
    t = torch.ones(2)
    assert not is_dtensor(t) and local_tensor(t) is t
