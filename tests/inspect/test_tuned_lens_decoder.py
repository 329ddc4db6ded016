"""The tuned lens of an encoder-decoder's decoder (issue 35): trained on (source, target) rows,
closer to the output than the logit lens at every decoder layer, the last row the decoder's
logits, saved and loaded like a GPT's; shown by ``attnlab view --lens tuned:PATH``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import attnlab as al
from attnlab.cli import main
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect import TunedLens, load_tuned_lens, logit_lens, train_tuned_lens
from tests.cli.test_view_generate import TOKENIZER, _save

V = TOKENIZER.vocab_size


def seq2seq(norm_first: bool) -> al.Transformer:
    torch.manual_seed(2)
    cfg = al.TransformerConfig(
        src_vocab_size=V, tgt_vocab_size=V, d_model=16, num_heads=2, num_encoder_layers=1,
        num_decoder_layers=2, d_ff=32, dropout=0.0, norm_first=norm_first, max_len=16,
        bos_id=TOKENIZER.bos_id, eos_id=TOKENIZER.eos_id, pad_id=TOKENIZER.pad_id,
    )  # fmt: skip
    return al.Transformer(cfg).eval()


def pairs(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (rows, 6), generator=g)
    tgt = torch.cat([torch.full((rows, 1), TOKENIZER.bos_id), src[:, :4].flip(1)], dim=1)
    return src, tgt


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_decoders_tuned_lens(norm_first: bool, tmp_path: Path) -> None:
    model = seq2seq(norm_first)
    lens = train_tuned_lens(model, pairs(32, 0), steps=30, batch_size=8, lr=3e-2)
    assert lens.config["n_layer"] == 2 and lens.config["family"] == "transformer"
    src, tgt = pairs(8, 1)  # held out
    tuned = logit_lens(model, src, target_ids=tgt, tuned=lens)
    plain = logit_lens(model, src, target_ids=tgt)
    assert torch.equal(tuned.logits[-1], model(src, tgt).logits)  # the last row is the output
    kl_t, kl_l = tuned.kl_to_final().mean((1, 2)), plain.kl_to_final().mean((1, 2))
    assert bool((kl_t[:-1] < kl_l[:-1]).all()), (kl_t, kl_l)
    lens.save(tmp_path / "lens")
    back = load_tuned_lens(tmp_path / "lens", model)
    again = logit_lens(model, src, target_ids=tgt, tuned=back)
    assert torch.equal(again.logits, tuned.logits)
    with pytest.raises(ArgumentError, match="another model"):
        load_tuned_lens(tmp_path / "lens", seq2seq(not norm_first))


def test_bad_data_is_one_typed_error() -> None:
    model = seq2seq(True)
    src, tgt = pairs(4, 0)
    with pytest.raises(ArgumentTypeError, match=r"pair \(source_ids, target_ids\)"):
        train_tuned_lens(model, src, steps=1)
    with pytest.raises(ArgumentError, match="pair up"):
        train_tuned_lens(model, (src, tgt[:3]), steps=1)
    with pytest.raises(ArgumentTypeError, match=r"GPT or an attnlab\.Transformer"):
        TunedLens.for_model(torch.nn.Linear(2, 2))


def test_view_shows_the_decoders_tuned_lens(tmp_path: Path, capsys) -> None:
    model = seq2seq(True)
    run = _save(tmp_path / "s2s", model)
    lens = train_tuned_lens(model, pairs(16, 0), steps=3, batch_size=4, lr=3e-2)
    lens.save(tmp_path / "lens")
    out = tmp_path / "v.html"
    argv = ["view", str(run), "--text", "abc", "--target", "cba", "--lens"]
    assert main([*argv, f"tuned:{tmp_path / 'lens'}", "-o", str(out)]) == 0
    m = re.search(r'id="attnlab-data">(.*?)</script>', out.read_text(), re.S)
    assert m
    logit, tuned = json.loads(m.group(1))["lenses"]
    assert (logit["lens"], tuned["lens"]) == ("logit", "tuned")
    assert logit["layers"] == ["embed", "0", "1"]
    assert tuned["top_probs"] != logit["top_probs"]
    assert tuned["top_ids"][-1] == logit["top_ids"][-1]  # the output, under both
    # the command line trains a language model's lens only, and says how to train this one
    capsys.readouterr()
    argv = [
        "inspect",
        str(run),
        "--train-tuned-lens",
        str(tmp_path / "x"),
        "--data",
        "tinyshakespeare",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "train_tuned_lens(model, (source_ids, target_ids))" in err and "\n" not in err
