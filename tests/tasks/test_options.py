"""The shared pieces of the training tasks: the Noam schedule with a cool-down."""

from __future__ import annotations

import pytest
import torch

from attnlab.tasks.seq2seq import cooldown_factor, noam_adam
from attnlab.training.schedules import NoamLR, noam_rate


def test_cooldown_factor() -> None:
    assert [cooldown_factor(s, 4, 10) for s in (1, 6, 7, 8, 9, 10, 11)] == [
        1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0,
    ]  # fmt: skip
    assert cooldown_factor(10**6, 0, 0) == 1.0


def _rates(make, steps: int) -> list[float]:
    model = torch.nn.Linear(2, 2)
    opt, sched = make(model)
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


def test_noam_adam_is_noam_then_cools_to_zero() -> None:
    plain = noam_adam(64, 4, 0.5)
    assert isinstance(plain(torch.nn.Linear(2, 2))[1], NoamLR)
    rates = _rates(noam_adam(64, 4, 0.5, cooldown=3, cooldown_end=8), 9)
    expected = [noam_rate(s, 64, 4, 0.5) * cooldown_factor(s, 3, 8) for s in range(1, 10)]
    assert rates == pytest.approx(expected)
    assert rates[:5] == pytest.approx([noam_rate(s, 64, 4, 0.5) for s in range(1, 6)])
    assert rates[7] > 0 and rates[8] == 0.0


def test_cooldown_needs_an_end(capsys, tmp_path) -> None:
    from attnlab.cli import main

    args = ["train", "reverse", "--out", str(tmp_path / "r"), "--steps", "1", "--cooldown", "5"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--cooldown-end must be >= --cooldown (5)" in err
