"""Hugging Face folders and configs written to mislead: values of the wrong JSON type, sizes no
machine holds, a head the config says is not there, files that are not files, the Hugging Face
cache's layout of links. Each is refused in one line naming the key (or file) and the value, or
read as ``transformers`` reads it; tiny random models written to ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import attnlab as al
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.families import family_named, preset
from attnlab.models.hf import check_directory, config_from_hf, from_hf, save_hf, to_hf
from attnlab.models.pretrained import is_pretrained_source

VOCAB = 32
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


def tiny(family: str, **fields: Any) -> al.GPT:
    torch.manual_seed(0)
    config = al.GPTConfig(
        **{**preset(family, n_embd=16, n_head=2), **fields},
        vocab_size=VOCAB, n_positions=16, n_layer=1, n_embd=16, n_head=2,
    )  # fmt: skip
    return al.GPT(config).eval()


def folder(tmp_path: Path, family: str = "llama", **fields: Any) -> Path:
    return save_hf(tiny(family, **fields), tmp_path / family)


def edit_config(path: Path, **changes: Any) -> dict[str, Any]:
    data = json.loads((path / "config.json").read_text())
    data.update(changes)
    (path / "config.json").write_text(json.dumps(data))  # Python's json writes Infinity too
    return data


def _dict(family: str) -> dict[str, Any]:
    """The ``config.json`` dict of a tiny model of ``family`` (Qwen2: Llama's, renamed)."""
    if family == "qwen2":
        return {**_dict("llama"), "model_type": "qwen2", "use_sliding_window": False}
    return family_named(family).config_to_hf(tiny(family).config)


# ----------------------------------------------------------------------------------------------
# values read by key and type, never by truthiness
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "key", "value", "message"),
    [
        (
            "llama",
            "tie_word_embeddings",
            "false",
            "tie_word_embeddings must be true or false, got 'false' (str)",
        ),
        (
            "llama",
            "tie_word_embeddings",
            0,
            "tie_word_embeddings must be true or false, got 0 (int)",
        ),
        (
            "neox",
            "use_parallel_residual",
            "false",
            "use_parallel_residual must be true or false, got 'false'",
        ),
        ("llama", "attention_bias", "true", "attention_bias must be true or false"),
        ("llama", "mlp_bias", 1, "mlp_bias must be true or false"),
        ("qwen2", "use_sliding_window", "false", "use_sliding_window must be true or false"),
        ("neox", "attention_bias", "no", "attention_bias must be true or false"),
        ("gpt2", "scale_attn_weights", 1, "scale_attn_weights must be true or false"),
        ("gpt2", "add_cross_attention", "false", "add_cross_attention must be true or false"),
        ("llama", "hidden_size", 16.5, "hidden_size must be an integer, got 16.5 (float)"),
        ("llama", "hidden_size", 16.0, "hidden_size must be an integer, got 16.0 (float)"),
        ("llama", "hidden_size", float("inf"), "hidden_size must be an integer, got inf"),
        ("llama", "hidden_size", "16", "hidden_size must be an integer, got '16' (str)"),
        ("llama", "num_hidden_layers", True, "num_hidden_layers must be an integer, got True"),
        ("neox", "vocab_size", 32.0, "vocab_size must be an integer, got 32.0"),
        ("gpt2", "n_inner", "64", "n_inner must be an integer, got '64' (str)"),
        ("gpt2", "n_layer", 1.0, "n_layer must be an integer, got 1.0"),
        ("llama", "head_dim", 8.0, "head_dim must be an integer, got 8.0"),
        ("llama", "rms_norm_eps", "1e-5", "rms_norm_eps must be a number, got '1e-5' (str)"),
        ("llama", "rms_norm_eps", float("nan"), "rms_norm_eps must be a finite positive numbe"),
        ("llama", "rope_theta", float("inf"), "rope_theta must be a finite positive numbe"),
        ("neox", "rotary_pct", "0.25", "rotary_pct must be a number, got '0.25'"),
        ("gpt2", "tie_word_embeddings", False, "tie_word_embeddings must be true for GPT-2"),
    ],
)
def test_a_value_of_the_wrong_json_type_is_refused_by_key(
    family: str, key: str, value: object, message: str
) -> None:
    data = {**_dict(family), key: value}
    if key == "rope_theta":
        data.pop("rope_parameters")
    if key == "rotary_pct":
        data.pop("rope_parameters"), data.pop("partial_rotary_factor")
    with pytest.raises((ArgumentError, ArgumentTypeError), match=re.escape(message)):
        config_from_hf(data)


def test_the_folder_error_names_the_file_the_key_and_the_value(tmp_path: Path) -> None:
    path = folder(tmp_path)
    edit_config(path, tie_word_embeddings="false")
    with pytest.raises(ArgumentTypeError) as err:
        check_directory(path)
    text = str(err.value)
    assert str(path / "config.json") in text and "'false' (str)" in text and "\n" not in text


