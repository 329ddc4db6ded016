"""Hostile GGUF files: every defect is one typed line that names the file and the GGUF key.

The files are the tiny models of ``tests/models/test_gguf.py`` (``write_tiny``) with one
metadata key replaced (any type the format has), or with their tensor table patched in place.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.gguf import read_gguf, read_gguf_config
from attnlab.models.pretrained import load_pretrained, pretrained_config
from tests.models.test_gguf import LAYERS, VOCAB, D, H, write_tiny

V = gguf.GGUFValueType
TENSORS = 3 + 9 * LAYERS  # embeddings, final norm, output; nine per layer


def tiny(tmp_path: Path, **meta: tuple[Any, ...] | None) -> Path:
    """The tiny llama file with metadata replaced (``.`` in a key spelled ``__``)."""
    path = tmp_path / "m.gguf"
    write_tiny(path, meta={k.replace("__", "."): v for k, v in meta.items()})
    return path


def refused(
    path: Path, error: type[Exception] = ArgumentError, *, config_only: bool = False
) -> str:
    """The one-line message ``read_gguf`` (or ``read_gguf_config``) refuses ``path`` with."""
    with pytest.raises(error) as exc:
        (read_gguf_config if config_only else read_gguf)(path)
    message = str(exc.value)
    assert "\n" not in message, message
    assert str(path) in message, message
    return message


@pytest.mark.parametrize(
    ("key", "typed", "got"),
    [
        ("llama.block_count", ("abc", V.STRING), "must be an integer, got the string 'abc'"),
        ("llama.block_count", (2.5, V.FLOAT32), "must be an integer, got the float 2.5"),
        ("llama.embedding_length", (64.0, V.FLOAT64), "must be an integer, got the float 64.0"),
        ("llama.embedding_length", (True, V.BOOL), "must be an integer, got the bool True"),
        ("llama.context_length", (["128", "256"], V.ARRAY, V.STRING), "must be an integer, got a list of 2 strings"),
        ("llama.vocab_size", (1e30, V.FLOAT64), "must be an integer, got the float 1e+30"),
        ("llama.attention.layer_norm_rms_epsilon", ("1e-6", V.STRING), "must be a number, got the string '1e-6'"),
        ("llama.rope.freq_base", ([1.0], V.ARRAY, V.FLOAT32), "must be a number, got a list of 1 floats"),
        ("tokenizer.ggml.bos_token_id", ("one", V.STRING), "must be an integer, got the string 'one'"),
        ("general.architecture", (7, V.UINT32), "must be a string, got the integer 7"),
        ("general.name", (7, V.UINT32), "must be a string, got the integer 7"),
    ],
)  # fmt: skip
def test_wrong_typed_metadata_is_one_typed_error(
    tmp_path: Path, key: str, typed: tuple[Any, ...], got: str
) -> None:
    """Before: ``int("abc")``'s ValueError, ``int(2.5) == 2`` silently, …"""
    message = refused(tiny(tmp_path, **{key.replace(".", "__"): typed}), ArgumentTypeError)
    assert f"GGUF key {key!r} {got}" in message


