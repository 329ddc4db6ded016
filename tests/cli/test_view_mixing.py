"""``attnlab view --mixing``: the page's method switch holds what ``attnlab.inspect.mixing``
computes on the saved model; a method the page cannot show is one line; an encoder-decoder's
methods read its encoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab import Transformer, TransformerConfig
from attnlab.cli import main
from attnlab.inspect.mixing import mixing
from tests.cli.test_view_generate import PROMPT, TOKENIZER, _embedded, _gpt, _save, gpt_run  # noqa: F401
from tests.viz.test_viewer_mixing import decode


def test_view_mixing_embeds_mixings_tensors(gpt_run: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "v.html"
    argv = ["view", str(gpt_run), "--text", PROMPT, "--mixing", "norm,alti", "-o", str(out)]
    assert main(argv) == 0
    data = _embedded(out.read_text())
    assert [m["name"] for m in data["methods"]] == ["norm", "alti"]
    ids = torch.tensor([TOKENIZER.encode(PROMPT)])
    t = ids.shape[1]
    model = _gpt()
    norm, alti = mixing(model, ids, "norm", heads=True), mixing(model, ids, "alti")
    for li, layer in enumerate(data["groups"][0]["layers"]):
        assert np.array_equal(decode(layer["mixing"]["norm"], t, t), norm.per_head[li, 0].numpy())
        rolled = alti.cumulative[li, 0].detach().numpy()  # type: ignore[index]
        assert np.array_equal(decode(layer["mixing"]["alti"], t, t)[0], rolled)
    # the default stays weights only
    plain = tmp_path / "p.html"
    assert main(["view", str(gpt_run), "--text", PROMPT, "-o", str(plain)]) == 0
    assert _embedded(plain.read_text())["methods"] == []
    assert plain.stat().st_size < out.stat().st_size


@pytest.mark.parametrize(
    ("methods", "said"),
    [
        ("norm,bogus", "unknown method 'bogus'; choose from rollout, norm"),
        ("flow", "no matrix per layer"),
        ("integrated_gradients", "attnlab plot mixing --method integrated_gradients"),
        (",", "--mixing needs methods"),
    ],
)
def test_a_method_the_page_cannot_show_is_one_line(
    gpt_run: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    methods: str,
    said: str,
) -> None:
    out = tmp_path / "v.html"
    rc = main(["view", str(gpt_run), "--text", PROMPT, "--mixing", methods, "-o", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and said in err and "\n" not in err and "Traceback" not in err
    assert not out.exists()


def test_an_encoder_decoder_gets_its_encoders_methods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=TOKENIZER.vocab_size, tgt_vocab_size=TOKENIZER.vocab_size, d_model=16,
        num_heads=2, num_encoder_layers=2, num_decoder_layers=1, d_ff=32, max_len=32,
        bos_id=TOKENIZER.bos_id, eos_id=TOKENIZER.eos_id,
    )  # fmt: skip
    run = _save(tmp_path / "s2s", Transformer(cfg))
    out = tmp_path / "s.html"
    argv = ["view", str(run), "--text", "abcd", "--target", "dcba", "--mixing", "all"]
    assert main([*argv, "-o", str(out)]) == 0
    capsys.readouterr()
    data = _embedded(out.read_text())
    # every method but grad_weights (which explains output positions over the same tokens)
    names = [m["name"] for m in data["methods"]]
    assert names == ["rollout", "norm", "norm_residual", "alti", "value_zeroing"]
    groups = {g["name"]: g for g in data["groups"]}
    assert all(
        set(layer["mixing"]) == set(names) for layer in groups["encoder self-attention"]["layers"]
    )
    assert all(layer["mixing"] == {} for layer in groups["decoder cross-attention"]["layers"])
    # asked for by name, grad_weights is refused in one line
    assert main([*argv[:-1], "grad_weights", "-o", str(tmp_path / "g.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert "grad_weights" in err and "encoder" in err and "\n" not in err


def test_view_help_states_the_page_size_cost(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["view", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--mixing METHODS" in out and "Page size" in out and "2.6×" in out


def test_a_linformer_model_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.cli.test_view_plot import _linformer_run

    run = _linformer_run(tmp_path)
    argv = ["view", str(run), "--text", "abcd", "--target", "dcba", "--mixing", "norm"]
    assert main([*argv, "-o", str(tmp_path / "l.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert "Linformer" in err and "projected rows" in err and "\n" not in err
