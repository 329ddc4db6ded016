"""``attnlab flops``: presets, size options, JSON output and errors."""

from __future__ import annotations

import json

import pytest

from attnlab import GPTConfig
from attnlab.cli import main
from attnlab.inspect import flops


def test_gpt2_preset_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["flops", "--preset", "gpt2", "--seq-len", "1024"]) == 0
    out = capsys.readouterr().out
    for text in ("Q/K/V projections", "QKᵀ", "weights · V", "output projection", "feed-forward",
                 "lm head", "training step", "KV cache MQA", "124,439,808"):  # fmt: skip
        assert text in out, text
    assert f"{flops(GPTConfig(), 1024).forward_total / 1e9:,.2f}" in out


def test_json_with_options_matches_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["flops", "--preset", "gpt2-medium", "--seq-len", "256", "--batch", "4", "--kv-heads", "4",
            "--layers", "6", "--dtype", "bf16", "--json"]  # fmt: skip
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    cfg = GPTConfig(n_embd=1024, n_layer=6, n_head=16, num_kv_heads=4)
    assert data == json.loads(
        json.dumps(flops(cfg, 256, 4, dtype=__import__("torch").bfloat16).to_dict())
    )
    assert data["kv_heads"] == {"MHA": 16, "GQA": 4, "MQA": 1}


def test_transformer_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "flops",
                "--preset",
                "transformer-base",
                "--seq-len",
                "64",
                "--src-len",
                "80",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["model"] == "transformer" and data["src_len"] == 80
    assert data["forward"]["decoder/cross_attention/scores"] == 6 * 2 * 8 * 64 * 80 * 64


def test_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["flops", "--kv-heads", "5"]) == 2
    assert main(["flops", "--seq-len", "0"]) == 2
    assert main(["flops", "--src-len", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("attnlab: error:") for line in err)
    assert "num_kv_heads = 5" in err[0] and "seq_len must be a positive int" in err[1]
    with pytest.raises(SystemExit):
        main(["flops", "--preset", "nope"])


def test_a_causal_model_is_told_its_scores_are_counted_over_the_full_matrix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["flops", "--preset", "gpt2", "--seq-len", "1024"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    r = flops(GPTConfig(), 1024)
    full = r.forward["attention/scores"] + r.forward["attention/reduce"]
    kept = full * 1025 / 2048  # T(T+1)/2 of the T² pairs
    assert "counted over the full T × T = 1024 × 1024 matrix" in out
    assert f"{full / 1e9:,.2f} GFLOPs counted, {int(kept) / 1e9:,.2f} over the kept pairs" in out
    assert main(["flops", "--attention", "sliding", "--window", "64"]) == 0
    assert "note:" not in capsys.readouterr().out  # a pattern's count is already its own
    with pytest.raises(SystemExit):
        main(["flops", "--help"])
    assert "T(T+1)/2 pairs the causal mask keeps" in " ".join(capsys.readouterr().out.split())
