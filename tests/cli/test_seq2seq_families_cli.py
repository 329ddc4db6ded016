"""``attnlab translate``, ``inspect`` and ``view`` on a Hugging Face Marian and BART folder
(tiny, random, a word-level tokenizer.json): the source read with ``</s>`` last (and ``<s>``
first for BART), the decoder started from the family's start token, the viewer's three groups (encoder, decoder, cross-attention)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import attnlab as al
from attnlab.cli import main
from attnlab.models.seq2seq_hf import save_transformer_hf

WORDS = ["the", "cat", "sat", "on", "mat", "le", "chat", "est", "sur", "tapis"]
#: family → (vocabulary, pad, decoder start, eos, the tokenizer's specials, its own fields)
FAMILIES = {
    "marian": (["</s>", "<unk>", *WORDS, "<pad>"], 11 + 1, 12, 0,
               {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"},
               {"activation": "silu", "sinusoid_layout": "halves"}),
    "bart": (["<s>", "<pad>", "</s>", "<unk>", *WORDS], 1, 2, 2,
             {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"},
             {"activation": "gelu", "scale_embedding": False, "positions": "learned",
              "position_offset": 2, "norm_embeddings": True}),
}  # fmt: skip
TEXT = "the cat sat"


@pytest.fixture(scope="module", params=list(FAMILIES))
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    family = request.param
    vocab, pad, start, eos, special, own = FAMILIES[family]
    folder = tmp_path_factory.mktemp(family) / family
    torch.manual_seed(0)
    config = al.TransformerConfig(
        src_vocab_size=len(vocab), tgt_vocab_size=len(vocab), d_model=16, num_heads=4,
        num_encoder_layers=2, num_decoder_layers=2, d_ff=24, share_embeddings=True, max_len=32,
        pad_id=pad, bos_id=start, eos_id=eos, family=family, final_logits_bias=True,
        mask_target_padding=False, **own,
    )  # fmt: skip
    model = al.Transformer(config)
    model.final_logits_bias[pad] = -1e4  # never <pad> (the families' generation configs ban it)
    save_transformer_hf(model, folder)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(special))
    return folder


def test_translate_prints_a_decoding(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["translate", str(folder), TEXT, "--beams", "2"]) == 0
    out = capsys.readouterr().out.strip()
    assert out and all(w in [*WORDS, "<unk>"] for w in out.split())


def test_inspect_reads_the_source_with_eos_and_reports_three_kinds(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["inspect", str(folder), "--text", TEXT, "--json"])
    report = json.loads(capsys.readouterr().out)
    start = ["<s>"] if folder.name == "bart" else []  # BART reads <s> … </s>, Marian … </s>
    assert report["source_tokens"] == [*start, "the", "cat", "sat", "</s>"]
    layers = {h["layer"] for h in report["heads"]}
    assert {"encoder.layers.1.self_attn", "decoder.layers.0.self_attn",
            "decoder.layers.1.cross_attn"} <= layers  # fmt: skip


def test_view_shows_encoder_decoder_and_cross_attention(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "v.html"
    assert main(["view", str(folder), "--text", TEXT, "-o", str(out)]) == 0
    m = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>',
                  out.read_text(), re.S)  # fmt: skip
    assert m
    names = [g["name"] for g in json.loads(m.group(1))["groups"]]
    assert len(names) == 3 and any("cross" in n for n in names), names


def test_a_folder_without_a_tokenizer_is_refused_in_one_line(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((folder / name).read_bytes())
    assert main(["translate", str(bare), TEXT]) != 0
    assert "holds no tokenizer.json" in capsys.readouterr().err
