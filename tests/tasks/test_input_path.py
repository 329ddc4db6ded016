"""One path from a run and a text to the model's inputs, for every task.

For each task (copy, reverse, sort, lm with characters and BPE, translate): the inputs built for a
text equal those the trainer's evaluation builds, and the output that ``view`` and ``inspect`` show
equals what ``translate`` / ``generate`` print for the same run and text.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.data.batching import make_seq2seq_batch
from attnlab.data.parallel import read_parallel
from attnlab.tasks import load_run
from attnlab.tasks.algorithmic import evaluate_task
from attnlab.tasks.lm import load_corpus
from attnlab.tasks.registry import get_task

TINY = ["--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff", "32", "--warmup", "5"]
TINY_TASK = [*TINY, "--max-len", "6", "--num-heldout", "20", "--batch-size", "8"]
TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def _train(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *argv]) == 0
    capsys.readouterr()


def _stdout(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 0) -> str:
    assert main(argv) in ((0, 1) if code is None else (code,))
    return capsys.readouterr().out


def _view_sequences(path: Path) -> dict:
    html = path.read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', html, re.S)
    assert m
    return json.loads(m.group(1).replace("<\\/", "</"))["sequences"]


def _inspect(run: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    assert main(["inspect", str(run), *extra, "--json"]) in (0, 1)
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", ["copy", "reverse", "sort"])
def test_algorithmic_tasks(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / name
    _train([name, "--out", str(run_dir), "--steps", "3", *TINY_TASK], capsys)
    run = load_run(run_dir)
    task_obj = get_task(name)
    task = task_obj.make_task(argparse.Namespace(**run.args))  # type: ignore[attr-defined]
    tok = task.tokenizer
    # the encoder reads the string then <eos>, as the training batches and the evaluation do
    heldout = task.heldout()[:8]
    for src in heldout:
        assert run.io.encode_source(tok.decode(src)) == task.model_input(src)
        batch = task.make_batch([src])
        assert batch.src[0].tolist() == task.model_input(src)
    # the evaluation's decoded outputs are the ones the one path gives for the text
    report = evaluate_task(run.model, task)
    for src, pred in list(zip(report.sources, report.predictions))[:8]:
        inputs = run.inputs(tok.decode(src))
        assert inputs.output == tok.decode(pred)
        assert list(inputs.source_ids) == task.model_input(src)
        assert inputs.source_tokens[-1] == "<eos>" and inputs.target_ids[0] == tok.bos_id
    # the commands agree with each other for the same text
    text = "abcdef"
    printed = _stdout(["translate", str(run_dir), text], capsys).strip()
    assert (
        _stdout(
            ["generate", str(run_dir), "--prompt", text, "--strategy", "greedy"], capsys
        ).strip()
        == printed
    )
    report_json = _inspect(run_dir, capsys, "--text", text)
    assert report_json["output"] == printed
    assert report_json["source_tokens"] == [*text, "<eos>"]
    assert "".join(t for t in report_json["target_tokens"] if t != "<eos>") == printed
    view = tmp_path / "view.html"
    assert main(["view", str(run_dir), "--text", text, "-o", str(view)]) == 0
    seqs = _view_sequences(view)
    assert seqs["source"] == report_json["source_tokens"]
    assert seqs["target"] == report_json["target_tokens"]


@pytest.mark.parametrize("bpe", [False, True], ids=["char", "bpe"])
def test_lm_task(bpe: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data.txt"
    data.write_text(TEXT, encoding="utf-8")
    run_dir = tmp_path / "lm"
    argv = ["lm", "--data", str(data), "--out", str(run_dir), "--steps", "2",
            "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "32",
            "--warmup", "1", "--lr-decay-steps", "10", "--eval-iters", "1"]  # fmt: skip
    if bpe:
        argv += ["--bpe", "--bpe-vocab", "300"]
    _train(argv, capsys)
    run = load_run(run_dir)
    corpus = load_corpus(data, bpe=bpe, bpe_vocab=300)
    # the text path encodes as the training corpus was encoded
    n = int(0.9 * len(TEXT))
    head = TEXT[:n] if bpe else TEXT[:200]
    expected = corpus.train.tolist() if bpe else corpus.train[:200].tolist()
    assert run.io.encode(head) == expected
    prompt = "the lazy "
    printed = _stdout(
        [
            "generate",
            str(run_dir),
            "--prompt",
            prompt,
            "--strategy",
            "greedy",
            "--max-new-tokens",
            "6",
        ],
        capsys,
    ).rstrip("\n")
    report_json = _inspect(run_dir, capsys, "--text", prompt, "--max-new-tokens", "6")
    assert report_json["output"] == printed
    assert len(report_json["target_tokens"]) == 6
    view = tmp_path / "view.html"
    assert (
        main(["view", str(run_dir), "--text", prompt, "--max-new-tokens", "6", "-o", str(view)])
        == 0
    )
    assert (
        _view_sequences(view)["tokens"]
        == report_json["source_tokens"] + report_json["target_tokens"]
    )


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return str(path)


def test_translate_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    en = ["the cat sat .", "a dog ran .", "the dog sat .", "a cat ran ."] * 6
    fr = ["le chat assis .", "un chien courut .", "le chien assis .", "un chat courut ."] * 6
    src, tgt = _write(tmp_path / "train.en", en), _write(tmp_path / "train.fr", fr)
    dev_src, dev_tgt = _write(tmp_path / "dev.en", en[:4]), _write(tmp_path / "dev.fr", fr[:4])
    run_dir = tmp_path / "tr"
    _train(["translate", "--out", str(run_dir), "--steps", "2", *TINY, "--src", src, "--tgt", tgt,
            "--dev-src", dev_src, "--dev-tgt", dev_tgt, "--tokenizer", "word",
            "--src-vocab", "60", "--tgt-vocab", "60", "--max-tokens", "64", "--beams", "2"],
           capsys)  # fmt: skip
    run = load_run(run_dir)
    assert run.io.beams == 2  # type: ignore[attr-defined]  # the run's own final decoding
    dev = read_parallel(dev_src, dev_tgt)
    io = run.io
    batch = make_seq2seq_batch(
        [io.src_tok.encode(s) for s in dev.src], [io.tgt_tok.encode(t) for t in dev.tgt],  # type: ignore[attr-defined]
        pad_id=0, bos_id=io.bos_id, eos_id=io.eos_id,  # type: ignore[attr-defined]
    )  # fmt: skip
    for i, sentence in enumerate(dev.src):
        ids = io.encode_source(sentence)  # type: ignore[attr-defined]
        assert batch.src[i, : len(ids)].tolist() == ids
    sentence = "the cat ran ."
    printed = _stdout(["translate", str(run_dir), sentence], capsys).strip()
    report_json = _inspect(run_dir, capsys, "--text", sentence)
    assert report_json["output"] == printed
    assert (
        _inspect(run_dir, capsys, "--text", sentence, "--beams", "1")["output"]
        == _stdout(["translate", str(run_dir), sentence, "--beams", "1"], capsys).strip()
    )


def test_text_outside_the_alphabet_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "rev"
    _train(["reverse", "--out", str(run_dir), "--steps", "1", *TINY_TASK], capsys)
    for argv in (["translate", str(run_dir), "abz"], ["view", str(run_dir), "--text", "abz"],
                 ["inspect", str(run_dir), "--text", "abz"]):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "outside the task's alphabet: 'z'" in err
    assert main(["translate", str(run_dir), "a" * 80]) == 2
    assert "more than the model's limit of 64" in capsys.readouterr().err


def test_probe_inputs_teacher_force_the_correct_answer(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "rev"
    _train(["reverse", "--out", str(run_dir), "--steps", "1", *TINY_TASK], capsys)
    probe = load_run(run_dir).io.probe_inputs("abcd")
    assert probe.source_tokens == ("a", "b", "c", "d", "<eos>")
    assert probe.target_tokens == ("d", "c", "b", "a", "<eos>")
    assert torch.equal(probe.tensors()[1], torch.tensor([[2, *probe.target_ids[1:-1]]]))