@pytest.mark.parametrize(
    ("key", "typed", "says"),
    [
        ("llama.attention.head_count", (0, V.UINT32), "must be in [1, 64], got 0"),
        ("llama.attention.head_count", ([4, 4, 8], V.ARRAY, V.UINT32), "must be one value for every layer"),
        ("llama.attention.head_count_kv", (3, V.UINT32), "must divide llama.attention.head_count = 4"),
        ("llama.attention.head_count_kv", (8, V.UINT32), "must be in [1, 4], got 8"),
        ("llama.embedding_length", (0, V.UINT32), "must be at least 1, got 0"),
        ("llama.context_length", (0, V.UINT32), "must be at least 1, got 0"),
        ("llama.feed_forward_length", (0, V.UINT32), "must be at least 1, got 0"),
        ("llama.attention.layer_norm_rms_epsilon", (float("inf"), V.FLOAT32), "must be a finite positive number, got inf"),
        ("llama.attention.layer_norm_rms_epsilon", (float("nan"), V.FLOAT32), "must be a finite positive number, got nan"),
        ("llama.attention.layer_norm_rms_epsilon", (0.0, V.FLOAT32), "must be a finite positive number, got 0.0"),
        ("llama.attention.layer_norm_rms_epsilon", (-1e-6, V.FLOAT64), "must be a finite positive number"),
        ("llama.rope.freq_base", (0.0, V.FLOAT32), "must be a finite positive number, got 0.0"),
        ("llama.rope.dimension_count", (8, V.UINT32), "is 8, but 4 heads of it must make llama.embedding_length = 64"),
        ("llama.block_count", (0, V.UINT32), "must be at least 1, got 0"),
        ("tokenizer.ggml.bos_token_id", (-1, V.INT32), "must be at least 0, got -1"),
        ("llama.rope.scaling.factor", (float("nan"), V.FLOAT32), "must be a finite positive number"),
    ],
)  # fmt: skip
def test_metadata_out_of_bounds_names_the_key(
    tmp_path: Path, key: str, typed: tuple[Any, ...], says: str
) -> None:
    """Before: ``head_count`` 0 was a ZeroDivisionError, an ε of inf or NaN was read (every
    token then gets the same logits), …"""
    message = refused(tiny(tmp_path, **{key.replace(".", "__"): typed}))
    assert f"GGUF key {key!r} {says}" in message


def test_more_tokens_than_embedding_rows(tmp_path: Path) -> None:
    tokens = [f"t{i}" for i in range(VOCAB + 1)]
    path = tiny(tmp_path, tokenizer__ggml__tokens=(tokens, V.ARRAY, V.STRING))
    assert f"holds {VOCAB + 1} tokens, more than the {VOCAB} rows" in refused(path)


def test_block_count_beyond_the_tensors_is_refused_at_once(tmp_path: Path) -> None:
    """Before: 2**40 layers of expected shapes were built (a hang)."""
    path = tiny(tmp_path, llama__block_count=(2**40, V.UINT64))
    message = refused(path, config_only=True)
    assert f"'llama.block_count' is {2**40}, but the file holds {TENSORS} tensors" in message
    assert refused(path) == message


