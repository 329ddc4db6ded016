"""Faithfulness of explanations (attnlab.inspect.faithfulness) against explicit forwards."""

from __future__ import annotations

import math

import pytest
import torch

import attnlab as al
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect import patch_residual
from attnlab.inspect.faithfulness import (
    BINS,
    faithfulness,
    faithfulness_table,
    leave_one_out,
)

BLANK = 0


@pytest.fixture(scope="module")
def model() -> al.GPT:
    torch.manual_seed(0)
    cfg = al.GPTConfig(vocab_size=30, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    m = al.GPT(cfg).double().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(3.0)
    return m


def prob(model: al.GPT, ids: torch.Tensor, target: int) -> float:
    with torch.no_grad():
        return float(model(ids[None]).logits[0, -1].softmax(-1)[target])


def test_leave_one_out_is_each_token_blanked_alone(model: al.GPT) -> None:
    ids = torch.randint(1, 30, (9,))
    target = int(model(ids[None]).logits[0, -1].argmax())
    loo = leave_one_out(model, ids, blank_id=BLANK)
    for j in range(9):
        blanked = ids.clone()
        blanked[j] = BLANK
        assert (
            abs(float(loo[j]) - (prob(model, ids, target) - prob(model, blanked, target))) < 1e-12
        )


def test_leave_one_out_equals_patching_the_blank_embedding(model: al.GPT) -> None:
    ids = torch.randint(1, 30, (1, 7))
    target = int(model(ids).logits[0, -1].argmax())

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -1].double().softmax(-1)[:, target]

    blank = torch.full_like(ids, BLANK)
    patched = patch_residual(model, blank, ids, metric, layers=[0])  # blank token j into x's run
    loo = leave_one_out(model, ids, blank_id=BLANK)
    torch.testing.assert_close(patched.corrupted - patched.patched[0], loo, rtol=0, atol=1e-12)


def test_curves_and_aopc_equal_explicit_forwards(model: al.GPT) -> None:
    t = 12
    ids = torch.randint(1, 30, (t,))
    target = int(model(ids[None]).logits[0, -1].argmax())
    scores = torch.randn(t, dtype=torch.float64)
    got = faithfulness(model, ids, scores, blank_id=BLANK, method="randn")
    order = torch.argsort(scores, descending=True)
    full = prob(model, ids, target)
    blank_all = prob(model, torch.full_like(ids, BLANK), target)
    assert abs(float(got.deletion[0]) - full) < 1e-12
    assert abs(float(got.insertion[t]) - full) < 1e-12
    assert abs(float(got.deletion[t]) - blank_all) < 1e-12
    assert abs(float(got.insertion[0]) - blank_all) < 1e-12
    comp, suff = [], []
    for k in BINS:
        n = max(1, math.ceil(k * t))
        removed, kept = ids.clone(), torch.full_like(ids, BLANK)
        removed[order[:n]] = BLANK
        kept[order[:n]] = ids[order[:n]]
        comp.append(full - prob(model, removed, target))
        suff.append(full - prob(model, kept, target))
    assert abs(got.comprehensiveness - sum(comp) / len(BINS)) < 1e-12
    assert abs(got.sufficiency - sum(suff) / len(BINS)) < 1e-12


def test_leave_one_out_itself_agrees_perfectly(model: al.GPT) -> None:
    ids = torch.randint(1, 30, (10,))
    loo = leave_one_out(model, ids, blank_id=BLANK)
    got = faithfulness(model, ids, loo, blank_id=BLANK)
    assert got.kendall_tau == pytest.approx(1.0) and got.spearman == pytest.approx(1.0)
    opposite = faithfulness(model, ids, -loo, blank_id=BLANK)
    assert opposite.kendall_tau == pytest.approx(-1.0)


def test_table_has_every_method_and_a_random_row(model: al.GPT) -> None:
    ids = torch.randint(1, 30, (8,))
    rows = faithfulness_table(model, ids, ["weights", "rollout", "alti"], blank_id=BLANK)
    assert [r.method for r in rows] == ["weights", "rollout", "alti", "random"]
    for r in rows:
        assert r.deletion.shape == (9,) and math.isfinite(r.comprehensiveness)
        assert -1.0 <= r.kendall_tau <= 1.0


def test_bad_input_is_refused_by_name(model: al.GPT) -> None:
    ids = torch.randint(1, 30, (6,))
    with pytest.raises(ArgumentError, match=r"scores must be one score per token, shape \(6,\)"):
        faithfulness(model, ids, torch.zeros(5), blank_id=BLANK)
    with pytest.raises(ArgumentError, match="scores must be finite"):
        faithfulness(model, ids, torch.full((6,), float("nan")), blank_id=BLANK)
    with pytest.raises(ArgumentError, match=r"blank_id must be a token id in \[0, 30\)"):
        leave_one_out(model, ids, blank_id=30)
    with pytest.raises(ArgumentTypeError, match="blank_id must be an int"):
        leave_one_out(model, ids, blank_id=1.5)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="one prompt"):
        leave_one_out(model, ids.repeat(2, 1), blank_id=BLANK)
