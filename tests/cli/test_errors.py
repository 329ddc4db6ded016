"""How the command line reports errors: a user's mistake in one line (exit 2), a bug with its
traceback (exit 1), ``--verbose`` with the traceback of every error; no message matching."""

from __future__ import annotations

import argparse
import ast
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import matplotlib.figure
import pytest
import torch

import attnlab
import attnlab.cli.flops
from attnlab.cli import CLIError, main
from attnlab.cli.errors import is_user_error, user_message
from attnlab.errors import ArgumentError, ArgumentTypeError, AttnlabError

BUG_SUFFIX = " (this is a bug in attnlab; please report it)"
CLI_DIR = Path(attnlab.cli.__file__).parent


def _attnlab_functions() -> dict[str, Callable[..., Any]]:
    """Functions whose code lies in the attnlab package (as if a module of it defined them)."""
    source = (
        "from attnlab.errors import ArgumentError\n"
        "def raises_on_purpose(*args):\n"
        "    raise ArgumentError('width must be a positive int, got 0')\n"
        "def raises_a_plain_value_error(*args):\n"
        "    raise ValueError('not raised through the hierarchy')\n"
        "def raises_from_a_builtin(*args):\n"
        "    return int('not a number')\n"
        "def calls_with_wrong_arguments(*args):\n"
        "    return len(1, 2)\n"
        "def raises_key_error(*args):\n"
        "    raise KeyError('missing')\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, str(CLI_DIR / "_errors_test_module.py"), "exec"), namespace)
    return namespace


def _raised(fn: Callable[[], object]) -> BaseException:
    try:
        fn()
    except Exception as exc:
        return exc
    raise AssertionError("expected an exception")


def _command(monkeypatch: pytest.MonkeyPatch, fn: Callable[[argparse.Namespace], int]) -> None:
    """Make ``attnlab flops`` run ``fn``."""
    monkeypatch.setattr(attnlab.cli.flops, "run", fn)


# ------------------------------------------------------------------------------ user mistakes


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # a ValueError of the library (attnlab.inspect.flops validates seq_len)
        (["flops", "--seq-len", "0"], "seq_len must be a positive int, got 0"),
        # the command line's own CLIError
        (["plot", "heatmap", "-o", "x.png"], "plot heatmap needs --model RUN_OR_CHECKPOINT"),
        # a FileNotFoundError the library raised with its own message
        (["view", "no/such/run", "--text", "a"], "no such run or checkpoint folder: no/such/run"),
    ],
)
def test_a_user_mistake_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnlab: error: {message}")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_multi_line_message_is_joined_into_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(args: argparse.Namespace) -> NoReturn:
        raise CLIError("first line\n  second line\n")

    _command(monkeypatch, run)
    assert main(["flops"]) == 2
    assert capsys.readouterr().err == "attnlab: error: first line second line\n"


