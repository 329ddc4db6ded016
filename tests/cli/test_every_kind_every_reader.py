"""Every attention kind × every command that reads a run (issue 21, defect 1: a BigBird run
could be trained but read by no command). A new kind joins the grid by its name alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.nn.kinds import attention_kinds, spec_class

TEXT = (
    "to be, or not to be, that is the question:\nwhether 'tis nobler in the mind to suffer\n" * 20
)
LM = ["--block-size", "16", "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--batch-size",
      "4", "--eval-iters", "1", "--warmup", "1", "--lr-decay-steps", "4", "--eval-every", "2"]  # fmt: skip
REVERSE = ["--num-symbols", "5", "--max-len", "5", "--num-heldout", "20", "--d-model", "16",
           "--layers", "1", "--heads", "2", "--d-ff", "32", "--batch-size", "8", "--warmup", "1",
           "--eval-every", "2"]  # fmt: skip
# each kind's smallest options (its required ones)
OPTIONS = {
    "full": [],
    "sliding": ["--window", "4"],
    "linformer": ["--linformer-k", "4"],
    "performer": ["--num-features", "8"],
    "bigbird": ["--bigbird-block", "4", "--random-blocks", "1"],
}
BUILT_IN = ("full", "sliding", "linformer", "performer", "bigbird")


def test_the_grid_covers_every_built_in_kind() -> None:
    assert set(BUILT_IN) <= set(attention_kinds())
    for name in BUILT_IN:  # a required option the grid would not pass would fail the grid
        required = [o.flag for o in spec_class(name).cli_options if o.required]
        assert all(flag in OPTIONS[name] for flag in required), name


def _run(argv: list[str], capsys: pytest.CaptureFixture[str], ok: tuple[int, ...] = (0,)) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code in ok, (argv, captured.err[-2000:])
    return captured.out


def _inspect(run: str, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    # exit 1: a barely trained model may have collapsed (every head uniform), which inspect reports
    _run(["inspect", run, "--text", text, "--json"], capsys, ok=(0, 1))


@pytest.mark.parametrize("kind", [k for k in BUILT_IN if not spec_class(k).bidirectional_only])
def test_an_lm_run_of_each_kind_is_read_by_every_command(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    run = str(tmp_path / "run")
    attention = ["--attention", kind, *OPTIONS[kind]]
    _run(
        ["train", "lm", "--data", str(data), "--out", run, *LM, "--steps", "2", *attention], capsys
    )
    out = _run(["generate", run, "--prompt", "to be", "--max-new-tokens", "4"], capsys)
    assert out.startswith("to be")
    _run(["generate", run, "--prompt", "to be", "--max-new-tokens", "3", "--strategy", "beam",
          "--beams", "2"], capsys)  # fmt: skip
    _run(["view", run, "--text", "to be", "-o", str(tmp_path / "v.html")], capsys)
    assert (tmp_path / "v.html").stat().st_size > 0
    _inspect(run, "to be", capsys)
    _run(["inspect", run, "--ablate", "--figure", str(tmp_path / "p.png")], capsys)
    _run(
        ["plot", "heads", "--model", run, "--text", "to be", "-o", str(tmp_path / "h.png")], capsys
    )
    _run(["train", "lm", "--data", str(data), "--out", run, *LM, "--steps", "3", "--resume",
          *attention], capsys)  # fmt: skip


@pytest.mark.parametrize("kind", BUILT_IN)
def test_an_encoder_decoder_run_of_each_kind_is_read_by_every_command(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(tmp_path / "run")
    attention = ["--attention", kind, *OPTIONS[kind]]
    _run(["train", "reverse", "--out", run, *REVERSE, "--steps", "2", *attention], capsys)
    assert len(_run(["translate", run, "abc", "--beams", "2"], capsys).splitlines()) == 1
    _run(["view", run, "--text", "abc", "-o", str(tmp_path / "v.html")], capsys)
    _inspect(run, "abc", capsys)
    _run(["inspect", run, "--ablate", "--figure", str(tmp_path / "p.png")], capsys)
    _run(["plot", "heads", "--model", run, "--text", "abc", "--kind", "cross", "-o",
          str(tmp_path / "h.png")], capsys)  # fmt: skip
    _run(["train", "reverse", "--out", run, *REVERSE, "--steps", "3", "--resume", *attention],
         capsys)  # fmt: skip
