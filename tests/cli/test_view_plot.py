"""``attnlab view`` and ``attnlab plot`` on saved checkpoints."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab import GPT, GPTConfig, Transformer, TransformerConfig
from attnlab.cli import main
from attnlab.data.tokenizers import BOS, EOS, PAD, UNK, CharTokenizer
from attnlab.inspect.capture import capture
from attnlab.models.config import config_to_dict
from attnlab.training.checkpoint import save_checkpoint

TOKENIZER = CharTokenizer(list("abcdefgh "), [PAD, UNK, BOS, EOS])


def _save(run: Path, model: torch.nn.Module) -> Path:
    save_checkpoint(
        run,
        step=1,
        model=model,
        config={"model": config_to_dict(model.config)},
        files={"tokenizer.json": TOKENIZER.to_json()},
    )
    return run


def _embedded(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', html, re.S)
    assert m
    return json.loads(m.group(1).replace("<\\/", "</"))


def test_view_gpt_embeds_the_captured_weights(tmp_path: Path) -> None:
    model = GPT(
        GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    ).eval()
    run = _save(tmp_path / "gpt", model)
    out = tmp_path / "v.html"
    assert main(["view", str(run), "--text", "abc bad", "-o", str(out)]) == 0
    data = _embedded(out.read_text())
    assert data["sequences"]["tokens"] == [
        TOKENIZER.id_to_token(i) for i in TOKENIZER.encode("abc bad")
    ]
    with torch.no_grad(), capture(model) as cache:
        model(torch.tensor([TOKENIZER.encode("abc bad")]))
    layer = data["groups"][0]["layers"][1]
    w = np.frombuffer(base64.b64decode(layer["weights"]), dtype="<f4").reshape(4, 7, 7)
    np.testing.assert_allclose(w, cache.attentions[layer["name"]][0].numpy(), rtol=1e-5, atol=1e-6)


def test_view_seq2seq_has_three_groups(tmp_path: Path) -> None:
    cfg = TransformerConfig(
        src_vocab_size=TOKENIZER.vocab_size, tgt_vocab_size=TOKENIZER.vocab_size, d_model=32,
        num_heads=4, num_encoder_layers=1, num_decoder_layers=1, d_ff=64, max_len=32,
        bos_id=TOKENIZER.bos_id, eos_id=TOKENIZER.eos_id,
    )  # fmt: skip
    run = _save(tmp_path / "s2s", Transformer(cfg))
    out = tmp_path / "s.html"
    assert main(["view", str(run), "--text", "abcd", "--target", "dcba", "-o", str(out)]) == 0
    data = _embedded(out.read_text())
    assert [g["name"] for g in data["groups"]] == [
        "encoder self-attention",
        "decoder self-attention",
        "decoder cross-attention",
    ]
    assert len(data["sequences"]["target"]) == 5 and len(data["sequences"]["source"]) == 4


def test_view_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(tmp_path / "nope"), "--text", "a"]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["noam", "positional", "masks", "steps"])
def test_plot_kinds_write_files(tmp_path: Path, kind: str) -> None:
    out = tmp_path / f"{kind}.svg"
    extra = ["--steps", "200", "--warmup", "50"] if kind == "noam" else []
    assert main(["plot", kind, "-o", str(out), *extra]) == 0
    assert out.stat().st_size > 1000


def test_plot_heads_from_model(tmp_path: Path) -> None:
    model = GPT(
        GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    )
    run = _save(tmp_path / "gpt", model)
    for kind in ("heads", "heatmap", "layers"):
        out = tmp_path / f"{kind}.png"
        assert main(["plot", kind, "--model", str(run), "--text", "abcabc", "-o", str(out)]) == 0
        assert out.stat().st_size > 1000