def test_verbose_shows_the_traceback_of_a_user_mistake(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--verbose", "flops", "--seq-len", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "attnlab/inspect/flops.py" in err.replace(os.sep, "/")
    assert err.splitlines()[-1] == "attnlab: error: seq_len must be a positive int, got 0"


def test_a_value_error_raised_on_purpose_by_attnlab_is_the_users(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _command(monkeypatch, _attnlab_functions()["raises_on_purpose"])
    assert main(["flops"]) == 2
    assert capsys.readouterr().err == "attnlab: error: width must be a positive int, got 0\n"


# ------------------------------------------------------------------------------------- bugs


def _assert_bug(err: str, last_line: str) -> None:
    assert err.startswith("Traceback (most recent call last):"), err
    assert err.splitlines()[-1] == f"attnlab: internal error: {last_line}{BUG_SUFFIX}"


def test_a_key_error_is_a_bug_with_its_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(args: argparse.Namespace) -> int:
        return {"a": 1}["boom"]

    _command(monkeypatch, run)
    assert main(["flops"]) == 1
    err = capsys.readouterr().err
    _assert_bug(err, "KeyError: 'boom'")
    assert 'return {"a": 1}["boom"]' in err  # the frame that failed is shown


def test_a_value_error_raised_inside_torch_is_a_bug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(args: argparse.Namespace) -> int:
        # a value attnlab should have validated, caught by torch instead
        torch.nn.functional.dropout(torch.ones(3), p=2.0)
        return 0

    _command(monkeypatch, run)
    assert main(["flops"]) == 1
    err = capsys.readouterr().err
    _assert_bug(err, "ValueError: dropout probability has to be between 0 and 1, but got 2.0")


@pytest.mark.parametrize(
    ("name", "last_line"),
    [
        ("raises_from_a_builtin", "ValueError: invalid literal for int() with base 10: "),
        ("calls_with_wrong_arguments", "TypeError: len() takes exactly one argument (2 given)"),
        ("raises_key_error", "KeyError: 'missing'"),
    ],
)
def test_errors_attnlab_did_not_raise_on_purpose_are_bugs(
    name: str, last_line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _command(monkeypatch, _attnlab_functions()[name])
    assert main(["flops"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert err.splitlines()[-1].startswith(f"attnlab: internal error: {last_line}")
    assert err.endswith(f"{BUG_SUFFIX}\n")


def test_verbose_does_not_change_a_bug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(args: argparse.Namespace) -> NoReturn:
        raise AttributeError("no attribute 'x'")

    _command(monkeypatch, run)
    assert main(["-v", "flops"]) == 1
    err = capsys.readouterr().err
    _assert_bug(err, "AttributeError: no attribute 'x'")
    assert err.count("Traceback") == 1


# -------------------------------------------------------------------------- the user's files


def test_a_read_only_output_path_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # savefig writes into an open file (a temporary sibling of the output): its OSError names
    # no path, and the one-line report names the path the user gave
    def read_only(self: object, fname: object, *args: object, **kwargs: object) -> NoReturn:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", read_only)
    out = tmp_path / "noam.png"
    assert main(["plot", "noam", "--steps", "20", "--warmup", "5", "-o", str(out)]) == 2
    assert capsys.readouterr().err == f"attnlab: error: {out}: {os.strerror(errno.EROFS)}\n"


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write anywhere"
)
def test_a_folder_without_write_permission_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        out = f"{locked}/n.png"
        assert main(["plot", "noam", "--steps", "20", "--warmup", "5", "-o", out]) == 2
        err = capsys.readouterr().err
    finally:
        locked.chmod(0o700)
    assert err == f"attnlab: error: {out}: {os.strerror(errno.EACCES)}\n"


def test_an_output_path_below_a_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "afile").write_text("x")
    out = str(tmp_path / "afile" / "n.png")
    assert main(["plot", "noam", "--steps", "20", "--warmup", "5", "-o", out]) == 2
    assert capsys.readouterr().err == (
        f"attnlab: error: -o/--output must lie in a folder, but {str(tmp_path / 'afile')!r} is "
        f"a file, not a folder (got {out!r})\n"
    )


def test_an_output_path_that_is_a_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "n.png"
    folder.mkdir()
    assert main(["plot", "noam", "--steps", "20", "--warmup", "5", "-o", str(folder)]) == 2
    assert capsys.readouterr().err == f"attnlab: error: {folder}: {os.strerror(errno.EISDIR)}\n"


@pytest.mark.parametrize("device", ["bogus", "cuda:99", "meta"])  # meta: issue 32
def test_an_unknown_device_is_one_line(device: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["generate", "run", "--prompt", "a", "--device", device])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --device" in err and repr(device) in err


# ------------------------------------------------------------------------------------ the rule


def test_the_rule() -> None:
    fns = _attnlab_functions()
    assert is_user_error(CLIError("x"))
    assert is_user_error(_raised(fns["raises_on_purpose"]))
    assert not is_user_error(_raised(fns["raises_a_plain_value_error"]))
    assert is_user_error(ArgumentError("no traceback needed: the type decides"))
    assert is_user_error(ArgumentTypeError("x"))
    assert not is_user_error(_raised(fns["raises_from_a_builtin"]))
    assert not is_user_error(_raised(fns["calls_with_wrong_arguments"]))
    assert not is_user_error(_raised(fns["raises_key_error"]))
    assert not is_user_error(ValueError("never raised: no traceback"))
    assert not is_user_error(_raised(lambda: int("x")))  # raised outside attnlab
    assert not is_user_error(RuntimeError("x"))
    for code in (errno.ENOSPC, errno.EROFS):
        exc = OSError(code, os.strerror(code), "/data/out.png")
        assert is_user_error(exc)
        assert user_message(exc) == f"/data/out.png: {os.strerror(code)}"
    moved = PermissionError(errno.EACCES, "Permission denied", "a", None, "b")
    assert user_message(moved) == "a -> b: Permission denied"
    assert not is_user_error(OSError(errno.EIO, os.strerror(errno.EIO)))
    assert not is_user_error(ConnectionResetError())


def test_the_hierarchy_is_what_python_users_expect() -> None:
    assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentError, AttnlabError)
    assert issubclass(ArgumentTypeError, TypeError) and issubclass(ArgumentTypeError, AttnlabError)
    assert issubclass(CLIError, AttnlabError)
    from attnlab.training.manifest import CheckpointError

    assert issubclass(CheckpointError, ArgumentError)


def test_the_library_raises_its_own_types() -> None:
    """No ``raise ValueError``/``raise TypeError`` in the package: a user's mistake is raised as
    an :class:`~attnlab.errors.AttnlabError`, so the command line can tell it from a bug."""
    offences = []
    for path in sorted(CLI_DIR.parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(exc, ast.Name) and exc.id in ("ValueError", "TypeError"):
                    offences.append(f"{path.name}:{node.lineno} raises {exc.id}")
    assert not offences, offences


def test_the_command_line_never_reads_an_error_message() -> None:
    """In an ``except ... as exc`` of the command line, ``exc`` is never turned into text (no
    ``str(exc)``, f-string, ``exc.args``, ``repr``): what to say is chosen by type, not by
    matching messages."""
    offences = []
    for path in sorted(CLI_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for handler in ast.walk(tree):
            if not isinstance(handler, ast.ExceptHandler) or handler.name is None:
                continue
            for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
                as_text = (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("str", "repr", "format")
                    and any(isinstance(a, ast.Name) and a.id == handler.name for a in node.args)
                ) or (
                    isinstance(node, (ast.FormattedValue, ast.Attribute))
                    and isinstance(node.value, ast.Name)
                    and node.value.id == handler.name
                    and (not isinstance(node, ast.Attribute) or node.attr in ("args", "msg"))
                )
                if as_text:
                    offences.append(f"{path.name}:{node.lineno}")
        assert "import re\n" not in path.read_text(encoding="utf-8"), path.name
    assert not offences, offences
