"""``attnlab view --generate N`` and ``attnlab inspect --json`` on a grouped-query rotary GPT:
the page holds the prompt and the generated tokens, the report names every query head."""

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
from attnlab.inspect import capture
from attnlab.models.config import config_to_dict
from attnlab.training.checkpoint import save_checkpoint

TOKENIZER = CharTokenizer(list("abcdefgh "), [PAD, UNK, BOS, EOS])
PROMPT = "abc bad"


def _save(run: Path, model: torch.nn.Module) -> Path:
    save_checkpoint(
        run, step=1, model=model, config={"model": config_to_dict(model.config)},
        files={"tokenizer.json": TOKENIZER.to_json()},
    )  # fmt: skip
    return run


def _gpt() -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=64, n_embd=32, n_layer=2,
                    n_head=4, num_kv_heads=2, positions="rope")  # fmt: skip
    model = GPT(cfg).eval()
    with torch.no_grad():
        model.transformer.h[0].attn.c_attn.weight.mul_(15.0)
        model.transformer.h[1].attn.c_attn.weight.mul_(15.0)
    return model


@pytest.fixture
def gpt_run(tmp_path: Path) -> Path:
    return _save(tmp_path / "gpt", _gpt())


def _embedded(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', html, re.S)
    assert m
    return json.loads(m.group(1))


def test_view_generate_holds_the_prompt_and_the_generated_tokens(
    gpt_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "v.html"
    assert main(["view", str(gpt_run), "--text", PROMPT, "--generate", "3", "-o", str(out)]) == 0
    data = _embedded(out.read_text())
    tokens = data["sequences"]["tokens"]
    n = len(TOKENIZER.encode(PROMPT))
    assert len(tokens) == n + 3 and data["prompt_length"] == n
    # the weights are those of the whole sequence, prompt and generated tokens: causal rows
    layer = data["groups"][0]["layers"][1]
    w = np.frombuffer(base64.b64decode(layer["weights"]), dtype="<f4").reshape(4, n + 3, n + 3)
    assert np.allclose(w.sum(-1), 1, atol=1e-5) and np.all(np.triu(w, 1) == 0)
    # each generated token with the probability it was generated with (greedy: the softmax of
    # the logits, its largest entry), read off one forward of the whole sequence
    scores = data["token_scores"]
    assert [s["position"] for s in scores] == [n, n + 1, n + 2]
    with torch.no_grad():
        seq = torch.tensor([TOKENIZER.encode(PROMPT) + [s["id"] for s in scores]])
        pi = _gpt()(seq).logits[0, n - 1 : -1].softmax(-1)
    assert [s["probability"] for s in scores] == pytest.approx(pi.max(-1).values.tolist(), abs=1e-6)
    assert [s["alternatives"][0]["id"] for s in scores] == [s["id"] for s in scores]
    # --max-new-tokens is the same option
    again = tmp_path / "w.html"
    argv = ["view", str(gpt_run), "--text", PROMPT, "--max-new-tokens", "3", "-o", str(again)]
    assert main(argv) == 0
    assert _embedded(again.read_text())["sequences"] == data["sequences"]
    # without generation nothing is marked
    plain = tmp_path / "p.html"
    assert main(["view", str(gpt_run), "--text", PROMPT, "-o", str(plain)]) == 0
    assert _embedded(plain.read_text())["prompt_length"] is None
    assert _embedded(plain.read_text())["token_scores"] is None


def test_generate_on_an_encoder_decoder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = TransformerConfig(
        src_vocab_size=TOKENIZER.vocab_size, tgt_vocab_size=TOKENIZER.vocab_size, d_model=16,
        num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32, max_len=32,
        bos_id=TOKENIZER.bos_id, eos_id=TOKENIZER.eos_id,
    )  # fmt: skip
    run = _save(tmp_path / "s2s", Transformer(cfg))
    rc = main(
        ["view", str(run), "--text", "abc", "--generate", "2", "-o", str(tmp_path / "x.html")]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--generate" in err and "language models" in err and "\n" not in err


def test_inspect_json_reports_every_query_head(
    gpt_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(gpt_run), "--text", PROMPT, "--generate", "2", "--json"]) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    assert report["streamed"] is False
    ids = torch.tensor([TOKENIZER.encode(PROMPT)])
    assert len(report["source_tokens"]) + len(report["target_tokens"]) == ids.shape[1] + 2
    heads = report["heads"]
    assert [(h["layer"], h["head"]) for h in heads] == [
        (f"transformer.h.{i}.attn", h) for i in range(2) for h in range(4)
    ]  # 4 query heads over 2 key/value heads
    model = _gpt()
    full = [TOKENIZER.token_to_id(t) for t in report["source_tokens"] + report["target_tokens"]]
    with torch.no_grad(), capture(model) as cache:
        model(torch.tensor([full]))
    for h in heads:
        w = cache.attentions[h["layer"]][0, h["head"]].double()
        ent = -torch.special.xlogy(w, w).sum(-1)
        assert h["entropy_mean"] == pytest.approx(float(ent.mean()), abs=1e-5)
        assert h["max_weight_mean"] == pytest.approx(float(w.amax(-1).mean()), abs=1e-6)
        assert h["first_token_share"] == pytest.approx(float(w[:, 0].mean()), abs=1e-6)
    # the streamed path (no T × T weights) gives the same three numbers
    main(["inspect", str(gpt_run), "--text", PROMPT, "--generate", "2", "--json", "--long"])
    streamed = json.loads(capsys.readouterr().out)
    assert streamed["streamed"] is True
    for a, b in zip(heads, streamed["heads"]):
        for key in ("entropy_mean", "max_weight_mean", "first_token_share"):
            assert a[key] == pytest.approx(b[key], abs=2e-5)


def test_inspect_table_uses_the_json_names(
    gpt_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["inspect", str(gpt_run), "--text", PROMPT])
    out = capsys.readouterr().out
    for name in ("entropy_mean", "max_weight_mean", "first_token_share"):
        assert name in out


def test_inspect_streams_a_long_text_by_itself(
    gpt_run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("attnlab.cli.inspect.STREAM_BYTES", 1000)
    main(["inspect", str(gpt_run), "--text", PROMPT, "--json"])
    assert json.loads(capsys.readouterr().out)["streamed"] is True


@pytest.mark.parametrize("command", ["view", "inspect", "plot"])
def test_generate_past_the_context_is_refused_before_generating(
    command: str, gpt_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    # issue 32: --generate 1000000 generated for minutes before the context error
    import attnlab.tasks.lm

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("generated before the length was checked")

    monkeypatch.setattr(attnlab.tasks.lm, "generate_text", never)
    extra = {"view": ["-o", str(tmp_path / "v.html")], "inspect": [],
             "plot": ["-o", str(tmp_path / "p.png")]}[command]  # fmt: skip
    head = ["plot", "heads", "--model"] if command == "plot" else [command]
    argv = [*head, str(gpt_run), "--text", PROMPT, "--generate", "1000000", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{len(PROMPT)} tokens and 1000000 new ones" in err and "limit of 64" in err


def test_generate_refuses_a_prompt_longer_than_the_context(gpt_run: Path, capsys) -> None:
    # issue 32: the prompt's head was dropped without a word (a --chat lost its template's head)
    assert main(["generate", str(gpt_run), "--prompt", "abc " * 20, "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the prompt has 80 tokens" in err and "limit of 64" in err
    # within the context it continues, and the continuation slides past the context as before
    assert main(["generate", str(gpt_run), "--prompt", "abc " * 16, "--max-new-tokens", "40"]) == 0


@pytest.fixture
def long_run(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=4096, n_embd=8, n_layer=2,
                    n_head=2)  # fmt: skip
    return _save(tmp_path / "long", GPT(cfg).eval())


def _never_captured(monkeypatch: pytest.MonkeyPatch) -> None:
    import attnlab.cli.view

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("captured before the page's size was checked")

    monkeypatch.setattr(attnlab.cli.view, "capture_inputs", never)


def test_view_refuses_a_page_a_browser_cannot_open(
    long_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    # issue 32: 10,000 tokens on a tiny model wrote a 1.2 GB page Chromium cannot open (and
    # 2000 tokens of SmolLM2 grew to 9.5 GB before an internal MemoryError)
    _never_captured(monkeypatch)
    out = tmp_path / "v.html"
    assert main(["view", str(long_run), "--text", "abc " * 975, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not out.exists(), err
    # 2 layers × 2 heads × 3900² float32 weights in base64: 324.5 MB
    assert "2 attention layers, 4 heads of 3900 × 3900 weights: about 309.4 MiB" in err
    assert "more than the 190.7 MiB a browser opens" in err
    assert "--layer PATH (one layer: about 154.7 MiB; these layers take at most 3061 tokens)" in err


def test_view_layer_keeps_the_page_under_the_limit(
    gpt_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import attnlab.cli.view

    # two layers of 4 heads × 60² weights: 153,600 bytes of page; one layer is half of it
    monkeypatch.setattr(attnlab.cli.view, "MAX_PAGE_BYTES", 100_000)
    out = tmp_path / "v.html"
    assert main(["view", str(gpt_run), "--ids", "5 " * 60, "-o", str(out)]) == 2
    assert "--layer PATH" in capsys.readouterr().err
    argv = ["view", str(gpt_run), "--ids", "5 " * 60, "--layer", "h.1.", "-o", str(out)]
    assert main(argv) == 0
    layers = [layer["name"] for g in _embedded(out.read_text())["groups"] for layer in g["layers"]]
    assert layers == ["transformer.h.1.attn"]


def test_view_refuses_weights_beyond_the_memory(
    long_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import attnlab._budget

    _never_captured(monkeypatch)
    monkeypatch.setattr(attnlab._budget, "_physical_memory", lambda: 10**6)
    assert main(["view", str(long_run), "--text", "abc " * 50, "-o", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the text (200 tokens) needs about" in err, err


@pytest.mark.parametrize("ids", ["-1", str(2**70), "13"])
@pytest.mark.parametrize("command", ["view", "inspect"])
def test_ids_outside_the_vocabulary_name_ids(
    command: str, ids: str, gpt_run: Path, tmp_path: Path, capsys
) -> None:
    # issue 32: --ids 2**70 was an OverflowError; out-of-range ids are named by the option
    extra = ["-o", str(tmp_path / "v.html")] if command == "view" else []
    assert main([command, str(gpt_run), "--ids", f"1 {ids}", *extra]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"attnlab: error: --ids must be token ids in [0, 13) (the vocabulary), got {ids}\n"
    )


def test_token_scores_need_one_entry_per_generated_token() -> None:
    from attnlab.errors import ArgumentError
    from attnlab.viz.viewer import viewer_data

    weights = {"transformer.h.0.attn": np.tril(np.ones((1, 3, 3))) / np.arange(1, 4)[:, None]}
    one = [{"probability": 0.5, "entropy": 1.0, "alternatives": []}]
    assert viewer_data(weights, tokens=list("abc"), prompt_length=2, token_scores=one)
    with pytest.raises(ArgumentError, match="one entry per generated token"):
        viewer_data(weights, tokens=list("abc"), prompt_length=1, token_scores=one)
    with pytest.raises(ArgumentError, match="token_scores needs prompt_length"):
        viewer_data(weights, tokens=list("abc"), token_scores=one)
