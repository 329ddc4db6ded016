"""``attnlab serve`` of an encoder-decoder: its JSON API against the library's own calls, on a
tiny random :class:`attnlab.Transformer` built here (cheap)."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch
from starlette.testclient import TestClient  # needs httpx: the serve extra, in dev

from attnlab.decoding.generate import generate
from attnlab.inspect import capture
from attnlab.models.transformer import Transformer, TransformerConfig
from attnlab.tasks.seq2seq import Seq2SeqIO
from tests.cli.test_view_generate import TOKENIZER

TEXT = "abc fade"


def tiny_config(decoder_layers: int = 2) -> TransformerConfig:
    """A tiny encoder-decoder over the character tokenizer of the view tests."""
    return TransformerConfig(
        src_vocab_size=TOKENIZER.vocab_size, tgt_vocab_size=TOKENIZER.vocab_size, d_model=16,
        num_heads=2, num_encoder_layers=1, num_decoder_layers=decoder_layers, d_ff=32, max_len=32,
        bos_id=TOKENIZER.bos_id, eos_id=TOKENIZER.eos_id, pad_id=TOKENIZER.pad_id,
    )  # fmt: skip


@pytest.fixture(scope="module")
def client():
    from attnlab.serve import create_app

    torch.manual_seed(0)
    cfg = tiny_config()
    model = Transformer(cfg).eval()
    io = Seq2SeqIO(
        src_tok=TOKENIZER, tgt_tok=TOKENIZER, bos_id=cfg.bos_id, eos_id=cfg.eos_id,
        pad_id=cfg.pad_id, source_suffix=(), max_source_len=32,
        max_new_tokens=lambda n: min(31, 2 * n + 10),
    )  # fmt: skip
    app = create_app(model, io=io, title="tiny s2s", max_tokens=32)
    with TestClient(app, base_url="http://127.0.0.1:8000") as c:
        c.model, c.io = model, io  # type: ignore[attr-defined]
        yield c


def _src() -> torch.Tensor:
    return torch.tensor([TOKENIZER.encode(TEXT)])


def test_without_a_target_the_target_is_what_translate_decodes(client) -> None:
    r = client.post("/api/tokenize", json={"text": TEXT})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["source_ids"] == TOKENIZER.encode(TEXT)
    assert body["output"] == client.io.translate(client.model, [TEXT])[0]
    assert body["target_ids"] == list(client.io.inputs(client.model, TEXT).target_ids[1:])
    assert client.get("/api/info").json()["kind"] == "seq2seq"


def test_the_view_holds_encoder_decoder_and_cross_attention_as_captured(client) -> None:
    target = TOKENIZER.encode("fed")
    r = client.post("/api/view", json={"text": TEXT, "target_ids": target})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["target_tokens"] == ["f", "e", "d"] and "attnlab-data" in body["html"]
    tgt_in = torch.tensor([[TOKENIZER.bos_id, *target[:-1]]])  # the rows that wrote the target
    with capture(client.model) as cache, torch.no_grad():
        client.model(_src(), tgt_in)
    layers = {layer["name"]: layer for g in body["viewer"]["groups"] for layer in g["layers"]}
    assert set(layers) == set(cache.attentions)
    assert set(cache.kinds.values()) == {"self", "cross"}
    for name, layer in layers.items():
        got = np.frombuffer(base64.b64decode(layer["weights"]), dtype="<f4")
        assert np.array_equal(got, cache.attentions[name][0].float().numpy().ravel()), name


def test_next_target_token_and_greedy_decoding(client) -> None:
    target = TOKENIZER.encode("fe")
    r = client.post("/api/next", json={"text": TEXT, "target_ids": target, "temperature": 0.7,
                                       "top": 5})  # fmt: skip
    assert r.status_code == 200, r.text
    with torch.no_grad():
        z = client.model(_src(), torch.tensor([[TOKENIZER.bos_id, *target]])).logits[0, -1]
    want = (z.double() / 0.7).softmax(-1)
    for t in r.json()["tokens"]:
        assert t["probability"] == pytest.approx(float(want[t["id"]]), abs=1e-6)
    # generate N: greedy from <bos>, as translate decodes (stops at <eos>)
    g = client.post("/api/generate", json={"text": TEXT, "target_ids": [], "n": 4})
    assert g.status_code == 200, g.text
    with torch.no_grad():
        rows = generate(client.model, _src(), max_new_tokens=4, strategy="greedy")
    row = rows[0, 1:].tolist()
    if TOKENIZER.eos_id in row:
        row = row[: row.index(TOKENIZER.eos_id) + 1]
    assert g.json()["target_ids"] == row and g.json()["new"] == row
    # after a typed prefix: each new token the argmax of the logits the bars show
    g = client.post("/api/generate", json={"text": TEXT, "target": "fe", "n": 1}).json()
    assert g["target_ids"] == [*target, int(z.argmax())]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/view", {"text": TEXT, "target_ids": [99]}, "target_ids"),
        ("/api/view", {"text": TEXT, "target": 3}, "target"),
        ("/api/view", {"text": TEXT, "target": "ab", "target_ids": [4]}, "target"),
        ("/api/view", {"text": "a" * 40}, "text"),
        ("/api/view", {"text": ""}, "text"),
        ("/api/generate", {"text": TEXT, "target_ids": [4] * 28, "n": 8}, "n"),
        ("/api/view", {"text": TEXT, "target_ids": []}, "target_ids"),
        ("/api/steps", {"text": TEXT}, "text"),
    ],
)
def test_bad_requests_are_a_4xx_naming_the_field(client, path, body, field) -> None:
    r = client.post(path, json=body)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["field"] == field
