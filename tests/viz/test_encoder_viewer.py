"""The page of ``attnlab view`` on a BERT folder in headless Chromium: the encoder's
self-attention drawn over every key (no look-ahead mask), ``[CLS]``/``[SEP]`` named as special
tokens on hover, no error, nothing fetched."""

from __future__ import annotations

from pathlib import Path

from attnlab.cli import main
from tests.models._encoders import tiny_bert_folder
from tests.viz.test_viewer import _open, browser  # noqa: F401 (the fixture)


def test_encoder_page_marks_special_tokens(browser, tmp_path: Path) -> None:  # noqa: F811
    folder = tiny_bert_folder(tmp_path / "bert")
    out = tmp_path / "v.html"
    assert main(["view", str(folder), "--text", "the cat sat", "-o", str(out)]) == 0
    page, errors, requests = _open(browser, out)
    drawn = page.evaluate("window.attnlabViewer.chosen")
    assert drawn["rows"] == 5  # [CLS] the cat sat [SEP]
    assert "encoder self-attention" in page.inner_text("#groups")
    for row, special in ((0, True), (1, False), (4, True)):
        c = page.evaluate(f"window.attnlabViewer.cellCenter({row}, 4)")
        page.mouse.move(c["x"], c["y"])
        assert ("special token" in page.inner_text("#tip")) == special, row
    page.screenshot(path=str(tmp_path / "encoder.png"))
    assert errors == [] and requests == []
    page.close()
