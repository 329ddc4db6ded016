"""Attention recorded while training (``--probe``), and the figures of trained runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.cli import main
from attnlab.inspect.capture import capture
from attnlab.tasks import load_run
from attnlab.tasks.probe import PROBE_DIR, load_probe_history

TINY = ["--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff", "32", "--warmup", "5"]
TINY_TASK = [*TINY, "--max-len", "6", "--num-heldout", "20", "--batch-size", "8"]


def _train(run: Path, steps: int, *extra: str) -> None:
    argv = ["train", "reverse", "--out", str(run), "--steps", str(steps), *TINY_TASK, *extra]
    assert main(argv) == 0


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # trained once for the module: the tests only read the run (their own runs and figures go
    # to their own tmp_path), and training is seeded, so each test sees the same folder
    run = tmp_path_factory.mktemp("probed") / "rev"
    _train(run, 6, "--probe", "abcd", "--probe-every", "2")
    return run


def test_probe_records_steps_and_the_last_one_equals_the_final_model(probed: Path) -> None:
    history = load_probe_history(probed)
    assert history.steps == [0, 2, 4, 6]
    assert history.sequences == {"source": [*"abcd", "<eos>"],
                                 "target": [*"dcba", "<eos>"]}  # fmt: skip
    assert history.kinds["decoder.layers.0.cross_attn"] == "cross"
    assert history.layer_sequences["decoder.layers.0.cross_attn"] == ("target", "source")
    # the record of the last step is the trained model's attention on the probe, exactly
    run = load_run(probed)
    probe = run.io.probe_inputs("abcd")
    with torch.no_grad(), capture(run.model) as cache:
        probe.forward(run.model)
    for name, w in cache.attentions.items():
        assert history.attentions[name].shape == (4, *w.shape[1:])
        assert torch.equal(history.attentions[name][-1], w[0])
    # training moved the weights: step 0 differs from the end
    name = "decoder.layers.0.cross_attn"
    assert not torch.equal(history.attentions[name][0], history.attentions[name][-1])


def test_probe_does_not_change_training_and_resume_drops_later_records(
    probed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "plain"
    _train(plain, 6)
    a = load_file(str(probed / "checkpoints" / "step-00000006" / "model.safetensors"))
    b = load_file(str(plain / "checkpoints" / "step-00000006" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # resume a run stopped at step 3 whose folder still holds a record of a later step
    again = tmp_path / "again"
    _train(again, 3, "--probe", "abcd", "--probe-every", "2")
    stale = again / PROBE_DIR / "step-00000004.safetensors"
    stale.write_bytes((again / PROBE_DIR / "step-00000002.safetensors").read_bytes())
    _train(again, 6, "--probe", "abcd", "--probe-every", "2", "--resume")
    capsys.readouterr()
    steps = load_probe_history(again).steps
    assert steps == [0, 2, 3, 4, 6]
    ref = load_probe_history(probed)
    for name in ref.attentions:
        assert torch.equal(load_probe_history(again).attentions[name][-1], ref.attentions[name][-1])


def test_plot_training_and_the_training_viewer(
    probed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "training.png"
    assert main(["plot", "training", str(probed), "-o", str(out)]) == 0
    assert out.stat().st_size > 5000 and (tmp_path / "training_entropy.png").stat().st_size > 5000
    html = tmp_path / "t.html"
    assert main(["view", str(probed), "--training", "-o", str(html)]) == 0
    assert '"steps":[0,2,4,6]' in html.read_text(encoding="utf-8")
    capsys.readouterr()
    plain = tmp_path / "plain"
    _train(plain, 1)
    capsys.readouterr()
    assert main(["plot", "training", str(plain), "-o", str(out)]) == 2
    assert "recorded no attention probe" in capsys.readouterr().err


def test_bad_probe_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "bad"
    assert main(["train", "reverse", "--out", str(run), "--steps", "2", *TINY_TASK,
                 "--probe", "xyz"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "outside the task's alphabet" in err
    assert not (run / "checkpoints").exists()


def test_model_figures_cover_self_and_cross_attention(
    probed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for kind in ("heatmap", "heads", "layers"):
        for attention in ("self", "cross", "all"):
            out = tmp_path / f"{kind}-{attention}.png"
            argv = ["plot", kind, "--model", str(probed), "--text", "abcd", "--kind", attention]
            assert main([*argv, "-o", str(out)]) == 0, (kind, attention)
            assert out.stat().st_size > 3000
    out = tmp_path / "steps.png"
    assert main(["plot", "steps", "--model", str(probed), "--text", "abc", "-o", str(out)]) == 0
    assert out.stat().st_size > 5000
    assert main(["plot", "heatmap", "--model", str(probed), "--text", "abcd", "--head", "9"]) == 2
    assert "--head must be in [0, 2)" in capsys.readouterr().err


def test_inspect_ablate(probed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fig = tmp_path / "pruning.png"
    assert main(["inspect", str(probed), "--ablate", "--figure", str(fig), "--json",
                 "--examples", "20"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["metric"] == "exact-match accuracy"
    layers = out["importance"]["layers"]
    assert len(layers) == 3 and len(out["pruning"]["loss"]) == 3 * 2 + 1
    assert fig.stat().st_size > 5000
    assert main(["inspect", str(probed), "--ablate", "--figure", str(fig)]) == 0
    text = capsys.readouterr().out
    assert "head importance" in text and "6 removed" in text
