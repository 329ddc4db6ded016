"""Writing figures, viewers and histories: a bad path is one clear error, a failed write loses
nothing (``attnlab.viz.files``)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import NoReturn

import pytest

from attnlab.viz import noam_curve, viewer_data_from_history, write_viewer
from attnlab.viz.files import check_output_path, write_file
from tests.viz.histories import gpt_history


def _writers() -> dict[str, object]:
    history = gpt_history([0, 10], layers=1)
    data = viewer_data_from_history(history)
    return {
        "save_figure": lambda p: noam_curve(steps=10).save(p),
        "write_viewer": lambda p: write_viewer(data, p),
        "ProbeHistory.save": history.save,
    }


SUFFIX = {"save_figure": ".png", "write_viewer": ".html", "ProbeHistory.save": ".pt"}


@pytest.mark.parametrize("writer", list(SUFFIX))
@pytest.mark.parametrize("depth", [1, 2], ids=["parent", "grandparent"])
def test_a_parent_that_is_a_file_is_a_value_error_naming_the_path(
    writer: str, depth: int, tmp_path: Path
) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("mine")
    path = blocker / ("sub/" if depth == 2 else "") / f"out{SUFFIX[writer]}"
    write = _writers()[writer]
    with pytest.raises(ValueError) as info:
        write(path)  # type: ignore[operator]
    assert str(info.value) == (
        f"path must lie in a folder, but {str(blocker)!r} is a file, not a folder "
        f"(got {str(path)!r})"
    )
    assert blocker.read_text() == "mine"


@pytest.mark.parametrize("writer", list(SUFFIX))
def test_writers_create_parent_folders_and_leave_no_temporary_file(
    writer: str, tmp_path: Path
) -> None:
    path = tmp_path / "a" / "b" / f"out{SUFFIX[writer]}"
    assert _writers()[writer](path) == path  # type: ignore[operator]
    assert path.stat().st_size > 100
    assert os.listdir(path.parent) == [path.name]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EDQUOT])
def test_a_failed_write_keeps_the_old_file_and_names_the_path(code: int, tmp_path: Path) -> None:
    path = tmp_path / "view.html"
    path.write_text("the good one")

    def full(f: object) -> NoReturn:
        raise OSError(code, os.strerror(code))  # what writing into an open file raises

    with pytest.raises(OSError) as info:
        write_file(path, full)
    assert (info.value.errno, info.value.filename) == (code, str(path))
    assert path.read_text() == "the good one"
    assert os.listdir(tmp_path) == ["view.html"]


def test_an_error_of_another_file_and_a_bug_pass_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "out.png"
    path.write_bytes(b"old")
    other = FileNotFoundError(errno.ENOENT, "No such file or directory", "/fonts/x.ttf")

    def missing_font(f: object) -> NoReturn:
        raise other

    with pytest.raises(FileNotFoundError) as info:
        write_file(path, missing_font)
    assert info.value is other

    def bug(f: object) -> NoReturn:
        raise KeyError("x")

    with pytest.raises(KeyError):
        write_file(path, bug)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.png"]


def test_a_folder_is_not_a_file_and_a_link_is_written_through(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError) as info:
        check_output_path(tmp_path)
    assert info.value.filename == str(tmp_path)
    target = tmp_path / "real.html"
    target.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    write_file(link, lambda f: f.write(b"new"))
    assert link.is_symlink() and target.read_text() == "new"
