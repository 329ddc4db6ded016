"""Merging two parts of the keys by their log-sum-exps equals attention over all of them."""

from __future__ import annotations

import math

import torch

from attnlab.nn.backends.common import merge_partials, merge_partials_


def _part(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = q @ k.transpose(-1, -2)
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1) @ v, lse


def test_merge_equals_attention_over_the_union_and_in_place_gives_the_same_numbers() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    o_a, l_a = _part(q, k[:, :, :2], v[:, :, :2])
    o_b, l_b = _part(q, k[:, :, 2:], v[:, :, 2:])
    # a row of the second part that sees no key: L = −inf, weight 0
    o_b[:, :, 0], l_b[:, :, 0] = 0.0, -math.inf
    want_o, want_l = _part(q, k, v)
    first_o, first_l = _part(q[:, :, :1], k[:, :, :2], v[:, :, :2])
    want_o[:, :, :1], want_l[:, :, :1] = first_o, first_l
    out, lse = merge_partials(o_a, l_a, o_b, l_b)
    torch.testing.assert_close(out, want_o, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, want_l, rtol=0, atol=1e-12)
    merge_partials_(o_a, l_a, o_b.clone(), l_b)
    assert torch.equal(o_a, out) and torch.equal(l_a, lse)
