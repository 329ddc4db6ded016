"""fp16 training with a gradient scaler (and its place in the saved configuration)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.training import TrainConfig, Trainer
from attnlab.training.checkpoint import load_config, load_training_state
from attnlab.training.losses import TokenLoss
from attnlab.training.rng import seed_everything
from tests.training._tiny_task import TinyBatches, TinyModel, evaluate, make_optimizer, tiny_loss

POISONED = 2  # the global micro-batch whose loss is blown up, so its step overflows in fp16


class PoisonBatches(TinyBatches):
    """TinyBatches that mark one batch (a per-row flag, so that it shards like the rest)."""

    def next_batch(self) -> dict[str, torch.Tensor]:
        index = self.count
        batch = super().next_batch()
        batch["poison"] = torch.full((self.batch_size,), float(index == POISONED))
        return batch


def poison_loss(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> TokenLoss:
    out = tiny_loss(model, batch)
    # × 1e8: finite in fp32, but the scaled gradient overflows fp16 (max 65504)
    factor = 1.0 + 1e8 * batch["poison"].max()
    return TokenLoss(out.loss * factor, out.count)


def _trainer(run_dir: Path, steps: int, poison: bool = False, **cfg: Any) -> Trainer:
    seed_everything(3)
    config = TrainConfig(steps=steps, **{"grad_accum": 2, "eval_every": 2, "fp16": True, **cfg})
    return Trainer(
        TinyModel(dropout=0.2),
        make_optimizer=make_optimizer,
        batches=PoisonBatches(7) if poison else TinyBatches(7),
        loss_fn=poison_loss if poison else tiny_loss,
        config=config,
        run_dir=run_dir,
        run_config={"task": "tiny", "model": {"dim": 16}},
        evaluate=evaluate,
    )


def _train_lines(run_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    drop = ("tokens_per_s", "elapsed", "total_steps")
    return [{k: v for k, v in x.items() if k not in drop} for x in lines if x["kind"] == "train"]


def test_fp16_trains_and_tracks_fp32(tmp_path: Path) -> None:
    fp16 = _trainer(tmp_path / "fp16", 20, eval_every=0, grad_accum=1)
    losses = fp16.fit().losses
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:3]) / 3  # it learns
    fp32 = _trainer(tmp_path / "fp32", 20, eval_every=0, grad_accum=1, fp16=False)
    reference = fp32.fit().losses
    assert losses[0] == pytest.approx(reference[0], rel=1e-2)
    assert sum(losses[-5:]) == pytest.approx(sum(reference[-5:]), rel=0.05)
    lines = _train_lines(tmp_path / "fp16")
    assert all(x["loss_scale"] == 65536.0 and x["skipped"] is False for x in lines)
    assert "loss_scale" not in _train_lines(tmp_path / "fp32")[0]  # fp32 lines as before
    # the weights stay fp32; autocast made the matmuls fp16
    assert all(p.dtype == torch.float32 for p in fp16.model.parameters())


def test_an_overflowing_step_is_skipped_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer = _trainer(tmp_path, 3, poison=True, eval_every=0, grad_accum=1, clip=None)
    seen: list[dict[str, torch.Tensor]] = []

    def snapshot() -> None:
        seen.append({k: v.clone() for k, v in trainer.model.state_dict().items()})

    class Snap:
        def on_start(self, t: Trainer) -> None:
            snapshot()

        def on_step(self, m: Any) -> None:
            snapshot()

        def on_eval(self, *a: Any) -> None: ...
        def on_save(self, *a: Any) -> None: ...
        def on_end(self, *a: Any) -> None: ...

    trainer.callbacks.append(Snap())  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="attnlab.training.trainer"):
        result = trainer.fit()
    assert result.step == 3 and len(result.losses) == 3  # the skipped step counts
    lines = _train_lines(tmp_path)
    assert [x["skipped"] for x in lines] == [False, False, True]
    assert [x["loss_scale"] == 65536.0 for x in lines] == [True, True, True]
    assert trainer.scaler is not None and trainer.scaler.get_scale() == 32768.0
    assert any(
        "step 3: fp16 gradients overflowed at loss scale 65536; the optimizer step was skipped"
        in r.getMessage()
        for r in caplog.records
    )
    # step 3 changed no weight, steps 1 and 2 did; the schedule moved on all the same
    assert all(torch.equal(seen[3][k], seen[2][k]) for k in seen[2])
    assert not all(torch.equal(seen[2][k], seen[1][k]) for k in seen[1])
    assert trainer.scheduler is not None and trainer.scheduler.last_epoch == 3
    assert load_training_state(tmp_path)["scaler"]["scale"] == 32768.0


def test_fp16_resume_is_bit_identical(tmp_path: Path) -> None:
    full = _trainer(tmp_path / "full", 6, poison=True)
    res_full = full.fit()
    first = _trainer(tmp_path / "split", 3, poison=True)
    first.fit()
    second = _trainer(tmp_path / "split", 6, poison=True)  # fresh objects, as a new process
    assert second.resume() == 3
    assert second.scaler is not None and second.scaler.get_scale() == 32768.0  # step 2 skipped
    res_second = second.fit()
    for (name, p), q in zip(full.model.state_dict().items(), second.model.state_dict().values()):
        assert torch.equal(p, q), name
    sa, sb = full.optimizer.state_dict(), second.optimizer.state_dict()
    for k in sa["state"]:
        for name, v in sa["state"][k].items():
            assert torch.equal(v, sb["state"][k][name]), (k, name)
    assert full.scaler is not None and full.scaler.state_dict() == second.scaler.state_dict()
    assert res_second.losses == res_full.losses[3:]
    lines = _train_lines(tmp_path / "split")
    assert lines == _train_lines(tmp_path / "full")
    assert [x["skipped"] for x in lines] == [False, True, False, False, False, False]


def test_config_fp16_and_resume_across_precisions(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bf16 and fp16 exclude each other"):
        TrainConfig(steps=1, bf16=True, fp16=True)
    with pytest.raises(TypeError, match="fp16 must be a bool, got int"):
        TrainConfig(steps=1, fp16=1)  # type: ignore[arg-type]
    # saved configurations from before fp16 existed compare equal to fp32/bf16 runs
    assert TrainConfig(steps=1).trajectory() == {"grad_accum": 1, "clip": 1.0, "bf16": False}
    assert TrainConfig(steps=1, bf16=True).trajectory() == {
        "grad_accum": 1,
        "clip": 1.0,
        "bf16": True,
    }
    assert TrainConfig(steps=1, fp16=True).trajectory()["fp16"] is True
    _trainer(tmp_path, 2).fit()
    assert load_config(tmp_path)["train"] == {
        "grad_accum": 2,
        "clip": 1.0,
        "bf16": False,
        "fp16": True,
    }
    with pytest.raises(ValueError, match=r"train.fp16: True in the checkpoint vs absent now"):
        _trainer(tmp_path, 4, fp16=False).resume()
    # an fp32 run's checkpoint has no scaler state
    _trainer(tmp_path / "fp32", 1, fp16=False).fit()
    assert load_training_state(tmp_path / "fp32")["scaler"] is None
