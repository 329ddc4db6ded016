"""Positional encodings: sinusoidal, learned, rotary, ALiBi."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

import attnlab as al
from attnlab.nn.positional import alibi_bias, sinusoidal_table


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


def _rotate_reference(
    x: torch.Tensor, positions: torch.Tensor, base: float, r: int, pairing: str
) -> torch.Tensor:
    """The rotation written out pair by pair, in float64: (a, b) → (a cos − b sin, b cos + a sin)
    with θ_i = base^{−2i/r} and angle pos · θ_i."""
    x = x.double()
    inv = base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    angle = positions.double()[..., None] * inv  # (.., T, r/2)
    if positions.dim() == 2:
        angle = angle[:, None]
    cos, sin = angle.cos(), angle.sin()
    if pairing == "interleaved":
        a, b = x[..., 0:r:2], x[..., 1:r:2]
        turned = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    else:
        a, b = x[..., : r // 2], x[..., r // 2 : r]
        turned = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    return torch.cat((turned, x[..., r:]), dim=-1)


@pytest.mark.parametrize("pairing", ["interleaved", "halves"])
@pytest.mark.parametrize("rotary_dim", [None, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rope_matches_the_pairwise_rotation_in_float64(
    pairing: str, rotary_dim: int | None, dtype: torch.dtype
) -> None:
    """x · cos + turn(x) · sin (the fast form) is the pairwise rotation, for both pairings, a
    partial rotary dimension, per-row positions and every dtype."""
    torch.manual_seed(0)
    rope = al.RotaryEmbedding(16, max_len=64, rotary_dim=rotary_dim, pairing=pairing)
    x = torch.randn(2, 3, 5, 16).to(dtype)
    for pos in (torch.arange(10, 15), torch.tensor([[0, 1, 2, 3, 4], [40, 41, 42, 43, 44]])):
        got = rope(x, pos)
        assert got.dtype == dtype
        want = _rotate_reference(x, pos, 10000.0, rotary_dim or 16, pairing)
        tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float64: 1e-6}[dtype]
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


def test_rope_fast_form_is_bit_identical_to_the_pairwise_form() -> None:
    """a − b·s and a + (−b)·s round alike: the rotation gives the pairwise form's fp32 numbers
    exactly (what Hugging Face's rotate_half computes, so converted models keep their tokens)."""
    torch.manual_seed(0)
    rope = al.RotaryEmbedding(16, max_len=64, pairing="halves")
    x, pos = torch.randn(2, 3, 5, 16), torch.arange(20, 25)
    cos, sin = rope.cos[pos], rope.sin[pos]
    a, b = x[..., :8], x[..., 8:]
    want = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    assert torch.equal(rope(x, pos), want)


def test_rope_shared_angles_computes_them_once_per_positions() -> None:
    """Inside shared_angles() the angles of one positions tensor are computed once (every layer
    of a model reads them), a new positions tensor gets its own, and they are dropped on exit."""
    rope = al.RotaryEmbedding(16, max_len=64)
    x = torch.randn(1, 2, 3, 16)
    p1, p2 = torch.arange(3), torch.arange(5, 8)
    with rope.shared_angles():
        y1 = rope(x, p1)
        with rope.shared_angles():  # nested: the outer block's angles
            assert torch.equal(rope(x, p1), y1)
        assert rope._memo is not None and len(rope._memo) == 1
        y2 = rope(x, p2)
        assert len(rope._memo) == 2
    assert rope._memo is None
    assert torch.equal(y1, rope(x, p1)) and torch.equal(y2, rope(x, p2))


def test_gpt_forward_computes_the_rotary_angles_once() -> None:
    """A rotary GPT's blocks share one positions tensor: its angles are indexed once a forward,
    and the logits are those of angles computed per layer."""
    cfg = al.GPTConfig(
        vocab_size=50, n_positions=32, n_embd=32, n_layer=3, n_head=4, positions="rope"
    )
    torch.manual_seed(0)
    model = al.GPT(cfg).eval()
    ids = torch.randint(0, 50, (2, 7))
    rope = model.transformer.h[0].attn.rotary
    assert all(b.attn.rotary is rope for b in model.transformer.h)
    computed = []
    original = type(rope)._angles

    def counting(self: al.RotaryEmbedding, positions: torch.Tensor, work: torch.dtype) -> object:
        before = 0 if self._memo is None else len(self._memo)
        out = original(self, positions, work)
        computed.append(self._memo is None or len(self._memo) > before)
        return out

    with torch.no_grad():
        rope.shared_angles = contextlib.nullcontext  # type: ignore[method-assign]
        want = model(ids).logits  # the angles computed by every call
        del rope.shared_angles
        type(rope)._angles = counting  # type: ignore[method-assign]
        try:
            got = model(ids).logits
        finally:
            type(rope)._angles = original  # type: ignore[method-assign]
    assert len(computed) == 2 * cfg.n_layer and sum(computed) == 1
    assert torch.equal(got, want)


def test_alibi_bias_at_slots_is_the_bottom_right_bias() -> None:
    """A static cache's queries at slots 2, 3, 4 of 6 keys: the bias of 3 queries over 5 keys
    (bottom-right), and the sixth key one further away."""
    slots = torch.tensor([2, 3, 4])
    got = alibi_bias(4, 3, 6, slots=slots)
    torch.testing.assert_close(got[..., :5], alibi_bias(4, 3, 5), rtol=0, atol=0)
    torch.testing.assert_close(got[..., 5] - got[..., 4], got[..., 4] - got[..., 3])
