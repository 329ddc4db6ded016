"""attnlab.viz.costs: the FLOP/memory calculator against T, and measured peak memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import attnlab as al
from attnlab.inspect import flops
from attnlab.viz.costs import (
    flops_figure,
    memory_figure,
    residual_growth_figure,
    scaling_figure,
)


def test_flops_figure_holds_the_calculators_numbers(tmp_path: Path) -> None:
    cfg = al.GPTConfig(vocab_size=100, n_positions=4096, n_embd=64, n_layer=2, n_head=4,
                       num_kv_heads=2)  # fmt: skip
    lens = [16, 64, 256, 1024, 4096]
    plot = flops_figure(cfg, lens, batch=2)
    np.testing.assert_array_equal(plot.data["seq_len"], lens)
    for i, t in enumerate(lens):
        r = flops(cfg, t, 2)
        g = r.grouped()
        assert plot.data["flops/attention"][i] == g["scores"] + g["reduce"]
        assert plot.data["flops/projections"][i] == g["qkv"] + g["proj"]
        assert plot.data["flops/mlp"][i] == g["ffw1"] + g["ffw2"]
        assert plot.data["flops/lm_head"][i] == g["lm_head"]
        assert plot.data["flops/total"][i] == r.forward_total
        for name in ("MHA", "GQA", "MQA"):
            assert plot.data[f"memory/kv_cache/{name}"][i] == r.kv_cache[name]
        for key in ("attention_matrix", "parameters", "training_state"):
            assert plot.data[f"memory/{key}"][i] == r.memory[key]
    parts = sum(plot.data[f"flops/{c}"] for c in ("attention", "projections", "mlp", "lm_head"))
    np.testing.assert_array_equal(parts, plot.data["flops/total"])
    # attention (4 T² d per layer) overtakes projections + MLP: with 2 of 4 kv heads the QKV
    # projection is 2 T d (d + d/2 + d/2) = 4 T d², + 2 T d² output + 16 T d² MLP = 22 T d²,
    # so at T = 5.5 d = 352 (6 d for multi-head attention)
    assert plot.data["crossover"][0] == pytest.approx(352, rel=1e-9)
    ax_f, ax_m = plot.figure.axes[:2]
    assert ax_f.get_xscale() == "log" and ax_f.get_yscale() == "log"
    assert ax_m.get_xscale() == "log" and ax_m.get_yscale() == "log"
    np.testing.assert_array_equal(ax_f.lines[0].get_ydata(), plot.data["flops/attention"])
    assert plot.save(tmp_path / "flops.png").stat().st_size > 1000


def test_flops_figure_encoder_decoder_and_no_crossover() -> None:
    cfg = al.TransformerConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=32, num_heads=4,
                               num_encoder_layers=1, num_decoder_layers=1, d_ff=64)  # fmt: skip
    plot = flops_figure(cfg, [8, 16], dtype=torch.bfloat16)
    r = flops(cfg, 16, dtype=torch.bfloat16)
    g = r.grouped()
    assert plot.data["flops/projections"][1] == g["qkv"] + g["q"] + g["kv"] + g["proj"]
    assert "memory/kv_cache/GQA" not in plot.data
    assert np.isnan(plot.data["crossover"][0])


def test_flops_figure_bad_arguments() -> None:
    cfg = al.GPTConfig(vocab_size=10, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    with pytest.raises(TypeError, match="seq_lens must be a sequence of ints, got int"):
        flops_figure(cfg, 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seq_lens must be strictly increasing"):
        flops_figure(cfg, [16, 8])
    with pytest.raises(ValueError, match="seq_lens must hold at least one length"):
        flops_figure(cfg, [])
    with pytest.raises(ValueError, match=r"seq_len must be at most config\.n_positions = 32"):
        flops_figure(cfg, [16, 64])
    with pytest.raises(TypeError, match="config must be a GPTConfig or a TransformerConfig"):
        flops_figure("gpt2", [8])  # type: ignore[arg-type]


def test_memory_figure(tmp_path: Path) -> None:
    peaks = {"math": [1e6, 4e6, 16e6], "blockwise": [2e5, 4e5, float("nan")]}
    plot = memory_figure([256, 512, 1024], peaks)
    np.testing.assert_array_equal(plot.data["seq_len"], [256, 512, 1024])
    np.testing.assert_array_equal(plot.data["peak/math"], peaks["math"])
    np.testing.assert_array_equal(plot.data["peak/blockwise"], peaks["blockwise"])
    ax = plot.figure.axes[0]
    assert ax.get_ylabel() == "peak memory (MiB)"
    np.testing.assert_allclose(ax.lines[0].get_ydata(), np.asarray(peaks["math"]) / 2**20)
    assert plot.save(tmp_path / "mem.svg").stat().st_size > 1000
    with pytest.raises(ValueError, match=r"peaks\['math'\] must have one value per length \(3\)"):
        memory_figure([256, 512, 1024], {"math": [1.0]})
    with pytest.raises(ValueError, match="peaks must hold at least one series"):
        memory_figure([8], {})
    with pytest.raises(TypeError, match="peaks must be a mapping"):
        memory_figure([8], [1.0])  # type: ignore[arg-type]


def test_memory_figure_with_predictions() -> None:
    plot = memory_figure(
        [1, 2], {"MHA": [10.0, 20.0]}, expected={"MHA": [8.0, 16.0], "MQA": [1.0, 2.0]},
        legend_title=None, xlabel="tokens decoded",
    )  # fmt: skip
    np.testing.assert_array_equal(plot.data["expected/MHA"], [8.0, 16.0])
    np.testing.assert_array_equal(plot.data["expected/MQA"], [1.0, 2.0])
    ax = plot.figure.axes[0]
    assert [line.get_label() for line in ax.lines] == [
        "MHA (measured)", "MHA (predicted)", "MQA (predicted)",
    ]  # fmt: skip
    assert ax.get_xlabel() == "tokens decoded" and ax.get_ylabel() == "peak memory (B)"
    with pytest.raises(ValueError, match=r"expected\['MQA'\] must have one value per length"):
        memory_figure([1, 2], {"MHA": [1.0, 2.0]}, expected={"MQA": [1.0]})
    with pytest.raises(TypeError, match="expected must be a mapping"):
        memory_figure([1, 2], {"MHA": [1.0, 2.0]}, expected=[1.0, 2.0])  # type: ignore[arg-type]


def test_residual_growth_figure(tmp_path: Path) -> None:
    stds = {"scaled": [0.03, 0.04, 0.05], "unscaled": [0.03, 0.1, 0.15]}
    plot = residual_growth_figure(stds)
    np.testing.assert_array_equal(plot.data["layer"], [0, 1, 2])
    np.testing.assert_array_equal(plot.data["std/scaled"], stds["scaled"])
    np.testing.assert_array_equal(plot.data["std/unscaled"], stds["unscaled"])
    labels = [line.get_label() for line in plot.figure.axes[0].lines]
    assert labels == ["scaled: ×1.7 over 2 blocks", "unscaled: ×5.0 over 2 blocks"]
    assert plot.save(tmp_path / "resid.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="stds must hold 1-D series of one length"):
        residual_growth_figure({"a": [1.0, 2.0], "b": [1.0]})
    with pytest.raises(ValueError, match="stds must hold at least one series"):
        residual_growth_figure({})


def test_scaling_figure(tmp_path: Path) -> None:
    lens = [1024, 2048, 4096]
    times = {"full": [0.01, 0.04, 0.16], "window": [0.002, 0.004, float("nan")]}
    memory = {"full": [1e6, 2e6, 4e6], "window": [1e6, 2e6, 4e6]}
    plot = scaling_figure(lens, times, memory, title="cost")
    np.testing.assert_array_equal(plot.data["seq_len"], lens)
    np.testing.assert_array_equal(plot.data["time/full"], times["full"])
    np.testing.assert_array_equal(plot.data["time/window"], times["window"])
    np.testing.assert_array_equal(plot.data["memory/window"], memory["window"])
    # the guides pass through the first series' first point: ∝ T and ∝ T²
    np.testing.assert_allclose(plot.data["guide/time/T"], [0.01, 0.02, 0.04])
    np.testing.assert_allclose(plot.data["guide/time/T^2"], [0.01, 0.04, 0.16])
    np.testing.assert_allclose(plot.data["guide/memory/T"], [1e6, 2e6, 4e6])
    ax_t, ax_m = plot.figure.axes[:2]
    assert ax_t.get_xscale() == "log" and ax_t.get_yscale() == "log"
    assert ax_m.get_xscale() == "log" and ax_m.get_yscale() == "log"
    assert ax_t.get_ylabel() == "time (ms)" and ax_m.get_ylabel() == "peak memory (MiB)"
    np.testing.assert_allclose(ax_t.lines[0].get_ydata(), np.asarray(times["full"]) * 1e3)
    assert [line.get_label() for line in ax_t.lines] == ["full", "window", "∝ T", "∝ T²"]
    assert plot.save(tmp_path / "scaling.png").stat().st_size > 1000


def test_scaling_figure_time_only_and_bad_arguments() -> None:
    plot = scaling_figure([8, 16], {"a": [2.0, 8.0]}, guides=False, time_label="forward")
    assert len(plot.figure.axes) == 1 and "guide/time/T" not in plot.data
    assert plot.figure.axes[0].get_ylabel() == "forward (s)"
    with pytest.raises(ValueError, match=r"times\['a'\] must have one value per length \(2\)"):
        scaling_figure([8, 16], {"a": [1.0]})
    with pytest.raises(ValueError, match=r"memory\['a'\] must be bytes >= 0"):
        scaling_figure([8, 16], {"a": [1.0, 2.0]}, {"a": [-1.0, 2.0]})
    with pytest.raises(ValueError, match="times must hold at least one series"):
        scaling_figure([8], {})
    with pytest.raises(TypeError, match="memory must be a mapping"):
        scaling_figure([8], {"a": [1.0]}, [1.0])  # type: ignore[arg-type]