def test_tokenizer_config_add_bos_token_must_be_a_boolean(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    from attnlab.data.pretrained_tokenizer import tokenizer_from_folder

    Tokenizer(models.WordLevel({"<s>": 0, "a": 1}, unk_token="a")).save(
        str(tmp_path / "tokenizer.json")
    )
    (tmp_path / "tokenizer_config.json").write_text('{"add_bos_token": "no", "bos_token": "<s>"}')
    with pytest.raises(ArgumentTypeError, match="add_bos_token must be true or false, got 'no'"):
        tokenizer_from_folder(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"add_bos_token": false}')
    assert tokenizer_from_folder(tmp_path).add_bos is False
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "tokenizer_config.json").write_text(deep)
    with pytest.raises(ArgumentError, match=r"tokenizer_config\.json is nested deeper than 100"):
        tokenizer_from_folder(tmp_path)


# ----------------------------------------------------------------------------------------------
# a tied config with a head of its own
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "head"), [("llama", "lm_head.weight"), ("neox", "embed_out.weight")]
)
def test_a_tied_config_with_a_different_head_is_refused(
    tmp_path: Path, family: str, head: str
) -> None:
    path = folder(tmp_path, family)  # untied: the file holds its own head
    edit_config(path, tie_word_embeddings=True)
    with pytest.raises(ArgumentError, match=f"hold a {head} that differs from the token embedding"):
        from_hf(path)
    state = load_file(str(path / "model.safetensors"))
    embedding = "model.embed_tokens.weight" if family == "llama" else "gpt_neox.embed_in.weight"
    state[head] = state[embedding].clone()  # an equal copy is the tied head
    save_file(state, str(path / "model.safetensors"))
    gpt = from_hf(path)
    assert gpt.lm_head.weight is gpt.transformer.wte.weight


def test_gpt2_with_a_different_head_is_refused(tmp_path: Path) -> None:
    path = folder(tmp_path, "gpt2")
    state = load_file(str(path / "model.safetensors"))
    state["lm_head.weight"] = torch.randn(VOCAB, 16)
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(ArgumentError, match=r"lm_head\.weight that differs"):
        from_hf(path)


# ----------------------------------------------------------------------------------------------
# sizes checked before anything is built
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("max_position_embeddings", 10**9, "max_position_embeddings must be at most"),
        ("vocab_size", 10**30, "vocab_size must be at most"),
        ("num_hidden_layers", 2**40, "num_hidden_layers must be at most"),
        ("hidden_size", 2**40, "hidden_size must be at most"),
        ("intermediate_size", 10**12, "intermediate_size must be at most"),
        ("num_key_value_heads", 2**40, "num_key_value_heads must be at most"),
    ],
)
def test_sizes_beyond_any_model_are_refused_naming_the_key(
    tmp_path: Path, key: str, value: int, message: str
) -> None:
    path = folder(tmp_path)
    edit_config(path, **{key: value})
    with pytest.raises(ArgumentError, match=message) as err:
        check_directory(path)
    assert str(path / "config.json") in str(err.value) and str(value) in str(err.value)


def test_a_context_whose_rotary_tables_do_not_fit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("attnlab._budget._physical_memory", lambda: 2**28)
    path = folder(tmp_path)
    edit_config(path, max_position_embeddings=10**7)  # tables of 480 MB for heads of 8
    with pytest.raises(ArgumentError, match="max_position_embeddings = 10000000 needs about"):
        check_directory(path)


# ----------------------------------------------------------------------------------------------
# the Hugging Face cache's layout, and index names that leave the folder
# ----------------------------------------------------------------------------------------------


def hub_snapshot(tmp_path: Path, source: Path) -> Path:
    """``source`` sharded in two and laid out as the Hub's cache does: the snapshot's files are
    links to ``../../blobs/<sha>``."""
    state = load_file(str(source / "model.safetensors"))
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}  # fmt: skip
    repo = tmp_path / "models--o--n"
    blobs, snap = repo / "blobs", repo / "snapshots" / "rev0"
    blobs.mkdir(parents=True), snap.mkdir(parents=True)
    files = {"config.json": (source / "config.json").read_bytes()}
    for shard, part in shards.items():
        save_file({n: state[n] for n in part}, str(tmp_path / "shard"))
        files[shard] = (tmp_path / "shard").read_bytes()
    weight_map = {n: shard for shard, part in shards.items() for n in part}
    files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    for i, (name, data) in enumerate(files.items()):
        (blobs / f"sha{i}").write_bytes(data)
        (snap / name).symlink_to(f"../../blobs/sha{i}")
    return snap


def test_a_sharded_model_in_the_hub_cache_layout_loads(tmp_path: Path) -> None:
    source = folder(tmp_path)
    snap = hub_snapshot(tmp_path, source)
    x = torch.randint(0, VOCAB, (1, 5))
    assert torch.equal(from_hf(snap)(x).logits, from_hf(source)(x).logits)


@pytest.mark.parametrize("name", ["../outside.safetensors", "/abs/outside.safetensors",
                                  "sub/../../outside.safetensors"])  # fmt: skip
