"""Plausibility of alignments (attnlab.inspect.plausibility): the scoring against known sources."""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab.errors import ArgumentError
from attnlab.inspect.plausibility import _score, plausibility, source_alignment


def test_top1_and_f1_count_repeated_tokens_as_several_sources() -> None:
    src = torch.tensor([[5, 6, 5, 7]])
    written = torch.tensor([[5, 7, 9]])  # 5 came from 0 or 2; 7 from 3; 9 from nowhere
    scores = torch.tensor([[[0.1, 0.0, 0.9, 0.0], [0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]]])
    top1, f1, n = _score(scores, src, written)
    assert n == 2 and top1 == 1.0 and f1 == 1.0  # row 0's top two {2, 0} = its sources
    scores[0, 0] = torch.tensor([0.0, 0.9, 0.1, 0.0])  # top 1 is 6 (wrong), top two {1, 2}
    top1, f1, _ = _score(scores, src, written)
    assert top1 == 0.5 and f1 == pytest.approx((0.5 + 1.0) / 2)


def test_weights_alignment_is_the_mean_cross_attention_and_rows_are_named() -> None:
    torch.manual_seed(0)
    cfg = al.TransformerConfig(
        src_vocab_size=20, tgt_vocab_size=20, d_model=16, num_heads=2, num_encoder_layers=1,
        num_decoder_layers=2, d_ff=32, dropout=0.0, max_len=16,
    )  # fmt: skip
    model = al.Transformer(cfg).double().eval()
    src, tgt = torch.randint(3, 20, (2, 5)), torch.randint(3, 20, (2, 4))
    kept = []
    handles = [
        layer.cross_attn.hook_weights.register_forward_hook(lambda _m, _a, w: kept.append(w))
        for layer in model.decoder.layers
    ]
    model(src, tgt)
    for h in handles:
        h.remove()
    expected = torch.stack(kept).mean(dim=(0, 2))
    torch.testing.assert_close(source_alignment(model, src, tgt, "weights"), expected)
    alti = source_alignment(model, src, tgt, "alti")
    assert alti.shape == (2, 4, 5) and (alti >= 0).all() and (alti.sum(-1) <= 1 + 1e-12).all()
    rows = plausibility(model, src, tgt, src[:, :4])
    assert [r.method for r in rows] == ["weights", "alti", "random"]
    with pytest.raises(ArgumentError, match="method must be one of"):
        source_alignment(model, src, tgt, "rollout")
    with pytest.raises(ArgumentError, match="written must have tgt_in's shape"):
        plausibility(model, src, tgt, src)
