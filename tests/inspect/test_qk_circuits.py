"""Heads as low-rank bilinear relations (attnlab.inspect.qk_circuits): the singular values of
every head's ``W_Q^hᵀ W_K^g / √d_head`` and ``W_V^gᵀ W_O^hᵀ`` against a float64 SVD of the product
built by hand from the fused weights, ranks of heads made low-rank by construction, the
grouped-query mapping, the figure, the command line and bad input."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect import head_weights, qk_spectrum
from attnlab.models.config import config_to_dict
from attnlab.training.checkpoint import save_checkpoint

D, HEADS, E = 32, 4, 8  # d_model, query heads, d_head


def _configs() -> dict[str, attnlab.GPTConfig]:
    small = {"vocab_size": 64, "n_positions": 32, "n_embd": D, "n_layer": 2, "n_head": HEADS}
    return {
        "gpt2": attnlab.GPTConfig(**small),
        "llama": attnlab.GPTConfig(
            **small, positions="rope", norm="rmsnorm", mlp="gated", activation="silu",
            num_kv_heads=2, bias=False, tie_embeddings=True,
        ),
        "mqa": attnlab.GPTConfig(**small, num_kv_heads=1, bias=False),
        "neox": attnlab.GPTConfig(
            **small, positions="rope", rotary_dim=4, parallel_residual=True, activation="gelu",
        ),
    }  # fmt: skip


def _model(family: str, seed: int = 0) -> attnlab.GPT:
    torch.manual_seed(seed)
    return attnlab.GPT(_configs()[family]).eval()


def _reference(model: attnlab.GPT, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Full float64 SVDs of the d_model × d_model products, sliced by hand from c_attn/c_proj."""
    cfg = model.config
    kv_heads = cfg.num_kv_heads or cfg.n_head
    attn = model.transformer.h[layer].attn
    w = attn.c_attn.weight.detach().double()  # rows: H·E queries, H_kv·E keys, H_kv·E values
    w_o = attn.c_proj.weight.detach().double()  # (D, H·E)
    qk, ov = [], []
    for h in range(HEADS):
        g = h // (HEADS // kv_heads)
        w_q = w[h * E : (h + 1) * E]  # (E, D)
        w_k = w[HEADS * E + g * E : HEADS * E + (g + 1) * E]
        w_v = w[(HEADS + kv_heads) * E + g * E : (HEADS + kv_heads) * E + (g + 1) * E]
        qk.append(torch.linalg.svdvals(w_q.T @ w_k / math.sqrt(E)))  # (D,)
        ov.append(torch.linalg.svdvals(w_v.T @ w_o[:, h * E : (h + 1) * E].T))
    return torch.stack(qk), torch.stack(ov)  # (H, D)


