"""``attnlab inspect RUN --text ...`` on saved checkpoints of both model families."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from attnlab import GPT, GPTConfig, Transformer, TransformerConfig
from attnlab.cli import main
from attnlab.data.tokenizers import BOS, EOS, PAD, UNK, CharTokenizer
from attnlab.models.config import config_to_dict
from attnlab.training.checkpoint import save_checkpoint

TOKENIZER = CharTokenizer(list("abcdefgh "), [PAD, UNK, BOS, EOS])


def _save(run: Path, model: torch.nn.Module, step: int = 3) -> None:
    save_checkpoint(
        run, step=step, model=model, config={"model": config_to_dict(model.config)},
        files={"tokenizer.json": TOKENIZER.to_json()},
    )  # fmt: skip


def _sharp(model: torch.nn.Module) -> torch.nn.Module:
    """Scale the query/key projections up: at GPT-2's init (std 0.02) every head is uniform,
    which `inspect` rightly flags; a trained model's heads are not."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("c_attn.weight") or name.endswith("in_proj_weight"):
                p.mul_(15.0 if name.endswith("c_attn.weight") else 4.0)
    return model


@pytest.fixture
def gpt_run(tmp_path: Path) -> Path:
    cfg = GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    _save(tmp_path / "gpt", _sharp(GPT(cfg)))
    return tmp_path / "gpt"


def test_gpt_run_prints_a_health_table(gpt_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(gpt_run), "--text", "abc dea"]) == 0
    out = capsys.readouterr().out
    assert "transformer.h.0.attn" in out and "transformer.h.1.attn" in out
    assert "all 8 heads healthy" in out and "sum err" in out


