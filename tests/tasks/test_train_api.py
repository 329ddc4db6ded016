"""``attnlab.tasks.train``: typed options per task, the one Trainer wiring the CLI also runs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import pytest

from attnlab import tasks
from attnlab.cli import build_parser, main
from attnlab.nn.kinds import cli_dests
from attnlab.tasks.train_options import run_args, task_fields

TINY = dict(num_symbols=5, max_len=5, num_heldout=20, d_model=16, layers=1, heads=2, d_ff=32,
            batch_size=8, warmup=5)  # fmt: skip
TINY_ARGV = ["--num-symbols", "5", "--max-len", "5", "--num-heldout", "20", "--d-model", "16",
             "--layers", "1", "--heads", "2", "--d-ff", "32", "--batch-size", "8", "--warmup", "5"]  # fmt: skip


def _task_parser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["train"]
    return next(a for a in sub._actions if a.dest == "task").choices[name]


@pytest.mark.parametrize("name", ["copy", "reverse", "sort", "lm", "translate"])
def test_each_task_options_are_its_command_line_options_with_the_same_defaults(name) -> None:
    parser = _task_parser(name)
    cls = tasks.get_task(name).options
    # the attention kind's options (--attention, --window, …) are one field, its spec
    kinds = set(cli_dests()) - {"attention"}
    actions = {a.dest: a.default for a in parser._actions if a.dest not in {"help", *kinds}}
    assert set(task_fields(cls)) == set(parser.get_default("_task_dests")) - kinds
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    assert set(defaults) == set(actions) - {"_task_dests", "func"} | {"task"}
    for field, default in defaults.items():
        if field not in ("task", "out", "steps", "data"):
            assert actions[field] == default, field


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (dict(steps=-1), ValueError, "steps must be a non-negative int, got -1"),
        (dict(steps=2.0), TypeError, "steps must be a non-negative int, got float"),
        (dict(d_model=0), ValueError, "d_model must be a positive int, got 0"),
        (dict(dropout=1.0), ValueError, r"dropout must be a float in \[0, 1\), got 1.0"),
        (dict(clip=-1.0), ValueError, "clip must be a finite positive float, got -1.0"),
        (dict(parallel="zero"), ValueError, "parallel must be one of ddp, fsdp, got 'zero'"),
        (dict(attention="dense"), ValueError, "attention must be one of 'full', 'sliding'"),
        (dict(task="lm"), ValueError, "task must be one of copy, reverse, sort"),
        (dict(bf16=True, fp16=True), ValueError, "bf16 and fp16 do not combine"),
        (dict(resume="yes"), TypeError, "resume must be a bool, got str"),
    ],
)
def test_options_are_checked_when_built(options, error, message, tmp_path) -> None:
    with pytest.raises(error, match=message):
        tasks.AlgorithmicOptions(**{"out": tmp_path, "steps": 1, **options})


def test_unknown_tasks_and_fields_are_one_line_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"unknown task 'rot13'; known tasks: copy, .*lm"):
        tasks.train("rot13", out=tmp_path, steps=1)
    with pytest.raises(
        ValueError, match="options must be fields of AlgorithmicOptions, got 'dmodel'"
    ):
        tasks.train("reverse", out=tmp_path, steps=1, dmodel=16)
    with pytest.raises(TypeError, match="task must be a task's name or a TrainOptions"):
        tasks.train(3)  # type: ignore[arg-type]


def test_train_returns_the_model_and_a_run_the_cli_resumes(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    result = tasks.train("reverse", out=run, steps=2, progress=False, **TINY)
    assert result.step == 2 and len(result.losses) == 2 and not result.interrupted
    assert result.run_dir == run and result.checkpoint is not None
    assert "exact_match" in result.eval_metrics
    assert result.setup.io.inputs(result.model, "abc").source_tokens[-1] == "<eos>"
    saved = json.loads((result.checkpoint / "config.json").read_text())
    assert saved["task"] == "reverse" and saved["args"] == run_args(result.options)
    assert capsys.readouterr().out == ""  # no report asked for: nothing printed, no figures
    assert not list(run.glob("*.png"))
    # the command line continues it: the same saved options
    argv = ["train", "reverse", "--out", str(run), "--steps", "3", "--resume", *TINY_ARGV]
    assert main(argv) == 0
    assert "step 3: loss" in capsys.readouterr().out


def test_options_objects_take_overrides_and_report_to_a_console(tmp_path, capsys) -> None:
    from rich.console import Console

    options = tasks.AlgorithmicOptions(task="copy", out=tmp_path / "a", steps=1, **TINY)
    result = tasks.train(options, steps=2, progress=False, report=Console(width=100))
    assert result.options == dataclasses.replace(options, steps=2)
    out = capsys.readouterr().out
    assert "step 2: loss" in out and "checkpoint:" in out and "exact-match accuracy:" in out


def test_a_run_saved_by_the_command_line_before_resumes_from_python(tmp_path) -> None:
    run = tmp_path / "run"
    assert main(["train", "sort", "--out", str(run), "--steps", "1", *TINY_ARGV]) == 0
    result = tasks.train("sort", out=run, steps=2, resume=True, progress=False, **TINY)
    assert result.step == 2


def test_a_task_without_an_options_class_cannot_be_trained_by_name(tmp_path) -> None:
    class Bare:
        name = "bare"

    with pytest.raises(ValueError, match="task 'bare' declares no options class"):
        tasks.train_options.options_class(Bare())


def test_a_ddp_run_does_not_import_attnlab_distributed(tmp_path, monkeypatch) -> None:
    """``strategy_of`` imported attnlab.distributed.fsdp and .mesh (and torch.distributed.checkpoint
    with them) for every run, though DDP and one process need neither (the FSDP and mesh
    strategies are run by tests/distributed)."""
    from attnlab.tasks.driver import strategy_of
    from attnlab.training.processes import DDPStrategy

    for name in ("attnlab.distributed.fsdp", "attnlab.distributed.mesh"):
        monkeypatch.setitem(sys.modules, name, None)  # an import of it raises ImportError
    options = tasks.AlgorithmicOptions(task="copy", out=tmp_path / "a", steps=1, **TINY)
    assert type(strategy_of(options)) is DDPStrategy
