"""Positional encodings: sinusoidal, learned, rotary, ALiBi."""

from __future__ import annotations

import math

import pytest
import torch

import attnlab as al
from attnlab.nn.positional import sinusoidal_table


def test_sinusoidal_table_values() -> None:
    """PE(pos, 2i) = sin(pos / 10000^{2i/d}), PE(pos, 2i+1) = cos(…)."""
    table = sinusoidal_table(50, 16)
    assert table.shape == (50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-7)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-7)
    assert table[0, 0::2].abs().max() == 0 and (table[0, 1::2] == 1).all()
    assert sinusoidal_table(4, 5).shape == (4, 5)  # odd width drops the last cosine


def test_sinusoidal_module_adds_table_with_offset() -> None:
    pe = al.SinusoidalPositionalEncoding(8, max_len=20)
    x = torch.zeros(2, 3, 8)
    torch.testing.assert_close(pe(x), sinusoidal_table(20, 8)[:3].expand(2, 3, 8))
    torch.testing.assert_close(pe(x, offset=5), sinusoidal_table(20, 8)[5:8].expand(2, 3, 8))
    pos = torch.tensor([[0, 1, 2], [4, 5, 6]])
    torch.testing.assert_close(pe(x, positions=pos), sinusoidal_table(20, 8)[pos])


def test_learned_positions() -> None:
    emb = al.LearnedPositionalEmbedding(10, 4)
    out = emb(torch.arange(3))
    assert out.shape == (3, 4)
    torch.testing.assert_close(out, emb.weight[:3])
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 10\)"):
        emb(torch.tensor([10]))


def test_rope_dot_product_depends_only_on_offset() -> None:
    """⟨R_m q, R_n k⟩ is a function of m − n."""
    rope = al.RotaryEmbedding(16, max_len=128)
    q = torch.randn(1, 1, 1, 16, dtype=torch.float64)
    k = torch.randn(1, 1, 1, 16, dtype=torch.float64)

    def dot(m: int, n: int) -> float:
        qm = rope(q.float(), torch.tensor([m])).double()
        kn = rope(k.float(), torch.tensor([n])).double()
        return float((qm * kn).sum())

    for delta in (0, 3, 17):
        values = [dot(m + delta, m) for m in (0, 5, 40, 100)]
        assert max(values) - min(values) < 1e-4, values
    assert abs(dot(10, 0) - dot(0, 10)) > 1e-3  # but it does depend on the offset's sign/size
    # position 0 is the identity; rotation preserves norms
    torch.testing.assert_close(rope(q.float(), torch.tensor([0])), q.float())
    x = torch.randn(2, 3, 5, 16)
    y = rope(x, torch.arange(5))
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    # per-batch positions (B, T)
    pos = torch.tensor([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]])
    yb = rope(x[:, :1], pos)
    torch.testing.assert_close(yb[1], rope(x[1:2, :1], torch.arange(3, 8))[0])


def test_alibi_slopes_match_the_paper() -> None:
    """Press et al. (2022): 8 heads → 1/2, 1/4, …, 1/256; 12 heads → the 8-head slopes followed by
    every other slope of the 16-head sequence (2^{-0.5}, 2^{-1.5}, 2^{-2.5}, 2^{-3.5})."""
    eight = [2.0**-k for k in range(1, 9)]
    assert al.alibi_slopes(8).tolist() == eight
    twelve = [*eight, 2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    assert al.alibi_slopes(12).tolist() == pytest.approx(twelve, rel=1e-7, abs=0)
    assert al.alibi_slopes(16).tolist() == pytest.approx([2.0 ** (-k / 2) for k in range(1, 17)])


def test_alibi_bias_bottom_right() -> None:
    bias = al.alibi_bias(8, 2, 4)
    assert bias.shape == (8, 2, 4)
    # query i sits at absolute position i + 2; bias = −m · (i' − j)
    assert bias[0].tolist() == [[-1.0, -0.5, 0.0, 0.5], [-1.5, -1.0, -0.5, 0.0]]
    assert (al.alibi_bias(4, 5).diagonal(dim1=-2, dim2=-1) == 0).all()
