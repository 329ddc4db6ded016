"""Loading a crafted run allocates nothing the stored tensors do not bear out (hardening 7):
sizes in config.json are checked against the header of model.safetensors first; a Hugging Face
folder is read from safetensors only, never from a pickle."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.cli import main
from attnlab.tasks.run import load_run
from attnlab.training.checkpoint import CheckpointError, resolve_checkpoint
from attnlab.training.manifest import file_entry

TEXT = "to be, or not to be, that is the question:\n" * 10
LM = ["--block-size", "8", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
      "--batch-size", "2", "--eval-iters", "1", "--warmup", "1", "--lr-decay-steps", "4"]  # fmt: skip
SEQ = ["--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff", "32", "--warmup", "2",
       "--max-len", "4", "--num-heldout", "5", "--batch-size", "4"]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    (root / "text.txt").write_text(TEXT)
    lm = ["train", "lm", "--data", str(root / "text.txt"), "--out", str(root / "lm")]
    assert main([*lm, "--steps", "1", *LM]) == 0
    assert main(["train", "reverse", "--out", str(root / "reverse"), "--steps", "1", *SEQ]) == 0
    return {"lm": root / "lm", "reverse": root / "reverse"}


def _crafted(runs: dict[str, Path], which: str, tmp_path: Path, **model: Any) -> Path:
    """A copy of a run whose config.json's model has ``model`` changed (and re-signed)."""
    run = tmp_path / which
    shutil.copytree(runs[which], run)
    ckpt = resolve_checkpoint(run)
    config = json.loads((ckpt / "config.json").read_text())
    config["model"].update(model)
    (ckpt / "config.json").write_text(json.dumps(config))
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["config.json"] = file_entry(ckpt / "config.json")
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    return run


@pytest.mark.parametrize(
    ("kind", "change", "message"),
    [
        # 64 TB: the allocator refuses (a RuntimeError deep in torch) — or worse, it succeeds
        ("lm", {"vocab_size": 10**12}, r"gives \S+ the shape \(1000000000000, 16\) but model"),
        # 640 MB that would really be allocated, then found not to fit
        ("lm", {"vocab_size": 10**7}, r"gives \S+ the shape \(10000000, 16\) but model"),
        ("lm", {"n_layer": 3000}, "gives n_layer = 3000 but model.safetensors stores 1"),
        ("lm", {"n_positions": 10**9}, r"gives transformer.wpe.weight the shape"),
        ("reverse", {"num_decoder_layers": 10**6}, "gives num_decoder_layers = 1000000"),
        # a sinusoidal table that no stored tensor bounds: 10^9 positions x 16 x 4 bytes
        ("reverse", {"max_len": 10**9}, "MiB of computed position tables"),
        ("reverse", {"kind": ["GPTConfig"]}, "model kind must be GPTConfig or TransformerConfig"),
        ("reverse", {"d_model": "wide"}, "config.json's model is invalid"),
    ],
)
def test_sizes_the_weights_do_not_bear_out_are_refused_before_allocating(
    runs: dict[str, Path], tmp_path: Path, kind: str, change: dict[str, Any], message: str
) -> None:
    run = _crafted(runs, kind, tmp_path, **change)
    with pytest.raises(CheckpointError, match=message) as info:
        load_run(run)
    assert "\n" not in str(info.value)


def test_a_positions_table_within_bounds_still_loads(runs: dict[str, Path], tmp_path: Path) -> None:
    run = _crafted(runs, "reverse", tmp_path, max_len=1000)  # not stored: any sane length loads
    assert load_run(run).config.max_len == 1000  # type: ignore[union-attr]


def test_task_files_are_read_from_the_manifest_only(runs: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "lm"
    shutil.copytree(runs["lm"], run)
    (resolve_checkpoint(run) / "unlisted.json").write_text("{}")  # never read: not verified
    assert load_run(run).io is not None


def _hf_dir(tmp_path: Path, **config: Any) -> Path:
    transformers = pytest.importorskip("transformers")
    hf = tmp_path / "hf"
    cfg = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(hf)
    if config:
        data = json.loads((hf / "config.json").read_text())
        data.update(config)
        (hf / "config.json").write_text(json.dumps(data))
    return hf


def test_a_pickle_only_hugging_face_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    hf = _hf_dir(tmp_path)
    torch.save(load_file(hf / "model.safetensors"), hf / "pytorch_model.bin")
    (hf / "model.safetensors").unlink()

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a pickle must never be loaded")

    monkeypatch.setattr(torch, "load", forbidden)
    assert main(["generate", str(hf), "--prompt", "1 2"]) == 2
    err = capsys.readouterr().err  # (transformers may log its own warnings about the config)
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("attnlab: error: ")
    assert "holds no safetensors weights (it holds pytorch_model.bin, a pickle" in last


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vocab_size": 10**6}, r"gives wte.weight the shape \(1000000, 16\)"),
        ({"vocab_size": 10**12}, "vocab_size must be at most 16777216"),
        ({"n_layer": 5000}, "gives n_layer = 5000 but the weights store 1 layers"),
    ],
)
def test_a_crafted_hugging_face_config_is_refused_before_allocating(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        load_run(_hf_dir(tmp_path, **change))
