"""``attnlab inspect``, ``view`` and ``plot`` on a Hugging Face BERT folder (tiny, random,
WordPiece tokenizer): the text read with ``[CLS] … [SEP]``, every head reported, the viewer's
encoder self-attention with no look-ahead mask and the special tokens marked."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest

from attnlab.cli import main
from tests.models._encoders import tiny_bert_folder

TEXT = "The cat sat on the mat."
TOKENS = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert_folder(tmp_path_factory.mktemp("bert") / "bert")


def test_inspect_json_reads_the_text_with_its_special_tokens(
    bert: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["inspect", str(bert), "--text", TEXT, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["source_tokens"] == TOKENS and report["target_tokens"] == []
    assert [(h["layer"], h["head"]) for h in report["heads"]] == [
        (f"layers.{i}.self_attn", h) for i in range(2) for h in range(4)
    ]
    assert all(h["rows"] == len(TOKENS) and h["masked_rows"] == 0 for h in report["heads"])


def test_view_shows_bidirectional_attention_and_marks_cls_sep(bert: Path, tmp_path: Path) -> None:
    out = tmp_path / "v.html"
    assert main(["view", str(bert), "--text", TEXT, "-o", str(out)]) == 0
    html = out.read_text()
    m = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', html, re.S)
    assert m
    data = json.loads(m.group(1))
    assert data["sequences"] == {"tokens": TOKENS}
    assert data["special"] == {"tokens": [0, len(TOKENS) - 1]}
    (group,) = data["groups"]
    assert group["name"] == "encoder self-attention"
    n = len(TOKENS)
    for layer in group["layers"]:
        assert layer["mask"] is None  # no look-ahead mask drawn over an encoder
        w = np.frombuffer(base64.b64decode(layer["weights"]), dtype="<f4").reshape(4, n, n)
        above = np.triu_indices(n, 1)
        assert np.all(w[:, above[0], above[1]] > 0)  # every token sees the tokens after it


def test_plot_layers_and_encoder_only_errors(
    bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "layers.png"
    assert main(["plot", "layers", "--model", str(bert), "--text", TEXT, "-o", str(out)]) == 0
    assert out.stat().st_size > 0
    capsys.readouterr()
    assert main(["inspect", str(bert), "--text", TEXT, "--generate", "2"]) == 2
    assert main(["inspect", str(bert), "--text", TEXT, "--target", "x"]) == 2
    assert main(["generate", str(bert), "--prompt", TEXT]) == 2
    assert main(["translate", str(bert), TEXT]) == 2
    assert main(["patch", str(bert), "--clean", "the", "--corrupted", "cat", "--answer", "cat",
                 "--wrong", "the"]) == 2  # fmt: skip
    assert main(["inspect", str(bert), "--roles"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 6 and all(line.startswith("attnlab: error: ") for line in err)
    assert "an encoder reads the text in both directions" in err[0]
    assert "this run is an encoder" in err[1]
    assert "is an encoder: it reads a text in both directions and generates nothing" in err[2]
    assert "holds an encoder, not an encoder-decoder" in err[3]
    assert "patch is for language models; this run is an encoder" in err[4]
    assert "role scores need a decoder-only language model" in err[5] and "encoder" in err[5]


def test_embed_prints_cosine_similarities(bert: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    import attnlab

    texts = ["the cat sat", "the dog ran on the mat", "a cat"]
    assert main(["embed", str(bert), *texts, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    model, tokenizer = attnlab.load_pretrained(bert)
    want = attnlab.embed(texts, model, tokenizer)
    e = torch.tensor(out["embeddings"])
    assert out["texts"] == texts and torch.allclose(e, want, atol=1e-6)
    assert torch.allclose(torch.tensor(out["similarity"]), want @ want.T, atol=1e-6)
    assert main(["embed", str(bert), *texts]) == 0
    assert "cosine similarity" in capsys.readouterr().out
    assert main(["embed", str(bert / "missing"), "a"]) == 2
    assert "MODEL must be a pretrained encoder" in capsys.readouterr().err


def test_mixing_reads_an_encoders_layers_and_refuses_what_needs_logits(
    bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.html"
    assert main(["view", str(bert), "--text", "the cat", "--mixing", "all", "-o", str(out)]) == 0
    m = re.search(r'id="attnlab-data">(.*?)</script>', out.read_text(), re.S)
    assert m
    methods = [v["name"] for v in json.loads(m.group(1))["methods"]]
    assert "norm" in methods and "alti" in methods and "grad_weights" not in methods
    assert main(["inspect", str(bert), "--text", "the cat", "--mixing", "norm"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(bert), "--text", "the cat", "--mixing", "grad_weights"]) == 2
    assert main(["inspect", str(bert), "--text", "the cat", "--faithfulness"]) == 2
    assert main(["view", str(bert), "--text", "the cat", "--lens", "logit", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "Encoder predicts none (no logits)" in err[0]
    assert "this run is an encoder" in err[1] and "an encoder predicts none" in err[2]
