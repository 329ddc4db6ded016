"""Non-finite inputs reach exactly the rows that may see them (docs/design.md, "Non-finite values").

Forward, a NaN or an inf reaches the rows that may see it; backward, the plain equation's rule
(``NaN · anything = NaN``): a reached row's query gradient is NaN, and so are the gradients of
every key and value that a reached row may see. Every other output and gradient equals the
float64 reference computed without the entry. Checked on a grid (backends × mask forms × which
entry) and on random small shapes, masks, windows and block layouts (hypothesis).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlab as al
from tests.reference import assert_close_rule, attention_ref, visible_mask

B, H, H_KV, T_Q, T_K, D = 2, 4, 2, 20, 24, 8
BAD_KEY = 10  # a key position some rows see and others do not, under every mask form

MaskForm = Callable[[torch.Generator], tuple[dict[str, Any], torch.Tensor | None]]


def _none(gen: torch.Generator) -> tuple[dict[str, Any], torch.Tensor | None]:
    return {}, None


def _causal(gen: torch.Generator) -> tuple[dict[str, Any], torch.Tensor | None]:
    return {"is_causal": True}, al.masks.causal_mask(T_Q, T_K)


def _boolean(gen: torch.Generator) -> tuple[dict[str, Any], torch.Tensor | None]:
    mask = torch.rand(B, 1, T_Q, T_K, generator=gen) < 0.6
    return {"mask": mask}, mask


def _additive(gen: torch.Generator) -> tuple[dict[str, Any], torch.Tensor | None]:
    hidden = torch.rand(B, 1, T_Q, T_K, generator=gen) < 0.4
    bias = torch.randn(B, 1, T_Q, T_K, generator=gen).masked_fill(
        hidden, torch.finfo(torch.float32).min
    )
    return {"mask": bias}, ~hidden


def _padding(gen: torch.Generator) -> tuple[dict[str, Any], torch.Tensor | None]:
    tokens = torch.ones(B, T_K, dtype=torch.long)
    tokens[0, BAD_KEY:] = 0  # batch 0 pads the bad key: no row of it sees the key
    mask = al.masks.padding_mask(tokens, pad_id=0)
    return {"mask": mask}, mask


def _window(gen: torch.Generator) -> tuple[dict[str, Any], torch.Tensor | None]:
    return {"window": (3, 2)}, al.masks.sliding_window_mask(T_Q, T_K, (3, 2))


def _blocks(gen: torch.Generator) -> tuple[dict[str, Any], torch.Tensor | None]:
    layout = al.masks.bigbird_layout(
        T_K, block_size=4, global_blocks=0, window_blocks=1, num_random_blocks=1, seed=3
    )
    return {"block_mask": layout}, layout.to_dense(T_Q)


MASKS: dict[str, MaskForm] = {
    "none": _none,
    "causal": _causal,
    "boolean": _boolean,
    "additive": _additive,
    "padding": _padding,
    "window": _window,
    "blocks": _blocks,
}
BACKENDS = ["math", "sdpa", "blockwise", "blockwise_python", "flex"]
ENTRIES = {  # which entry is non-finite: (tensor, index, value)
    "query_nan": ("q", (0, 1, 7, 0), float("nan")),
    "query_inf": ("q", (1, 3, 12, 5), float("inf")),
    "key_nan": ("k", (0, 0, BAD_KEY, 3), float("nan")),  # key/value head 0: query heads 0, 1
    "key_inf": ("k", (0, 0, BAD_KEY, 3), float("inf")),
    "value_inf": ("v", (0, 1, BAD_KEY, 2), float("inf")),  # key/value head 1: query heads 2, 3
}


def expected_nan(
    vis: torch.Tensor, bad_q: torch.Tensor, bad_kv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule, from the dense visibility: the reached rows and the keys they may see.

    Args:
        vis: where each row may attend, ``(B, H, T_q, T_k)``.
        bad_q: the non-finite query rows, ``(B, H, T_q)``.
        bad_kv: the keys whose key or value holds a non-finite entry, ``(B, H_kv, T_k)``.

    Returns:
        ``(rows, keys)``: the rows whose output and query gradient are NaN ``(B, H, T_q)``
        (not those that see no key), and the keys whose key and value gradients are NaN
        ``(B, H_kv, T_k)``.
    """
    groups = vis.shape[1] // bad_kv.shape[1]
    bad_k = bad_kv.repeat_interleave(groups, dim=1)  # per query head
    rows = (bad_q | (vis & bad_k[:, :, None, :]).any(-1)) & vis.any(-1)
    keys = (vis & rows[..., None]).any(-2)  # (B, H, T_k)
    return rows, keys.unflatten(1, (-1, groups)).any(2)


