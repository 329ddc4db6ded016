"""``attnlab train lm --family {gpt2,llama,neox}``: the family's parts from the one preset
(:func:`attnlab.models.families.preset`), with attention kinds, resumed, counted by ``attnlab
flops --run``; a run saved before the option resumes unchanged (``tests/tasks/test_old_runs.py``)."""

from __future__ import annotations

import json

import pytest

from attnlab.cli import main
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.families import llama_ff_width, preset
from attnlab.nn.kinds import SlidingSpec
from attnlab.tasks.lm import lm_config
from attnlab.tasks.run import load_run
from attnlab.tasks.train_options import LMOptions, run_args

TEXT = (
    "to be, or not to be, that is the question:\nwhether 'tis nobler in the mind to suffer\n" * 20
)
TINY = ["--block-size", "16", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
        "--batch-size", "4", "--eval-iters", "1", "--warmup", "1", "--lr-decay-steps", "10"]  # fmt: skip


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return str(path)


def _options(**kw) -> LMOptions:
    return LMOptions(data="x.txt", out="run", steps=1, **kw)


def test_each_family_preset_gives_its_parts() -> None:
    llama = lm_config(_options(family="llama", n_embd=48, n_head=6), 50, SlidingSpec(4))
    assert (llama.norm, llama.mlp, llama.activation, llama.positions) == (
        "rmsnorm", "gated", "silu", "rope")  # fmt: skip
    assert llama.rope_pairing == "halves" and not llama.tie_embeddings
    assert not any(llama.bias_of(p) for p in ("qkv", "proj", "mlp", "norm"))
    assert llama.d_ff == 128 == llama_ff_width(48)  # 8/3 · 48, a multiple of 8
    assert llama.family == "mistral"  # a Llama with a sliding window exports as Mistral
    neox = lm_config(_options(family="neox", n_embd=64, n_head=2), 50, SlidingSpec(4))
    assert neox.parallel_residual and neox.activation == "gelu" and neox.norm == "layernorm"
    assert neox.rotary_dim == 8 and neox.rope_pairing == "halves" and not neox.tie_embeddings
    assert all(neox.bias_of(p) for p in ("qkv", "proj", "mlp", "norm")) and neox.family == "neox"
    assert preset("neox", n_embd=8, n_head=4)["rotary_dim"] == 2  # d_head 2: at least 2
    assert preset("gpt2", n_embd=8, n_head=4) == {}
    gpt2 = lm_config(_options(), 50, SlidingSpec(4))
    assert (gpt2.family, gpt2.positions, gpt2.bias) == ("gpt2", "learned", True)
    with pytest.raises(ArgumentError, match="family"):
        preset("mistral", n_embd=8, n_head=4)


def test_family_option_is_checked_and_sets_the_bias_default() -> None:
    assert _options().bias is True and _options(family="neox").bias is True
    assert _options(family="llama").bias is False
    assert _options(family="llama", bias=True).bias is True
    with pytest.raises(ArgumentError, match="family must be one of gpt2, llama, neox"):
        _options(family="qwen2")
    with pytest.raises(ArgumentTypeError, match="bias"):
        _options(bias="yes")
    # a run saved before --family existed (GPT-2) saves the same args
    assert "family" not in run_args(_options()) and run_args(_options(family="neox"))["family"]
    with pytest.raises(ArgumentError, match="--family llama: attention='performer'"):
        lm_config(_options(family="llama"), 50, _options(attention="performer").attention)


@pytest.mark.parametrize("family", ["llama", "neox"])
def test_train_lm_family_resumes_and_is_counted(family, text_file, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    args = ["train", "lm", "--data", text_file, "--out", str(run), *TINY, "--family", family,
            "--attention", "sliding", "--window", "4"]  # fmt: skip
    assert main([*args, "--steps", "2"]) == 0
    model = load_run(run).config
    assert model.family == ("mistral" if family == "llama" else "neox")
    saved = json.loads((run / "checkpoints" / "step-00000002" / "config.json").read_text())
    assert saved["args"]["family"] == family
    assert main([*args, "--steps", "3", "--resume"]) == 0
    capsys.readouterr()
    other = [a if a != family else "gpt2" for a in args]
    assert main([*other, "--steps", "4", "--resume"]) == 2  # another family: refused
    assert "family" in capsys.readouterr().err
    assert main(["flops", str(run), "--seq-len", "16"]) == 0
    out = capsys.readouterr().out
    assert "gate" in out if family == "llama" else "params: total" in out
