"""Non-finite inputs reach exactly the rows that may see them (docs/design.md, "Non-finite values").

One grid: backends × mask forms (none, causal, boolean, additive, padding, window, block layout)
× which entry is non-finite (a query row NaN, a key NaN hidden from some rows, a value inf hidden
from some rows). The rows that may see the entry are non-finite; every other row, and the
gradients of a loss over those rows, equal the float64 reference computed without the entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import attnlab as al
from tests.reference import assert_close_rule, attention_ref

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
BACKENDS = ["math", "sdpa", "blockwise", "blockwise_python"]


def _poison(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, entry: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = q.clone(), k.clone(), v.clone()
    if entry == "query_nan":
        q[0, 1, 7] = float("nan")
    elif entry == "key_nan":
        k[0, 0, BAD_KEY, 3] = float("nan")  # key/value head 0 serves query heads 0 and 1
    else:
        v[0, 1, BAD_KEY, 2] = float("inf")  # key/value head 1 serves query heads 2 and 3
    return q, k, v


def _reached(entry: str, vis: torch.Tensor | None) -> torch.Tensor:
    """The rows the entry may reach, ``(B, H, T_q)``, rows that see no key left out (zeros)."""
    full = torch.ones(B, H, T_Q, T_K, dtype=torch.bool)
    if vis is not None:
        full = full & vis
    reach = torch.zeros(B, H, T_Q, dtype=torch.bool)
    if entry == "query_nan":
        reach[0, 1, 7] = True
    else:
        heads = slice(0, 2) if entry == "key_nan" else slice(2, 4)
        reach[0, heads] = full[0, heads, :, BAD_KEY]
    return reach & full.any(-1)


@pytest.mark.parametrize("entry", ["query_nan", "key_nan", "value_inf"])
@pytest.mark.parametrize("form", list(MASKS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_nonfinite_reaches_exactly_the_rows_that_see_it(
    backend: str, form: str, entry: str
) -> None:
    gen = torch.Generator().manual_seed(21)
    q0, k0, v0 = (
        torch.randn(B, h, t, D, generator=gen) for h, t in ((H, T_Q), (H_KV, T_K), (H_KV, T_K))
    )
    kwargs, vis = MASKS[form](gen)
    reach = _reached(entry, vis)
    assert not reach.all(), "the grid must hide the entry from some rows"
    q, k, v = (t.requires_grad_() for t in _poison(q0, k0, v0, entry))
    out = al.scaled_dot_product_attention(q, k, v, backend=backend, **kwargs)

    # the rows that may see the entry are non-finite, a NaN query row in its own row only
    rows_bad = ~torch.isfinite(out).all(-1)
    assert torch.equal(rows_bad, reach), (
        f"non-finite rows {rows_bad.nonzero().tolist()} != rows that see it "
        f"{reach.nonzero().tolist()}"
    )

    # every other row, and its gradients, as the float64 reference without the entry
    ref_mask = kwargs.get("mask")
    if vis is not None and ref_mask is None:
        ref_mask = vis
    refs = [t.double().requires_grad_() for t in (q0, k0, v0)]
    base = [t.clone().requires_grad_() for t in (q0, k0, v0)]
    ref, _ = attention_ref(*refs, ref_mask, is_causal=form == "causal")
    baseline, _ = attention_ref(*base, ref_mask, is_causal=form == "causal", upcast=False)
    keep = ~reach.unsqueeze(-1)
    assert_close_rule(out.masked_fill(reach.unsqueeze(-1), 0.0), ref * keep, baseline * keep)

    grad = torch.randn(out.shape, generator=gen) * keep
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, refs, grad.double())
    basegrads = torch.autograd.grad(baseline, base, grad)
    # where every row of a key/value head's group is reached (no mask), its gradients are those
    # of a NaN output: compared are the query rows and key/value heads that some clean row reads
    clean_q = keep.expand_as(got[0])
    clean_kv = (~reach).unflatten(1, (H_KV, H // H_KV)).any(-1).any(-1)[..., None, None]
    for name, g, w, b in zip("qkv", got, want, basegrads, strict=True):
        clean = clean_q if name == "q" else clean_kv.expand_as(g)
        assert_close_rule(g[clean], w[clean], b[clean], what=f"d{name}")


@pytest.mark.parametrize("entry", ["query_nan", "key_nan", "value_inf", "key_inf"])
@pytest.mark.parametrize("is_causal", [True, False])
def test_performer_nonfinite_reaches_exactly_the_rows_that_see_it(
    entry: str, is_causal: bool
) -> None:
    """Causal FAVOR+: a future token's inf must not reach the rows before it (the keys'
    stabiliser is one maximum over all keys; the chunk products multiply hidden values by 0)."""
    gen = torch.Generator().manual_seed(5)
    q0, k0, v0 = (torch.randn(1, 2, T_K, D, generator=gen, dtype=torch.float64) for _ in "qkv")
    features = al.nn.performer.orthogonal_random_features(16, D, generator=gen)
    features = features.to(torch.float64)
    q, k, v = q0.clone(), k0.clone(), v0.clone()
    if entry == "query_nan":
        q[0, 1, 7] = float("nan")
    elif entry == "key_nan":
        k[0, 0, BAD_KEY, 3] = float("nan")
    elif entry == "key_inf":
        k[0, 0, BAD_KEY, 3] = float("inf")
    else:
        v[0, 1, BAD_KEY, 2] = float("inf")
    out = al.nn.performer.favor_attention(q, k, v, features, is_causal, chunk_size=8)
    ref = al.nn.performer.favor_attention(q0, k0, v0, features, is_causal, chunk_size=8)
    reach = torch.zeros(1, 2, T_K, dtype=torch.bool)
    if entry == "query_nan":
        reach[0, 1, 7] = True
    else:
        head = 1 if entry == "value_inf" else 0
        reach[0, head, BAD_KEY if is_causal else 0 :] = True
    rows_bad = ~torch.isfinite(out).all(-1)
    assert torch.equal(rows_bad, reach), rows_bad.nonzero().tolist()
    torch.testing.assert_close(out[~reach], ref[~reach], rtol=1e-12, atol=1e-12)
