"""Per-head health checks: entropy, max weight, row sums, masked rows, first NaN/inf."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.inspect import attention_entropy, capture, diagnose, diagnose_model, run_with_cache


def test_entropy_of_known_rows() -> None:
    w = torch.tensor([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(attention_entropy(w), torch.tensor([math.log(4), 0.0, 0.0]))
    assert str(attention_entropy(w)[1].item()) == "0.0"  # not "-0.0"


def test_healthy_model_and_masked_rows_of_left_padding() -> None:
    model = GPT(GPTConfig(vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=4)).eval()
    x = torch.randint(0, 50, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0  # two left-padding tokens in the second row
    _, report = diagnose_model(model, x, attention_mask=mask)
    assert report.ok and report.first_nonfinite is None and not report.problems()
    assert len(report.heads) == 2 * 4 and report.layers() == [
        "transformer.h.0.attn",
        "transformer.h.1.attn",
    ]
    for h in report.heads:
        assert h.masked_rows == 2 and h.rows == 12  # padded queries see no key: zero rows
        assert 0 <= h.entropy_min <= h.entropy_mean <= h.entropy_max <= math.log(6) + 1e-6
        assert 1 / 6 <= h.max_weight_mean <= 1 and h.row_sum_error < 1e-5
    json.dumps(report.to_dict(), allow_nan=False)


def test_first_nan_is_located_in_execution_order() -> None:
    w = torch.softmax(torch.randn(2, 3, 4, 4), dim=-1)
    late, early = w.clone(), w.clone()
    early[1, 2, 3, 1] = float("nan")
    early[1, 2, 3, 2] = float("inf")
    late[0, 0, 0, 0] = float("nan")
    report = diagnose({"layer.a": w, "layer.b": early, "layer.c": late})
    loc = report.first_nonfinite
    assert loc is not None and (loc.layer, loc.head, loc.batch, loc.query, loc.key) == (
        "layer.b",
        2,
        1,
        3,
        1,
    )
    assert loc.value == "nan" and "layer.b head 2 at batch 1, query 3, key 1" in str(loc)
    assert not report.ok
    bad = [h for h in report.heads if not h.ok]
    assert [(h.layer, h.head, h.nonfinite) for h in bad] == [("layer.b", 2, 2), ("layer.c", 0, 1)]
    assert math.isfinite(report.for_layer("layer.b")[2].entropy_mean)  # other rows still measured
    d = report.to_dict()
    assert d["first_nonfinite"]["query"] == 3 and d["ok"] is False


def test_row_sum_error_is_caught() -> None:
    w = torch.softmax(torch.randn(1, 2, 5, 5), dim=-1)
    w[0, 1, 2] *= 0.9
    report = diagnose({"attn": w})
    assert report.heads[0].ok and not report.heads[1].ok
    assert report.heads[1].row_sum_error == pytest.approx(0.1, abs=1e-6)
    assert "attn head 1: rows sum to 1 ± 1.00e-01" in report.problems()[0]
    assert diagnose({"attn": w}, atol=0.2).ok


def test_cache_kinds_and_bad_input() -> None:
    model = GPT(GPTConfig(vocab_size=20, n_positions=8, n_embd=16, n_layer=1, n_head=2))
    _, cache = run_with_cache(model, torch.tensor([[1, 2, 3]]))
    assert {h.kind for h in diagnose(cache).heads} == {"self"}
    with pytest.raises(ValueError, match=r"attentions\['x'\] must be a \(B, H, T_q, T_k\) tensor"):
        diagnose({"x": torch.ones(3, 3)})
    with pytest.raises(TypeError, match="attentions must be an ActivationCache or a mapping"):
        diagnose([torch.ones(1, 1, 1, 1)])  # type: ignore[arg-type]


def test_report_from_blockwise_statistics_matches_the_weights() -> None:
    model = GPT(GPTConfig(vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=4)).eval()
    x = torch.randint(0, 50, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0
    _, exact = run_with_cache(model, x, attention_mask=mask)
    with capture(model, weights=False, stats=True) as cache:
        model(x, attention_mask=mask)
    full, light = diagnose(exact), diagnose(cache)
    assert light.ok and len(light.heads) == len(full.heads) == 8
    for a, b in zip(full.heads, light.heads):
        assert (a.layer, a.head, a.masked_rows, a.rows) == (b.layer, b.head, b.masked_rows, b.rows)
        assert b.entropy_mean == pytest.approx(a.entropy_mean, abs=1e-5)
        assert b.max_weight_max == pytest.approx(a.max_weight_max, abs=1e-5)
        assert math.isnan(b.row_sum_error)  # not measured without the weights
    json.dumps(light.to_dict(), allow_nan=False)


def test_nan_located_from_blockwise_statistics() -> None:
    model = GPT(GPTConfig(vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=4)).eval()
    with torch.no_grad():
        model.transformer.h[1].attn.c_attn.weight[16:24] = float("nan")  # queries of head 2
    with capture(model, weights=False, stats=True) as cache:
        model(torch.randint(0, 50, (1, 5)))
    report = diagnose(cache)
    loc = report.first_nonfinite
    assert loc is not None and (loc.layer, loc.head, loc.query, loc.key) == (
        "transformer.h.1.attn",
        2,
        0,
        -1,
    )
    assert str(loc) == "nan in transformer.h.1.attn head 2 at batch 0, query 0"
    assert report.problems()[-1] == "transformer.h.1.attn head 2: 5 non-finite rows"
