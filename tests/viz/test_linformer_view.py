"""The viewer and the static figures on a Linformer encoder (issue 12): ``T × k`` weights over
projected ``E·K`` rows, labelled as such, no token-to-token lines, and the effective weights
``A · F`` over the source tokens on a diverging scale."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import attnlab.viz as V
from attnlab import Transformer, TransformerConfig
from attnlab.inspect import capture
from attnlab.viz.viewer import (
    AttentionGroup,
    AttentionLayer,
    ViewerData,
    render_viewer,
    viewer_data,
    write_viewer,
)

# the Chromium fixture and page helpers of the viewer's browser tests
from tests.viz.test_viewer import _canvas_hash, _hover, _open, browser  # noqa: F401

K = 6
SOURCE = ["<s>", "t", "h", "e", "c", "a", "t", "</s>", "<pad>"]  # 9 positions, the last padding
TARGET = ["<bos>", "t", "a", "c"]
ENCODER = ("encoder.layers.0.self_attn", "encoder.layers.1.self_attn")


@pytest.fixture(scope="module")
def captured():
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=30, tgt_vocab_size=30, d_model=32, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=1, d_ff=64, dropout=0.0, max_len=24, attention="linformer",
        linformer_k=K,
    )  # fmt: skip
    model = Transformer(cfg).eval()
    src = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 2, 0], [12, 13, 14, 2, 0, 0, 0, 0, 0]])
    tgt = torch.tensor([[1, 6, 10, 9], [1, 14, 13, 12]])
    with torch.no_grad(), capture(model) as cache:
        model(src, tgt)
    return cache


def _decode(b64: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype="<f4").reshape(shape)


def test_viewer_data_of_a_linformer_model(captured) -> None:
    data = viewer_data(
        captured.attentions,
        source=SOURCE,
        target=TARGET,
        kinds=captured.kinds,
        projected=captured.projected,
    )
    assert [g.name for g in data.groups] == [
        f"encoder self-attention (Linformer, k = {K})",
        "decoder self-attention",
        "decoder cross-attention",
    ]
    payload = data.to_json()
    lin = payload["groups"][0]
    rows = f"E·K rows (k = {K})"
    assert (lin["query"], lin["key"], lin["projected_from"]) == ("source", rows, "source")
    assert payload["sequences"][rows] == [f"E·K row {j}" for j in range(K)]
    assert payload["sequences"]["source"] == SOURCE
    assert lin["note"].startswith(f"keys projected to k = {K} rows (Linformer)")
    assert "not a token" in lin["note"] and "may be negative" in lin["note"]
    assert [layer["name"] for layer in lin["layers"]] == list(ENCODER)
    for layer in lin["layers"]:
        assert layer["heads"] == 4 and layer["mask"] is None
        w = _decode(layer["weights"], (4, 9, K))  # (H, T_q, k): the true shape
        np.testing.assert_array_equal(w, captured.attentions[layer["name"]][0].numpy())
        eff = _decode(layer["effective"], (4, 9, 9))  # (H, T_q, T_k) over the source tokens
        want = captured.effective_weights(layer["name"])[0].numpy()
        np.testing.assert_array_equal(eff, want)
        assert (eff < 0).any() and np.all(eff[:, :, 8] == 0)  # signed; padding gives nothing
    for g in payload["groups"][1:]:  # the token × token groups are as before
        assert g["projected_from"] is None and g["note"] is None
        assert all(layer["effective"] is None for layer in g["layers"])
    # the second sequence of the batch: its own mask, so its own effective weights
    other = viewer_data(
        captured.attentions, source=SOURCE, target=TARGET, kinds=captured.kinds,
        projected=captured.projected, batch_index=1,
    )  # fmt: skip
    eff = other.groups[0].layers[0].effective
    np.testing.assert_array_equal(eff, captured.effective_weights(ENCODER[0])[1].numpy())
    assert np.all(eff[:, :, 4:] == 0)
    # attnlab.viz.view takes the projection from the cache itself
    assert V.view(captured, source=SOURCE, target=TARGET).data.to_json() == payload


def test_a_projected_layer_without_its_projection_is_refused(captured) -> None:
    with pytest.raises(
        ValueError,
        match=r"must be \(H, T_q, T_k\) = \(H, 9, 9\) .*, got \(4, 9, 6\); .* pass projected=cache.projected",
    ):
        viewer_data(captured.attentions, source=SOURCE, target=TARGET, kinds=captured.kinds)


def test_viewer_data_checks_the_effective_weights() -> None:
    seqs = {"tokens": list("abcd"), "rows": ["r0", "r1"]}
    w = np.full((2, 4, 2), 0.5, dtype=np.float32)
    good = AttentionLayer("a", w, effective=np.zeros((2, 4, 4), dtype=np.float32))
    ViewerData("t", seqs, [AttentionGroup("g", "tokens", "rows", [good], projected_from="tokens")])
    with pytest.raises(ValueError, match="no projected keys"):
        ViewerData("t", seqs, [AttentionGroup("g", "tokens", "rows", [good])])
    bad = AttentionLayer("a", w, effective=np.zeros((2, 4, 2), dtype=np.float32))
    with pytest.raises(ValueError, match=r"effective weights of 'a' must be \(H, T_q, T_k\)"):
        ViewerData(
            "t", seqs, [AttentionGroup("g", "tokens", "rows", [bad], projected_from="tokens")]
        )
    with pytest.raises(ValueError, match="names sequence 'nope'"):
        ViewerData(
            "t", seqs, [AttentionGroup("g", "tokens", "rows", [good], projected_from="nope")]
        )


# ----------------------------------------------------------------------------- static figures


def _ticks(ax, axis: str) -> list[str]:
    labels = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    return [t.get_text() for t in labels]


def test_static_figures_draw_t_by_k_weights_with_their_row_labels(captured, tmp_path) -> None:
    name = ENCODER[1]
    w = captured.attentions[name][0]  # (H, T, k)
    rows = captured.key_labels(name)
    heat = V.attention_heatmap(w[2], query_tokens=SOURCE, key_tokens=rows)
    np.testing.assert_array_equal(heat.data["weights"], w[2].numpy())
    ax = heat.figure.axes[0]
    assert _ticks(ax, "x") == rows and _ticks(ax, "y") == SOURCE
    grid = V.head_grid(w, query_tokens=SOURCE, key_tokens=rows, title=name)
    assert grid.data["weights"].shape == (4, 9, K)
    assert _ticks(grid.figure.axes[3], "x") == rows
    assert grid.figure.axes[0].images[0].get_clim() == (0.0, 1.0)
    # a layers × heads grid mixing T × k and T × T layers, labelled per layer
    layers = {n: captured.attentions[n] for n in (*ENCODER, "decoder.layers.0.cross_attn")}
    keys = {n: captured.key_labels(n) or SOURCE for n in layers}
    queries = {n: SOURCE if n in ENCODER else TARGET for n in layers}
    both = V.layer_head_grid(layers, query_tokens=queries, key_tokens=keys)
    assert both.data["weights"].shape == (3, 4, 9, 9)
    assert np.isnan(both.data["weights"][0, :, :, K:]).all()  # k = 6 columns drawn, no more
    assert _ticks(both.figure.axes[4], "x") == rows  # layer 1, head 0: under it the cross layer
    assert _ticks(both.figure.axes[8], "x") == SOURCE
    # the effective weights: a diverging scale symmetric about 0, labelled as such
    eff = captured.effective_weights(name)[0]
    plot = V.attention_heatmap(
        eff[0], query_tokens=SOURCE, key_tokens=SOURCE, value_label="effective weight (A·F)"
    )
    img = plot.figure.axes[0].images[0]
    m = float(eff[0].abs().max())
    assert img.get_clim() == pytest.approx((-m, m)) and img.cmap.name.startswith("RdBu_r")
    assert plot.figure.axes[1].get_ylabel() == "effective weight (A·F)"
    signed = V.head_grid(eff, query_tokens=SOURCE, key_tokens=SOURCE)
    lo, hi = signed.figure.axes[0].images[0].get_clim()
    assert lo == -hi == pytest.approx(-float(eff.abs().max()))
    plot.save(tmp_path / "effective.png")
    grid.save(tmp_path / "grid.png")


# ----------------------------------------------------------------------------- in Chromium


def test_viewer_draws_the_linformer_layer_in_chromium(browser, captured, tmp_path) -> None:  # noqa: F811
    viewer = V.view(captured, source=SOURCE, target=TARGET, title="Linformer encoder")
    html = render_viewer(viewer.data)
    assert "http://" not in html and "https://" not in html
    page, errors, requests = _open(browser, write_viewer(viewer.data, tmp_path / "lin.html"))
    api = "window.attnlabViewer"
    assert page.locator("#groups button").first.inner_text() == (
        f"encoder self-attention (Linformer, k = {K})"
    )
    page.locator("#groups button").first.click()  # the page opens on the cross-attention
    # the page says what the columns are, and offers no token-to-token lines
    assert page.locator("#note").is_visible()
    assert f"keys projected to k = {K} rows (Linformer)" in page.locator("#note").inner_text()
    assert page.locator(".view-btn", has_text="lines").is_disabled()
    drawn = page.evaluate(f"{api}.drawn")
    assert drawn == {
        "view": "matrix", "mode": "weights", "rows": 9, "cols": K,
        "columns": [f"E·K row {j}" for j in range(K)],
    }  # fmt: skip
    assert "projected E·K rows" in page.locator("#info").inner_text()
    # hover: the exact T × k weights of layer 1, head 2
    page.locator("#layers button", has_text="1").click()
    page.locator("#heads button", has_text="2").click()
    w = captured.attentions[ENCODER[1]][0, 2]
    for i, j in ((0, 0), (3, 5), (8, 2)):
        qi, kj, value, text = _hover(page, i, j)
        assert (qi, kj) == (i, j)
        assert value == pytest.approx(float(w[i, j]), rel=1e-6)
        assert f"E·K row {j} (a mix of all positions, not a token)" in text
        assert f"{float(w[i, j]):.6f}" in text
        assert page.locator("#tip").get_attribute("data-mode") == "weights"
    # a "lines" view asked for while the group was elsewhere still draws the matrix here
    page.locator("#groups button", has_text="cross").click()
    assert not page.locator(".view-btn", has_text="lines").is_disabled()
    assert not page.locator("#mode-row").is_visible() and not page.locator("#note").is_visible()
    page.locator(".view-btn", has_text="lines").click()
    assert page.evaluate(f"{api}.drawn")["view"] == "lines"
    page.locator("#groups button", has_text="Linformer").click()
    assert page.evaluate(f"{api}.drawn")["view"] == "matrix"
    page.locator("#layers button", has_text="1").click()  # the cross group had one layer
    # the effective weights A·F over the source tokens: another drawing, signed values on hover
    before = _canvas_hash(page)
    page.locator(".mode-btn", has_text="effective").click()
    assert _canvas_hash(page) != before
    drawn = page.evaluate(f"{api}.drawn")
    assert (drawn["mode"], drawn["rows"], drawn["cols"], drawn["columns"]) == (
        "effective",
        9,
        9,
        SOURCE,
    )
    assert "blue < 0 < red" in page.locator("#info").inner_text()
    eff = captured.effective_weights(ENCODER[1])[0, 2]
    negative = [(i, j) for i in range(9) for j in range(8) if eff[i, j] < 0][:2]
    assert negative
    for i, j in (*negative, (4, 8)):
        qi, kj, value, text = _hover(page, i, j)
        assert (qi, kj) == (i, j)
        assert value == pytest.approx(float(eff[i, j]), rel=1e-6, abs=1e-12)
        assert f"token {j} " in text and "effective weight (A·F)" in text
        assert page.locator("#tip").get_attribute("data-mode") == "effective"
    assert float(page.locator("#tip").get_attribute("data-value")) == 0.0  # padding
    # every head at once, then back to the weights
    page.locator("#heads button", has_text="all").click()
    _, _, value, _ = _hover(page, 5, 1, head=3)
    assert value == pytest.approx(
        float(captured.effective_weights(ENCODER[1])[0, 3, 5, 1]), rel=1e-6
    )
    page.locator(".mode-btn", has_text="weights").click()
    assert page.evaluate(f"{api}.drawn")["cols"] == K
    shot = Path(os.environ.get("ATTNLAB_SHOT_DIR", tmp_path)) / "viewer_linformer.png"
    page.screenshot(path=str(shot), full_page=True)
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert pixels.std() > 10, "the screenshot is blank"
    assert errors == [] and requests == []
    page.close()