def test_index_names_that_leave_the_folder_are_refused(tmp_path: Path, name: str) -> None:
    source = folder(tmp_path)
    snap = hub_snapshot(tmp_path, source)
    (tmp_path / "models--o--n" / "snapshots" / "outside.safetensors").write_bytes(b"")
    index = snap / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["model.norm.weight"] = name.replace("/abs", str(tmp_path))
    index.unlink()
    index.write_text(json.dumps(data))
    with pytest.raises(ArgumentError, match="names shards that are not files of"):
        check_directory(snap)


# ----------------------------------------------------------------------------------------------
# files that are not files
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder"])
@pytest.mark.parametrize(
    "name", ["config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
)
def test_a_small_file_that_is_not_a_regular_file_is_refused_without_reading(
    tmp_path: Path, kind: str, name: str
) -> None:
    from tokenizers import Tokenizer, models

    from attnlab.data.pretrained_tokenizer import tokenizer_from_folder

    path = folder(tmp_path)
    Tokenizer(models.WordLevel({"a": 0}, unk_token="a")).save(str(path / "tokenizer.json"))
    target = path / name
    target.unlink(missing_ok=True)
    if kind == "dev-zero":
        target.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    want = {"dev-zero": "a device", "fifo": "a FIFO", "folder": "a folder"}[kind]
    with pytest.raises(ArgumentError, match=f"{name} must be a regular file, got {want}"):
        if name == "config.json":
            assert is_pretrained_source(str(path))  # not "manifest.json is missing"
            check_directory(path)
        elif name == "tokenizer.json":
            al.load_pretrained(str(path))  # no longer read as a folder without a tokenizer
        else:
            tokenizer_from_folder(path)


def test_a_small_file_over_the_cap_is_refused(tmp_path: Path) -> None:
    from attnlab._checks import read_small_json

    big = tmp_path / "config.json"
    big.write_bytes(b" " * 101)
    with pytest.raises(ArgumentError, match="must be at most 100 bytes, got 101"):
        read_small_json(big, limit=100)


# ----------------------------------------------------------------------------------------------
# parity: Llama ignores partial_rotary_factor, as LlamaForCausalLM does
# ----------------------------------------------------------------------------------------------


def test_llama_partial_rotary_factor_is_ignored_as_transformers_does() -> None:
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, intermediate_size=48, max_position_embeddings=16,
        partial_rotary_factor=0.5,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    hf = hf.double().eval()
    gpt = from_hf(hf)
    assert gpt.config.rotary_dim is None
    x = torch.randint(0, VOCAB, (1, 9))
    with torch.no_grad():
        err = (gpt(x).logits - hf(x).logits).abs().max().item()
    assert err < 1e-6  # RMSNorm's float32 rounding; a half-rotated head is off by ~1e-2


def test_llama_partial_rotary_factor_with_a_scaling_is_refused() -> None:
    data = {**_dict("llama"), "partial_rotary_factor": 0.5}
    data["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(ArgumentError, match="partial_rotary_factor must be 1 with a rope scaling"):
        config_from_hf(data)


def test_a_llama_with_a_partial_rotary_is_not_exported() -> None:
    with pytest.raises(ArgumentError, match="rotary_dim must be None for llama, got 4"):
        to_hf(tiny("llama", rotary_dim=4))


# ----------------------------------------------------------------------------------------------
# messages
# ----------------------------------------------------------------------------------------------


def test_a_pretrained_file_with_nan_weights_is_not_called_a_diverged_run(tmp_path: Path) -> None:
    path = folder(tmp_path)
    state = load_file(str(path / "model.safetensors"))
    state["model.layers.0.mlp.up_proj.weight"][0, 0] = float("nan")
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(ArgumentError) as err:
        al.generate(from_hf(path), torch.tensor([[1, 2]]), max_new_tokens=1)
    text = str(err.value)
    assert "transformer.h.0.mlp.c_fc.weight" in text and "pretrained file" in text
    assert "the run diverged" not in text


@pytest.mark.parametrize(
    ("key", "value", "error", "message"),
    [
        ("hidden_act", ["silu"], ArgumentError, "hidden_act must be one of"),
        ("rope_scaling", False, ArgumentTypeError, "rope_scaling must be a dict, got bool"),
        ("rope_scaling", "linear", ArgumentTypeError, "rope_scaling must be a dict, got str"),
        (
            "rope_scaling",
            {"rope_type": "linear", "factor": float("inf")},
            ArgumentError,
            "factor must be a finite positive number, got inf",
        ),
        (
            "rope_scaling",
            {**LLAMA3, "original_max_position_embeddings": 16.5},
            ArgumentError,
            "original_max_position_embeddings must be an integer",
        ),
    ],
)
def test_other_values_of_the_wrong_type_are_one_line_errors(
    key: str, value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        config_from_hf({**_dict("llama"), key: value})


def test_the_cli_names_a_config_json_that_is_a_fifo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to call the folder a run and say that its manifest.json is missing."""
    from attnlab.cli import main

    path = folder(tmp_path)
    (path / "config.json").unlink()
    os.mkfifo(path / "config.json")
    assert main(["flops", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"attnlab: error: {path / 'config.json'} must be a regular file, got a FIFO"]
