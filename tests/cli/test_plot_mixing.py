"""``attnlab plot mixing --model RUN --text … --method M``: the figure of inspect.mixing."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab import GPT, GPTConfig
from attnlab.cli import main
from tests.cli.test_inspect import TOKENIZER, _save, _sharp


def test_plot_mixing_writes_the_methods_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    _save(tmp_path / "gpt", _sharp(GPT(cfg)))
    out = tmp_path / "mix.png"
    args = ["plot", "mixing", "--model", str(tmp_path / "gpt"), "--text", "abc dea", "-o", str(out)]
    assert main([*args, "--method", "norm"]) == 0
    assert out.stat().st_size > 10_000 and "wrote" in capsys.readouterr().err
    assert main(["plot", "mixing", "--model", str(tmp_path / "gpt"), "-o", str(out)]) == 2
    assert "plot mixing needs --model MODEL and --text" in capsys.readouterr().err