def test_json_report_and_checkpoint_folder(
    gpt_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = next((gpt_run / "checkpoints").glob("step-*"))
    assert main(["inspect", str(ckpt), "--ids", "4 5 6 7", "--json", "--layer", "h.1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and {h["layer"] for h in report["heads"]} == {
        "transformer.h.1.attn"
    }
    assert all(h["rows"] == 4 for h in report["heads"])


def test_nan_weights_are_located(
    gpt_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    model = GPT(cfg)
    with torch.no_grad():
        model.transformer.h[1].attn.c_attn.weight[8:16, :] = float("nan")  # queries of head 1
    _save(tmp_path / "bad", model)
    assert main(["inspect", str(tmp_path / "bad"), "--text", "abcd"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "first non-finite weight: nan in transformer.h.1.attn head 1 at batch 0, query 0, key 0"
        in out
    )
    assert "FAIL" in out


def test_encoder_decoder_with_and_without_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = TransformerConfig(
        src_vocab_size=TOKENIZER.vocab_size, tgt_vocab_size=TOKENIZER.vocab_size, d_model=32,
        num_heads=4, num_encoder_layers=1, num_decoder_layers=1, d_ff=64, max_len=32,
        bos_id=TOKENIZER.bos_id, eos_id=TOKENIZER.eos_id,
    )  # fmt: skip
    _save(tmp_path / "s2s", _sharp(Transformer(cfg)))
    assert (
        main(["inspect", str(tmp_path / "s2s"), "--text", "abcd", "--target", "dcba", "--json"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["source_tokens"] == list("abcd")
    assert report["target_tokens"] == [*"dcba", "<eos>"] and report["output"] == "dcba"
    kinds = {(h["layer"], h["kind"]) for h in report["heads"]}
    assert ("decoder.layers.0.cross_attn", "cross") in kinds and (
        "encoder.layers.0.self_attn",
        "self",
    ) in kinds
    cross = [h for h in report["heads"] if h["kind"] == "cross"]
    assert cross[0]["rows"] == 5  # <bos> + 4 target tokens
    assert main(["inspect", str(tmp_path / "s2s"), "--text", "abcd"]) in (0, 1)
    assert "decoder.layers.0.cross_attn" in capsys.readouterr().out
    # the decoding length is the task's: a language model's option is refused, in one line
    assert main(["inspect", str(tmp_path / "s2s"), "--text", "abcd", "--max-new-tokens", "3"]) == 2
    assert "--max-new-tokens is for language models" in capsys.readouterr().err


def test_user_errors_are_one_line(
    gpt_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(tmp_path / "missing"), "--text", "a"]) == 2
    assert main(["inspect", str(gpt_run), "--ids", "1 x"]) == 2
    assert main(["inspect", str(gpt_run), "--text", "a" * 40]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("attnlab: error: ") for line in err)
    assert "no such run or checkpoint folder" in err[0] and "--ids must be integers" in err[1]
    assert "more than the model's limit of 32" in err[2]


def test_hugging_face_gpt2_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(hf_cfg).save_pretrained(tmp_path / "hf")
    # a randomly initialised GPT-2 has uniform heads only: collapsed, exit code 1
    assert main(["inspect", str(tmp_path / "hf"), "--ids", "1 2 3", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["collapsed"] is True and report["counts"]["uniform"] == 2
    assert report["source_tokens"] == ["1", "2", "3"] and report["output"] == "1 2 3"
    assert [h["layer"] for h in report["heads"]] == ["transformer.h.0.attn"] * 2


def test_long_mode_uses_row_statistics(gpt_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(gpt_run), "--text", "abcdefgh" * 3, "--long", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and len(report["heads"]) == 8
    assert all(h["row_sum_error"] is None and h["rows"] == 24 for h in report["heads"])


def test_an_inf_weight_is_traced_to_its_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    model = _sharp(GPT(cfg))
    with torch.no_grad():
        model.transformer.h[1].attn.c_attn.weight[3, 5] = float("inf")
    _save(tmp_path / "inf", model)
    assert main(["inspect", str(tmp_path / "inf"), "--text", "abcd", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["origin"]["module"] == "transformer.h.1.attn.c_attn"
    assert (
        report["origin"]["layer"] == 1
        and report["origin"]["parameter"] == "transformer.h.1.attn.c_attn.weight"
    )
    assert report["problems"][0].startswith("first non-finite output: ")


def test_a_sink_head_is_reported_not_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32: pretrained models have attention sinks (every row ≥ 0.99 on the first token);
    `inspect` reports them as SINK and exits 0 — only what is broken exits 1."""
    cfg = GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    model = _sharp(GPT(cfg))
    d, dh = 32, 8
    with torch.no_grad():  # head 2 of layer 0: constant queries, keys that read channel 0,
        model.transformer.wpe.weight[0, 0] = 1.0  # large at position 0 only
        w, b = model.transformer.h[0].attn.c_attn.weight, model.transformer.h[0].attn.c_attn.bias
        q, k = slice(2 * dh, 3 * dh), slice(d + 2 * dh, d + 3 * dh)
        w[q], b[q], w[k], b[k] = 0.0, 1.0, 0.0, 0.0
        w[k, 0] = 10.0
    _save(tmp_path / "sink", model)
    assert main(["inspect", str(tmp_path / "sink"), "--text", "abc dea", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["problems"] == [] and report["collapsed"] is False
    assert [(h["layer"], h["head"]) for h in report["heads"] if h["status"] == "sink"] == [
        ("transformer.h.0.attn", 2)
    ]
    assert report["counts"]["sink"] == 1 and report["counts"]["fail"] == 0
    assert report["notes"][0].startswith("transformer.h.0.attn head 2: sink")
    assert main(["inspect", str(tmp_path / "sink"), "--text", "abc dea"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if re.search(r" \d+/\d+ ", line)]
    status = [row[-1] for row in rows]  # the last column of each head's row
    assert sorted(status) == ["SINK"] + ["ok"] * 7
    assert "all 8 heads healthy (7 ok, 1 sinks)" in " ".join(out.split())


def test_a_collapsed_model_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    _save(tmp_path / "fresh", GPT(cfg))  # weights of std 0.02: every head uniform
    assert main(["inspect", str(tmp_path / "fresh"), "--text", "abc dea"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "collapsed: every head is uniform (8) or a sink (0)" in out
    assert "broken: 1 problems (8 uniform)" in out


def test_atol_must_be_a_finite_tolerance(gpt_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--atol nan` passed every row ("all heads healthy"): refused in one line, exit 2."""
    for bad in ("nan", "inf", "-1e-3", "x"):
        with pytest.raises(SystemExit) as exit_:
            main(["inspect", str(gpt_run), "--text", "abc", f"--atol={bad}"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "expected a finite non-negative float" in err
    assert main(["inspect", str(gpt_run), "--text", "abc", "--atol", "0.5"]) == 0


def test_help_says_what_the_exit_status_means(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 nothing broken" in out and "collapsed model" in out
    assert "2 a usage error" in out


def test_mixing_prints_the_last_positions_row_and_json_every_matrix(
    gpt_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnlab.inspect import mixing
    from attnlab.tasks.run import load_run

    assert main(["inspect", str(gpt_run), "--text", "abc dea", "--mixing", "alti"]) == 0
    out = capsys.readouterr().out
    assert "ALTI contribution" in out and "through every layer" in out
    assert main(["inspect", str(gpt_run), "--text", "abc dea", "--mixing", "norm", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    run = load_run(gpt_run)
    ids = torch.tensor([run.inputs("abc dea").source_ids])
    expected = mixing(run.model.eval(), ids, "norm").per_layer[:, 0]
    assert report["tokens"] == list("abc dea") and report["total"] is None
    torch.testing.assert_close(torch.tensor(report["per_layer"]), expected, rtol=1e-6, atol=1e-7)


def test_faithfulness_prints_every_method_and_a_random_row(
    gpt_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["inspect", str(gpt_run), "--text", "abc", "--faithfulness", "--blank-id", "0", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    methods = [m["method"] for m in report["methods"]]
    assert methods[-1] == "random" and "alti" in methods and report["blank_id"] == 0


def test_mixing_of_an_encoder_decoder_reads_its_encoder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = TransformerConfig(
        src_vocab_size=TOKENIZER.vocab_size, tgt_vocab_size=TOKENIZER.vocab_size, d_model=32,
        num_heads=4, num_encoder_layers=2, num_decoder_layers=1, d_ff=64, max_len=32,
        bos_id=TOKENIZER.bos_id, eos_id=TOKENIZER.eos_id,
    )  # fmt: skip
    _save(tmp_path / "s2s", _sharp(Transformer(cfg)))
    args = ["inspect", str(tmp_path / "s2s"), "--text", "abcd", "--target", "dcba"]
    assert main([*args, "--mixing", "rollout", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["layers"] == ["encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    assert len(report["total"]) == 4
    assert main([*args, "--faithfulness"]) == 2
    assert "encoder-decoder" in capsys.readouterr().err


def test_faithfulness_over_a_prompts_file_averages_each_prompts_table(
    gpt_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--prompts FILE`` prints the library's table (mean ± std over the prompts), and its JSON
    is the mean of each prompt's own ``faithfulness_table``; τ-patch where a prompt has a
    corrupted version of the same length."""
    from attnlab.inspect import faithfulness_table
    from attnlab.tasks.run import load_run

    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([
        {"prompt": "abc dea", "answer": "a", "foil": "b", "corrupted": "abc deh"},
        "bad cafe",
    ]), encoding="utf-8")  # fmt: skip
    args = ["inspect", str(gpt_run), "--faithfulness", "--prompts", str(prompts), "--blank-id", "0"]
    assert main([*args, "--methods", "weights,alti", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [m["method"] for m in report["methods"]] == ["weights", "alti", "random"]
    assert report["tokens"] == [7, 8] and report["with_answer"] == 1
    run = load_run(str(gpt_run))
    per_prompt = [
        faithfulness_table(run.model.eval(), torch.tensor([TOKENIZER.encode(t)]), ["alti"],
                           blank_id=0)[0]
        for t in ("abc dea", "bad cafe")
    ]  # fmt: skip
    alti = report["methods"][1]
    expected = sum(r.comprehensiveness for r in per_prompt) / 2
    assert alti["comprehensiveness_mean"] == pytest.approx(expected, abs=1e-6)
    assert alti["kendall_tau_mean"] == pytest.approx(sum(r.kendall_tau for r in per_prompt) / 2)
    # one prompt has a corrupted version: τ-patch of that one alone, std 0
    assert alti["patching_tau_std"] == 0.0 and alti["per_prompt"]["patching_tau"][1] is None
    assert main([*args, "--methods", "weights"]) == 0
    out = capsys.readouterr().out
    assert "τ-patch" in out and "random" in out and "2 prompts of 7–8 tokens" in out


def test_prompt_set_options_are_refused_in_one_line(
    gpt_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    uneven = tmp_path / "uneven.json"
    uneven.write_text(json.dumps([{"prompt": "abc", "answer": "a", "foil": "b",
                                   "corrupted": "abcd"}]), encoding="utf-8")  # fmt: skip
    run = ["inspect", str(gpt_run)]
    cases = {
        (*run, "--faithfulness", "--prompts", str(empty)): "holds no prompt",
        (*run, "--faithfulness", "--prompts", str(tmp_path / "none.txt")): "cannot be read",
        (*run, "--faithfulness", "--prompts", str(uneven)): "as many tokens as the prompt (3)",
        (*run, "--prompts", str(uneven)): "add it",
        (*run, "--faithfulness", "--text", "abc", "--prompt-set", "ioi"): "one of --text",
        (*run, "--plausibility"): "needs a run of copy/reverse/sort",
    }
    for argv, message in cases.items():
        assert main(list(argv)) == 2, argv
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    with pytest.raises(SystemExit) as exit_:
        main([*run, "--faithfulness", "--prompt-set", "nope"])
    assert exit_.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*run, "--faithfulness", "--text", "abc", "--methods", "weights,attention"])
    assert "must be methods among" in capsys.readouterr().err


def test_plausibility_of_a_reverse_run_has_every_alignment_and_a_random_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(tmp_path / "rev")
    train = ["train", "reverse", "--out", run, "--num-symbols", "5", "--max-len", "5",
             "--num-heldout", "20", "--d-model", "16", "--layers", "1", "--heads", "2",
             "--d-ff", "32", "--batch-size", "8", "--warmup", "1", "--steps", "2"]  # fmt: skip
    assert main(train) == 0
    capsys.readouterr()
    assert main(["inspect", run, "--plausibility", "--examples", "10", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    methods = [m["method"] for m in report["methods"]]
    assert methods == ["weights", "rollout", "norm", "norm_residual", "alti", "random"]
    assert report["positions"] > 10 and all(0 <= m["top1"] <= 1 for m in report["methods"])
    assert main(["inspect", run, "--plausibility", "--examples", "10", "--methods", "alti"]) == 0
    out = capsys.readouterr().out
    assert "top-1" in out and "alti" in out and "random" in out
    assert main(["inspect", run, "--plausibility", "--methods", "grad_weights"]) == 2
    assert "gives no source alignment" in capsys.readouterr().err
