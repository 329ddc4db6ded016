"""Context mixing by blocks of query rows (long inputs): the streamed result equals the whole
matrix whatever the block, ``rows=`` gives the same rows for less, the memory is stated and a
length that does not fit is refused in one line."""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.mixing import mixing, mixing_memory, record_layers
from attnlab.inspect.mixing_rules import alti_contributions, rollout, token_vectors
from attnlab.nn.kinds import BigBirdSpec, SlidingSpec

KINDS = {
    "llama": dict(positions="rope", num_kv_heads=2, norm="rmsnorm", mlp="gated", bias=False),
    "alibi": dict(positions="alibi"),
    "window": dict(attention=SlidingSpec(window=3)),
    "bigbird": dict(attention=BigBirdSpec(block_size=2, num_random_blocks=1)),
}


def tiny(**extra: object) -> al.GPT:
    torch.manual_seed(0)
    cfg = al.GPTConfig(vocab_size=40, n_positions=32, n_embd=32, n_layer=2, n_head=4, **extra)
    model = al.GPT(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model


def unblocked(model: al.GPT, ids: torch.Tensor, method: str, **kw: object) -> torch.Tensor:
    """The whole matrices at once from the weights the layers returned (the unstreamed way)."""
    runs, _ = record_layers(model, lambda: model(ids, **kw))
    mats = []
    for r in runs:
        if method == "weights":
            mats.append(r.weights.mean(1))
            continue
        vectors = token_vectors(r.weights, r.values, r.w_out, residual=r.resid_pre)
        mats.append(vectors.norm(dim=-1) if method == "norm_residual" else None)
        if method == "alti":
            mats[-1] = alti_contributions(vectors, r.resid_pre + r.attn_out)
    return torch.stack(mats)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("method", ["weights", "norm_residual", "alti"])
def test_streamed_rows_equal_the_whole_matrix_whatever_the_block(kind: str, method: str) -> None:
    model = tiny(**KINDS[kind])
    ids = torch.randint(0, 40, (2, 10))
    keep = torch.ones(2, 10, dtype=torch.long)
    keep[1, :3] = 0  # left padding in the second row
    whole = unblocked(model, ids, method, attention_mask=keep)
    for block in (1, 3, None):
        got = mixing(model, ids, method, block_size=block, attention_mask=keep)
        torch.testing.assert_close(got.per_layer, whole, rtol=1e-10, atol=1e-12)
    some = mixing(model, ids, method, rows=[7, 2, -1], block_size=2, attention_mask=keep)
    assert some.rows.tolist() == [2, 7, 9]
    torch.testing.assert_close(some.per_layer, whole[:, :, [2, 7, 9]], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["rollout", "alti"])
def test_a_rollout_of_some_rows_is_those_rows_of_the_whole_rollout(method: str) -> None:
    model = tiny(**KINDS["llama"])
    ids = torch.randint(0, 40, (2, 9))
    whole = mixing(model, ids, method)
    if method == "rollout":  # Abnar & Zuidema, forwards through the layers
        torch.testing.assert_close(
            whole.total, rollout(list(whole.per_layer)), rtol=1e-10, atol=1e-12
        )
    for block in (1, 4):
        last = mixing(model, ids, method, rows=-1, block_size=block)
        assert last.total.shape == (2, 1, 9) and last.per_layer.shape == (2, 2, 1, 9)
        torch.testing.assert_close(last.total, whole.total[:, -1:], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(
            last.per_layer, whole.per_layer[:, :, -1:], rtol=1e-10, atol=1e-12
        )


def test_rows_cut_flow_value_zeroing_and_the_gradient_methods() -> None:
    model = tiny()
    ids = torch.randint(0, 40, (1, 6))
    for method in ("flow", "value_zeroing", "grad_weights"):
        whole = mixing(model, ids, method)
        some = mixing(model, ids, method, rows=slice(2, 5))
        for a, b in ((whole.total, some.total), (whole.per_layer, some.per_layer)):
            if a is not None:
                torch.testing.assert_close(b, a[..., 2:5, :], rtol=1e-9, atol=1e-12)


def test_bad_rows_are_refused_by_name() -> None:
    model = tiny()
    ids = torch.randint(0, 40, (1, 6))
    with pytest.raises(ArgumentError, match=r"rows must lie in \[-6, 6\) for T = 6"):
        mixing(model, ids, "norm", rows=6)
    with pytest.raises(ArgumentError, match="distinct positions"):
        mixing(model, ids, "norm", rows=[1, -5])
    with pytest.raises(ArgumentTypeError, match="rows must be an int, a slice"):
        mixing(model, ids, "norm", rows=1.5)
    with pytest.raises(ArgumentError, match="block_size must be a positive int"):
        mixing(model, ids, "norm", block_size=0)


@pytest.mark.parametrize("method", ["weights", "norm", "rollout", "alti"])
def test_the_memory_formula_counts_the_tensors_kept(method: str) -> None:
    model = tiny(**KINDS["llama"]).float()
    b, t = 2, 12
    ids = torch.randint(0, 40, (b, t))
    for rows, heads in ((None, True), ([3, 11], False)):
        got = mixing(model, ids, method, rows=rows, heads=heads)
        total = got.total if got.cumulative is None else got.cumulative  # total: its last
        kept = [got.per_layer, got.per_head, total]
        result = sum(x.numel() * x.element_size() for x in kept if x is not None)
        parts = mixing_memory(model, method, b, t, rows=None if rows is None else 2, heads=heads)
        assert parts["result"] == result, (method, rows)
    runs, _ = record_layers(model, lambda: model(ids), weights=False)
    held = sum(
        x.numel() * x.element_size()
        for r in runs
        for x in (
            r.call.query_input,
            r.call.q,
            r.call.k,
            r.call.v,
            r.call.output,
            r.resid_pre,
            r.attn_out,
        )
    )
    assert held <= parts["recorded"] <= 2 * held


def test_a_length_past_the_memory_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import attnlab._budget as budget

    model = tiny()
    ids = torch.randint(0, 40, (1, 8))
    parts = mixing_memory(model, "norm", 1, 8)
    need = sum(parts.values())
    monkeypatch.setattr(budget, "available_memory", lambda device=None: need - 1)
    with pytest.raises(ArgumentError) as err:
        mixing(model, ids, "norm")
    text = str(err.value)
    assert "\n" not in text
    assert "input_ids of 8 tokens (T = 8) needs about" in text and f"({need} bytes)" in text
    assert f"({need - 1} bytes) of memory" in text and "rows= computes fewer" in text
    # the last row alone fits
    assert mixing(model, ids, "norm", rows=-1).per_layer.shape == (2, 1, 1, 8)