@pytest.fixture
def eight_gib(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine of 8 GiB, whatever this one has."""
    monkeypatch.setattr("attnlab._budget._physical_memory", lambda: 8 * 2**30)


def test_context_length_beyond_memory(tmp_path: Path, eight_gib: None) -> None:
    """Before: read, then 10**9 positions of rotary tables were computed (tens of GB)."""
    path = tiny(tmp_path, llama__context_length=(10**9, V.UINT64))
    message = refused(path)
    assert "GGUF key 'llama.context_length' 1000000000 needs about" in message
    assert "for the rotary tables of every position, but the machine has 8.0 GiB" in message


def test_vocabulary_beyond_memory(tmp_path: Path, eight_gib: None) -> None:
    path = tiny(tmp_path, llama__vocab_size=(2**62, V.UINT64))
    message = refused(path)
    assert "llama.vocab_size" in message and "needs about" in message and "weights" in message


def test_context_length_zero_names_the_gguf_key_not_config_json(tmp_path: Path) -> None:
    """Before: "config.json's max_position_embeddings must be a positive number" (no path)."""
    path = tiny(tmp_path, llama__context_length=(0, V.UINT32))
    with pytest.raises(ArgumentError) as exc:
        pretrained_config(path)
    assert str(exc.value) == f"{path}: GGUF key 'llama.context_length' must be at least 1, got 0"


def patch_tensor_info(path: Path, name: str, part: int, value: int) -> None:
    """Write ``value`` into a tensor's info in the file: part 3 its dims, 4 its type, 5 its
    offset (``gguf.GGUFReader``'s field parts)."""
    reader = gguf.GGUFReader(str(path), "r+")
    field = next(t.field for t in reader.tensors if t.name == name)
    field.parts[part][...] = value
    reader.data.flush()
    del reader


def test_misaligned_tensor_offset_is_refused(tmp_path: Path) -> None:
    """Before: the tensor was read from 4 bytes early: garbage. llama.cpp refuses it too."""
    path = tiny(tmp_path)
    reader = gguf.GGUFReader(str(path))
    offset = int(
        next(t.field.parts[5][0] for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    )
    del reader
    patch_tensor_info(path, "blk.0.attn_q.weight", 5, offset - 4)
    message = refused(path)
    assert "tensor 'blk.0.attn_q.weight': its data starts at offset" in message
    assert "not a multiple of the file's alignment 32" in message


@pytest.mark.parametrize(
    ("typed", "says"),
    [((48, V.UINT32), "must be a non-zero power of two"), (("32", V.STRING), "Bad type")],
)
def test_a_bad_declared_alignment_is_refused(
    tmp_path: Path, typed: tuple[Any, ...], says: str
) -> None:
    message = refused(tiny(tmp_path, general__alignment=typed))
    assert "truncated or damaged GGUF file" in message and says in message


def test_tensor_with_wrong_shape_type_or_dims(tmp_path: Path) -> None:
    path = tiny(tmp_path)
    data = path.read_bytes()
    patch_tensor_info(path, "output_norm.weight", 3, 32)  # (64,) → (32,)
    assert "tensor 'output_norm.weight' has shape (32,), the config implies (64,)" in refused(path)
    path.write_bytes(data)
    patch_tensor_info(path, "output_norm.weight", 4, int(gguf.GGMLQuantizationType.I32))
    assert "cannot dequantise ggml type I32" in refused(path)
    path.write_bytes(data)
    patch_tensor_info(path, "output_norm.weight", 4, 200)  # no such ggml type
    assert "truncated or damaged GGUF file" in refused(path)


def test_tensor_data_past_the_end(tmp_path: Path) -> None:
    path = tiny(tmp_path)
    size = os.path.getsize(path)
    reader = gguf.GGUFReader(str(path))
    data_offset = reader.data_offset
    del reader
    patch_tensor_info(path, "output_norm.weight", 5, (size - data_offset) // 32 * 32)
    message = refused(path)
    assert "truncated" in message


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_gguf_name_that_is_not_a_file_says_what_it_is(tmp_path: Path, kind: str) -> None:
    """Before: "no such GGUF file" for both (and a FIFO would block the read of its magic)."""
    path = tmp_path / "x.gguf"
    if kind == "directory":
        path.mkdir()
        error: type[Exception] = IsADirectoryError
        says = f"{path} is a directory, not a GGUF file"
    else:
        os.mkfifo(path)
        error, says = ArgumentError, f"{path} is a FIFO (named pipe), not a regular GGUF file"
    for load in (read_gguf, read_gguf_config, load_pretrained, pretrained_config):
        with pytest.raises(error) as exc:
            load(path)
        assert str(exc.value) == says
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        load_pretrained(tmp_path / "absent.gguf")


def test_the_tiny_file_still_loads(tmp_path: Path) -> None:
    model = load_pretrained(tiny(tmp_path))
    assert model.model.config.n_layer == LAYERS and model.model.config.n_embd == D
    assert model.model.config.n_head == H
    assert np.isfinite(model.model.config.layer_norm_epsilon)


def header(*kvs: bytes, tensors: int = 0, keys: int | None = None) -> bytes:
    """A GGUF v3 header of raw key/value entries."""
    count = len(kvs) if keys is None else keys
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, count) + b"".join(kvs)


def kv(key: str, kind: int, payload: bytes) -> bytes:
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + payload


@pytest.mark.parametrize(
    ("data", "says"),
    [
        # an array of 2**40 bytes in a 60-byte file: the reader looped over them, reading nothing
        (header(kv("general.x", 9, struct.pack("<IQ", 0, 2**40))), f"declares {2**40} items"),
        (header(kv("general.x", 9, struct.pack("<IQ", 8, 2**40))), f"declares {2**40} items"),
        (header(kv("general.x", 8, struct.pack("<Q", 2**62))), f"declares {2**62} items"),
        (header(keys=2**60), f"the key count declares {2**60} items"),
        (header(tensors=2**60), f"the tensor count declares {2**60} items"),
    ],
    ids=["byte-array", "string-array", "string", "keys", "tensors"],
)
def test_header_counts_past_the_end_are_refused_at_once(
    tmp_path: Path, data: bytes, says: str
) -> None:
    path = tmp_path / "h.gguf"
    path.write_bytes(data)
    message = refused(path, config_only=True)
    assert "truncated or damaged GGUF file" in message and says in message


@pytest.mark.parametrize("dims", [5, 2**31])
def test_a_tensor_of_more_than_four_dimensions(tmp_path: Path, dims: int) -> None:
    path = tiny(tmp_path)
    patch_tensor_info(path, "output_norm.weight", 2, dims)
    assert f"a tensor has {dims} dimensions" in refused(path, config_only=True)


def test_rope_scaling_types(tmp_path: Path) -> None:
    """Before: a 'yarn' file was read, then refused by the model without naming file or key;
    a linear scaling with llama.cpp's original_context_length could not be loaded at all."""
    scaling = {"llama__rope__scaling__factor": (2.0, V.FLOAT32)}
    path = tiny(tmp_path, llama__rope__scaling__type=("yarn", V.STRING), **scaling)
    assert "GGUF key 'llama.rope.scaling.type' is 'yarn'; attnlab implements" in refused(path)
    path = tiny(
        tmp_path,
        llama__rope__scaling__type=("linear", V.STRING),
        llama__rope__scaling__original_context_length=(64, V.UINT32),
        **scaling,
    )
    rope = load_pretrained(path).model.config.rope_scaling
    assert rope is not None and (rope.rope_type, rope.factor) == ("linear", 2.0)


def test_the_config_reads_the_header_as_the_reader_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``read_gguf_config`` parses the header itself (``gguf.GGUFReader`` takes seconds on
    SmolLM2's 49k-token vocabulary): every value type, as the reader's ``contents()`` gives it."""
    import attnlab.models.gguf as gguf_module
    from attnlab.models.gguf_header import read_header

    scalars = {f"x.t{int(t)}": (v, t) for v, t in [
        (200, V.UINT8), (-7, V.INT8), (60000, V.UINT16), (-3, V.INT16), (4_000_000_000, V.UINT32),
        (-5, V.INT32), (0.1, V.FLOAT32), (True, V.BOOL), ("é ✓", V.STRING), (2**40, V.UINT64),
        (-(2**40), V.INT64), (0.1, V.FLOAT64),
    ]}  # fmt: skip
    arrays = {
        "x.floats": ([0.5, -1.25], V.ARRAY, V.FLOAT32),
        "x.bools": ([True, False], V.ARRAY, V.BOOL),
        "x.strings": (["a", "", "ü"], V.ARRAY, V.STRING),
        "x.ints": ([3, -4], V.ARRAY, V.INT64),
    }
    path = tiny(tmp_path, **{k.replace(".", "__"): v for k, v in {**scalars, **arrays}.items()})
    reader = gguf.GGUFReader(str(path))
    theirs = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    header = read_header(path)
    assert header is not None
    ours, names = header
    assert ours == theirs and names == [t.name for t in reader.tensors]
    for key, value in theirs.items():
        assert type(ours[key]) is type(value), key
        if isinstance(value, list):
            assert [type(v) for v in ours[key]] == [type(v) for v in value], key
    expected = read_gguf(path).hf_config

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("read_gguf_config built a gguf.GGUFReader")

    monkeypatch.setattr(gguf_module, "_READERS", type(gguf_module._READERS)())
    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    assert read_gguf_config(path) == expected
