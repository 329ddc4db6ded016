"""``attnlab plot steps``: the masks the model applies, ``--kind``/``--layer`` of the chosen kind,
and the hands-on (``--no-mask --d-model 4 --inputs FILE``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab import GPT, BigBirdSpec, GPTConfig, SlidingSpec, Transformer, TransformerConfig
from attnlab.cli import build_parser, main
from attnlab.viz.lessons import mask_panel
from tests.cli.test_view_plot import TOKENIZER, _save


def _plot(argv: list[str]):
    """The figure ``attnlab plot steps`` would save for ``argv``."""
    from attnlab.cli.plot import _model_figure, _steps_by_hand

    args = build_parser().parse_args(argv)
    return _model_figure(args) if args.model else _steps_by_hand(args)


def test_default_applies_the_padding_and_look_ahead_masks_of_plot_masks(tmp_path: Path) -> None:
    plot = _plot(["plot", "steps"])
    tokens = "the cat sat on the mat <pad> <pad>".split()
    np.testing.assert_array_equal(plot.data["mask"], mask_panel(tokens).data["combined"])
    pads = [j for j, t in enumerate(tokens) if t == "<pad>"]
    assert (plot.data["weights"][:, pads] == 0).all()  # no weight on a <pad> key, exactly
    assert plot.data["x"].shape == (8, 8)  # --d-model defaults to 8 for steps
    out = tmp_path / "steps.png"
    assert main(["plot", "steps", "-o", str(out)]) == 0 and out.stat().st_size > 5000


def test_no_mask_lets_every_query_see_every_key() -> None:
    plot = _plot(["plot", "steps", "--no-mask", "--text", "a b <pad>", "--d-model", "4"])
    assert plot.data["mask"].all() and (plot.data["weights"] > 0).all()
    assert plot.data["x"].shape == (3, 4) and plot.data["v"].shape == (3, 4)


def test_hands_on_from_a_file_equals_softmax_qk_v_by_hand(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    h = {k: rng.standard_normal((3, 4) if k == "x" else (4, 4)) for k in ("x", "W_q", "W_k", "W_v")}
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps({k: v.tolist() for k, v in h.items()}))
    argv = ["plot", "steps", "--no-mask", "--d-model", "4", "--inputs", str(path)]
    plot = _plot([*argv, "--text", "the cat sat"])
    # softmax(Q Kᵀ / √d) V, in float64 by hand
    q, k, v = h["x"] @ h["W_q"], h["x"] @ h["W_k"], h["x"] @ h["W_v"]
    s = q @ k.T / math.sqrt(4)
    a = np.exp(s - s.max(1, keepdims=True))
    a /= a.sum(1, keepdims=True)
    np.testing.assert_allclose(plot.data["weights"], a, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(plot.data["v"], v, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(plot.data["output"], a @ v, rtol=1e-12, atol=1e-12)
    titles = " | ".join(ax.get_title() for ax in plot.figure.axes)
    assert "V = x" in titles and "Z = A" in titles  # the values and the output are drawn
    out = tmp_path / "hands_on.png"
    assert main([*argv, "-o", str(out)]) == 0 and out.stat().st_size > 5000


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--d-model", "5"], "--d-model 5 differs from the width of x in --inputs (4)"),
        (["--text", "a b"], "--text must have one word per row of x in --inputs (3), got 2"),
        (["--head", "1"], "plot steps without --model computes one head"),
    ],
)
def test_inputs_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps({"x": np.ones((3, 4)).tolist()}))
    out = tmp_path / "x.png"
    assert main(["plot", "steps", "--inputs", str(path), *extra, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_a_bad_inputs_file_names_the_key_and_the_shapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "inputs.npz"
    np.savez(path, x=np.ones((3, 4)), W_q=np.ones((3, 2)))
    assert main(["plot", "steps", "--inputs", str(path), "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "inputs['W_q'] must be (d_model, d) = (4, d) to multiply x (3, 4), got (3, 2)" in err
    assert main(["plot", "steps", "--inputs", str(tmp_path / "no.json")]) == 2
    assert "error: inputs file" in capsys.readouterr().err


# ----------------------------------------------------------------------------- a model's layer


@pytest.fixture(scope="module")
def seq2seq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=TOKENIZER.vocab_size, tgt_vocab_size=TOKENIZER.vocab_size, d_model=32,
        num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64, max_len=32,
        bos_id=TOKENIZER.bos_id, eos_id=TOKENIZER.eos_id,
    )  # fmt: skip
    return _save(tmp_path_factory.mktemp("s2s") / "run", Transformer(cfg))


def _captured(run: Path, text: str, target: str) -> dict[str, torch.Tensor]:
    from attnlab.tasks.figures import capture_inputs
    from attnlab.tasks.run import load_run

    loaded = load_run(str(run))
    return capture_inputs(loaded.model, loaded.inputs(text, target=target)).attentions


@pytest.mark.parametrize(
    ("kind", "layer", "name"),
    [
        ("cross", "1", "decoder.layers.1.cross_attn"),
        ("cross", "0", "decoder.layers.0.cross_attn"),
        ("self", "1", "encoder.layers.1.self_attn"),
        ("self", "2", "decoder.layers.0.self_attn"),
        ("all", "2", "decoder.layers.0.self_attn"),
    ],
)
def test_kind_and_layer_pick_the_layer_of_that_kind(
    seq2seq: Path, kind: str, layer: str, name: str
) -> None:
    base = ["--model", str(seq2seq), "--text", "abcd", "--target", "dcba"]
    plot = _plot(["plot", "steps", *base, "--kind", kind, "--layer", layer, "--head", "3"])
    assert plot.figure._suptitle.get_text().startswith(f"{name} · head 3")
    captured = _captured(seq2seq, "abcd", "dcba")[name][0, 3].double().numpy()
    np.testing.assert_allclose(plot.data["weights"], captured, atol=1e-6)


def test_a_layer_out_of_range_names_the_layers_of_that_kind(
    seq2seq: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    base = ["--model", str(seq2seq), "--text", "abcd", "--target", "dcba"]
    assert (
        main(
            [
                "plot",
                "steps",
                *base,
                "--kind",
                "cross",
                "--layer",
                "2",
                "-o",
                str(tmp_path / "x.png"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert (
        "--layer must be in [0, 2) (the model's 2 cross-attention layers, "
        "decoder.layers.0.cross_attn … decoder.layers.1.cross_attn), got 2"
    ) in err
    assert main(["plot", "steps", *base, "--no-mask", "-o", str(tmp_path / "x.png")]) == 2
    assert "--no-mask is for plot steps without --model" in capsys.readouterr().err


@pytest.mark.parametrize(
    "attention",
    [SlidingSpec(window=2), BigBirdSpec(block_size=1, num_random_blocks=1)],
    ids=["sliding", "bigbird"],
)
def test_model_steps_draw_the_window_and_layout_the_model_applies(
    tmp_path: Path, attention: object
) -> None:
    # it drew the causal softmax over every past key: weights the model does not compute
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=TOKENIZER.vocab_size, n_positions=32, n_embd=32, n_layer=1, n_head=4,
        attention=attention,
    )  # fmt: skip
    run = _save(tmp_path / "run", GPT(cfg))
    plot = _plot(["plot", "steps", "--model", str(run), "--text", "abcdefg", "--head", "1"])
    captured = _captured(run, "abcdefg", None)["transformer.h.0.attn"][0, 1].double().numpy()
    np.testing.assert_allclose(plot.data["weights"], captured, atol=1e-6)
    hidden = ~plot.data["mask"]
    assert hidden[np.tril_indices(hidden.shape[0])].any()  # some past key is out of sight
    assert (plot.data["weights"][hidden] == 0).all()
