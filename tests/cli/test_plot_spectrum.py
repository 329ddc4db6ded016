"""``attnlab plot spectrum --model RUN [--layer L,L]``: the QK spectra of a model's heads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.cli import build_parser, main
from attnlab.cli.plot import _spectrum
from attnlab.data.tokenizers import BOS, EOS, PAD, UNK, CharTokenizer
from attnlab.inspect import qk_spectrum
from attnlab.models.config import config_to_dict
from attnlab.training.checkpoint import save_checkpoint

TOKENIZER = CharTokenizer(list("abcdefgh "), [PAD, UNK, BOS, EOS])


@pytest.fixture
def gpt_run(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=16, n_embd=32, n_layer=3, n_head=4)
    )
    run = tmp_path / "gpt"
    save_checkpoint(run, step=1, model=model, config={"model": config_to_dict(model.config)},
                    files={"tokenizer.json": TOKENIZER.to_json()})  # fmt: skip
    return run


def test_plot_spectrum_writes_the_png(gpt_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "spectrum.png"
    assert (
        main(["plot", "spectrum", "--model", str(gpt_run), "--layer", "0,2", "-o", str(out)]) == 0
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_plot_spectrum_draws_the_chosen_layers_of_the_model(gpt_run: Path) -> None:
    args = build_parser().parse_args(
        ["plot", "spectrum", "--model", str(gpt_run), "--layer", "2,-3"]
    )
    plot = _spectrum(args)
    assert plot.data["shown"].tolist() == [2, 0]  # -3: the first of 3 layers
    from attnlab.tasks.run import load_run

    expected = qk_spectrum(load_run(gpt_run).model)
    assert torch.equal(torch.from_numpy(plot.data["singular_values"][1]), expected.qk[0].double())
    default = _spectrum(build_parser().parse_args(["plot", "spectrum", "--model", str(gpt_run)]))
    assert default.data["shown"].tolist() == [0, 1, 2]  # first, middle, last
    bars = [ax.get_ylabel() for ax in plot.figure.axes if ax.get_label() == "<colorbar>"]
    assert bars == ["effective rank exp(−Σ p log p), p = σ / Σσ"]  # the bar says what it maps


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ("3", "attnlab: error: --layer must be in [0, 3) (the model's 3 attention layers, "
              "transformer.h.0.attn … transformer.h.2.attn), got 3"),
        ("0,1,2,0,1", "attnlab: error: --layer: plot spectrum draws 1 to 4 layers, got 5"),
    ],
)  # fmt: skip
def test_plot_spectrum_bad_layer_is_one_line(
    gpt_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], layer: str, message: str
) -> None:
    out = tmp_path / "bad.png"
    code = main(["plot", "spectrum", "--model", str(gpt_run), "--layer", layer, "-o", str(out)])
    assert code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
    assert not out.exists()


def test_plot_spectrum_layer_not_ints_is_one_line(gpt_run: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["plot", "spectrum", "--model", str(gpt_run), "--layer", "0,x"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "attnlab plot: error: argument --layer: must be an int or comma-separated ints "
        "(e.g. 0,15,29), got '0,x'"
    ]


def test_plot_spectrum_needs_a_model_and_no_text(gpt_run: Path, capsys) -> None:
    assert main(["plot", "spectrum"]) == 2
    assert "plot spectrum needs --model" in capsys.readouterr().err
    assert main(["plot", "spectrum", "--model", str(gpt_run), "--text", "abc"]) == 2
    assert "from the weights alone; it takes no --text" in capsys.readouterr().err


def test_other_kinds_take_one_layer(gpt_run: Path, tmp_path: Path, capsys) -> None:
    argv = ["plot", "heatmap", "--model", str(gpt_run), "--text", "abc", "--layer", "0,1"]
    assert main([*argv, "-o", str(tmp_path / "h.png")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["attnlab: error: --layer takes one index for plot heatmap, got 2"]
