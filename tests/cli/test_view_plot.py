"""``attnlab view`` and ``attnlab plot`` on saved checkpoints."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab import GPT, GPTConfig, Transformer, TransformerConfig
from attnlab.cli import main
from attnlab.data.tokenizers import BOS, EOS, PAD, UNK, CharTokenizer
from attnlab.inspect.capture import capture
from attnlab.models.config import config_to_dict
from attnlab.training.checkpoint import save_checkpoint

TOKENIZER = CharTokenizer(list("abcdefgh "), [PAD, UNK, BOS, EOS])


def _save(run: Path, model: torch.nn.Module) -> Path:
    save_checkpoint(
        run,
        step=1,
        model=model,
        config={"model": config_to_dict(model.config)},
        files={"tokenizer.json": TOKENIZER.to_json()},
    )
    return run


def _embedded(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', html, re.S)
    assert m
    return json.loads(m.group(1).replace("<\\/", "</"))


def test_view_gpt_embeds_the_captured_weights(tmp_path: Path) -> None:
    model = GPT(
        GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    ).eval()
    run = _save(tmp_path / "gpt", model)
    out = tmp_path / "v.html"
    assert main(["view", str(run), "--text", "abc bad", "-o", str(out)]) == 0
    data = _embedded(out.read_text())
    assert data["sequences"]["tokens"] == [
        TOKENIZER.id_to_token(i) for i in TOKENIZER.encode("abc bad")
    ]
    with torch.no_grad(), capture(model) as cache:
        model(torch.tensor([TOKENIZER.encode("abc bad")]))
    layer = data["groups"][0]["layers"][1]
    w = np.frombuffer(base64.b64decode(layer["weights"]), dtype="<f4").reshape(4, 7, 7)
    np.testing.assert_allclose(w, cache.attentions[layer["name"]][0].numpy(), rtol=1e-5, atol=1e-6)


def test_view_seq2seq_has_three_groups(tmp_path: Path) -> None:
    cfg = TransformerConfig(
        src_vocab_size=TOKENIZER.vocab_size, tgt_vocab_size=TOKENIZER.vocab_size, d_model=32,
        num_heads=4, num_encoder_layers=1, num_decoder_layers=1, d_ff=64, max_len=32,
        bos_id=TOKENIZER.bos_id, eos_id=TOKENIZER.eos_id,
    )  # fmt: skip
    run = _save(tmp_path / "s2s", Transformer(cfg))
    out = tmp_path / "s.html"
    assert main(["view", str(run), "--text", "abcd", "--target", "dcba", "-o", str(out)]) == 0
    data = _embedded(out.read_text())
    assert [g["name"] for g in data["groups"]] == [
        "encoder self-attention",
        "decoder self-attention",
        "decoder cross-attention",
    ]
    assert len(data["sequences"]["target"]) == 5 and len(data["sequences"]["source"]) == 4


def test_view_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(tmp_path / "nope"), "--text", "a"]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["noam", "positional", "masks", "steps"])
def test_plot_kinds_write_files(tmp_path: Path, kind: str) -> None:
    out = tmp_path / f"{kind}.svg"
    extra = ["--steps", "200", "--warmup", "50"] if kind == "noam" else []
    assert main(["plot", kind, "-o", str(out), *extra]) == 0
    assert out.stat().st_size > 1000


def test_plot_heads_from_model(tmp_path: Path) -> None:
    model = GPT(
        GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    )
    run = _save(tmp_path / "gpt", model)
    for kind in ("heads", "heatmap", "layers"):
        out = tmp_path / f"{kind}.png"
        assert main(["plot", kind, "--model", str(run), "--text", "abcabc", "-o", str(out)]) == 0
        assert out.stat().st_size > 1000


# ----------------------------------------------------------------------------- a Linformer encoder


def _linformer_run(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=TOKENIZER.vocab_size, tgt_vocab_size=TOKENIZER.vocab_size, d_model=32,
        num_heads=4, num_encoder_layers=2, num_decoder_layers=1, d_ff=64, max_len=32,
        bos_id=TOKENIZER.bos_id, eos_id=TOKENIZER.eos_id, attention="linformer", linformer_k=6,
    )  # fmt: skip
    return _save(tmp_path / "linformer", Transformer(cfg))


def _figure(argv: list[str]):
    """The plot ``attnlab plot`` would save for ``argv``, and what the model captured."""
    from attnlab.cli import build_parser
    from attnlab.cli.plot import _model_figure
    from attnlab.tasks.figures import capture_inputs
    from attnlab.tasks.run import load_run

    args = build_parser().parse_args(argv)
    loaded = load_run(args.model)
    inputs = loaded.inputs(args.text, target=args.target)
    return _model_figure(args), capture_inputs(loaded.model, inputs)


def _ticks(ax, axis: str) -> list[str]:
    return [t.get_text() for t in (ax.get_xticklabels() if axis == "x" else ax.get_yticklabels())]


def test_plot_a_linformer_layer_labels_its_columns_e_k_rows(tmp_path: Path) -> None:
    run = _linformer_run(tmp_path)
    base = ["--model", str(run), "--text", "abcd", "--target", "dcba", "--kind", "self"]
    rows = [f"E·K row {j}" for j in range(6)]
    layer = "encoder.layers.1.self_attn"
    plot, cache = _figure(["plot", "heatmap", *base, "--layer", "1", "--head", "2"])
    np.testing.assert_array_equal(plot.data["weights"], cache.attentions[layer][0, 2].numpy())
    assert _ticks(plot.figure.axes[0], "x") == rows and cache.key_labels(layer) == rows
    plot, _ = _figure(["plot", "heads", *base, "--layer", "0"])
    assert plot.data["weights"].shape == (4, 4, 6)  # (H, T, k): the source is "abcd"
    assert _ticks(plot.figure.axes[3], "x") == rows
    plot, _ = _figure(["plot", "layers", *base])
    assert list(plot.data["layers"]) == [
        "encoder.layers.0.self_attn", "encoder.layers.1.self_attn", "decoder.layers.0.self_attn",
    ]  # fmt: skip
    assert _ticks(plot.figure.axes[4], "x") == rows  # layer 1, head 0
    for kind in ("heatmap", "heads", "layers"):  # through the command: files written
        out = tmp_path / f"{kind}.png"
        assert main(["plot", kind, *base, "--layer", "0", "-o", str(out)]) == 0
        assert out.stat().st_size > 3000


def test_plot_effective_draws_a_f_on_a_diverging_scale(tmp_path: Path) -> None:
    run = _linformer_run(tmp_path)
    base = ["--model", str(run), "--text", "abcd", "--target", "dcba", "--kind", "self"]
    layer = "encoder.layers.0.self_attn"
    plot, cache = _figure(["plot", "heads", *base, "--layer", "0", "--effective"])
    eff = cache.effective_weights(layer)[0]  # (H, T, T) over the source tokens
    np.testing.assert_array_equal(plot.data["weights"], eff.numpy())
    assert (eff < 0).any()
    lo, hi = plot.figure.axes[0].images[0].get_clim()
    assert lo == -hi == pytest.approx(-float(eff.abs().max()))
    assert plot.figure.axes[0].images[0].cmap.name.startswith("RdBu")
    assert _ticks(plot.figure.axes[3], "x") == ["a", "b", "c", "d"]
    assert "effective weights A·F" in plot.figure.get_suptitle()
    assert plot.figure.axes[-1].get_ylabel() == "effective weight (A·F)"
    plot, _ = _figure(["plot", "heatmap", *base, "--layer", "0", "--head", "3", "--effective"])
    np.testing.assert_array_equal(plot.data["weights"], eff[3].numpy())
    assert plot.figure.axes[0].images[0].get_clim() == pytest.approx(
        (-float(eff[3].abs().max()), float(eff[3].abs().max()))
    )
    out = tmp_path / "effective.png"
    assert main(["plot", "heatmap", *base, "--layer", "0", "--effective", "-o", str(out)]) == 0
    assert out.stat().st_size > 3000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plot", "heads", "--effective"],
         "--effective: decoder.layers.0.cross_attn attends to its key tokens directly (its weights "
         "are already per token); the layers with projected keys are encoder.layers.0.self_attn "
         "(--kind all --layer 0), encoder.layers.1.self_attn (--kind all --layer 1)"),
        (["plot", "heads", "--kind", "cross", "--effective"],
         "encoder.layers.0.self_attn (--kind self --layer 0)"),
        (["plot", "layers", "--effective"],
         "--effective draws one layer's effective weights: plot heatmap or heads, got plot layers"),
    ],
    ids=["not-projected", "other-kind", "layers"],
)  # fmt: skip
def test_plot_linformer_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    run = _linformer_run(tmp_path)
    out = tmp_path / "x.png"
    args = [*argv, "--model", str(run), "--text", "abcd", "--target", "dcba", "-o", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_plot_steps_draws_a_linformer_layer_over_its_projected_rows(tmp_path: Path) -> None:
    # it refused to: its panel recomputed softmax(Q Kᵀ/√d) over the tokens, not the layer's path
    run = _linformer_run(tmp_path)
    base = ["--model", str(run), "--text", "abcd", "--target", "dcba", "--head", "2"]
    plot, cache = _figure(["plot", "steps", *base])
    layer = "encoder.layers.0.self_attn"
    assert plot.figure.get_suptitle().startswith(f"{layer} · head 2")
    np.testing.assert_allclose(
        plot.data["weights"], cache.attentions[layer][0, 2].double().numpy(), atol=1e-6
    )
    assert plot.data["k"].shape[0] == 6  # the k rows of E K
    scores = plot.figure.axes[8]  # S: tokens down, projected rows across
    assert _ticks(scores, "x") == [f"E·K row {j}" for j in range(6)]


def test_plot_effective_on_full_attention_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = GPT(
        GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=32, n_embd=32, n_layer=1, n_head=2)
    )
    run = _save(tmp_path / "gpt", model)
    argv = ["plot", "heads", "--model", str(run), "--text", "abc", "--effective"]
    assert main([*argv, "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the model has no layer with projected keys" in err


def test_plot_draws_a_dollar_token_and_greys_the_masked_future(tmp_path: Path) -> None:
    """``plot heads|layers --text 'a $$ b'`` used to end in mathtext's ParseException (in the
    tick labels, and in the title of ``layers``); ``layers`` painted the future as weight 0."""
    from attnlab.cli import build_parser
    from attnlab.cli.plot import _model_figure

    tok = CharTokenizer(list("ab$ "), [PAD, UNK, BOS, EOS])
    model = GPT(
        GPTConfig(vocab_size=tok.vocab_size, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    )
    run = tmp_path / "gpt"
    save_checkpoint(
        run, step=1, model=model.eval(), config={"model": config_to_dict(model.config)},
        files={"tokenizer.json": tok.to_json()},
    )  # fmt: skip
    argv = ["plot", "layers", "--model", str(run), "--text", "a $$ b", "--layer", "1"]
    plot = _model_figure(build_parser().parse_args(argv))
    assert list(plot.data["layers"]) == ["transformer.h.1.attn"]  # --layer chose the layer
    future = ~torch.ones(6, 6, dtype=torch.bool).tril()
    assert np.isnan(plot.data["weights"][0][:, future]).all()  # drawn in the "bad" grey
    assert not np.isnan(plot.data["weights"][0][:, ~future]).any()
    out = tmp_path / "layers.png"
    assert main([*argv, "-o", str(out)]) == 0 and out.stat().st_size > 1000
    assert main(["plot", "heads", *argv[2:6], "-o", str(tmp_path / "heads.png")]) == 0
    heatmap = _model_figure(build_parser().parse_args(["plot", "heatmap", *argv[2:6]]))
    np.testing.assert_array_equal(heatmap.data["mask"], ~future.numpy())  # the future: grey
    heads = _model_figure(build_parser().parse_args(["plot", "heads", *argv[2:6]]))
    assert np.isnan(heads.data["weights"][:, future]).all()
    assert not np.isnan(heads.data["weights"][:, ~future]).any()
