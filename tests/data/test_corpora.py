"""The datasets packaged with attnlab (attnlab.data.corpora): no network, no file beside the repo."""

from __future__ import annotations

import pytest
import tomllib
import torch

from attnlab.data import corpora
from attnlab.data.parallel import read_parallel
from attnlab.data.text import split_train_val
from tests.conftest import REPO


def test_the_registry_lists_both_datasets_with_their_licences() -> None:
    assert corpora.names() == ["tinyshakespeare", "small_parallel_enja"]
    assert corpora.names("text") == ["tinyshakespeare"]
    assert corpora.names("parallel") == ["small_parallel_enja"]
    shakespeare = corpora.dataset("tinyshakespeare")
    assert "public domain" in shakespeare.licence and "MIT" in shakespeare.licence
    assert "karpathy/char-rnn" in shakespeare.source
    assert "CC BY 2.0 FR" in corpora.dataset("small_parallel_enja").licence
    notice = corpora.licence_text("tinyshakespeare")
    assert "Copyright (c) 2015 Andrej Karpathy" in notice and "public domain" in notice
    notice = corpora.licence_text("small_parallel_enja")
    assert "CC BY 2.0 FR" in notice and "odashi/small_parallel_enja" in notice
    assert "Corpus Statistics" in notice  # the repository's README, kept with the data


def test_tinyshakespeare_is_the_whole_text_and_splits_as_nanogpt() -> None:
    text = corpora.load_text("tinyshakespeare")
    assert len(text) == 1_115_394
    assert text.startswith("First Citizen:\nBefore we proceed any further, hear me speak.")
    train, val = split_train_val(torch.arange(len(text)))
    assert (train.numel(), val.numel()) == (1_003_854, 1_115_394 - 1_003_854)


def test_small_parallel_enja_has_its_three_splits() -> None:
    sizes = {s: len(corpora.load_parallel("small_parallel_enja", s)) for s in corpora.SPLITS}
    assert sizes == {"train": 50_000, "dev": 500, "test": 500}
    train = corpora.load_parallel("small_parallel_enja")
    assert train.src[0] == "i can 't tell who will arrive first ."
    assert train.tgt[0] == "誰 が 一番 に 着 く か 私 に は 分か り ま せ ん 。"


def test_a_split_reads_as_the_files_would(tmp_path) -> None:
    dev = corpora.load_parallel("small_parallel_enja", "dev")
    (tmp_path / "dev.en").write_text("\n".join(dev.src) + "\n", encoding="utf-8")
    (tmp_path / "dev.ja").write_text("\n".join(dev.tgt) + "\n", encoding="utf-8")
    assert read_parallel(tmp_path / "dev.en", tmp_path / "dev.ja") == dev


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: corpora.load_text("shakespeare"), "packaged text dataset .*tinyshakespeare"),
        (lambda: corpora.load_text("small_parallel_enja"), "got 'small_parallel_enja'"),
        (lambda: corpora.load_parallel("tinyshakespeare"), "packaged parallel dataset"),
        (lambda: corpora.load_parallel("small_parallel_enja", "valid"), "split must be one of"),
        (lambda: corpora.licence_text("nope"), "small_parallel_enja"),
        (lambda: corpora.resource_file("tinyshakespeare", "x.xz"), "file must be one of"),
    ],
)
def test_unknown_names_are_one_line_errors_listing_the_known_ones(call, message) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_every_packaged_file_is_in_the_wheel_and_small() -> None:
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["attnlab"]
    package = REPO / "src" / "attnlab"
    shipped = {p for pattern in patterns for p in package.glob(pattern)}
    total = 0
    for ds in corpora.available().values():
        for name in (*ds.files, "LICENSE.txt"):
            path = corpora.resource_file(ds.name, ds.files[0]).with_name(name)
            assert path in shipped, path
            total += path.stat().st_size
    assert total < 3_000_000  # compressed: about 1.3 MB in all
