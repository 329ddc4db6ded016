"""Divergence stops the run (hardening 4): no step on a non-finite loss or gradient norm, the last
finite state saved as ``latest``, ``null`` in ``metrics.jsonl``; and an evaluation error never
costs the training (hardening 1: saved before evaluated)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.training import TrainConfig, Trainer
from attnlab.training.checkpoint import (
    list_checkpoints,
    load_model_weights,
    load_training_state,
    resolve_checkpoint,
)
from attnlab.training.divergence import DivergenceError
from attnlab.training.losses import TokenLoss
from attnlab.training.rng import seed_everything
from tests.training._tiny_task import TinyBatches, TinyModel, evaluate, make_optimizer, tiny_loss

POISONED = 2  # the batch (0-based) whose step goes wrong: step 3


class PoisonBatches(TinyBatches):
    """TinyBatches that flag one batch (a per-row flag, so that it would shard like the rest)."""

    def next_batch(self) -> dict[str, torch.Tensor]:
        index = self.count
        batch = super().next_batch()
        batch["poison"] = torch.full((self.batch_size,), float(index == POISONED))
        return batch


class _InfGrad(torch.autograd.Function):
    """Identity forward, infinite gradient backward: a finite loss with a non-finite norm."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


def nan_loss(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> TokenLoss:
    out = tiny_loss(model, batch)
    if batch["poison"].max() > 0:
        return TokenLoss(out.loss * float("nan"), out.count)
    return out


def inf_grad_loss(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> TokenLoss:
    out = tiny_loss(model, batch)
    if batch["poison"].max() > 0:
        return TokenLoss(_InfGrad.apply(out.loss), out.count)
    return out


def tiny_loss_with_poison_ignored(
    model: torch.nn.Module, batch: Mapping[str, torch.Tensor]
) -> TokenLoss:
    return tiny_loss(model, batch)


def _trainer(run_dir: Path, steps: int, loss_fn: Any = nan_loss, **cfg: Any) -> Trainer:
    seed_everything(3)
    return Trainer(
        TinyModel(dropout=0.2),
        make_optimizer=make_optimizer,
        batches=PoisonBatches(7),
        loss_fn=loss_fn,
        config=TrainConfig(steps=steps, **cfg),
        run_dir=run_dir,
        run_config={"task": "tiny"},
        evaluate=evaluate,
    )


def _strict_lines(path: Path) -> list[dict[str, Any]]:
    def refuse(constant: str) -> None:
        raise AssertionError(f"metrics.jsonl holds a bare {constant}, which is not JSON")

    return [json.loads(x, parse_constant=refuse) for x in path.read_text().splitlines()]


@pytest.mark.parametrize(
    ("loss_fn", "what"), [(nan_loss, "the loss is nan"), (inf_grad_loss, "the gradient norm is")]
)
def test_a_non_finite_step_stops_the_run_and_keeps_the_last_finite_state(
    tmp_path: Path, loss_fn: Any, what: str
) -> None:
    trainer = _trainer(tmp_path, 6, loss_fn, save_every=5)
    with pytest.raises(DivergenceError, match=rf"training diverged at step 3: {what}") as info:
        trainer.fit()
    assert info.value.step == 3 and "\n" not in str(info.value)
    assert "step 2, is saved as the latest checkpoint" in str(info.value)
    # the step was not taken: the last finite state (step 2) is the latest checkpoint
    assert trainer.step == 2
    assert resolve_checkpoint(tmp_path).name == "step-00000002"
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2]
    model = TinyModel()
    load_model_weights(tmp_path, model)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # ... and it is exactly the state after step 2: its data position is before step 3's batch
    reference = _trainer(tmp_path / "ref", 2, loss_fn)
    reference.fit()
    assert load_training_state(tmp_path)["data"]["count"] == 2
    for (name, p), q in zip(reference.model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(p, q), name
    # metrics.jsonl is strict JSON: the diverged step is recorded with null, not NaN
    lines = _strict_lines(tmp_path / "metrics.jsonl")
    assert [x["step"] for x in lines if x["kind"] == "train"] == [1, 2]
    last = lines[-1]
    assert last["kind"] == "diverged" and last["step"] == 3
    assert last["grad_norm"] is None and (last["loss"] is None) == (loss_fn is nan_loss)


def test_non_finite_weights_are_never_saved(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, 2, tiny_loss_with_poison_ignored)
    trainer.fit()
    with torch.no_grad():
        trainer.model.out.weight[0, 0] = float("inf")
    trainer.step += 1  # as if a step had made the weights infinite
    with pytest.raises(DivergenceError, match="the weights hold NaN or infinite values"):
        trainer.save()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2]
    assert resolve_checkpoint(tmp_path).name == "step-00000002"


def test_metrics_log_writes_null_for_non_finite_values(tmp_path: Path) -> None:
    from attnlab.training.metrics_log import MetricsLog

    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.append({"kind": "eval", "step": 1, "loss": float("nan"), "x": [float("inf"), 1.0]})
    assert _strict_lines(log.path) == [{"kind": "eval", "step": 1, "loss": None, "x": [None, 1.0]}]


def _failing_evaluate(fail_at: int) -> Any:
    calls = {"n": 0}

    def run(model: torch.nn.Module) -> dict[str, float]:
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise RuntimeError("the evaluation broke")
        return evaluate(model)

    return run


def test_the_final_checkpoint_is_written_before_the_final_evaluation(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, 3, tiny_loss_with_poison_ignored)
    trainer.evaluate = _failing_evaluate(1)
    with pytest.raises(RuntimeError, match="the evaluation broke"):
        trainer.fit()
    assert resolve_checkpoint(tmp_path).name == "step-00000003"  # the training is not lost
    assert load_training_state(tmp_path)["step"] == 3


def test_an_evaluation_error_mid_run_saves_its_step_first(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, 6, tiny_loss_with_poison_ignored, eval_every=2)
    trainer.evaluate = _failing_evaluate(2)  # the evaluation of step 4
    with pytest.raises(RuntimeError, match="the evaluation broke"):
        trainer.fit()
    assert resolve_checkpoint(tmp_path).name == "step-00000004"
    # and that checkpoint resumes exactly as a run that never stopped
    full = _trainer(tmp_path / "full", 6, tiny_loss_with_poison_ignored, eval_every=2)
    full.fit()
    again = _trainer(tmp_path, 6, tiny_loss_with_poison_ignored, eval_every=2)
    assert again.resume() == 4
    again.fit()
    for (name, p), q in zip(full.model.state_dict().items(), again.model.state_dict().values()):
        assert torch.equal(p, q), name
