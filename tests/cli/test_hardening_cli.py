"""The command line under faults and hostile input (issue 10, items 6, 9, 13 and 14).

* The file system: a read-only folder and a full disk are real ``tmpfs`` mounts where this
  process may mount (root, as in the project's sandbox); elsewhere the figure and viewer cases
  inject the same ``OSError`` at the write and the training cases are skipped.
* Terminal safety: a model's text reaches a terminal with its control characters escaped.
* Messages and start-up: Ctrl-C while the command line starts is one line and exit 130.
* Consistency: lengths a model cannot hold are refused.
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import attnlab._files
from attnlab import GPT, GPTConfig, Transformer, TransformerConfig
from attnlab.cli import main
from attnlab.cli._terminal import TextConsole, escape_controls
from attnlab.data.tokenizers import BOS, EOS, PAD, UNK, CharTokenizer
from attnlab.models.config import config_to_dict
from attnlab.training.checkpoint import save_checkpoint

REPO = Path(__file__).resolve().parents[2]
LM_TINY = ["--block-size", "16", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
           "--batch-size", "4", "--eval-iters", "2", "--warmup", "2", "--lr-decay-steps", "10"]  # fmt: skip
LM_TEXT = "to be, or not to be, that is the question:\nwhether 'tis nobler in the mind\n" * 8
ESC_CHARS = CharTokenizer(list("\x1b[2J\x07]0;ab"))


# ------------------------------------------------------------------------------------- helpers


def _one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("attnlab: error: "), err
    return err


def _gpt_checkpoint(where: Path, tok: CharTokenizer = ESC_CHARS) -> Path:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tok.vocab_size, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    model = GPT(cfg).eval()
    files = {"tokenizer.json": tok.to_json()}
    save_checkpoint(where, step=1, model=model, config={"model": config_to_dict(cfg)}, files=files)
    return where


def _seq2seq_checkpoint(where: Path) -> Path:
    tok = CharTokenizer(list("abc"), [PAD, UNK, BOS, EOS])
    cfg = TransformerConfig(
        src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=16, num_heads=2,
        num_encoder_layers=1, num_decoder_layers=1, d_ff=32, max_len=32,
    )  # fmt: skip
    model = Transformer(cfg).eval()
    files = {"tokenizer.json": tok.to_json()}
    save_checkpoint(where, step=1, model=model, config={"model": config_to_dict(cfg)}, files=files)
    return where


def _tree(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` with the SHA-256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _can_mount() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str, str], Path | None]]:
    """``mount(name, size)``: a fresh tmpfs of ``size`` at ``tmp_path / name``, or ``None`` when
    this process cannot mount. Everything mounted is unmounted afterwards."""
    mounted: list[Path] = []

    def mount(name: str, size: str = "256k") -> Path | None:
        where = tmp_path / name
        where.mkdir()
        if not _can_mount():
            return None
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
            capture_output=True,
            timeout=60,
        )
        if done.returncode != 0:
            return None
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=60)


def _remount_read_only(where: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, timeout=60)


def _fill(where: Path, leave: int = 0) -> None:
    """Fill the file system of ``where`` up to its last byte (then free ``leave`` bytes)."""
    spare = where / "spare"
    if leave:
        spare.write_bytes(b"\0" * leave)
    with open(where / "filler", "wb", buffering=0) as f:
        while True:
            try:
                f.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    if leave:
        spare.unlink()


def _failing_folder(
    kind: str, tmpfs: Callable[[str, str], Path | None], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, files: dict[str, bytes],
) -> Path:  # fmt: skip
    """A folder holding ``files`` where writing a new file fails: a real read-only or full tmpfs
    where this process may mount, else one where attnlab's writes get that OSError."""
    code = errno.EROFS if kind == "read-only" else errno.ENOSPC
    where = tmpfs(kind, "256k")
    if where is not None:
        for name, content in files.items():
            (where / name).write_bytes(content)
        _remount_read_only(where) if kind == "read-only" else _fill(where)
        return where
    where = tmp_path / kind
    for name, content in files.items():
        (where / name).write_bytes(content)
    real_open = builtins.open

    def failing_open(file: object, mode: str = "r", *args: object, **kwargs: object) -> object:
        if Path(str(file)).parent == where and set(mode) & set("wxa"):
            raise OSError(code, os.strerror(code))
        return real_open(file, mode, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(attnlab._files, "open", failing_open, raising=False)
    return where


class _Terminal(io.StringIO):
    """A standard output that says it is a terminal."""

    def isatty(self) -> bool:
        return True


# ------------------------------------------------------------------- 6. the file system


@pytest.mark.parametrize("kind", ["read-only", "full"])
def test_view_and_plot_on_a_read_only_folder_or_a_full_disk_lose_nothing(
    kind: str,
    tmpfs: Callable[[str, str], Path | None],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = _gpt_checkpoint(tmp_path / "run")
    old = {"view.html": b"<p>the good viewer</p>", "noam.png": b"the good figure"}
    where = _failing_folder(kind, tmpfs, tmp_path, monkeypatch, old)
    before = set(os.listdir(where))
    reason = os.strerror(errno.EROFS if kind == "read-only" else errno.ENOSPC)
    commands = {
        "view.html": ["view", str(run), "--text", "ab", "-o", str(where / "view.html")],
        "noam.png": ["plot", "noam", "--steps", "20", "--warmup", "5", "-o", str(where / "noam.png")],
        "heads.svg": ["plot", "heads", "--model", str(run), "--text", "ab", "-o", str(where / "heads.svg")],
    }  # fmt: skip
    for name, argv in commands.items():
        assert main(argv) == 2, name
        # before: a traceback-free "[Errno 28] No space left on device" without the path, and a
        # truncated file in place of the good one
        assert _one_line(capsys.readouterr().err) == f"attnlab: error: {where / name}: {reason}\n"
    assert {name: (where / name).read_bytes() for name in old} == old
    assert set(os.listdir(where)) == before  # no temporary file left behind


@pytest.mark.skipif(not _can_mount(), reason="needs to mount a tmpfs (root)")
def test_train_on_a_read_only_folder_is_one_line_and_changes_nothing(
    tmpfs: Callable[[str, str], Path | None], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "text.txt"
    data.write_text(LM_TEXT, encoding="utf-8")
    where = tmpfs("runs", "4m")
    assert where is not None
    run = where / "run"
    train = ["train", "lm", "--data", str(data), "--out", str(run), *LM_TINY]
    assert main([*train, "--steps", "2"]) == 0
    before = _tree(where)
    _remount_read_only(where)
    capsys.readouterr()
    reason = os.strerror(errno.EROFS)
    assert main([*train, "--steps", "4", "--resume"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert err.startswith(f"attnlab: error: {run}/") and err.endswith(f": {reason}\n"), err
    new = ["train", "lm", "--data", str(data), "--out", str(where / "new"), "--steps", "2"]
    assert main([*new, *LM_TINY]) == 2
    assert _one_line(capsys.readouterr().err) == f"attnlab: error: {where / 'new'}: {reason}\n"
    assert _tree(where) == before
    assert main(["generate", str(run), "--prompt", "to", "--max-new-tokens", "3"]) == 0


@pytest.mark.skipif(not _can_mount(), reason="needs to mount a tmpfs (root)")
@pytest.mark.parametrize("leave", [16 * 1024, 0], ids=["room-for-the-lock", "no-byte-left"])
def test_train_on_a_full_disk_is_one_line_and_keeps_the_last_checkpoint(
    tmpfs: Callable[[str, str], Path | None],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    leave: int,
) -> None:
    data = tmp_path / "text.txt"
    data.write_text(LM_TEXT, encoding="utf-8")
    where = tmpfs("runs", "256k")
    assert where is not None
    run = where / "run"
    train = ["train", "lm", "--data", str(data), "--out", str(run), *LM_TINY]
    assert main([*train, "--steps", "2"]) == 0
    latest = (run / "checkpoints" / "latest").read_text()
    checkpoint = _tree(run / "checkpoints")
    _fill(where, leave=leave)  # 16 KiB: room for the lock and a few metrics, not a checkpoint
    capsys.readouterr()
    assert main([*train, "--steps", "4", "--resume"]) == 2
    # off a terminal the progress is plain "lm step N/4 ..." lines; then the one error line
    err = "".join(x for x in capsys.readouterr().err.splitlines(True) if " step " not in x)
    assert _one_line(err).endswith(f": {os.strerror(errno.ENOSPC)}\n")
    assert err.startswith(f"attnlab: error: {run}/"), err  # issue 32: the errno alone, no path
    assert (run / "checkpoints" / "latest").read_text() == latest
    assert _tree(run / "checkpoints") == checkpoint
    assert main(["generate", str(run), "--prompt", "to", "--max-new-tokens", "3"]) == 0


# ------------------------------------------------------------------- 9. terminal safety


def test_escape_controls() -> None:
    assert escape_controls("\x1b[2Jgone") == "\\x1b[2Jgone"
    assert escape_controls("a\tb\nc\r\nd") == "a\tb\nc\r\nd"  # tabs, newlines, CRLF stay
    assert escape_controls("bar\rover") == "bar\\x0dover"  # a lone carriage return rewrites
    assert escape_controls("\x00\x07\x08\x7f\x9b") == "\\x00\\x07\\x08\\x7f\\x9b"  # C1 CSI too
    assert escape_controls("élan 猫 \\x1b") == "élan 猫 \\x1b"  # the rest unchanged
    for code in range(0x110000):
        ch = chr(code)
        if 0xD800 <= code <= 0xDFFF:
            continue
        escaped = escape_controls(ch)
        if ch in "\t\n" or not (code < 0x20 or 0x7F <= code < 0xA0):
            assert escaped == ch
        else:
            assert escaped == f"\\x{code:02x}"


def test_text_console_escapes_only_on_a_terminal() -> None:
    text = "hi\x1b]0;owned\x07 there\r!"
    for file, raw, shown in [
        (_Terminal(), False, "hi\\x1b]0;owned\\x07 there\\x0d!\n"),
        (_Terminal(), True, text + "\n"),
        (io.StringIO(), False, text + "\n"),
    ]:
        console = TextConsole(raw=raw, file=file)
        console.print_text(text)
        assert file.getvalue() == shown
    report = _Terminal()  # what a task's report prints through the console, markup included
    TextConsole(file=report, color_system=None).print(f"[bold]sample:[/bold] {text}")
    assert report.getvalue() == "sample: hi\\x1b]0;owned\\x07 there\\x0d!\n"


def test_generate_escapes_control_characters_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _gpt_checkpoint(tmp_path / "run")
    argv = ["generate", str(run), "--prompt", "\x1b[2Jab", "--max-new-tokens", "4",
            "--strategy", "greedy"]  # fmt: skip
    assert main(argv) == 0
    raw = capsys.readouterr().out  # a pipe: the bytes as decoded
    assert raw.startswith("\x1b[2Jab") and raw.endswith("\n")
    for extra, expected in [([], escape_controls(raw)), (["--raw"], raw)]:
        terminal = _Terminal()
        monkeypatch.setattr(sys, "stdout", terminal)
        assert main([*argv, *extra]) == 0
        monkeypatch.undo()
        assert terminal.getvalue() == expected
    assert escape_controls(raw).startswith("\\x1b[2Jab") and "\x1b" not in escape_controls(raw)


def test_translate_escapes_control_characters_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnlab.tasks.seq2seq import Seq2SeqIO

    run = _seq2seq_checkpoint(tmp_path / "run")
    hostile = "\x1b]0;owned\x07\x1b[2Jdone"

    def decode_output(self: object, ids: object) -> str:
        return hostile  # what a model may decode

    monkeypatch.setattr(Seq2SeqIO, "decode_output", decode_output)
    pipe = sys.stdout
    for extra, expected in [([], "\\x1b]0;owned\\x07\\x1b[2Jdone\n"), (["--raw"], hostile + "\n")]:
        terminal = _Terminal()
        monkeypatch.setattr(sys, "stdout", terminal)
        assert main(["translate", str(run), "abc", *extra]) == 0
        monkeypatch.setattr(sys, "stdout", pipe)
        assert terminal.getvalue() == expected
    assert main(["translate", str(run), "abc"]) == 0
    assert capsys.readouterr().out == hostile + "\n"  # a pipe keeps the bytes


def test_a_training_report_escapes_control_characters_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "esc.txt"
    data.write_text("\x1b[2J" * 100, encoding="utf-8")  # the sample starts at "\x1b"
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    argv = ["train", "lm", "--data", str(data), "--out", str(tmp_path / "run"), "--steps", "1"]
    assert main([*argv, *LM_TINY]) == 0
    monkeypatch.undo()
    out = re.sub(r"\x1b\[[0-9;]*m", "", terminal.getvalue())  # rich's own colours
    sample = out.split("sample:\n", 1)[1]
    assert sample.startswith("\\x1b") and "\x1b" not in out


# ------------------------------------------------------------- 13. messages and start-up


def test_ctrl_c_while_the_commands_are_imported_or_parsed_is_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import attnlab.cli

    def interrupt(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    for target, name in [(attnlab.cli, "build_parser"), (attnlab.cli.importlib, "import_module")]:
        monkeypatch.setattr(target, name, interrupt)
        assert main(["flops"]) == 130
        monkeypatch.undo()
        assert capsys.readouterr().err == "attnlab: interrupted\n"
    monkeypatch.setattr(attnlab.cli._Parser, "parse_args", interrupt)
    assert main(["flops"]) == 130
    assert capsys.readouterr().err == "attnlab: interrupted\n"


STOP_AT_IMPORT = """
import runpy, sys

class Stop:  # Ctrl-C while {module} is being imported
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, Stop())
sys.argv = ["attnlab", "flops"]
runpy.run_module("attnlab", run_name="__main__", alter_sys=True)
"""


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )


@pytest.mark.parametrize("module", ["attnlab.cli", "attnlab.cli.flops"])
def test_ctrl_c_during_start_up_of_python_m_attnlab(module: str) -> None:
    done = _python(STOP_AT_IMPORT.format(module=module))
    assert (done.returncode, done.stderr) == (130, "attnlab: interrupted\n")


SIGINT_AT_IMPORT = """
import os, runpy, signal, sys, time

class Interrupt:  # a real Ctrl-C (SIGINT) while {module} is being imported
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
            try:  # as a library may: the interrupt turned into another error
                time.sleep(5)
            except KeyboardInterrupt:
                raise ImportError("cannot load module more than once per process")
        return None

sys.meta_path.insert(0, Interrupt())
sys.argv = ["attnlab", "flops"]
runpy.run_module("attnlab", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module", ["torch", "numpy"])
def test_a_real_ctrl_c_while_torch_imports_is_one_line_and_130(module: str) -> None:
    # issue 32: `import attnlab` imported torch before __main__ could catch anything, and an
    # interrupt inside numpy's import came back as numpy's ImportError: both were tracebacks
    done = _python(SIGINT_AT_IMPORT.format(module=module))
    assert (done.returncode, done.stderr) == (130, "attnlab: interrupted\n")


def test_import_attnlab_imports_no_torch() -> None:
    done = _python("import sys, attnlab, attnlab.cli; print('torch' in sys.modules, attnlab.GPT)")
    assert done.stdout == "False <class 'attnlab.models.gpt.GPT'>\n", done.stderr


@pytest.fixture
def probe_run(tmp_path: Path) -> Path:
    data = tmp_path / "text.txt"
    data.write_text(LM_TEXT, encoding="utf-8")
    run = tmp_path / "run"
    argv = ["train", "lm", "--data", str(data), "--out", str(run), "--steps", "1",
            "--probe", "to be", "--probe-every", "1", *LM_TINY]  # fmt: skip
    assert main(argv) == 0
    return run


@pytest.mark.parametrize(
    "content",
    ["3", '"x"', "[1]", '{"kinds": 3, "sequences": {}, "layer_sequences": {}}',
     '{"kinds": {"transformer.h.0.attn": "self"}, "sequences": {"tokens": 3}, '
     '"layer_sequences": {"transformer.h.0.attn": ["tokens", "tokens"]}}'],
    ids=["int", "str", "list", "kinds-int", "sequence-int"],
)  # fmt: skip
def test_a_crafted_probe_file_is_one_line(
    content: str, probe_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # "'int' object is not subscriptable", "string indices must be integers", … as bugs (exit 1)
    (probe_run / "probe" / "probe.json").write_text(content, encoding="utf-8")
    capsys.readouterr()
    assert main(["plot", "training", str(probe_run), "-o", str(tmp_path / "t.png")]) == 2
    _one_line(capsys.readouterr().err)


def test_a_data_file_too_short_for_the_block_size_names_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "short.txt"
    data.write_text("abcdefghijklmnopqrstuvwxyz0123456789", encoding="utf-8")
    argv = ["train", "lm", "--data", str(data), "--out", str(tmp_path / "run"), "--steps", "1"]
    assert main([*argv, *LM_TINY]) == 2  # --block-size 16; 36 characters: 32 train, 4 validation
    err = _one_line(capsys.readouterr().err)
    assert "--block-size" in err and re.search(r"\b4\b", err)  # the option and what came


# --------------------------------------------------------------------- 14. consistency


@pytest.mark.parametrize("command", ["view", "plot"])
def test_a_negative_max_new_tokens_is_refused(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _gpt_checkpoint(tmp_path / "run")
    argv = [command, *(["heads", "--model"] if command == "plot" else []), str(run),
            "--text", "ab", "--max-new-tokens", "-5", "-o", str(tmp_path / "out.svg")]  # fmt: skip
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        f"attnlab {command}: error: argument --max-new-tokens: "
        "expected a non-negative int, got -5\n"
    )
    assert not (tmp_path / "out.svg").exists()


def test_flops_refuses_a_length_the_model_cannot_hold(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["flops", "--seq-len", "4096", "--preset", "gpt2"]) == 2
    assert _one_line(capsys.readouterr().err) == (
        "attnlab: error: --seq-len must be at most 1024, the longest sequence the gpt2 model "
        "holds, got 4096 (pass --n-positions 4096 for a model with a longer context)\n"
    )
    assert main(["flops", "--preset", "transformer-base", "--src-len", "2048"]) == 2
    assert "--src-len must be at most 1024" in _one_line(capsys.readouterr().err)
    assert main(["flops", "--seq-len", "4096", "--n-positions", "4096", "--json"]) == 0
    assert '"embedding/position": 3145728' in capsys.readouterr().out  # 4096 × 768
    assert main(["flops", "--seq-len", "1024"]) == 0  # the limit itself
    assert main(["flops", "--n-positions", "512"]) == 0  # the default length follows the model
    assert "seq_len 512" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["flops", "--help"])
    assert "--n-positions sets a model with a longer context" in " ".join(
        capsys.readouterr().out.split()
    )


def test_help_is_plain_text_and_per_figure(capsys: pytest.CaptureFixture[str]) -> None:
    """``plot steps --help`` used to print the help of every figure; ``demo --help`` showed
    reStructuredText (````attnlab demo````); ``attnlab --help`` did not name ``inspect``'s
    ``--roles``/``--qk-spectrum``/``--ablate``."""
    with pytest.raises(SystemExit):
        main(["plot", "steps", "--help"])
    steps = capsys.readouterr().out
    assert steps.startswith("usage: attnlab plot steps") and "--inputs" in steps
    assert "--warmup" not in steps and "--roles-seed" not in steps  # noam's, roles' options
    with pytest.raises(SystemExit):
        main(["plot", "--help"])
    assert "--warmup" in capsys.readouterr().out  # without a KIND: every option
    for command in ("demo", "generate", "train", "translate", "bench"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "``" not in capsys.readouterr().out, command
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert all(flag in top for flag in ("--roles", "--qk-spectrum", "--ablate"))
