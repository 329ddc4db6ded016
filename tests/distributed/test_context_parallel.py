"""A GPT context parallel (issue 13): its attention is ring attention, its tokens each rank's part.

In float64, with real gloo process groups of 2 and 4 ranks: the logits of every rank's tokens and
the gradients summed over the ranks equal the single-process model's (rotary and learned
positions, grouped-query attention, both layouts). The refusals are one clear error each.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from attnlab.cli import main
from attnlab.distributed.context_parallel import (
    ContextParallelAttention,
    ContextParallelModel,
    check_context_parallel,
    context_parallelize,
)
from attnlab.distributed.mesh import MeshStrategy
from attnlab.distributed.ring_schedule import shard_sequence
from attnlab.models.config import GPTConfig, TransformerConfig
from attnlab.models.gpt import GPT
from attnlab.models.transformer import Transformer
from attnlab.training.processes import DistInfo
from tests.distributed._launch import launch

VOCAB = 29


def _gpt(positions: str, tokens: int, **kw: object) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=VOCAB, n_positions=tokens, n_embd=32, n_layer=2, n_head=4, num_kv_heads=2,
        positions=positions, dropout=0.0, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    model = GPT(cfg).double()
    with torch.no_grad():  # biases and LayerNorms away from their initial 0 / 1
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="sum")


def _errors(rank: int, world: int, layout: str, positions: str, t_local: int) -> dict[str, float]:
    """One rank: the context-parallel GPT against the whole one, the largest differences."""
    t = t_local * world
    model = _gpt(positions, t)
    ids = torch.randint(VOCAB, (3, t + 1), generator=torch.Generator().manual_seed(1))
    inputs, targets = ids[:, :-1], ids[:, 1:]
    # the reference: the whole sequence in this process
    ref_logits = model(inputs).logits
    _loss_sum(ref_logits, targets).backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    # context parallel: this rank's tokens, attention around the ring
    cp = copy.deepcopy(model)
    cp.zero_grad(set_to_none=True)
    wrapped = ContextParallelModel(
        context_parallelize(cp, None, layout=layout), rank, world, layout
    )
    mine = shard_sequence(inputs, 1, rank=rank, world_size=world, layout=layout)
    logits = wrapped(mine).logits
    _loss_sum(
        logits, shard_sequence(targets, 1, rank=rank, world_size=world, layout=layout)
    ).backward()
    errors = {
        "logits": float(
            (logits - shard_sequence(ref_logits, 1, rank=rank, world_size=world, layout=layout))
            .abs()
            .max()
        )
    }
    worst = 0.0
    for name, p in cp.named_parameters():
        grad = p.grad.clone()
        dist.all_reduce(grad)  # a parameter's gradient: the sum of the ranks' shares
        worst = max(worst, float((grad - ref_grads[name]).abs().max()))
    errors["grads"] = worst
    errors["layers"] = sum(isinstance(m, ContextParallelAttention) for m in cp.modules())
    return errors


def _cases(rank: int, world: int) -> list[dict[str, float]]:
    out = []
    for layout, positions, t_local in (
        ("zigzag", "rope", 6),
        ("contiguous", "learned", 5),
        ("zigzag", "learned", 4),
    ):
        out.append(_errors(rank, world, layout, positions, t_local))
    return out


def _refusals(rank: int, world: int) -> list[str]:
    """What a mesh refuses under a real process group (every rank the same message)."""
    seen = []
    for kwargs in ({"tensor_parallel": 4}, {"context_parallel": 3}):
        try:
            MeshStrategy(**kwargs).wrap(_gpt("learned", 8), DistInfo(rank, world))  # type: ignore[arg-type]
        except ValueError as exc:
            seen.append(str(exc))
    strategy = MeshStrategy(context_parallel=2)
    strategy.wrap(_gpt("learned", 8), DistInfo(rank, world))
    try:
        strategy.local_batch(
            {"input_ids": torch.zeros(2, 6, dtype=torch.long)}, DistInfo(rank, world)
        )
    except ValueError as exc:
        seen.append(str(exc))
    return seen


def _cases_and_refusals(rank: int, world: int) -> tuple[list[dict[str, float]], list[str]]:
    """Both checks in one group of processes (a launch is seconds of start-up): the cases first,
    then the refusals, whose mesh is made after the cases are done."""
    return _cases(rank, world), _refusals(rank, world)


@pytest.fixture(scope="module")
def two_ranks() -> list[tuple[list[dict[str, float]], list[str]]]:
    """One launch of two processes: what :func:`_cases` and :func:`_refusals` saw on each rank."""
    return launch(_cases_and_refusals, 2)


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_gpt_equals_one_process_in_float64(
    world: int, two_ranks: list[Any]
) -> None:
    # two ranks: the module's launch (its tests then run on one pytest-xdist worker, which
    # launches it once); four: a launch of their own
    results = [cases for cases, _ in two_ranks] if world == 2 else launch(_cases, world)
    assert len(results) == world
    for rank_results in results:
        for errors in rank_results:
            assert errors["layers"] == 2
            assert errors["logits"] < 1e-12, errors
            assert errors["grads"] < 1e-12, errors


@pytest.mark.distributed
def test_a_mesh_refuses_what_does_not_fit_its_processes(two_ranks: list[Any]) -> None:
    seen = [refusals for _, refusals in two_ranks]
    assert seen[0] == seen[1]
    tp, cp, batch = seen[0]
    assert "must be a multiple of --context-parallel × --tensor-parallel = 1 × 4 = 4" in tp
    assert "the number of processes 2" in tp and "1 × 4" in tp
    assert "= 3 × 1 = 3" in cp
    assert "cuts every sequence into 4 chunks" in batch and "got (2, 6)" in batch


def test_what_context_parallelism_refuses() -> None:
    cfg = TransformerConfig(
        src_vocab_size=11, tgt_vocab_size=11, d_model=8, num_heads=2, num_encoder_layers=1,
        num_decoder_layers=1, d_ff=16,
    )  # fmt: skip
    with pytest.raises(TypeError, match="context parallelism runs a GPT"):
        check_context_parallel(Transformer(cfg))
    with pytest.raises(ValueError, match="needs attention='full'"):
        check_context_parallel(_gpt("learned", 8, attention="sliding", window=2))
    with pytest.raises(ValueError, match="got 'alibi'"):
        check_context_parallel(_gpt("alibi", 8))
    torch.manual_seed(0)
    dropped = GPT(
        GPTConfig(vocab_size=VOCAB, n_positions=8, n_embd=8, n_layer=1, n_head=2, dropout=0.1)
    )
    with pytest.raises(ValueError, match=r"no attention dropout, but the model's dropout is 0\.1"):
        context_parallelize(dropped, None)
    assert not any(isinstance(m, ContextParallelAttention) for m in dropped.modules())
    with pytest.raises(ValueError, match="layout must be one of"):
        context_parallelize(_gpt("learned", 8), None, layout="striped")
    with pytest.raises(TypeError, match="is not built directly"):
        ContextParallelAttention()
    wrapped = ContextParallelModel(context_parallelize(_gpt("learned", 8), None), 0, 2, "zigzag")
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="not attention_mask, labels"):
        wrapped(ids, labels=ids, attention_mask=torch.ones_like(ids))


def test_mesh_strategy_options() -> None:
    with pytest.raises(ValueError, match="context_parallel must be a positive int"):
        MeshStrategy(context_parallel=0)
    with pytest.raises(ValueError, match="layout must be one of"):
        MeshStrategy(layout="striped")
    with pytest.raises(
        ValueError, match="needs 4 processes or a multiple: start them with torchrun"
    ):
        MeshStrategy(context_parallel=2, tensor_parallel=2).wrap(_gpt("learned", 8), DistInfo())


def test_the_command_line_refuses_in_one_line(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    data = f"{tmp_path}/input.txt"
    with open(data, "w") as f:
        f.write("to be or not to be, that is the question.\n" * 20)
    lm = ["train", "lm", "--data", data, "--block-size", "16", "--n-layer", "1", "--n-head", "2"]
    lm += ["--n-embd", "8", "--batch-size", "2", "--warmup", "1", "--steps", "2"]
    cases = [
        (["--parallel", "fsdp", "--tensor-parallel", "2"], "--parallel fsdp does not combine"),
        (["--context-parallel", "2"], "needs 2 processes or a multiple: start them with torchrun"),
        # what the model allows is checked first, without processes
        (
            ["--context-parallel", "2", "--dropout", "0.1"],
            "ring attention has no attention dropout",
        ),
        (
            ["--context-parallel", "2", "--attention", "sliding", "--window", "4"],
            "attention='full'",
        ),
    ]
    for i, (extra, message) in enumerate(cases):
        assert main([*lm, *extra, "--out", f"{tmp_path}/run{i}"]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
