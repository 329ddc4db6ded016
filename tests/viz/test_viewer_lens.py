"""The viewer's lens panel (attnlab.viz.viewer_lens, ``attnlab view --lens``): the page embeds what
attnlab.inspect.logit_lens computed (top k, probabilities, KL to the output) as it is, bounded,
and Chromium draws it as a layers × positions table whose cells hold the top tokens."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import attnlab as al
from attnlab.cli import main
from attnlab.errors import ArgumentError
from attnlab.inspect import capture, logit_lens
from attnlab.inspect.lens import LensResult
from attnlab.inspect.tuned_lens import TunedLens
from attnlab.viz.viewer import render_viewer, viewer_data
from attnlab.viz.viewer_lens import MAX_LENS_POSITIONS, MAX_TOP_K, add_lens
from tests.cli.test_view_generate import PROMPT, TOKENIZER, _gpt, _never_captured, _save
from tests.viz.test_viewer import _open, browser  # noqa: F401 (the fixture)


def page_json(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', html, re.S)
    assert m
    return json.loads(m.group(1))


def tiny() -> tuple[al.GPT, torch.Tensor, list[str]]:
    torch.manual_seed(0)
    cfg = al.GPTConfig(vocab_size=40, n_positions=16, n_embd=16, n_layer=3, n_head=2,
                       norm="rmsnorm")  # fmt: skip
    ids = torch.randint(0, 40, (1, 6))
    return al.GPT(cfg).eval(), ids, [f"t{i}" for i in ids[0].tolist()]


def test_the_page_embeds_the_lens_numbers_exactly() -> None:
    model, ids, words = tiny()
    with torch.no_grad(), capture(model) as cache:
        model(ids)
    tuned = TunedLens.for_model(model)
    with torch.no_grad():
        for p in tuned.parameters():
            p.normal_(0, 0.1)  # not the identity: the tuned lens differs from the logit lens
    data = viewer_data(cache.attentions, tokens=words)
    for lens in (logit_lens(model, ids), logit_lens(model, ids, tuned=tuned)):
        data = add_lens(data, lens, words, lambda i: f"<{i}>", k=3)
    page = page_json(render_viewer(data))
    assert [v["lens"] for v in page["lenses"]] == ["logit", "tuned"]
    for shown, tuned_or_not in zip(page["lenses"], (None, tuned)):
        lens = logit_lens(model, ids, tuned=tuned_or_not)
        probs, top = lens.top(3)
        assert shown["layers"] == ["embed", "0", "1", "2"] and shown["positions"] == words
        assert shown["top_ids"] == top[:, 0].tolist()
        # float64 through JSON; the page's are taken a layer at a time (another shape: equal to
        # rounding, see design.md "Bit for bit")
        f64 = torch.float64
        close = dict(rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(
            torch.tensor(shown["top_probs"], dtype=f64), probs[:, 0], **close
        )
        kl = lens.kl_to_final()[:, 0]
        torch.testing.assert_close(torch.tensor(shown["kl_bits"], dtype=f64), kl, **close)
        assert shown["tokens"] == {str(i): f"<{i}>" for i in top.unique().tolist()}
        # the output row is the model's own prediction
        assert shown["top_ids"][-1] == model(ids).logits[0].topk(3).indices.tolist()
    assert page["lenses"][0]["top_probs"] != page["lenses"][1]["top_probs"]


def test_the_panel_is_bounded_and_refuses_in_one_line() -> None:
    model, ids, words = tiny()
    lens = logit_lens(model, ids)
    data = viewer_data({"h.0.attn": torch.full((1, 1, 6, 6), 1 / 6)}, tokens=words)
    decode = str
    for k in (0, MAX_TOP_K + 1):
        with pytest.raises(ArgumentError, match="k must be"):
            add_lens(data, lens, words, decode, k=k)
    with pytest.raises(ArgumentError, match="one label per position"):
        add_lens(data, lens, words[:-1], decode)
    t = MAX_LENS_POSITIONS + 1
    wide = LensResult("logit", ("embed", "0"), torch.zeros(2, 1, t, 5), torch.zeros(1, t, 5))
    with pytest.raises(ArgumentError, match=f"at most {MAX_LENS_POSITIONS} positions") as e:
        add_lens(data, wide, ["x"] * t, decode)
    assert "\n" not in str(e.value)
    # a lens of the same kind replaces the one there
    twice = add_lens(add_lens(data, lens, words, decode), lens, words, decode, k=2)
    assert [len(v.top_ids[0][0]) for v in twice.lenses or []] == [2]


def test_view_lens_cli_logit_tuned_and_refusals(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _gpt()
    run = _save(tmp_path / "gpt", model)
    tuned = TunedLens.for_model(model)
    with torch.no_grad():
        for p in tuned.parameters():
            p.normal_(0, 0.1)
    tuned.save(tmp_path / "lens")
    out = tmp_path / "v.html"
    argv = ["view", str(run), "--text", PROMPT, "--lens", f"tuned:{tmp_path / 'lens'}"]
    assert main([*argv, "-o", str(out)]) == 0
    page = page_json(out.read_text())
    logit, tuned_shown = page["lenses"]
    assert (logit["lens"], tuned_shown["lens"]) == ("logit", "tuned")
    assert logit["positions"] == list(PROMPT) and len(logit["layers"]) == 3
    ids = torch.tensor([TOKENIZER.encode(PROMPT)])
    probs, _ = logit_lens(model, ids).top(5)
    torch.testing.assert_close(torch.tensor(logit["top_probs"], dtype=torch.float64), probs[:, 0])
    # more tokens than the panel shows: refused in one line before anything is captured
    torch.manual_seed(0)
    cfg = al.GPTConfig(vocab_size=TOKENIZER.vocab_size, n_positions=256, n_embd=8, n_layer=1,
                       n_head=2)  # fmt: skip
    long = _save(tmp_path / "long", al.GPT(cfg))
    _never_captured(monkeypatch)
    capsys.readouterr()
    assert main(["view", str(long), "--ids", "5 " * 129, "--lens", "logit", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--lens shows at most {MAX_LENS_POSITIONS} positions" in err and "\n" not in err
    # the recorded probe has no lens (it was ignored before)
    assert main(["view", str(run), "--training", "--lens", "logit", "-o", str(out)]) == 2
    assert "--lens" in capsys.readouterr().err


def test_the_lens_panel_in_chromium(browser, tmp_path: Path) -> None:  # noqa: F811
    model = _gpt()
    run = _save(tmp_path / "gpt", model)
    out = tmp_path / "v.html"
    assert main(["view", str(run), "--text", PROMPT, "--lens", "logit", "-o", str(out)]) == 0
    probs, top = logit_lens(model, torch.tensor([TOKENIZER.encode(PROMPT)])).top(5)
    page, errors, requests = _open(browser, out)
    assert page.locator("#lens-panel").is_hidden()  # opens on the attention, as before
    page.click(".view-btn[data-view='lens']")
    assert page.locator("#canvas").is_hidden() and page.locator("#lens-panel").is_visible()
    assert page.locator("#lens-table tbody tr").count() == 3  # embed, after 0, output
    assert (
        page.locator("#lens-table tbody tr").first.locator("th").inner_text() == "output (after 1)"
    )
    row, pos = 1, 4  # after block 0, at the fifth token
    cell = page.locator(f"#lens-table td[data-row='{row}'][data-pos='{pos}']")
    word = TOKENIZER.id_to_token(int(top[row, 0, pos, 0]))
    expected = word.replace(" ", "␣") if not word.strip() else word
    assert cell.locator(".lens-tok").inner_text() == expected
    p = float(probs[row, 0, pos, 0])
    assert cell.locator(".lens-p").inner_text() == f"{round(p * 100)}%"
    cell.hover()  # the tip: the top 5 with Python's probabilities
    tip = page.inner_text("#tip")
    assert "after 0 · position 4" in tip
    for k in range(5):
        assert f"{float(probs[row, 0, pos, k]):.4f}" in tip
    cell.click()  # kept below the table
    assert page.evaluate("window.attnlabViewer.lens.pinned") == [row, pos]
    assert f"{p:.4f}" in page.inner_text("#lens-detail")
    before = cell.evaluate("e => getComputedStyle(e).backgroundColor")
    page.click(".lens-btn[data-value='kl']")
    assert page.evaluate("window.attnlabViewer.lens.colour") == "kl"
    after = page.locator(f"#lens-table td[data-row='{row}'][data-pos='{pos}']")
    assert after.evaluate("e => getComputedStyle(e).backgroundColor") != before
    page.click(".view-btn[data-view='matrix']")  # and back to the attention
    assert page.locator("#canvas").is_visible() and page.locator("#lens-panel").is_hidden()
    assert errors == [] and requests == []
    page.close()
