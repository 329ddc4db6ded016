"""NoamLR and warmup + cosine: step counting from 1, the formula, state round trips, bad input."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import attnlab
from attnlab.training import NoamLR, WarmupCosineLR
from attnlab.training.schedules import noam_rate


def _opt(groups: int = 1, lr: float = 1.0) -> torch.optim.Optimizer:
    params = [{"params": [torch.nn.Parameter(torch.zeros(2))]} for _ in range(groups)]
    return torch.optim.Adam(params, lr=lr)


def _noam(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def test_noam_is_public_and_an_lr_scheduler() -> None:
    assert attnlab.training.NoamLR is NoamLR
    assert issubclass(NoamLR, torch.optim.lr_scheduler.LRScheduler)


@pytest.mark.parametrize(("d_model", "warmup", "factor"), [(512, 4000, 1.0), (16, 3, 2.0)])
def test_noam_counts_steps_from_one(d_model: int, warmup: int, factor: float) -> None:
    opt = _opt(groups=2)
    sched = NoamLR(opt, d_model, warmup_steps=warmup, factor=factor)
    # before any step: the rate of step 1, in every group
    assert [g["lr"] for g in opt.param_groups] == pytest.approx(
        [_noam(1, d_model, warmup, factor)] * 2, rel=1e-12
    )
    for k in range(1, 3 * warmup + 5):
        opt.step()
        sched.step()
        # after k calls: the rate of step k + 1
        expected = _noam(k + 1, d_model, warmup, factor)
        assert opt.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12)
        assert sched.get_last_lr()[1] == pytest.approx(expected, rel=1e-12)


def test_noam_peak_at_warmup() -> None:
    opt = _opt()
    sched = NoamLR(opt, 64, warmup_steps=10)
    rates = []
    for _ in range(30):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert int(torch.tensor(rates).argmax()) + 1 == 10
    assert max(rates) == pytest.approx((64 * 10) ** -0.5, rel=1e-12)


def test_noam_state_dict_resumes_the_same_rates() -> None:
    opt = _opt()
    sched = NoamLR(opt, 32, warmup_steps=5)
    for _ in range(7):
        opt.step()
        sched.step()
    state = sched.state_dict()
    opt2 = _opt()
    sched2 = NoamLR(opt2, 32, warmup_steps=5)
    sched2.load_state_dict(state)
    for _ in range(4):
        opt.step()
        sched.step()
        opt2.step()
        sched2.step()
        assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        ({"d_model": 0}, ValueError, "d_model must be a positive int, got 0"),
        ({"d_model": 8.0}, TypeError, "d_model must be an int, got float"),
        (
            {"d_model": 8, "warmup_steps": 0},
            ValueError,
            "warmup_steps must be a positive int, got 0",
        ),
        (
            {"d_model": 8, "factor": -1.0},
            ValueError,
            "factor must be a positive finite float, got -1.0",
        ),
    ],
)
def test_noam_bad_arguments(kwargs: dict, exc: type, message: str) -> None:
    with pytest.raises(exc, match=message):
        NoamLR(_opt(), **kwargs)


def test_noam_rate_of_an_array_or_a_tensor_equals_the_rate_of_each_step() -> None:
    steps = list(range(1, 31))
    want = [noam_rate(s, 64, 10, 2.0) for s in steps]
    assert want == pytest.approx([_noam(s, 64, 10, 2.0) for s in steps], rel=1e-12)
    arr = noam_rate(np.array(steps).reshape(5, 6), 64, 10, 2.0)
    assert arr.shape == (5, 6) and arr.dtype == np.float64
    np.testing.assert_allclose(arr.ravel(), want, rtol=1e-12)
    ten = noam_rate(torch.tensor(steps), 64, 10, 2.0)
    assert ten.shape == (30,) and ten.dtype == torch.float64
    np.testing.assert_allclose(ten.numpy(), want, rtol=1e-12)
    assert noam_rate(torch.tensor(steps, dtype=torch.float32), 64, 10, 2.0).dtype == torch.float32


def test_warmup_cosine_shape() -> None:
    opt = _opt(lr=0.5)
    sched = WarmupCosineLR(opt, warmup_steps=4, total_steps=20, min_ratio=0.1)
    rates = []
    for _ in range(25):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # warmup: step/warmup · base, steps counted from 1
    assert rates[:4] == pytest.approx([0.125, 0.25, 0.375, 0.5], rel=1e-12)
    # halfway through the decay: the mean of base and min
    assert rates[11] == pytest.approx(0.5 * (0.5 + 0.05), rel=1e-12)
    mid = 6  # step 7
    p = (7 - 4) / 16
    assert rates[mid] == pytest.approx(0.05 + 0.45 * 0.5 * (1 + math.cos(math.pi * p)), rel=1e-12)
    assert all(a >= b for a, b in itertools.pairwise(rates[3:]))
    assert rates[19:] == pytest.approx([0.05] * 6, rel=1e-12)


def test_warmup_cosine_bad_arguments() -> None:
    with pytest.raises(ValueError, match="warmup_steps must be < total_steps = 5, got 5"):
        WarmupCosineLR(_opt(), warmup_steps=5, total_steps=5)
    with pytest.raises(ValueError, match=r"min_ratio must be in \[0, 1\], got 2"):
        WarmupCosineLR(_opt(), warmup_steps=1, total_steps=5, min_ratio=2)
