"""``attnlab generate … --show-probs [--top K] [--json]``: each generated token with its
probability, alternatives and entropy, against a direct softmax of the run's logits."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import torch

from attnlab import Transformer, TransformerConfig
from attnlab.cli import main
from attnlab.tasks.run import load_run
from tests.cli.test_view_generate import PROMPT, TOKENIZER, _gpt, _save
from tests.decoding._models import filtered_softmax


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save(tmp_path_factory.mktemp("probs") / "gpt", _gpt())


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_json_is_the_filtered_softmax_of_the_logits(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", str(run), "--prompt", PROMPT, "--max-new-tokens", "5", "--seed", "2",
            "--temperature", "0.8", "--top-k", "5", "--top-p", "0.9", "--show-probs",
            "--top", "3", "--json"]  # fmt: skip
    out = _json(argv, capsys)
    tokens = out["tokens"]
    assert len(tokens) == 5 and out["strategy"] == "sample"
    ids = TOKENIZER.encode(PROMPT) + [t["id"] for t in tokens]
    model = load_run(run).model
    with torch.no_grad():
        z = model(torch.tensor([ids[:-1]])).logits[0, len(ids) - 6 :].double()
    pi = filtered_softmax(z, 0.8, 5, 0.9)
    for t, (token, row) in enumerate(zip(tokens, pi)):
        assert token["position"] == len(ids) - 5 + t
        assert token["probability"] == pytest.approx(float(row[token["id"]]), abs=1e-6)
        assert token["entropy"] == pytest.approx(-float((row[row > 0] * row[row > 0].log()).sum()),
                                                 abs=1e-5)  # fmt: skip
        raw = z[t].softmax(-1)
        assert token["raw_entropy"] == pytest.approx(-float((raw * raw.log()).sum()), abs=1e-5)
        alts = token["alternatives"]
        assert 1 <= len(alts) <= 3 and all(a["probability"] > 0 for a in alts)
        want = row.topk(len(alts))
        assert [a["probability"] for a in alts] == pytest.approx(want.values.tolist(), abs=1e-6)
    # the same text as without --show-probs
    plain = _json([*argv[:-4], "--json"], capsys)
    assert plain == {"text": out["text"]}


def test_plain_lines_off_a_terminal_and_a_table_on_one(
    run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["generate", str(run), "--prompt", PROMPT, "--max-new-tokens", "3",
            "--strategy", "beam", "--beams", "2", "--show-probs"]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    head = lines[1].split("\t")
    assert head == ["position", "token", "probability", "entropy", "cumulative log p",
                    "alternatives"]  # fmt: skip
    rows = [line.split("\t") for line in lines[2:]]
    assert len(rows) == 3 and all(len(r) == 6 for r in rows)
    cumulative = [float(r[4]) for r in rows]
    assert cumulative == sorted(cumulative, reverse=True)  # log-probabilities add up

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stdout", screen)
    assert main(argv) == 0
    assert "┃" in screen.getvalue() and "alternatives" in screen.getvalue()


def test_bad_input_is_one_line(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = TransformerConfig(
        src_vocab_size=TOKENIZER.vocab_size, tgt_vocab_size=TOKENIZER.vocab_size, d_model=16,
        num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32, max_len=32,
        bos_id=TOKENIZER.bos_id, eos_id=TOKENIZER.eos_id,
    )  # fmt: skip
    s2s = _save(tmp_path / "s2s", Transformer(cfg))
    base = ["generate", str(run), "--prompt", PROMPT, "--max-new-tokens", "2"]
    for argv, words in (
        ([*base, "--show-probs", "--top", "0"], "--top"),
        ([*base, "--top", "3"], "--top needs --show-probs"),
        (["generate", str(s2s), "--prompt", "abc", "--show-probs"], "language models"),
    ):
        try:
            rc = main(argv)
        except SystemExit as stop:  # argparse's own errors
            rc = stop.code
        assert rc == 2, argv
        err = capsys.readouterr().err.strip()
        assert words in err and "\n" not in err, err