def _nan_rows(t: torch.Tensor) -> torch.Tensor:
    """The rows of ``t`` that are NaN, checking that a row is all NaN or has no NaN at all."""
    nan = torch.isnan(t)
    rows = nan.any(-1)
    assert torch.equal(nan, rows[..., None].expand_as(nan)), "a row is NaN only in part"
    return rows


def _check_rule(
    got: tuple[torch.Tensor, ...],
    ref: tuple[torch.Tensor, ...],
    rows: torch.Tensor,
    keys: torch.Tensor,
    close: Callable[[str, torch.Tensor, torch.Tensor, torch.Tensor], None],
) -> None:
    """Output and gradients ``(out, dq, dk, dv)``: NaN exactly where the rule says, the finite
    entries close to the reference (``close(name, got, ref, where_finite)``)."""
    for name, g, r, want in zip(("out", "dq", "dk", "dv"), got, ref, (rows, rows, keys, keys)):
        nan = _nan_rows(g)
        assert torch.equal(nan, want), (
            f"{name}: NaN rows {nan.nonzero().tolist()} != the rule's {want.nonzero().tolist()}"
        )
        assert torch.isfinite(g[~nan]).all(), f"{name}: an inf outside the NaN rows"
        close(name, g, r, ~nan)


@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("form", list(MASKS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_nonfinite_reaches_exactly_the_rows_that_see_it(
    backend: str, form: str, entry: str
) -> None:
    gen = torch.Generator().manual_seed(21)
    clean = [
        torch.randn(B, h, t, D, generator=gen) for h, t in ((H, T_Q), (H_KV, T_K), (H_KV, T_K))
    ]
    kwargs, vis = MASKS[form](gen)
    full = torch.ones(B, H, T_Q, T_K, dtype=torch.bool)
    full = full & vis if vis is not None else full
    which, index, bad = ENTRIES[entry]
    inputs = [t.clone() for t in clean]
    inputs["qkv".index(which)][index] = bad
    bad_q = ~torch.isfinite(inputs[0]).all(-1)
    bad_kv = ~(torch.isfinite(inputs[1]).all(-1) & torch.isfinite(inputs[2]).all(-1))
    rows, keys = expected_nan(full, bad_q, bad_kv)
    # padding hides the bad key from every row of batch 0 (it reaches nothing), else some rows
    assert not rows.all() and (rows.any() or form == "padding"), "the grid must hide the entry"
    q, k, v = (t.requires_grad_() for t in inputs)
    out = al.scaled_dot_product_attention(q, k, v, backend=backend, **kwargs)
    grad = torch.randn(out.shape, generator=gen)
    got = (out, *torch.autograd.grad(out, (q, k, v), grad))

    # the float64 reference and the float32 baseline, without the entry
    ref_mask = kwargs.get("mask")
    if vis is not None and ref_mask is None:
        ref_mask = vis
    causal = form == "causal"
    refs = [t.double().requires_grad_() for t in clean]
    base = [t.clone().requires_grad_() for t in clean]
    ref, _ = attention_ref(*refs, ref_mask, is_causal=causal)
    baseline, _ = attention_ref(*base, ref_mask, is_causal=causal, upcast=False)
    want = (ref, *torch.autograd.grad(ref, refs, grad.double()))
    basegot = (baseline, *torch.autograd.grad(baseline, base, grad))
    baselines = dict(zip(("out", "dq", "dk", "dv"), basegot))

    def close(name: str, g: torch.Tensor, r: torch.Tensor, ok: torch.Tensor) -> None:
        assert_close_rule(g[ok], r[ok], baselines[name][ok], what=name)

    _check_rule(got, want, rows, keys, close)


def test_nonfinite_query_gives_nan_gradients_like_pytorch_math() -> None:
    """PyTorch's ``test_non_masked_rows_nan_props``: an inf in a query row gives a NaN output
    row and NaN gradients for the query and every key and value it sees, on every backend — a
    zero upstream gradient for that row included (``NaN · 0 = NaN``, as the equation gives)."""
    gen = torch.Generator().manual_seed(0)
    q0, k0, v0 = (torch.randn(1, 2, 8, 4, generator=gen) for _ in "qkv")
    q0[0, 1, 5, 2] = float("inf")
    for backend in ("math", "sdpa", "blockwise", "flex"):
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        out = al.scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend)
        assert torch.isnan(out[0, 1, 5]).all() and torch.isfinite(out[0, 0]).all()
        out[0, 0].sum().backward()  # the loss reads head 0 only: zero gradient at the inf row
        for name, g in zip("qkv", (q.grad, k.grad, v.grad)):
            assert g is not None
            nan = torch.isnan(g).any(-1)[0]  # (H, T)
            want = torch.zeros_like(nan)
            if name == "q":
                want[1, 5] = True
            else:
                want[1, :6] = True  # the keys the causal row 5 sees
            assert torch.equal(nan, want), (backend, name, nan.nonzero().tolist())


def test_nonfinite_gradients_through_the_weights() -> None:
    """``need_weights``: a loss over the weights carries the same rule."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=gen) for _ in "qkv")
    k[0, 0, 2, 1] = float("nan")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    _, w = al.scaled_dot_product_attention(q, k, v, is_causal=True, need_weights=True)
    w.sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad is None  # w does not read v
    assert torch.equal(torch.isnan(q.grad).any(-1)[0, 0], torch.arange(6) >= 2)  # rows 2 … 5
    assert torch.isnan(k.grad[0, 0]).all()  # the rows 2 … 5 see every key
    assert torch.isfinite(q.grad[0, 1]).all() and torch.isfinite(k.grad[0, 1]).all()


@st.composite
def _problems(draw: st.DrawFn) -> dict[str, Any]:
    b, h_kv, groups = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    t_k = draw(st.integers(1, 9))
    t_q = draw(st.integers(1, 9))
    d = draw(st.integers(1, 4))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    h = h_kv * groups
    shapes = ((b, h, t_q, d), (b, h_kv, t_k, d), (b, h_kv, t_k, d))
    clean = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    kwargs: dict[str, Any] = {"is_causal": draw(st.booleans())}
    extra = torch.ones(t_q, t_k, dtype=torch.bool)  # the window and the layout, dense
    if draw(st.booleans()):
        window = (draw(st.none() | st.integers(0, 4)), draw(st.none() | st.integers(0, 4)))
        kwargs["window"] = window
        extra &= al.masks.sliding_window_mask(t_q, t_k, window)
    if t_q <= t_k and draw(st.booleans()):
        size = draw(st.integers(1, 3))
        n = -(-t_k // size)
        grid = torch.rand(n, n, generator=gen) < 0.6
        layout = al.masks.BlockLayout(grid, size, t_k)
        kwargs["block_mask"] = layout
        extra &= layout.to_dense(t_q)
    kind = draw(st.sampled_from(["none", "bool", "float", "padding"]))
    mask = ref_mask = None
    if kind == "bool":
        mask = torch.rand(b, 1, t_q, t_k, generator=gen) < 0.7
    elif kind == "padding":
        mask = (torch.rand(b, t_k, generator=gen) < 0.7)[:, None, None, :]
    elif kind == "float":
        mask = torch.randn(b, 1, t_q, t_k, generator=gen, dtype=torch.float64)
        mask = mask.masked_fill(torch.rand(mask.shape, generator=gen) < 0.3, float("-inf"))
    if mask is not None:
        kwargs["mask"] = mask
    if mask is None:
        ref_mask = extra
    elif mask.dtype == torch.bool:
        ref_mask = mask & extra
    else:
        ref_mask = mask.masked_fill(~extra, float("-inf"))
    inputs = [t.clone() for t in clean]
    for _ in range(draw(st.integers(1, 2))):
        which = draw(st.integers(0, 2))
        index = tuple(draw(st.integers(0, n - 1)) for n in inputs[which].shape)
        inputs[which][index] = draw(st.sampled_from([float("nan"), float("inf"), -float("inf")]))
    backend = draw(st.sampled_from(["math", "sdpa", "blockwise", "blockwise_python", "flex"]))
    return {
        "clean": clean,
        "inputs": inputs,
        "kwargs": kwargs,
        "ref_mask": ref_mask,
        "backend": backend,
    }


@settings(max_examples=30, deadline=None)
@given(_problems())
def test_nonfinite_rule_on_random_shapes_and_masks(p: dict[str, Any]) -> None:
    """Random shapes, masks, windows, layouts and non-finite entries, in float64: NaN exactly
    where the rule says (forward and backward), everything else the reference without them."""
    clean, inputs, kwargs, ref_mask = p["clean"], p["inputs"], p["kwargs"], p["ref_mask"]
    q, k, v = (t.clone().requires_grad_() for t in inputs)
    out = al.scaled_dot_product_attention(q, k, v, backend=p["backend"], **kwargs)
    grad = torch.randn(out.shape, dtype=out.dtype)
    got = (out, *torch.autograd.grad(out, (q, k, v), grad))
    refs = [t.clone().requires_grad_() for t in clean]
    ref, _ = attention_ref(*refs, ref_mask, is_causal=kwargs["is_causal"])
    want = (ref, *torch.autograd.grad(ref, refs, grad))

    t_q, t_k = q.shape[-2], k.shape[-2]
    vis = visible_mask(t_q, t_k, ref_mask, kwargs["is_causal"])
    full = torch.ones((*out.shape[:-1], t_k), dtype=torch.bool)
    full = full & vis if vis is not None else full
    bad_q = ~torch.isfinite(inputs[0]).all(-1)
    bad_kv = ~(torch.isfinite(inputs[1]).all(-1) & torch.isfinite(inputs[2]).all(-1))
    rows, keys = expected_nan(full, bad_q, bad_kv)

    def close(name: str, g: torch.Tensor, r: torch.Tensor, ok: torch.Tensor) -> None:
        torch.testing.assert_close(g[ok], r[ok], rtol=1e-9, atol=1e-9, msg=name)

    _check_rule(got, want, rows, keys, close)


@pytest.mark.parametrize("entry", ["query_nan", "key_nan", "value_inf", "key_inf"])
@pytest.mark.parametrize("is_causal", [True, False])
def test_performer_nonfinite_reaches_exactly_the_rows_that_see_it(
    entry: str, is_causal: bool
) -> None:
    """Causal FAVOR+: a future token's inf must not reach the rows before it (the keys'
    stabiliser is one maximum over all keys; the chunk products multiply hidden values by 0);
    backward, the same rule as exact attention."""
    gen = torch.Generator().manual_seed(5)
    clean = [torch.randn(1, 2, T_K, D, generator=gen, dtype=torch.float64) for _ in "qkv"]
    features = al.nn.performer.orthogonal_random_features(16, D, generator=gen)
    features = features.to(torch.float64)
    inputs = [t.clone() for t in clean]
    if entry == "query_nan":
        inputs[0][0, 1, 7] = float("nan")
    elif entry == "key_nan":
        inputs[1][0, 0, BAD_KEY, 3] = float("nan")
    elif entry == "key_inf":
        inputs[1][0, 0, BAD_KEY, 3] = float("inf")
    else:
        inputs[2][0, 1, BAD_KEY, 2] = float("inf")
    q, k, v = (t.requires_grad_() for t in inputs)
    out = al.nn.performer.favor_attention(q, k, v, features, is_causal, chunk_size=8)
    grad = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    got = (out, *torch.autograd.grad(out, (q, k, v), grad))
    refs = [t.clone().requires_grad_() for t in clean]
    ref = al.nn.performer.favor_attention(*refs, features, is_causal, chunk_size=8)
    want = (ref, *torch.autograd.grad(ref, refs, grad))
    vis = torch.ones(1, 2, T_K, T_K, dtype=torch.bool)
    if is_causal:
        vis = vis & al.masks.causal_mask(T_K, T_K)
    bad_q = ~torch.isfinite(inputs[0]).all(-1)
    bad_kv = ~(torch.isfinite(inputs[1]).all(-1) & torch.isfinite(inputs[2]).all(-1))
    rows, keys = expected_nan(vis, bad_q, bad_kv)

    def close(name: str, g: torch.Tensor, r: torch.Tensor, ok: torch.Tensor) -> None:
        torch.testing.assert_close(g[ok], r[ok], rtol=1e-10, atol=1e-10, msg=name)

    _check_rule(got, want, rows, keys, close)
