"""``attnlab inspect RUN --lens logit|tuned:PATH``, ``--train-tuned-lens`` and ``attnlab plot
lens`` on a tiny saved GPT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.cli import main
from tests.cli.test_inspect import TOKENIZER, _save, _sharp


@pytest.fixture(scope="module")
def run_and_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lens")
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    _save(root / "gpt", _sharp(GPT(cfg)))
    text = root / "text.txt"
    g = torch.Generator().manual_seed(0)
    text.write_text("".join("abcdefgh "[i] for i in torch.randint(0, 9, (600,), generator=g)))
    return root / "gpt", text


def status(argv: list[str]) -> int:
    """The exit status of the command line (argparse's own errors exit through SystemExit)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def test_logit_lens_table_and_json(run_and_data, capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = run_and_data
    assert main(["inspect", str(run), "--text", "abc dea", "--lens", "logit"]) == 0
    out = capsys.readouterr().out
    assert "logit lens" in out and "embed" in out and "0 a" in out
    assert main(["inspect", str(run), "--text", "abc dea", "--lens", "logit", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["lens"] == "logit" and report["tokens"] == list("abc dea")
    assert [x["layer"] for x in report["layers"]] == ["embed", "0", "1"]
    last = report["layers"][-1]["positions"]
    assert len(last) == 7 and all(c["kl_bits"] == 0.0 for c in last)
    assert {"token", "token_id", "prob"} <= set(last[0])


def test_train_then_read_a_tuned_lens(
    run_and_data, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, text = run_and_data
    out = tmp_path / "lens"
    args = ["inspect", str(run), "--train-tuned-lens", str(out), "--data", str(text)]
    assert main([*args, "--steps", "3", "--seq-len", "8", "--eval-tokens", "32", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert [r["layer"] for r in table["layers"]] == ["embed", "0", "1"]
    assert table["layers"][-1]["kl_tuned"] == 0.0 and table["tokens"] == 32
    assert (out / "config.json").is_file() and (out / "tuned_lens.safetensors").is_file()
    spec = f"tuned:{out}"
    assert main(["inspect", str(run), "--text", "abc", "--lens", spec, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lens"] == "tuned"
    assert (
        main(["inspect", str(run), "--lens", spec, "--data", str(text), "--eval-tokens", "16"]) == 0
    )
    assert "KL tuned" in capsys.readouterr().out


def test_plot_lens_writes_the_figure(
    run_and_data, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, _ = run_and_data
    png = tmp_path / "lens.png"
    assert main(["plot", "lens", "--model", str(run), "--text", "abc dea", "-o", str(png)]) == 0
    assert png.stat().st_size > 10_000 and "wrote" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--text", "abc", "--lens", "tuned"], "must be logit or tuned:PATH"),
        (["--text", "abc", "--lens", "tuned:/nonexistent"], "is not a tuned lens"),
        (["--lens", "logit"], "--lens needs --text"),
        (["--train-tuned-lens", "x"], "needs --data"),
        (["--text", "abc", "--lens", "logit", "--roles"], "takes no --roles"),
        (["--train-tuned-lens", "x", "--data", "tinyshakespeare", "--lr", "0"], "positive"),
    ],
)
def test_bad_lens_input_is_one_line(
    run_and_data, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run, _ = run_and_data
    assert status(["inspect", str(run), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_plot_lens_needs_a_text(run_and_data, capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = run_and_data
    assert status(["plot", "lens", "--model", str(run)]) == 2
    assert "plot lens needs --model MODEL and --text" in capsys.readouterr().err
    assert status(["plot", "mixing", "--model", str(run), "--text", "ab", "--lens", "logit"]) == 2
    assert "--lens is for plot lens" in capsys.readouterr().err
