"""The cache of a GGUF file's dequantised weights (attnlab.models.weight_cache).

Every test points ``ATTNLAB_CACHE`` at its own ``tmp_path`` (the suite's default is a
temporary folder too: tests/conftest.py); the GGUF files are the tiny ones of test_gguf.py, with
a small byte-level BPE tokenizer added.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType as Q

import attnlab
from attnlab.cli import main
from attnlab.errors import ArgumentTypeError
from attnlab.models import weight_cache
from attnlab.models.gguf import read_gguf
from attnlab.models.weight_cache import cache_dir, cache_path, read_gguf_cached
from tests.models.test_gguf import write_tiny

LETTERS = [chr(c) for c in range(ord("a"), ord("a") + 26)]
MERGES = ["a b", "a t", "c a", "Ġ t", "t h", "th e", "Ġ c", "Ġc a", "s a", "Ġ s"]
TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "Ġ", *LETTERS] + [
    m.replace(" ", "") for m in MERGES
]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


def add_tokenizer(writer: gguf.GGUFWriter) -> None:
    """A byte-level BPE tokenizer of 40 tokens (three control tokens) and a chat template."""
    assert len(TOKENS) == 40
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3, 3, 3] + [1] * (len(TOKENS) - 3))
    writer.add_token_merges(MERGES)
    writer.add_add_bos_token(True)
    writer.add_chat_template(TEMPLATE)


def tiny(path: Path, qtype: Q = Q.Q8_0, **kwargs: Any) -> Path:
    write_tiny(path, qtype=qtype, extra=add_tokenizer, **kwargs)
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("ATTNLAB_CACHE", str(folder))
    return folder


def entries(folder: Path) -> list[Path]:
    weights = folder / "weights"
    return sorted(weights.iterdir()) if weights.is_dir() else []


def assert_same(a: Any, b: Any) -> None:
    """Two GGUFModels: bit-identical weights, the same config, metadata and tokenizer."""
    assert a.state.keys() == b.state.keys()
    for name in a.state:
        assert a.state[name].dtype == b.state[name].dtype, name
        assert torch.equal(a.state[name], b.state[name]), name
    assert a.hf_config == b.hf_config
    assert a.metadata == b.metadata
    text = "the cat sat<|im_end|>"
    assert a.tokenizer.encode(text) == b.tokenizer.encode(text)
    assert a.tokenizer.chat_template == b.tokenizer.chat_template == TEMPLATE
    assert (a.tokenizer.bos_id, a.tokenizer.add_bos) == (b.tokenizer.bos_id, b.tokenizer.add_bos)


def no_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, reading the GGUF file (dequantising, or opening its reader) fails."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the GGUF file was read")

    monkeypatch.setattr(weight_cache, "read_gguf", refuse)
    monkeypatch.setattr(weight_cache, "read_gguf_metadata", refuse)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_second_read_is_bit_identical_and_reads_no_gguf(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any, dtype: Any
) -> None:
    path = tiny(tmp_path / "tiny.gguf")
    fresh = read_gguf(path, dtype=dtype)
    with caplog.at_level(logging.WARNING):
        first = read_gguf_cached(path, dtype=dtype)
    assert [e.name for e in entries(cache)] == [cache_path(path, dtype).name]
    assert "cached the dequantised weights of tiny.gguf" in caplog.text
    assert len(caplog.text.strip().splitlines()) == 1  # one line, the first time
    caplog.clear()
    no_reading(monkeypatch)
    with caplog.at_level(logging.WARNING):
        second = read_gguf_cached(path, dtype=dtype)
    assert caplog.text == ""  # nothing said the second time
    assert_same(first, fresh)
    assert_same(second, fresh)


def test_load_pretrained_uses_the_cache(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tiny(tmp_path / "tiny.gguf")
    plain, _ = attnlab.load_pretrained(path, cache=False)
    assert entries(cache) == []  # cache=False writes nothing
    attnlab.load_pretrained(path)
    assert len(entries(cache)) == 1
    no_reading(monkeypatch)
    cached, tokenizer = attnlab.load_pretrained(path)
    assert tokenizer.chat_template == TEMPLATE
    ours, theirs = cached.state_dict(), plain.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    with pytest.raises(ArgumentTypeError, match="cache must be a bool, got str"):
        attnlab.load_pretrained(path, cache="yes")  # type: ignore[arg-type]


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNLAB_CACHE", "/x/own")
    monkeypatch.setenv("XDG_CACHE_HOME", "/x/xdg")
    assert cache_dir() == Path("/x/own")
    monkeypatch.delenv("ATTNLAB_CACHE")
    assert cache_dir() == Path("/x/xdg/attnlab")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/x/home")
    assert cache_dir() == Path("/x/home/.cache/attnlab")


def test_a_changed_file_is_never_read_from_its_old_entry(tmp_path: Path, cache: Path) -> None:
    path = tiny(tmp_path / "tiny.gguf", Q.F32)
    read_gguf_cached(path)
    old = entries(cache)
    tiny(path, Q.Q8_0)  # other weights, another header, same path
    assert_same(read_gguf_cached(path), read_gguf(path))
    assert len(entries(cache)) == 1 and entries(cache) != old  # the stale entry is gone
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched: another key
    assert cache_path(path) != entries(cache)[0]


def test_a_killed_writers_old_temporary_file_is_removed(tmp_path: Path, cache: Path) -> None:
    path = tiny(tmp_path / "tiny.gguf")
    entry = cache_path(path)
    entry.parent.mkdir(parents=True)
    prefix = entry.name.rsplit("-", 1)[0]
    killed = entry.with_name(f".{entry.name}.0123456789ab.tmp")
    running = entry.with_name(f".{entry.name}.ba9876543210.tmp")
    for tmp in (killed, running):
        tmp.write_bytes(b"half an entry")
    os.utime(killed, (1, 1))
    (cache / "weights" / f"{prefix}-0000000000000000.safetensors").write_bytes(b"older version")
    read_gguf_cached(path)
    assert entries(cache) == sorted([entry, running])  # another writer's file is left to it


def damage_truncate(entry: Path) -> None:
    os.truncate(entry, entry.stat().st_size - 100)


def damage_flip(entry: Path) -> None:
    data = bytearray(entry.read_bytes())
    data[-5] ^= 0x40  # one bit of the last tensor's bytes
    entry.write_bytes(bytes(data))


def damage_garbage(entry: Path) -> None:
    entry.write_bytes(b"\xff" * 64)


def damage_metadata(entry: Path) -> None:
    data = entry.read_bytes()
    entry.write_bytes(data.replace(b'"model_type', b'"modelXtype', 1))


@pytest.mark.parametrize("damage", [damage_truncate, damage_flip, damage_garbage, damage_metadata])
def test_a_damaged_entry_is_rebuilt_never_loaded(
    tmp_path: Path, cache: Path, caplog: Any, damage: Any
) -> None:
    path = tiny(tmp_path / "tiny.gguf")
    read_gguf_cached(path)
    (entry,) = entries(cache)
    damage(entry)
    with caplog.at_level(logging.WARNING):
        again = read_gguf_cached(path)
    assert "are damaged" in caplog.text and "rebuilding them" in caplog.text
    assert_same(again, read_gguf(path))
    assert entries(cache) == [entry]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert_same(read_gguf_cached(path), again)  # the rebuilt entry reads clean
    assert caplog.text == ""


def test_a_cache_that_cannot_be_written_is_passed_by(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    path = tiny(tmp_path / "tiny.gguf")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ATTNLAB_CACHE", str(blocker / "cache"))  # cannot be created
    with caplog.at_level(logging.WARNING):
        assert_same(read_gguf_cached(path), read_gguf(path))
    assert "warning: cannot cache the weights in" in caplog.text


def test_a_full_disk_leaves_no_entry_and_no_temporary_file(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    path = tiny(tmp_path / "tiny.gguf")

    def full(tmp: Path, *args: Any) -> None:
        tmp.write_bytes(b"partial")
        raise OSError(28, "No space left on device", str(tmp))

    monkeypatch.setattr(weight_cache, "_write", full)
    with caplog.at_level(logging.WARNING):
        assert_same(read_gguf_cached(path), read_gguf(path))
    assert "No space left on device" in caplog.text
    assert entries(cache) == []


def test_metadata_that_is_no_json_is_not_cached_and_fails_nothing(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    path = tiny(tmp_path / "tiny.gguf")
    read = weight_cache.read_gguf

    def odd(*args: Any, **kwargs: Any) -> Any:
        model = read(*args, **kwargs)
        model.metadata["odd"] = object()  # not JSON: the entry cannot hold it
        return model

    monkeypatch.setattr(weight_cache, "read_gguf", odd)
    with caplog.at_level(logging.WARNING):
        assert "odd" in read_gguf_cached(path).metadata
    assert "warning: cannot cache the weights in" in caplog.text
    assert entries(cache) == []


def test_concurrent_writers_leave_one_valid_entry(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tiny(tmp_path / "tiny.gguf")
    results: list[Any] = []
    barrier = threading.Barrier(3)
    write = weight_cache._write

    def in_step(*args: Any) -> None:  # every writer has its temporary file before any renames
        write(*args)
        barrier.wait(timeout=30)

    monkeypatch.setattr(weight_cache, "_write", in_step)
    threads = [
        threading.Thread(target=lambda: results.append(read_gguf_cached(path))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 3
    assert [e.name for e in entries(cache)] == [cache_path(path).name]  # no temporary file left
    monkeypatch.setattr(weight_cache, "_write", write)
    no_reading(monkeypatch)
    assert_same(read_gguf_cached(path), results[0])


def test_cli_no_cache(tmp_path: Path, cache: Path, capsys: Any) -> None:
    path = tiny(tmp_path / "tiny.gguf")
    args = ["inspect", str(path), "--text", "the cat", "--json"]
    assert main([*args, "--no-cache"]) in (0, 1)
    assert entries(cache) == []
    assert main(args) in (0, 1)
    assert len(entries(cache)) == 1
