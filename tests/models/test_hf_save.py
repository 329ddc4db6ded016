"""``save_hf`` replaces a Hugging Face folder as a whole (docs/design.md, "Public contract").

A save interrupted at any point (a write that fails, a process killed: simulated by a failure
whose clean-up does not run, which is all a kill leaves) leaves the folder as the old model or
the new one — never new weights under an old config — and no temporary file in it; the staging
folder a killed save leaves beside it is deleted by the next save.
"""

from __future__ import annotations

import builtins
import io
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab as al
import attnlab._files
from attnlab.errors import ArgumentError
from attnlab.models.hf import from_hf, read_directory, save_hf

TINY = {"vocab_size": 61, "n_positions": 24, "n_embd": 32, "n_layer": 2, "n_head": 4}


def _model(seed: int, **overrides: Any) -> al.GPT:
    torch.manual_seed(seed)
    return al.GPT(al.GPTConfig(**{**TINY, **overrides})).eval()


def _same(folder: Path, gpt: al.GPT) -> bool:
    """Whether the folder loads as exactly ``gpt``: its config and every weight."""
    back = from_hf(folder)
    if back.config != gpt.config:
        return False
    mine = gpt.state_dict()
    return all(torch.equal(t, mine[n]) for n, t in back.state_dict().items())


def _siblings(folder: Path) -> list[str]:
    """The staging folders beside ``folder``."""
    stage = f".{folder.name}.save-"
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(stage))


class _Killed(BaseException):
    """The process stops here: nothing after it runs."""


def _interrupt_at_config(monkeypatch: pytest.MonkeyPatch, *, cleanup: bool) -> None:
    """Fail when ``config.json`` is opened for writing (the weights are written by then);
    without ``cleanup`` nothing is deleted afterwards, as after a kill."""
    for module in (builtins, io):
        real = module.open

        def failing(file: Any, mode: str = "r", *args: Any, _real: Any = real, **kw: Any) -> Any:
            if Path(str(file)).name == "config.json" and set(mode) & set("wxa"):
                raise _Killed
            return _real(file, mode, *args, **kw)

        monkeypatch.setattr(module, "open", failing)
    if not cleanup:
        monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: None)


@pytest.mark.parametrize("cleanup", [True, False], ids=["failed", "killed"])
def test_an_interrupted_save_leaves_the_old_folder_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cleanup: bool
) -> None:
    folder = tmp_path / "model"
    old, new = _model(0), _model(1, n_layer=3)
    save_hf(old, folder)
    with monkeypatch.context() as m:
        _interrupt_at_config(m, cleanup=cleanup)
        with pytest.raises(_Killed):
            save_hf(new, folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert _same(folder, old), "the folder mixes the new weights with the old config"
    if cleanup:
        assert _siblings(folder) == [], "a failed save left its temporaries"
    else:
        assert len(_siblings(folder)) == 1  # the killed save's staging folder, beside it
    save_hf(new, folder)  # the next save deletes it
    assert _same(folder, new) and _siblings(folder) == []


def test_a_save_replaces_the_model_and_keeps_the_other_files(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model.safetensors.index.json").write_text("{}")  # an old sharded model
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"old")
    new = _model(2)
    assert save_hf(new, folder) == folder
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["config.json", "model.safetensors", "tokenizer.json"]
    assert _same(folder, new) and _siblings(folder) == []
    config, state = read_directory(folder)
    assert config["n_layer"] == 2 and state


def test_without_a_folder_swap_config_json_is_renamed_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where two folders cannot be swapped (not Linux, a mount point) the files are renamed in
    one by one, the weights first: a kill before ``config.json`` keeps the old config."""
    folder = tmp_path / "model"
    save_hf(_model(0), folder)
    monkeypatch.setattr(attnlab._files, "_exchange", lambda a, b: False)
    renamed: list[str] = []
    real = attnlab._files.os.replace

    def record(src: Any, dst: Any) -> None:
        renamed.append(Path(dst).name)
        real(src, dst)

    monkeypatch.setattr(attnlab._files.os, "replace", record)
    new = _model(3)
    save_hf(new, folder)
    assert renamed == ["model.safetensors", "config.json"]
    assert _same(folder, new) and _siblings(folder) == []


def test_save_refuses_a_file_for_a_folder(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("")
    with pytest.raises(ArgumentError, match="must be a folder"):
        save_hf(_model(0), tmp_path / "x")


def test_a_save_into_the_working_directory_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The working directory is never swapped away (the process would sit in a deleted
    folder): its files are renamed in."""
    monkeypatch.chdir(tmp_path)
    save_hf(_model(0), ".")
    new = _model(4)
    save_hf(new, ".")
    assert Path.cwd().exists() and _same(tmp_path, new) and _siblings(tmp_path) == []
