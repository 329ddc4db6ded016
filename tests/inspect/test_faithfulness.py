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


def test_patching_importance_is_each_token_swapped_alone(model: al.GPT) -> None:
    """e_j = m(x) − m(x with token j from the corrupted prompt): explicit forwards; exactly 0
    where the prompts agree."""
    from attnlab.inspect.faithfulness import patching_importance

    ids = torch.randint(1, 30, (8,))
    corrupted = ids.clone()
    corrupted[[2, 5]] = (ids[[2, 5]] % 29) + 1

    def m(x: torch.Tensor) -> float:
        with torch.no_grad():
            logits = model(x[None]).logits[0, -1]
        return float(logits[3] - logits[7])

    got = patching_importance(model, ids, corrupted, good=3, bad=7)
    for j in range(8):
        swapped = ids.clone()
        swapped[j] = corrupted[j]
        assert abs(float(got[j]) - (m(ids) - m(swapped))) < 1e-10
    assert got[[0, 1, 3, 4, 6, 7]].abs().max() == 0.0 and got[[2, 5]].abs().min() > 0


def test_table_without_curves_gives_the_same_measures(model: al.GPT) -> None:
    """curves=False runs only the rows AOPC reads, each distinct prompt once: the same
    measures within rounding, the curves NaN where not run; τ-patch from the corrupted prompt."""
    ids = torch.randint(1, 30, (11,))
    corrupted = ids.clone()
    corrupted[4] = (ids[4] % 29) + 1
    options = {"blank_id": BLANK, "corrupted_ids": corrupted, "good": 3, "bad": 7}
    full = faithfulness_table(model, ids, ["weights", "norm"], **options)
    fast = faithfulness_table(model, ids, ["weights", "norm"], curves=False, **options)
    for a, b in zip(full, fast):
        assert a.method == b.method
        for k in ("comprehensiveness", "sufficiency", "kendall_tau", "spearman", "patching_tau"):
            assert getattr(a, k) == pytest.approx(getattr(b, k), abs=1e-12), k
        assert math.isfinite(a.patching_tau)
        assert b.deletion.isnan().sum() > 0 and b.deletion[[0, 11]].isfinite().all()
    with pytest.raises(ArgumentError, match="corrupted_ids needs good and bad"):
        faithfulness_table(model, ids, ["weights"], blank_id=BLANK, corrupted_ids=corrupted)


def test_gradient_methods_compute_only_the_rows_asked_for(model: al.GPT) -> None:
    from attnlab.inspect import mixing

    ids = torch.randint(1, 30, (1, 6))
    for method in ("grad_weights", "integrated_gradients"):
        every = mixing(model, ids, method, steps=4).total
        one = mixing(model, ids, method, rows=[-1], steps=4).total
        assert every is not None and one is not None
        assert one.shape == (1, 1, 6)  # the one row asked for
        torch.testing.assert_close(one[0, 0], every[0, 5])
    with pytest.raises(ArgumentError, match=r"rows"):
        mixing(model, ids, "grad_weights", rows=[6])
    with pytest.raises(ArgumentTypeError, match="steps must be an int"):
        mixing(model, ids, "integrated_gradients", steps=2.5)  # type: ignore[arg-type]


def test_faithfulness_over_prompts_is_the_mean_of_each_prompts_table(model: al.GPT) -> None:
    from attnlab.data.prompt_sets import Prompt
    from attnlab.inspect.faithfulness import faithfulness_over_prompts

    def encode(text: str) -> list[int]:
        return [int(c) for c in text.split()]

    prompts = [Prompt("5 9 12 4 7 3", " 3", " 7", "5 9 13 4 7 3"), Prompt("8 2 2 11 6")]
    result = faithfulness_over_prompts(model, prompts, encode, ["alti"], blank_id=BLANK)
    tables = [
        faithfulness_table(model, torch.tensor([encode(p.prompt)]), ["alti"], blank_id=BLANK)
        for p in prompts
    ]
    alti = result.rows[0]
    comps = [t[0].comprehensiveness for t in tables]
    assert alti.mean["comprehensiveness"] == pytest.approx(sum(comps) / 2, abs=1e-12)
    assert alti.std["comprehensiveness"] == pytest.approx(
        float(torch.tensor(comps, dtype=torch.float64).std()), abs=1e-12
    )
    assert math.isnan(alti.per_prompt["patching_tau"][1]) and alti.std["patching_tau"] == 0.0
    assert [r.method for r in result.rows] == ["alti", "random"] and result.tokens == [6, 5]
    assert "alti" in result.table() and "τ-patch" in result.table()
    with pytest.raises(ArgumentError, match="as many tokens as the prompt"):
        faithfulness_over_prompts(
            model, [Prompt("1 2 3", " 1", " 2", "1 2")], encode, ["weights"], blank_id=BLANK
        )
    with pytest.raises(ArgumentError, match="at least one prompt"):
        faithfulness_over_prompts(model, [], encode, ["weights"], blank_id=BLANK)
