"""Plausibility of alignments (attnlab.inspect.plausibility): the scoring against known sources."""

from __future__ import annotations

import sys

import pytest
import torch

import attnlab as al
from attnlab.errors import ArgumentError
from attnlab.inspect.plausibility import (
    ALIGNMENT_METHODS,
    _score,
    plausibility,
    plausibility_of_batches,
    plausibility_table,
    source_alignment,
)


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
    assert [r.method for r in rows] == [*ALIGNMENT_METHODS, "random"]
    with pytest.raises(ArgumentError, match="method must be one of"):
        source_alignment(model, src, tgt, "value_zeroing")
    with pytest.raises(ArgumentError, match="written must have tgt_in's shape"):
        plausibility(model, src, tgt, src)


def test_rollout_and_norm_alignments_follow_their_equations() -> None:
    """rollout: the mean cross-attention through the encoder's 0.5 A + 0.5 I (one layer);
    norm: ‖Σ_h α^h_is W_O^h v^h_s‖ per decoder layer, averaged, from the recorded values."""
    torch.manual_seed(1)
    cfg = al.TransformerConfig(
        src_vocab_size=20, tgt_vocab_size=20, d_model=16, num_heads=2, num_encoder_layers=1,
        num_decoder_layers=2, d_ff=32, dropout=0.0, max_len=16,
    )  # fmt: skip
    model = al.Transformer(cfg).double().eval()
    src, tgt = torch.randint(3, 20, (2, 5)), torch.randint(3, 20, (2, 4))
    enc, cross, values = [], [], []
    layer = model.encoder.layers[0]
    handles = [layer.self_attn.hook_weights.register_forward_hook(lambda _m, _a, w: enc.append(w))]
    for dec in model.decoder.layers:
        handles.append(dec.cross_attn.hook_weights.register_forward_hook(
            lambda _m, _a, w: cross.append(w)))  # fmt: skip
        handles.append(dec.cross_attn.hook_v.register_forward_hook(
            lambda _m, _a, v: values.append(v)))  # fmt: skip
    with torch.no_grad():
        model(src, tgt)
    for h in handles:
        h.remove()
    mean_cross = torch.stack(cross).mean(dim=(0, 2))  # (B, T, S)
    r_enc = 0.5 * enc[0].mean(1) + 0.5 * torch.eye(5, dtype=torch.float64)
    r_enc = r_enc / r_enc.sum(-1, keepdim=True)
    torch.testing.assert_close(source_alignment(model, src, tgt, "rollout"), mean_cross @ r_enc)
    norms = []
    for dec, a, v in zip(model.decoder.layers, cross, values):
        w_o = dec.cross_attn.out_proj.weight.view(16, 2, 8)  # (d_model, H, d_head)
        moved = torch.einsum("bhts,bhsd,ehd->btse", a, v, w_o)  # Σ_h α^h_ts W_O^h v^h_s
        norms.append(moved.norm(dim=-1))
    torch.testing.assert_close(
        source_alignment(model, src, tgt, "norm"), torch.stack(norms).mean(0)
    )
    assert source_alignment(model, src, tgt, "norm_residual").shape == (2, 4, 5)


def test_padding_and_eos_are_not_scored_and_batches_add_up(monkeypatch: pytest.MonkeyPatch) -> None:
    src = torch.tensor([[5, 6, 2, 0], [7, 8, 9, 2]])  # 2: <eos>, 0: padding
    written = torch.tensor([[6, 5, 2, 0], [9, 8, 7, 2]])
    scores = torch.zeros(2, 4, 4)
    scores[0, 0, 1] = scores[0, 1, 0] = scores[1, 0, 2] = scores[1, 1, 1] = scores[1, 2, 0] = 1.0
    scores[0, 2, 2] = scores[0, 3, 3] = scores[1, 3, 3] = 1.0  # <eos>/padding "aligned" too

    class Fixed(torch.nn.Module):
        pass

    module = sys.modules["attnlab.inspect.plausibility"]
    monkeypatch.setattr(module, "source_alignment", lambda _m, _s, _t, _method: scores)
    rows = plausibility_of_batches(
        Fixed(), [(src, written, written)], ["weights"], ignore_ids=[0, 2]
    )
    both = plausibility_of_batches(
        Fixed(), [(src, written, written)] * 2, ["weights"], ignore_ids=[0, 2]
    )
    assert rows[0].positions == 5 and rows[0].top1 == 1.0  # the 3 + 2 copied tokens only
    assert both[0].positions == 10 and both[0].top1 == 1.0
    assert "top-1" in plausibility_table(rows) and "random" in plausibility_table(rows)
    with pytest.raises(ArgumentError, match="batches must hold at least one batch"):
        plausibility_of_batches(Fixed(), [], ["weights"])
