"""Per-head health checks: entropy, max weight, row sums, masked rows, first NaN/inf."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect import attention_entropy, capture, diagnose, diagnose_model, run_with_cache


def _trained_like_gpt(**overrides: int) -> GPT:
    """A random GPT whose heads are not uniform.

    At initialisation (weights of std 0.02) the scores are ~0, so every head spreads its weight
    evenly and ``diagnose`` rightly flags it as uniform; larger query/key weights, as training
    produces, give heads that prefer some keys.
    """
    cfg = {"vocab_size": 50, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 4}
    model = GPT(GPTConfig(**{**cfg, **overrides})).eval()
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(8.0)
    return model


def test_entropy_of_known_rows() -> None:
    w = torch.tensor([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(attention_entropy(w), torch.tensor([math.log(4), 0.0, 0.0]))
    assert str(attention_entropy(w)[1].item()) == "0.0"  # not "-0.0"


def test_healthy_model_and_masked_rows_of_left_padding() -> None:
    torch.manual_seed(0)
    model = _trained_like_gpt()
    x = torch.randint(0, 50, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0  # two left-padding tokens in the second row
    _, report = diagnose_model(model, x, attention_mask=mask)
    assert report.ok and report.first_nonfinite is None and not report.problems()
    assert report.origin is None
    assert not any(h.uniform or h.one_token for h in report.heads)
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
    torch.manual_seed(0)
    model = _trained_like_gpt()
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


# ---------------------------------------------------------------- uniform and one-token heads


def _causal_rows(logits: torch.Tensor) -> torch.Tensor:
    """softmax over the causal rows of ``(..., T, T)`` logits (query i sees keys 0..i)."""
    t = logits.shape[-1]
    hidden = torch.ones(t, t, dtype=torch.bool).triu(1)
    return torch.softmax(logits.masked_fill(hidden, float("-inf")), dim=-1)


def test_uniform_and_one_token_heads_on_constructed_weights() -> None:
    t = 6
    uniform = _causal_rows(torch.zeros(t, t))  # 1/(i+1) on each visible key
    first = _causal_rows(torch.zeros(t, t).index_fill(1, torch.tensor([0]), 20.0))  # all on key 0
    torch.manual_seed(0)
    mixed = _causal_rows(torch.randn(t, t) * 2)
    nearly = uniform.clone()
    nearly[3] = torch.tensor([0.4, 0.2, 0.2, 0.2, 0, 0])  # one row clearly not uniform
    w = torch.stack([uniform, first, mixed, nearly])[None]  # (1, 4, T, T)
    report = diagnose(w)
    flags = [(h.uniform, h.one_token, h.sink, h.status) for h in report.heads]
    assert flags == [(True, False, False, "uniform"), (False, True, True, "sink"),
                     (False, False, False, "ok"), (False, False, False, "ok")]  # fmt: skip
    # patterns are reported, not failures: two heads select by content, nothing is broken
    assert report.layers() == ["attention"] and report.ok and not report.problems()
    assert all(h.ok for h in report.heads) and not report.collapsed
    notes = report.notes()
    assert len(notes) == 2
    assert notes[0].startswith("attention head 0: uniform")
    assert notes[1].startswith("attention head 1: sink — every row puts almost all its weight on "
                               "the first token")  # fmt: skip
    d = report.to_dict()
    assert d["heads"][0]["uniform"] is True and d["heads"][0]["status"] == "uniform"
    assert d["heads"][1]["sink"] is True and d["heads"][1]["ok"] is True
    assert d["heads"][2]["uniform"] is False and d["heads"][2]["status"] == "ok"
    assert d["ok"] is True and d["collapsed"] is False and d["notes"] == notes
    assert d["counts"] == {"ok": 2, "sink": 1, "one_token": 0, "uniform": 1, "fail": 0}
    json.dumps(d, allow_nan=False)


def test_the_rule_at_its_edges() -> None:
    # rows that see one key are every pattern trivially and do not count: no flag at all
    one_key = torch.eye(4)
    assert diagnose(one_key).heads[0].status == "ok" and diagnose(one_key).ok
    assert diagnose(one_key).heads[0].informative_rows == 0  # … nor a collapse
    # … unless another head of the layer sees more keys in those rows: an exactly one-hot
    # head (its other weights underflowed to 0) is a one-token head
    causal = torch.tril(torch.ones(4, 4))
    two = torch.stack([one_key, causal / causal.sum(-1, keepdim=True)])  # (2, 4, 4)
    assert [h.status for h in diagnose(two).heads] == ["one_token", "uniform"]
    # a zero row (masked) and one-key rows never count; the single 2-key row decides
    w = torch.zeros(3, 4)
    w[1, 0] = 1.0
    w[2, :2] = torch.tensor([0.52, 0.48])  # H = 0.6923 ≥ 0.99 · log 2 = 0.6862
    assert diagnose(w).heads[0].uniform
    w[2, :2] = torch.tensor([0.6, 0.4])  # H = 0.673 < 0.6862
    assert diagnose(w).heads[0].status == "ok"
    w[2, :2] = torch.tensor([0.99, 0.01])
    assert diagnose(w).heads[0].one_token and diagnose(w).heads[0].status == "sink"
    w[2, :2] = torch.tensor([0.01, 0.99])
    assert diagnose(w).heads[0].status == "one_token"  # on key 1: no sink
    w[2, :2] = torch.tensor([0.985, 0.015])
    assert diagnose(w).heads[0].status == "ok"
    assert diagnose(w, one_token_weight=0.98).heads[0].sink  # the thresholds are options
    # uniform over the visible keys only: a padded key (weight 0) is not visible
    w = torch.tensor([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    assert diagnose(w).heads[0].uniform
    w[0] = torch.tensor([0.7, 0.3, 0.0])  # one informative row that is not uniform is enough
    assert diagnose(w).heads[0].status == "ok"
    w = torch.tensor([[0.5, 0.5, 0.0], [0.34, 0.33, 0.33]])  # H = 0.99990 · log 3
    assert diagnose(w).heads[0].uniform and not diagnose(w, uniform_tol=1e-5).heads[0].uniform


def test_plain_tensor_shapes_and_bad_thresholds() -> None:
    w = torch.softmax(torch.randn(2, 3, 4, 5), dim=-1)
    full = diagnose(w)
    assert len(full.heads) == 3 and full.heads[0].rows == 8
    assert len(diagnose(w[0]).heads) == 3 and diagnose(w[0]).heads[0].rows == 4
    assert len(diagnose(w[0, 0]).heads) == 1
    with pytest.raises(ValueError, match=r"or \(T_q, T_k\), got \(5,\)"):
        diagnose(w[0, 0, 0])
    with pytest.raises(ValueError, match=r"uniform_tol must lie in \[0, 1\), got 1.5"):
        diagnose(w, uniform_tol=1.5)
    with pytest.raises(ValueError, match=r"one_token_weight must lie in \(0, 1\], got 0"):
        diagnose(w, one_token_weight=0)
    with pytest.raises(TypeError, match="one_token_weight must be a float, got str"):
        diagnose(w, one_token_weight="x")  # type: ignore[arg-type]
    # a tolerance of nan or inf would pass every row: refused, not "all heads healthy"
    for atol in (math.nan, math.inf, -1e-3):
        with pytest.raises(
            ArgumentError, match=f"atol must be a finite non-negative float, got {atol}"
        ):
            diagnose(w, atol=atol)
    with pytest.raises(ArgumentTypeError, match="atol must be a float or None, got str"):
        diagnose(w, atol="1e-4")  # type: ignore[arg-type]


def test_flags_on_a_real_capture() -> None:
    torch.manual_seed(0)
    x = torch.randint(0, 50, (2, 7))
    # freshly initialised: scores ≈ 0, every head uniform
    fresh = GPT(GPTConfig(vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=4)).eval()
    _, report = diagnose_model(fresh, x)
    assert all(h.status == "uniform" for h in report.heads) and len(report.notes()) == 8
    assert report.collapsed and not report.ok  # every head uniform: attention routes nothing
    assert report.problems() == [
        "collapsed: every head is uniform (8) or a sink (0) — no head's weights depend on the "
        "tokens (an untrained model, or query/key weights that did not load?)"
    ]
    # an "attention sink": head 2 of layer 0 sends every query to the first token. Position 0
    # gets a large channel 0 (wpe), the head's keys read channel 0 and its queries are constant.
    model = _trained_like_gpt()
    d, dh = 32, 8
    with torch.no_grad():
        model.transformer.wpe.weight[0, 0] = 1.0
        w, b = model.transformer.h[0].attn.c_attn.weight, model.transformer.h[0].attn.c_attn.bias
        q, k = slice(2 * dh, 3 * dh), slice(d + 2 * dh, d + 3 * dh)
        w[q], b[q] = 0.0, 1.0  # q = (1, …, 1) for every position
        w[k], b[k] = 0.0, 0.0
        w[k, 0] = 10.0  # k_j = 10 · LN(x_j)_0: ≈ 56 at position 0, O(10) elsewhere
    _, report = diagnose_model(model, x)
    flagged = [(h.layer, h.head) for h in report.heads if h.status != "ok"]
    assert flagged == [("transformer.h.0.attn", 2)]
    sink = report.for_layer("transformer.h.0.attn")[2]
    assert sink.sink and sink.one_token and not sink.uniform and sink.max_weight_mean > 0.99
    assert sink.status == "sink" and sink.ok and report.ok and not report.problems()
    assert report.notes() == [
        "transformer.h.0.attn head 2: sink — every row puts almost all its weight on the first "
        "token (an attention sink, normal in a pretrained model)"
    ]
    # the blockwise statistics see the same
    with capture(model, weights=False, stats=True) as cache:
        model(x)
    light = diagnose(cache)
    assert [(h.layer, h.head) for h in light.heads if h.sink] == flagged and light.ok


# ---------------------------------------------------------------- broken against reported


def _sink(t: int) -> torch.Tensor:
    """``(T, T)`` causal rows with all but 1e-4 of each row on key 0."""
    return _causal_rows(torch.zeros(t, t).index_fill(1, torch.tensor([0]), 12.0))


def test_each_class_sink_nan_row_sum_collapse() -> None:
    t = 6
    torch.manual_seed(0)
    mixed = _causal_rows(torch.randn(t, t) * 2)  # a head that selects by content
    uniform = _causal_rows(torch.zeros(t, t))
    # a sink head is reported as a sink, and the report stays ok
    report = diagnose(torch.stack([_sink(t), mixed]))
    assert [h.status for h in report.heads] == ["sink", "ok"]
    assert report.ok and not report.collapsed and not report.problems()
    # a NaN fails, whatever the head's pattern
    nan = torch.stack([_sink(t), mixed])
    nan[1, 3, 2] = float("nan")
    report = diagnose(nan)
    assert [h.status for h in report.heads] == ["sink", "fail"] and not report.ok
    # a row that does not sum to one fails
    off = torch.stack([_sink(t), mixed])
    off[1, 4] *= 0.95
    report = diagnose(off)
    assert [h.status for h in report.heads] == ["sink", "fail"] and not report.ok
    assert report.problems() == ["attention head 1: rows sum to 1 ± 5.00e-02 (tolerance 1e-04)"]
    # collapsed: every head uniform or a sink — also across layers, in any mix
    for heads in ([_sink(t), _sink(t)], [uniform, uniform], [_sink(t), uniform]):
        report = diagnose({"a": torch.stack(heads)[None], "b": torch.stack(heads[::-1])[None]})
        assert report.collapsed and not report.ok and all(h.ok for h in report.heads)
        assert report.problems()[-1].startswith("collapsed: every head is uniform")
        assert report.to_dict()["collapsed"] is True
    # one head that selects keeps the model from collapse: by content, or a sharp positional
    # head on another key (previous token: one token, not a sink)
    logits = torch.zeros(t, t)
    logits[torch.arange(1, t), torch.arange(t - 1)] = 12.0
    previous = _causal_rows(logits)  # all but ~1e-5 of each row on t − 1
    for other in (mixed, previous):
        report = diagnose({"a": torch.stack([_sink(t), uniform])[None], "b": other[None, None]})
        assert not report.collapsed and report.ok
    assert diagnose(previous).heads[0].status == "one_token"


def test_collapse_from_blockwise_statistics() -> None:
    """Every head a sink, seen through the statistics alone (no weights, no uniformity)."""
    model = GPT(GPTConfig(vocab_size=50, n_positions=32, n_embd=32, n_layer=1, n_head=2)).eval()
    with torch.no_grad():  # every key reads channel 0, ≈ 5.6 at position 0 after LN, ≈ 0
        model.transformer.wte.weight[:, 0] = 0.0  # elsewhere; the queries are constant
        model.transformer.wpe.weight[:, 0] = 0.0
        model.transformer.wpe.weight[0, 0] = 1.0
        w, b = model.transformer.h[0].attn.c_attn.weight, model.transformer.h[0].attn.c_attn.bias
        w[:64], b[:32], b[32:64] = 0.0, 1.0, 0.0
        w[32:64, 0] = 0.5  # scores 2 · LN(x)_0: ~1e-4 left off key 0, not underflowed to 0
    x = torch.randint(0, 50, (1, 7))
    with capture(model, weights=False, stats=True) as cache:
        model(x)
    light = diagnose(cache)
    assert [h.status for h in light.heads] == ["sink", "sink"]
    assert light.collapsed and not light.ok