@pytest.mark.parametrize("family", ["gpt2", "llama", "mqa", "neox"])
def test_singular_values_match_a_float64_svd_of_the_product(family: str) -> None:
    model = _model(family)
    spec = qk_spectrum(model)
    assert spec.qk.shape == spec.ov.shape == (2, HEADS, E) and spec.qk.dtype == torch.float64
    for layer in range(2):
        qk, ov = _reference(model, layer)
        # the d_head values that can be nonzero, then D − d_head zeros (float64 rounding)
        torch.testing.assert_close(spec.qk[layer], qk[:, :E], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(spec.ov[layer], ov[:, :E], rtol=1e-10, atol=1e-12)
        assert float(qk[:, E:].max()) < 1e-12 * float(qk.max())
    assert (spec.rank("qk") == E).all() and (spec.rank("ov") == E).all()


def test_the_scores_are_the_bilinear_form() -> None:
    """x_i M_QK^h x_jᵀ equals the head's q·k/√d_head (GPT-2: no rotation) up to the biases."""
    model = _model("gpt2")
    attn = model.transformer.h[0].attn
    with torch.no_grad():
        attn.c_attn.bias.zero_()
    x = torch.randn(5, D, dtype=torch.float64)
    q, k, _ = attn.project_qkv(x.float()[None])
    w = head_weights(attn)
    for h in range(HEADS):
        scores = q[0, :, h * E : (h + 1) * E] @ k[0, :, h * E : (h + 1) * E].T / math.sqrt(E)
        m = w.query[h].double().T @ w.key[h].double() / math.sqrt(E)  # (D, D)
        torch.testing.assert_close(scores.double(), x @ m @ x.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("r", [1, 3, 5])
def test_a_head_made_rank_r_reports_rank_r(r: int) -> None:
    model = _model("gpt2")
    attn = model.transformer.h[1].attn
    g = torch.Generator().manual_seed(r)
    with torch.no_grad():  # head 2's queries span only r directions: W_Q = A B, A (E, r), B (r, D)
        a, b = torch.randn(E, r, generator=g), torch.randn(r, D, generator=g)
        attn.c_attn.weight[2 * E : 3 * E] = a @ b
        attn.c_proj.weight[:, E : 2 * E] = torch.randn(D, r, generator=g) @ torch.randn(
            r, E, generator=g
        )
    spec = qk_spectrum(model, layer=1)
    assert spec.rank("qk")[0].tolist() == [E, E, r, E]
    assert spec.rank("ov")[0].tolist() == [E, r, E, E]  # head 1's W_O has rank r
    assert int(spec.energy_rank("qk", 1.0)[0, 2]) == r
    assert float(spec.effective_rank("qk")[0, 2]) <= r + 1e-6


def test_ranks_never_exceed_d_head_and_effective_rank_is_exact_for_equal_values() -> None:
    model = _model("llama", seed=3)
    spec = qk_spectrum(model)
    for circuit in ("qk", "ov"):
        assert (spec.rank(circuit) <= spec.d_head).all()
        assert (spec.effective_rank(circuit) <= spec.d_head + 1e-9).all()
        assert (spec.energy_rank(circuit) <= spec.rank(circuit)).all()
    attn = model.transformer.h[0].attn
    with torch.no_grad():  # head 0: W_Q = 2·[I_E 0] and W_K = [I_E 0] → E equal values 2/√E
        attn.c_attn.weight[:E] = 2 * torch.eye(E, D)
        attn.c_attn.weight[HEADS * E : HEADS * E + E] = torch.eye(E, D)
        attn.c_attn.weight[E : 2 * E] = 0.0  # head 1: nothing
    spec = qk_spectrum(model, layer=[0])
    torch.testing.assert_close(
        spec.qk[0, 0], torch.full((E,), 2 / math.sqrt(E), dtype=torch.float64)
    )
    assert float(spec.effective_rank()[0, 0]) == pytest.approx(E, abs=1e-9)
    assert int(spec.energy_rank("qk", 0.5)[0, 0]) == E // 2
    assert int(spec.rank()[0, 1]) == 0 and float(spec.effective_rank()[0, 1]) == 0.0


def test_grouped_query_heads_read_their_group() -> None:
    """Llama with H = 4, H_kv = 2: heads 0, 1 share key/value group 0, heads 2, 3 group 1."""
    model = _model("llama")
    attn = model.transformer.h[0].attn
    w = head_weights(attn)
    keys = attn.c_attn.weight[HEADS * E : HEADS * E + 2 * E].unflatten(0, (2, E))
    for h in range(HEADS):
        assert torch.equal(w.key[h], keys[h // 2])
    with torch.no_grad():  # zero key group 1: heads 2 and 3 lose their QK circuit, 0 and 1 keep it
        attn.c_attn.weight[HEADS * E + E : HEADS * E + 2 * E] = 0.0
    assert qk_spectrum(model, layer=0).rank("qk")[0].tolist() == [E, E, 0, 0]


def test_layer_selection_and_dict() -> None:
    model = _model("gpt2")
    spec = qk_spectrum(model, layer=[1, 0])
    assert spec.layers == ["transformer.h.1.attn", "transformer.h.0.attn"]
    torch.testing.assert_close(spec.qk[0], qk_spectrum(model, layer=1).qk[0])
    out = json.loads(json.dumps(spec.to_dict()))
    assert out["d_head"] == E and len(out["qk"]["singular_values"][0][0]) == E
    assert out["ov"]["rank"] == [[E] * HEADS] * 2


def test_bad_input_is_refused_clearly() -> None:
    model = _model("gpt2")
    with pytest.raises(ArgumentError, match=r"layer must be in \[0, 2\).*got 2"):
        qk_spectrum(model, layer=2)
    with pytest.raises(ArgumentError, match="got -1"):
        qk_spectrum(model, layer=-1)
    with pytest.raises(ArgumentError, match="at least one layer"):
        qk_spectrum(model, layer=[])
    with pytest.raises(ArgumentTypeError, match="layer must be an int"):
        qk_spectrum(model, layer="0")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="no attention layer"):
        qk_spectrum(torch.nn.Linear(2, 2))
    with pytest.raises(ArgumentError, match="circuit must be"):
        qk_spectrum(model).rank("vo")
    with pytest.raises(ArgumentError, match="energy"):
        qk_spectrum(model).energy_rank("qk", 0.0)
    with pytest.raises(ArgumentTypeError, match="MultiHeadAttention"):
        head_weights(torch.nn.Linear(2, 2))  # type: ignore[arg-type]


def test_figure_holds_the_spectrum() -> None:
    from attnlab.viz import head_spectrum_figure

    spec = qk_spectrum(_model("llama"))
    plot = head_spectrum_figure(spec, circuit="ov", layers=[1])
    assert (plot.data["singular_values"] == spec.ov[[1]].numpy()).all()
    assert (plot.data["effective_rank"] == spec.effective_rank("ov").numpy()).all()
    with pytest.raises(ArgumentError, match="layers"):
        head_spectrum_figure(spec, layers=[2])
    with pytest.raises(ArgumentTypeError):
        head_spectrum_figure(object())  # type: ignore[arg-type]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    model = _model("llama")
    cfg = dataclasses.replace(model.config)
    save_checkpoint(tmp_path / "run", step=1, model=model,
                    config={"model": config_to_dict(cfg)})  # fmt: skip
    return tmp_path / "run"


def test_cli_qk_spectrum(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(run_dir), "--qk-spectrum", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["d_head"] == E and out["qk"]["rank"] == [[E] * HEADS] * 2
    assert main(["inspect", str(run_dir), "--qk-spectrum"]) == 0
    table = capsys.readouterr().out
    eff = qk_spectrum(_model("llama")).effective_rank()
    assert "transformer.h.1.attn" in table and f"{E}/{E}" in table
    assert f" {float(eff[1, 3]):.0f}/" in table
    assert main(["inspect", str(run_dir), "--qk-spectrum", "--roles"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_non_finite_weights_name_the_layer_and_head() -> None:
    # issue 32: a NaN weight ended in linalg's LinAlgError (an internal error)
    model = _model("llama")
    d_head = model.config.n_embd // model.config.n_head
    with torch.no_grad():
        model.transformer.h[1].attn.qkv_parameters()[0][2 * d_head, 0] = float("nan")
    with pytest.raises(ArgumentError, match=r"layer 1 \(transformer.h.1.attn\) head 2: its W_Q"):
        qk_spectrum(model)
    assert qk_spectrum(model, layer=0).qk.isfinite().all()  # the finite layer still reads
