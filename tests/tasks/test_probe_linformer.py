"""``attnlab train reverse --attention linformer`` (issue 12): the copy/reverse/sort tasks take the
attention options of ``train translate``, and the attention recorded while a Linformer encoder
trains (``--probe``) keeps its ``T × k`` weights over the projected ``E·K`` rows and its effective
weights ``A · F``, for ``attnlab view --training``, ``attnlab plot training`` and the training
figures."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from attnlab.cli import main
from attnlab.inspect.capture import capture
from attnlab.nn.linformer import LinformerAttention
from attnlab.tasks import load_run
from attnlab.tasks.probe import PROBE_DIR, load_probe_history, write_training_figures
from attnlab.training.checkpoint import resolve_checkpoint

TINY = ["--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff", "32", "--warmup", "5"]
TINY_TASK = [*TINY, "--max-len", "6", "--num-heldout", "20", "--batch-size", "8"]
LINFORMER = ["--attention", "linformer", "--linformer-k", "8"]
ENCODER = "encoder.layers.0.self_attn"
ROWS = "E·K rows (k = 8)"


def _train(run: Path, steps: int, *extra: str) -> int:
    argv = ["train", "reverse", "--out", str(run), "--steps", str(steps), *TINY_TASK, *extra]
    return main(argv)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("linformer") / "rev"
    assert _train(run, 6, *LINFORMER, "--probe", "abcd", "--probe-every", "2") == 0
    return run


def test_reverse_trains_a_linformer_encoder_and_saves_the_options(probed: Path) -> None:
    saved = json.loads((resolve_checkpoint(probed) / "config.json").read_text())
    assert (saved["args"]["attention"], saved["args"]["linformer_k"]) == ("linformer", 8)
    assert saved["model"]["attention"] == {"kind": "linformer", "k": 8}
    model = load_run(probed).model
    assert isinstance(model.encoder.layers[0].self_attn, LinformerAttention)
    assert model.encoder.layers[0].self_attn.k == 8
    assert not isinstance(model.decoder.layers[0].self_attn, LinformerAttention)


def test_resume_with_other_attention_is_refused(
    probed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "copy"
    assert _train(run, 1, *LINFORMER) == 0
    capsys.readouterr()
    other = ["--attention", "linformer", "--linformer-k", "4"]
    assert _train(run, 2, *other, "--resume") == 2
    assert "linformer_k" in _one_line(capsys)
    assert _train(run, 2, *LINFORMER, "--resume") == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--linformer-k", "8"],
         "--linformer-k applies to --attention linformer, got --attention full"),
        (["--attention", "linformer"], "--attention linformer needs --linformer-k"),
        (["--attention", "sliding"], "--attention sliding needs --window"),
        (["--attention", "performer", "--window", "2"], "--window applies to --attention sliding"),
    ],
)  # fmt: skip
def test_bad_attention_options_are_one_line_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    run = tmp_path / "bad"
    assert _train(run, 1, *options) == 2
    assert message in _one_line(capsys)
    assert not (run / "checkpoints").exists()


def test_the_probe_records_the_rows_of_e_k_and_the_effective_weights(probed: Path) -> None:
    meta = json.loads((probed / PROBE_DIR / "probe.json").read_text(encoding="utf-8"))
    assert meta["layer_sequences"][ENCODER] == ["source", ROWS]
    assert meta["projected"] == {ENCODER: ["linformer", "source"]}
    assert meta["sequences"][ROWS] == [f"E·K row {j}" for j in range(8)]
    step = load_file(str(probed / PROBE_DIR / "step-00000006.safetensors"))
    assert step[ENCODER].shape == (2, 5, 8) and step[f"effective:{ENCODER}"].shape == (2, 5, 5)
    history = load_probe_history(probed)
    assert history.steps == [0, 2, 4, 6]
    assert history.projected == {ENCODER: ("linformer", "source")}
    assert history.tokens(ENCODER) == ([*"abcd", "<eos>"], [f"E·K row {j}" for j in range(8)])
    assert history.attentions[ENCODER].shape == (4, 2, 5, 8)
    assert history.effective[ENCODER].shape == (4, 2, 5, 5)
    # the last record is the trained model's attention on the probe, exactly
    run = load_run(probed)
    probe = run.io.probe_inputs("abcd")
    with torch.no_grad(), capture(run.model) as cache:
        probe.forward(run.model)
    for name, w in cache.attentions.items():
        assert torch.equal(history.attentions[name][-1], w[0])
    assert torch.equal(history.effective[ENCODER][-1], cache.effective_weights(ENCODER)[0])
    assert not torch.equal(history.effective[ENCODER][0], history.effective[ENCODER][-1])
    # a step file that lost the effective weights of the layer is refused, naming it
    broken = probed.parent / "broken"
    broken.mkdir()
    (broken / PROBE_DIR).mkdir()
    for f in (probed / PROBE_DIR).iterdir():
        (broken / PROBE_DIR / f.name).write_bytes(f.read_bytes())
    kept = {k: v for k, v in step.items() if not k.startswith("effective:")}
    save_file(kept, str(broken / PROBE_DIR / "step-00000006.safetensors"))
    with pytest.raises(ValueError, match=re.escape(f"lacks the effective weights of '{ENCODER}'")):
        load_probe_history(broken)


def _embedded(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', html, re.S)
    assert m
    return json.loads(m.group(1).replace("<\\/", "</"))


def test_view_training_plot_training_and_the_training_figures(
    probed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    html = tmp_path / "t.html"
    assert main(["view", str(probed), "--training", "-o", str(html)]) == 0
    data = _embedded(html.read_text(encoding="utf-8"))
    assert data["steps"] == [0, 2, 4, 6]
    lin = data["groups"][0]
    assert lin["name"] == "encoder self-attention (Linformer, k = 8)"
    assert (lin["query"], lin["key"], lin["projected_from"]) == ("source", ROWS, "source")
    assert "not a token" in lin["note"]
    assert lin["layers"][0]["effective"] is not None
    assert [g["name"] for g in data["groups"][1:]] == [
        "decoder self-attention",
        "decoder cross-attention",
    ]
    out = tmp_path / "training.png"
    assert main(["plot", "training", str(probed), "-o", str(out)]) == 0
    assert out.stat().st_size > 5000 and (tmp_path / "training_entropy.png").stat().st_size > 5000
    capsys.readouterr()
    paths = write_training_figures(probed)
    assert [p.name for p in paths] == ["training.png", "training_entropy.png", "training.html"]
    assert all(p.stat().st_size > 5000 for p in paths)
    assert _embedded(paths[2].read_text(encoding="utf-8"))["groups"][0]["key"] == ROWS


def test_view_and_plot_a_trained_linformer_run(
    probed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    html = tmp_path / "v.html"
    assert main(["view", str(probed), "--text", "abcd", "-o", str(html)]) == 0
    data = _embedded(html.read_text(encoding="utf-8"))
    assert data["groups"][0]["name"] == "encoder self-attention (Linformer, k = 8)"
    weights = np.frombuffer(
        base64.b64decode(data["groups"][0]["layers"][0]["weights"]), dtype="<f4"
    )
    assert weights.size == 2 * 5 * 8  # (H, T, k)
    for kind in ("heatmap", "heads", "layers"):
        out = tmp_path / f"{kind}.svg"
        argv = ["plot", kind, "--model", str(probed), "--text", "abcd", "--kind", "self"]
        assert main([*argv, "--layer", "0", "-o", str(out)]) == 0, kind
        assert "E·K row 7" in out.read_text(encoding="utf-8")  # the columns: the projected rows
    out = tmp_path / "effective.svg"
    argv = ["plot", "heads", "--model", str(probed), "--text", "abcd", "--kind", "self"]
    assert main([*argv, "--layer", "0", "--effective", "-o", str(out)]) == 0
    svg = out.read_text(encoding="utf-8")
    assert "effective weight (A·F)" in svg and "E·K row" not in svg
    capsys.readouterr()
