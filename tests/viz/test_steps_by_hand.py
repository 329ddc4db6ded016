"""One head by hand (:mod:`attnlab.viz.steps_by_hand`): the tutorial's softmax(QKᵀ/√d)V in float64,
the masks of ``plot masks``, and files of ``x`` and weights read with their shapes checked."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.viz.lessons import mask_panel, token_masks
from attnlab.viz.steps_by_hand import check_step_inputs, load_step_inputs, step_panel_by_hand


def _hand(x: np.ndarray, wq: np.ndarray, wk: np.ndarray, wv: np.ndarray) -> dict[str, np.ndarray]:
    """softmax(Q Kᵀ / √d_k) V written out in float64, no library."""
    q, k, v = x @ wq, x @ wk, x @ wv
    s = q @ k.T / math.sqrt(wq.shape[1])
    e = np.exp(s - s.max(axis=1, keepdims=True))
    a = e / e.sum(axis=1, keepdims=True)
    return {"q": q, "k": k, "v": v, "weights": a, "output": a @ v}


def _hands_on(seed: int = 0) -> dict[str, np.ndarray]:
    """The third tutorial's hands-on: three tokens of width 4, one head with d_k = 4."""
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((3, 4)),
        "W_q": rng.standard_normal((4, 4)),
        "W_k": rng.standard_normal((4, 4)),
        "W_v": rng.standard_normal((4, 4)),
    }


def test_hands_on_equals_the_computation_by_hand(tmp_path: Path) -> None:
    h = _hands_on()
    plot = step_panel_by_hand(h["x"], w_q=h["W_q"], w_k=h["W_k"], w_v=h["W_v"], mask="none")
    ref = _hand(h["x"], h["W_q"], h["W_k"], h["W_v"])
    for key in ("q", "k", "v", "weights", "output"):  # both float64: equal to rounding
        np.testing.assert_allclose(plot.data[key], ref[key], rtol=1e-12, atol=1e-12, err_msg=key)
    assert plot.data["mask"].all()
    assert plot.data["w_v"] is not None and np.array_equal(plot.data["w_v"], h["W_v"])
    titles = [ax.get_title() for ax in plot.figure.axes]
    assert any("V = x" in t for t in titles) and any("Z = A" in t for t in titles)
    assert plot.save(tmp_path / "s.png").stat().st_size > 3000


@pytest.mark.parametrize("suffix", [".json", ".pt", ".npz", ".safetensors"])
def test_every_file_format_reads_the_same_numbers(tmp_path: Path, suffix: str) -> None:
    h = _hands_on(1)
    path = tmp_path / f"inputs{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps({k: v.tolist() for k, v in h.items()}))
    elif suffix == ".pt":
        torch.save({k: torch.from_numpy(v) for k, v in h.items()}, path)
    elif suffix == ".npz":
        np.savez(path, **h)
    else:
        from safetensors.torch import save_file

        save_file({k: torch.from_numpy(v) for k, v in h.items()}, str(path))
    got = load_step_inputs(path)
    assert sorted(got) == sorted(h)
    for key, value in h.items():
        assert got[key].dtype == torch.float64
        np.testing.assert_array_equal(got[key].numpy(), value)


def test_missing_weights_are_random_of_the_right_shape() -> None:
    x = np.arange(12.0).reshape(3, 4) / 10
    plot = step_panel_by_hand(x, w_q=np.ones((4, 2)), mask="none", seed=5)
    assert plot.data["w_k"].shape == (4, 2) and plot.data["w_v"].shape == (4, 4)
    ref = _hand(x, np.ones((4, 2)), plot.data["w_k"], plot.data["w_v"])
    np.testing.assert_allclose(plot.data["output"], ref["output"], rtol=1e-12, atol=1e-12)
    again = step_panel_by_hand(x, w_q=np.ones((4, 2)), mask="none", seed=5)
    np.testing.assert_array_equal(again.data["w_k"], plot.data["w_k"])


def test_masks_are_those_of_plot_masks() -> None:
    tokens = "the cat sat on the mat <pad> <pad>".split()
    x = np.random.default_rng(0).standard_normal((8, 6))
    plot = step_panel_by_hand(x, tokens=tokens, mask="causal")
    np.testing.assert_array_equal(plot.data["mask"], mask_panel(tokens).data["combined"])
    assert (plot.data["weights"][:, 6:] == 0).all()  # no weight on a padding key, exactly
    assert (plot.data["weights"][:, :6] > 0).sum() == 6 * 7 / 2 + 2 * 6  # the causal triangle
    np.testing.assert_allclose(plot.data["weights"].sum(1), 1.0, atol=1e-12)
    padding = step_panel_by_hand(x, tokens=tokens, mask="padding")
    np.testing.assert_array_equal(padding.data["mask"], token_masks(tokens)["padding"].numpy())
    assert (padding.data["weights"][:, 6:] == 0).all() and (
        padding.data["weights"][:, :6] > 0
    ).all()


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"W_q": [[1.0]]}, "inputs must hold 'x' (T × d_model)"),
        ({"x": [[1.0, 2.0]], "W_o": [[1.0]]}, "unknown key(s) 'W_o'; allowed: x, W_q, W_k, W_v"),
        ({"x": [1.0, 2.0]}, "inputs['x'] must be a 2-D matrix (T × d_model), got (2,)"),
        ({"x": np.ones((3, 4)), "W_q": np.ones((3, 4))},
         "inputs['W_q'] must be (d_model, d) = (4, d) to multiply x (3, 4), got (3, 4)"),
        ({"x": np.ones((3, 4)), "W_q": np.ones((4, 2)), "W_k": np.ones((4, 3))},
         "inputs['W_k'] must be (4, 2) like W_q (queries and keys share d_k), got (4, 3)"),
        ({"x": np.ones((3, 4)), "W_v": np.ones((5, 4))},
         "inputs['W_v'] must be (d_model, d) = (4, d) to multiply x (3, 4), got (5, 4)"),
        ({"x": [[1.0, float("nan")]]}, "inputs['x'] holds NaN or inf"),
        ({"x": [["a", "b"]]}, "inputs['x'] must be a matrix of numbers"),
    ],
)  # fmt: skip
def test_bad_inputs_name_the_key_and_the_shapes(inputs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        check_step_inputs(inputs)
    assert message in str(info.value)


def test_bad_files_say_why(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_step_inputs(tmp_path / "none.json")
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(
        ValueError, match=r"must be \.json, \.pt, \.npz or \.safetensors, got 'a.txt'"
    ):
        load_step_inputs(tmp_path / "a.txt")
    (tmp_path / "b.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"could not be read as \.json"):
        load_step_inputs(tmp_path / "b.json")
    (tmp_path / "c.json").write_text("[[1, 2]]")
    with pytest.raises(ValueError, match="must hold a mapping of x, W_q, W_k, W_v, got list"):
        load_step_inputs(tmp_path / "c.json")
    with pytest.raises(ValueError, match="tokens must hold one label per row of x"):
        step_panel_by_hand(np.ones((3, 4)), tokens=["a", "b"])
    with pytest.raises(ValueError, match="mask must be 'none', 'padding' or 'causal'"):
        step_panel_by_hand(np.ones((3, 4)), mask="full")
