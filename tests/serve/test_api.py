"""The JSON API of ``attnlab serve`` against the library's own functions, on a tiny model."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
from starlette.testclient import TestClient  # needs httpx: the serve extra, in dev

from attnlab.decoding.generate import generate
from attnlab.inspect import capture
from tests.serve._app import MAX_TOKENS, TOKENIZER, tiny_app

TEXT = "abc bad fade"


@pytest.fixture(scope="module")
def client():
    app = tiny_app()
    with TestClient(app, base_url="http://127.0.0.1:8000") as c:
        c.model = app.state.session.model  # type: ignore[attr-defined]
        yield c


def _ids() -> torch.Tensor:
    return torch.tensor([TOKENIZER.encode(TEXT)])


def test_attention_is_what_capture_records(client) -> None:
    import base64

    import numpy as np

    r = client.post("/api/attention", json={"text": TEXT})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ids"] == TOKENIZER.encode(TEXT)
    with capture(client.model) as cache, torch.no_grad():
        client.model(_ids())
    layers = body["viewer"]["groups"][0]["layers"]
    assert [layer["name"] for layer in layers] == list(cache.attentions)
    for layer in layers:
        got = np.frombuffer(base64.b64decode(layer["weights"]), dtype="<f4")
        want = cache.attentions[layer["name"]][0].float().numpy().ravel()
        assert np.array_equal(got, want)  # the same capture of the same forward, float32 on both
    # the page opens on the most informative head, or keeps the one chosen
    assert body["viewer"]["start"]["reason"].startswith("lowest-entropy")
    kept = client.post("/api/attention", json={"text": TEXT, "layer": 1, "head": 3}).json()
    assert kept["viewer"]["start"] == {"group": 0, "layer": 1, "head": 3,
                                      "reason": "the head chosen before"}  # fmt: skip


@pytest.mark.parametrize(
    "options",
    [
        {"temperature": 0.7},
        {"temperature": 1.3, "top_k": 5},
        {"top_p": 0.8},
        {"temperature": 0.5, "top_k": 7, "top_p": 0.9},
    ],
)
def test_next_token_is_the_filtered_softmax_of_the_logits(client, options) -> None:
    r = client.post("/api/next", json={"text": TEXT, "top": 13, **options})
    assert r.status_code == 200, r.text
    body = r.json()
    with torch.no_grad():
        z = client.model(_ids()).logits[0, -1].double() / options.get("temperature", 1.0)
    # the reference in float64: top-k, then the smallest set of mass ≥ p (Hugging Face's order)
    if "top_k" in options:
        z = z.masked_fill(z < z.topk(options["top_k"]).values[-1], float("-inf"))
    if "top_p" in options:
        p = z.softmax(-1)
        order = p.argsort(descending=True)
        before = p[order].cumsum(0) - p[order]  # mass of the tokens ahead of each one
        drop = order[before >= options["top_p"]]
        z[drop] = float("-inf")
    want = z.softmax(-1)
    got = {t["id"]: t["probability"] for t in body["tokens"]}
    assert len(got) == 13
    for i, p in got.items():
        assert p == pytest.approx(float(want[i]), abs=1e-6)
    assert body["kept"] == int((want > 0).sum())
    listed = sorted(got.values(), reverse=True)
    assert listed == [t["probability"] for t in body["tokens"]]  # likeliest first


def test_generate_n_is_generate_with_the_same_seed(client) -> None:
    options = {"temperature": 0.9, "top_k": 6, "top_p": 0.95}
    r = client.post("/api/generate", json={"text": TEXT, "n": 6, "seed": 11, **options})
    assert r.status_code == 200, r.text
    body = r.json()
    want = generate(client.model, _ids(), max_new_tokens=6, strategy="sample",
                    generator=torch.Generator().manual_seed(11), **options)  # fmt: skip
    assert body["ids"] == want[0].tolist()
    assert body["prompt_length"] == len(TOKENIZER.encode(TEXT))
    assert body["new"] == want[0, _ids().shape[1] :].tolist()
    # the generated tokens go back as ids with the prompt's length: marked on the page
    view = client.post("/api/view", json={"ids": body["ids"], "prompt_length": 12}).json()
    assert '"prompt_length":12' in view["html"]
    # with the probabilities they were drawn with (the viewer's p% labels, view --generate's)
    scored = generate(client.model, _ids(), max_new_tokens=6, strategy="sample",
                      generator=torch.Generator().manual_seed(11), return_scores=True,
                      **options)  # fmt: skip
    want_p = scored.token_probs[0].tolist()
    assert [s["probability"] for s in body["scores"]] == want_p
    assert [s["position"] for s in body["scores"]] == list(range(12, 18))
    payload = client.post("/api/attention", json={"ids": body["ids"], "prompt_length": 12}).json()
    assert [s["probability"] for s in payload["viewer"]["token_scores"]] == want_p
    # one more token: the view holds the probabilities of all seven, in order
    more = client.post("/api/generate", json={"ids": body["ids"], "prompt_length": 12, "n": 1,
                                              "seed": 3, **options}).json()  # fmt: skip
    assert [s["position"] for s in more["scores"]] == list(range(12, 19))
    assert [s["probability"] for s in more["scores"]][:6] == want_p
    # typed ids were drawn by no one here: no labels (not a stale or a made-up number)
    other = 5 if body["ids"][-1] != 5 else 6
    typed = client.post("/api/attention", json={"ids": [*body["ids"][:-1], other],
                                                "prompt_length": 12}).json()  # fmt: skip
    assert typed["viewer"].get("token_scores") is None


def test_steps_are_the_plot_steps_panel_of_the_chosen_head(client) -> None:
    from attnlab.viz import step_panel_from_model

    r = client.post("/api/steps", json={"text": TEXT, "layer": 1, "head": 2, "query": 5,
                                        "figure": False})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    plot = step_panel_from_model(client.model, lambda: client.model(_ids()),
                                 layer="transformer.h.1.attn", head=2)  # fmt: skip
    assert body["weights"] == plot.data["weights"][5].tolist()
    assert body["scores"][:6] == plot.data["scores"][5, :6].tolist()
    assert body["scores"][6:] == [None] * (len(body["tokens"]) - 6)  # masked: null, not -inf
    assert body["image"] is None


BAD = [
    ("/api/view", {"text": ""}, 422, "text"),
    ("/api/view", {"text": "a" * 100_000}, 413, "text"),
    ("/api/view", {"text": "abc" * 20}, 413, "text"),  # past max_tokens
    ("/api/view", {"text": 5}, 422, "text"),
    ("/api/view", {}, 422, "text"),
    ("/api/view", {"text": "ab", "ids": [1]}, 422, "text"),
    ("/api/view", {"ids": [4, 99]}, 422, "ids"),
    ("/api/view", {"ids": [4, -1]}, 422, "ids"),
    ("/api/view", {"ids": [4, 2.5]}, 422, "ids"),
    ("/api/view", {"ids": []}, 422, "ids"),
    ("/api/view", {"text": "abc", "layer": 7, "head": 0}, 422, "layer"),
    ("/api/view", {"text": "abc", "layer": 0, "head": 4}, 422, "head"),
    ("/api/steps", {"text": "abc", "query": 3}, 422, "query"),
    ("/api/steps", {"text": "abc", "figure": "yes"}, 422, "figure"),
    ("/api/card", {"text": "abc", "parts": ["lens", "weights"]}, 422, "parts"),
    ("/api/card", {"text": "abc", "parts": "lens"}, 422, "parts"),
    ("/api/card", {"text": "abc", "layer": 0, "head": 9}, 422, "head"),
    ("/api/next", {"text": "abc", "temperature": 0}, 422, "temperature"),
    ("/api/next", {"text": "abc", "temperature": -1}, 422, "temperature"),
    ("/api/next", {"text": "abc", "temperature": "hot"}, 422, "temperature"),
    ("/api/next", {"text": "abc", "top_p": 0}, 422, "top_p"),
    ("/api/next", {"text": "abc", "top_p": 1.5}, 422, "top_p"),
    ("/api/next", {"text": "abc", "top_k": -2}, 422, "top_k"),
    ("/api/next", {"text": "abc", "top": 0}, 422, "top"),
    ("/api/generate", {"text": "abc", "n": 0}, 422, "n"),
    ("/api/generate", {"text": "abc", "n": MAX_TOKENS}, 413, "n"),
    ("/api/generate", {"text": "abc", "seed": -1}, 422, "seed"),
    ("/api/generate", {"text": "abc", "prompt_length": 9}, 422, "prompt_length"),
]


@pytest.mark.parametrize(("path", "body", "status", "field"), BAD)
def test_every_bad_input_is_a_4xx_naming_its_field(client, path, body, status, field) -> None:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    answer = r.json()
    assert answer["field"] == field
    assert answer["error"].startswith(field) or field in answer["error"]
    assert "Traceback" not in r.text


def test_bodies_that_are_not_json_and_foreign_hosts_are_refused(client) -> None:
    headers = {"content-type": "application/json"}
    for raw in (b'{"text": "ab\xff\xfe"}', b"{not json", b"[1, 2]", b'{"text": "\\ud800"}'):
        r = client.post("/api/view", content=raw, headers=headers)
        assert r.status_code in (400, 422), (raw, r.text)
        assert r.json()["field"] in ("body", "text")
    r = client.post("/api/view", content=b"[" * 200_000 + b"]" * 200_000, headers=headers)
    assert r.status_code == 400 and "nested" in r.json()["error"]
    r = client.post("/api/view", content=b"x" * 1_000_001, headers=headers)
    assert r.status_code == 413
    # DNS rebinding: a page on another name that resolves to 127.0.0.1 is not answered
    r = client.get("/api/info", headers={"host": "evil.example:8000"})
    assert r.status_code == 400
    assert client.get("/static/..%2F..%2Fapp.py").status_code == 404
    page = client.get("/")
    assert (
        page.status_code == 200 and "default-src 'none'" in page.headers["content-security-policy"]
    )


def test_requests_are_serialised_on_the_one_model(client) -> None:
    """Two threads asking at once never run the model at the same time."""
    session = client.app.state.session
    inside, most = [0], [0]
    original = session.model.forward

    def watched(*args, **kwargs):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.02)
        try:
            return original(*args, **kwargs)
        finally:
            inside[0] -= 1

    session.model.forward = watched
    try:
        # texts not asked before: the session keeps each text's logits
        threads = [threading.Thread(target=client.post, args=("/api/next",),
                                    kwargs={"json": {"text": "hg " + "e" * i}})
                   for i in range(1, 4)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        del session.model.forward
    assert most[0] == 1 and inside[0] == 0


def test_info_names_the_layers_and_the_limits(client) -> None:
    info = client.get("/api/info").json()
    assert info["layers"] == ["transformer.h.0.attn", "transformer.h.1.attn"]
    assert info["heads"] == [4, 4] and info["max_tokens"] == MAX_TOKENS
    assert json.loads(json.dumps(info)) == info


def test_share_downloads_the_viewer_page_of_the_chosen_head(client) -> None:
    r = client.post("/api/share", json={"text": TEXT, "layer": 1, "head": 3})
    assert r.status_code == 200
    assert r.headers["content-disposition"] == 'attachment; filename="attnlab-view.html"'
    assert r.text.startswith("<!DOCTYPE html>") and "attnlab-data" in r.text
    assert '"start":{"group":0,"layer":1,"head":3' in r.text


def test_a_page_too_large_for_a_browser_is_refused(client, monkeypatch) -> None:
    import attnlab.serve.session

    monkeypatch.setattr(
        attnlab.serve.session, "MAX_PAGE_BYTES", 8 * 100 * 16 // 3 + 1
    )  # 8 heads, T=10
    r = client.post("/api/view", json={"text": "abcdefghab"})
    assert r.status_code == 200
    r = client.post("/api/view", json={"text": "abcdefghabc"})
    assert r.status_code == 413 and "at most 10 tokens" in r.json()["error"]


def test_the_head_card_is_what_the_library_measures(client) -> None:
    from attnlab.inspect import diagnose, logit_lens
    from attnlab.inspect.qk_circuits import qk_spectrum
    from attnlab.inspect.roles import head_roles
    from attnlab.viz.viewer_lens import lens_view
    from attnlab.viz.viewer_mixing import mixing_views

    r = client.post("/api/card", json={"text": TEXT, "layer": 1, "head": 2, "query": 5})
    assert r.status_code == 200, r.text
    card = r.json()
    path = "transformer.h.1.attn"
    assert (card["layer"], card["head"], card["query"]) == (path, 2, 5)
    # role scores: inspect --roles' call (its defaults, cut to the 9 ordinary ids of the vocabulary)
    roles = head_roles(client.model, seq_len=9, batch=8, seed=0, token_range=(4, 13))
    for name in ("previous", "duplicate", "induction", "copying"):
        assert card["roles"][name] == float(roles.score(name)[1, 2])
    # entropy and sink share: inspect --text's diagnose of the same capture
    with capture(client.model) as cache, torch.no_grad():
        client.model(_ids())
    assert card["health"] == json.loads(json.dumps(diagnose(cache).for_layer(path)[2].to_dict()))
    assert card["health"]["first_token_share"] > 0
    # QK and OV spectra: inspect --qk-spectrum's
    spec = qk_spectrum(client.model)
    assert card["spectrum"]["qk"] == spec.values("qk")[1, 2].tolist()
    assert card["spectrum"]["ov_effective_rank"] == float(spec.effective_rank("ov")[1, 2])
    # context mixing: view --mixing's matrices, the query's row (per head for norm)
    with torch.no_grad():
        _, values = mixing_views(client.model, _ids(), ["norm", "alti"])
    assert card["mixing"][0]["row"] == values[path]["norm"][2, 5].tolist()
    assert card["mixing"][1]["row"] == values[path]["alti"][0, 5].tolist()
    # the lens: view --lens logit's panel, the query's column
    view = lens_view(logit_lens(client.model, _ids()), card["tokens"], str, k=5)
    rows = card["lens"]["rows"]
    assert [row["layer"] for row in rows] == view.layers
    assert [[t["id"] for t in row["top"]] for row in rows] == [r[5] for r in view.top_ids]
    assert [[t["probability"] for t in row["top"]] for row in rows] == [
        r[5] for r in view.top_probs
    ]
    assert [row["kl_bits"] for row in rows] == [r[5] for r in view.kl_bits]
    # a card of some parts: the others are not computed
    some = client.post("/api/card", json={"text": TEXT, "layer": 1, "head": 2, "parts": ["health"]})
    assert some.json()["health"] == card["health"]
    assert some.json()["lens"] is None and some.json()["mixing"] is None
    # another head or query of the same text runs nothing again (the text's results are kept)
    text = "hh fed"  # not asked before
    assert client.post("/api/card", json={"text": text, "layer": 1, "head": 2}).status_code == 200
    calls = [0]
    original = client.model.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    client.model.forward = counted
    try:
        again = client.post("/api/card", json={"text": text, "layer": 0, "head": 1, "query": 2})
        assert again.status_code == 200 and again.json()["lens"]["position"] == 2
        for t in (0.5, 1.5):
            assert (
                client.post("/api/next", json={"text": text, "temperature": t}).status_code == 200
            )
        assert client.post("/api/view", json={"text": text}).status_code == 200
    finally:
        del client.model.forward
    assert calls[0] == 0  # the capture's forward kept the last logits too
    # a new text's view and bars: one forward, and its logits are the model's, bit for bit
    calls[0] = 0
    client.model.forward = counted
    try:
        assert client.post("/api/view", json={"text": "gg fed"}).status_code == 200
        bars = client.post("/api/next", json={"text": "gg fed", "top": 3}).json()
    finally:
        del client.model.forward
    assert calls[0] == 1
    with torch.no_grad():
        z = client.model(torch.tensor([TOKENIZER.encode("gg fed")])).logits[0, -1]
    assert [t["raw"] for t in bars["tokens"]] == [float(z.double().softmax(-1)[t["id"]])
                                                  for t in bars["tokens"]]  # fmt: skip
