"""``attnlab patch MODEL --clean ... --corrupted ... --answer ... --wrong ...`` on a saved run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.cli import main
from attnlab.data.tokenizers import BOS, EOS, PAD, UNK, CharTokenizer
from attnlab.models.config import config_to_dict
from attnlab.training.checkpoint import save_checkpoint

TOKENIZER = CharTokenizer(list("abcdefgh "), [PAD, UNK, BOS, EOS])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(10.0)
    path = tmp_path_factory.mktemp("patch") / "gpt"
    save_checkpoint(
        path, step=1, model=model, config={"model": config_to_dict(cfg)},
        files={"tokenizer.json": TOKENIZER.to_json()},
    )  # fmt: skip
    return path


ARGS = ["--clean", "abcd", "--corrupted", "abed", "--answer", "a", "--wrong", "b"]


def test_json_heads_and_positions(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fig, dla = tmp_path / "heads.png", tmp_path / "dla.svg"
    assert main(["patch", str(run), *ARGS, "--json", "-o", str(fig), "--dla-figure", str(dla)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["clean_tokens"] == list("abcd") and out["answer"]["text"] == "a"
    p = out["patching"]
    assert p["kind"] == "heads" and len(p["normalized"]) == 2 and len(p["normalized"][0]) == 4
    a = out["attribution"]
    assert a["total"] == pytest.approx(a["logit"], rel=1e-4, abs=1e-4)
    assert a["logit"] == pytest.approx(p["clean"], rel=1e-5, abs=1e-5)
    assert fig.stat().st_size > 0 and dla.stat().st_size > 0
    assert main(["patch", str(run), *ARGS, "--json", "--by", "positions"]) == 0
    pos = json.loads(capsys.readouterr().out)["patching"]
    assert pos["kind"] == "positions" and len(pos["normalized"][0]) == 4
    # the tokens before the changed one ('c' at position 2) never matter
    assert all(abs(row[0]) < 1e-6 and abs(row[1]) < 1e-6 for row in pos["normalized"])
    assert main(["patch", str(run), *ARGS]) == 0
    assert "direct logit attribution" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--corrupted", "abcde"], "same length: 4 tokens ('a' | 'b' | 'c' | 'd') and 5 tokens"),
        (["--answer", "ab"], "--answer 'ab' must be one token, but it is 2: 'a' | 'b'"),
        (["--wrong", "a"], "--answer and --wrong are the same token"),
        (["--by", "positions", "--position", "1"], "--position is for --by heads"),
        (["--position", "9"], "--position 9 is outside the 4 tokens"),
        (["-o", "x.pdf"], "-o/--output must end in .png or .svg"),
    ],
)
def test_errors_are_one_line(
    run: Path, change: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = dict(zip(ARGS[::2], ARGS[1::2]))
    extra = []
    for flag, value in zip(change[::2], change[1::2]):
        if flag in args:
            args[flag] = value
        else:
            extra += [flag, value]
    argv = ["patch", str(run), *[x for kv in args.items() for x in kv], *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_attribution_and_path_methods(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["patch", str(run), *ARGS, "--json", "--method", "attribution"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "attribution" and out["patching"]["kind"] == "heads"
    est = out["attribution_patching"]
    assert len(est["q"]) == 2 and len(est["resid"]) == 3
    # the estimate of head (l, h) is the sum over positions of its z attribution
    total = sum(est["z"][1][2])
    assert out["patching"]["patched"][1][2] == pytest.approx(est["corrupted"] + total, abs=1e-9)
    fig = tmp_path / "senders.png"
    argv = ["patch", str(run), *ARGS, "--method", "path", "--receivers", "1.0,1.3"]
    assert main([*argv, "--via", "k", "--json", "-o", str(fig)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["path"] == {"receivers": [[1, 0], [1, 3]], "via": "k"}
    assert len(out["patching"]["patched"]) == 1 and fig.stat().st_size > 0
    assert main([*argv, "--sender", "0.2"]) == 0
    assert "path 0.2 → 1.0,1.3 via v" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--method", "path"], "--method path needs --receivers"),
        (["--receivers", "1.0"], "--receivers is for --method path"),
        (["--method", "path", "--receivers", "1"], "'1' is not a head: LAYER.HEAD"),
        (["--method", "path", "--receivers", "1.9"], "head 9 is not one of layer 1's 4 heads"),
        (["--method", "path", "--receivers", "1.0", "--by", "positions"], "no --by positions"),
        (["--method", "path", "--receivers", "0.1"], "receivers are all in layer 0"),
        (["--method", "attribution", "--position", "7"], "--position 7 is outside the 4 tokens"),
    ],
)
def test_method_errors_are_one_line(
    run: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["patch", str(run), *ARGS, *extra])
    except SystemExit as e:  # argparse's own (one line too)
        code = e.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
