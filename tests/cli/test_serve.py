"""``attnlab serve``: the model of a run behind the app on 127.0.0.1; every refusal one line."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import uvicorn  # the serve extra, in dev: make test installs it

from attnlab import Transformer
from attnlab.cli import main
from tests.cli.test_view_generate import TOKENIZER, _save, gpt_run  # noqa: F401 (a fixture)


def test_serve_runs_the_run_behind_the_app_on_loopback(
    gpt_run: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from starlette.testclient import TestClient

    served = {}

    def run(self, sockets=None):  # uvicorn.Server.run, without serving forever
        served["app"], served["address"] = self.config.app, sockets[0].getsockname()

    monkeypatch.setattr(uvicorn.Server, "run", run)
    assert main(["serve", str(gpt_run), "--port", "0", "--max-tokens", "500"]) == 0
    err = capsys.readouterr().err
    host, port = served["address"]
    assert host == "127.0.0.1" and port > 0
    assert f"on http://127.0.0.1:{port}/" in err and "up to 64 tokens" in err  # the context
    with TestClient(served["app"], base_url=f"http://127.0.0.1:{port}") as client:
        info = client.get("/api/info").json()
        assert info["layers"] == ["transformer.h.0.attn", "transformer.h.1.attn"]
        r = client.post("/api/next", json={"text": "abc bad", "temperature": 0})
        assert r.status_code == 422 and r.json()["field"] == "temperature"


def test_serve_takes_an_encoder_decoder_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from starlette.testclient import TestClient

    served = {}
    monkeypatch.setattr(uvicorn.Server, "run",
                        lambda self, sockets=None: served.update(app=self.config.app))  # fmt: skip
    from tests.serve.test_seq2seq import tiny_config

    run = _save(tmp_path / "s2s", Transformer(tiny_config(1)))
    assert main(["serve", str(run), "--port", "0"]) == 0
    assert "up to 32 tokens" in capsys.readouterr().err  # the model's max_len
    with TestClient(served["app"], base_url="http://127.0.0.1:8000") as client:
        assert client.get("/api/info").json()["kind"] == "seq2seq"
        r = client.post("/api/view", json={"text": "abc", "target": "cab"})
        assert r.status_code == 200 and r.json()["target_tokens"] == ["c", "a", "b"]


def test_serve_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", "smollm2-135m", "--port", str(port)]) == 2  # before any loading
    err = capsys.readouterr().err.strip()
    assert f"--port {port}: cannot listen there" in err and "\n" not in err
    run = tmp_path / "nothing"
    with pytest.raises(SystemExit) as exc:
        main(["serve", str(run), "--port", "70000"])
    assert exc.value.code == 2
    assert "--port: must be a port number in [0, 65535], got 70000" in capsys.readouterr().err
