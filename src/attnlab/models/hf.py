"""Hugging Face GPT-2 interop: weights in and out of ``transformers.GPT2LMHeadModel``.

The parameter names are the same on both sides; only the layout of the linear layers differs.
Hugging Face's GPT-2 uses ``Conv1D`` (``y = x W + b`` with ``W`` of shape ``(in, out)``) where
attnlab uses ``nn.Linear`` (``y = x Wᵀ + b``, ``W`` of shape ``(out, in)``), so the weights of
``c_attn``, ``c_proj`` and ``c_fc`` are transposed on the way in and out.

``transformers`` is imported only when these functions are called; nothing is ever downloaded.
A directory is read only from ``safetensors`` weights (``model.safetensors``, or the shards an
``model.safetensors.index.json`` names), never from a pickle (``pytorch_model.bin``), and its
``config.json`` sizes are checked against the shapes the weights' headers record before anything is
allocated (:func:`check_directory`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError, safe_open

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.config import GPTConfig

if TYPE_CHECKING:
    from transformers import GPT2Config, GPT2LMHeadModel

    from attnlab.models.gpt import GPT

__all__ = ["check_directory", "config_from_hf", "config_to_hf", "from_hf", "to_hf"]

_WEIGHTS, _INDEX = "model.safetensors", "model.safetensors.index.json"

_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def config_from_hf(hf_config: GPT2Config) -> GPTConfig:
    """The :class:`~attnlab.models.config.GPTConfig` of a ``transformers.GPT2Config``.

    Args:
        hf_config: the Hugging Face configuration, e.g. ``GPT2LMHeadModel.config``.

    Returns:
        The equivalent attnlab configuration (sizes, dropout, layer-norm epsilon).

    Raises:
        ValueError: for GPT-2 options attnlab does not implement (another activation, ``n_inner``
            other than ``4 · n_embd``, unscaled or layer-scaled attention, cross-attention).
    """
    act = hf_config.activation_function
    if act not in _GELU_TANH:
        raise ArgumentError(
            f"activation_function must be one of {_GELU_TANH} (tanh GELU), got {act!r}"
        )
    n_inner = getattr(hf_config, "n_inner", None)
    if n_inner is not None and n_inner != 4 * hf_config.n_embd:
        raise ArgumentError(
            f"n_inner must be None or 4 * n_embd = {4 * hf_config.n_embd}, got {n_inner}"
        )
    if not hf_config.scale_attn_weights or hf_config.scale_attn_by_inverse_layer_idx:
        raise ArgumentError(
            "scale_attn_weights must be True and scale_attn_by_inverse_layer_idx False "
            f"(scores scaled by 1/sqrt(d_head)), got {hf_config.scale_attn_weights} and "
            f"{hf_config.scale_attn_by_inverse_layer_idx}"
        )
    if getattr(hf_config, "add_cross_attention", False):
        raise ArgumentError("add_cross_attention must be False: attnlab's GPT is decoder-only")
    return GPTConfig(
        vocab_size=hf_config.vocab_size,
        n_positions=hf_config.n_positions,
        n_embd=hf_config.n_embd,
        n_layer=hf_config.n_layer,
        n_head=hf_config.n_head,
        dropout=float(hf_config.resid_pdrop),
        layer_norm_epsilon=float(hf_config.layer_norm_epsilon),
    )


def config_to_hf(config: GPTConfig, *, attn_implementation: str = "sdpa") -> GPT2Config:
    """A ``transformers.GPT2Config`` for a :class:`~attnlab.models.config.GPTConfig`.

    Args:
        config: the attnlab configuration.
        attn_implementation: the Hugging Face attention implementation to record in the config
            (``"sdpa"``, the default, or ``"eager"``).

    Returns:
        The equivalent ``transformers.GPT2Config``.

    Raises:
        ValueError: for options GPT-2 does not have (an attention other than ``"full"``,
            grouped-query heads, rope/alibi, no biases).
    """
    if config.attention.name != "full":
        name = config.attention.name
        raise ArgumentError(
            f"attention must be 'full' for GPT-2 (Hugging Face's GPT2LMHeadModel has no "
            f"{name!r} attention), got {name!r}"
        )
    from transformers import GPT2Config

    if config.kv_heads != config.n_head:
        raise ArgumentError(
            f"num_kv_heads must be None or n_head = {config.n_head} for GPT-2, got {config.num_kv_heads}"
        )
    if config.positions != "learned":
        raise ArgumentError(f"positions must be 'learned' for GPT-2, got {config.positions!r}")
    if not config.bias:
        raise ArgumentError("bias must be True for GPT-2, got False")
    special = min(50256, config.vocab_size - 1)  # GPT-2's <|endoftext|>, inside a small vocabulary
    return GPT2Config(  # type: ignore[call-arg]
        vocab_size=config.vocab_size,
        n_positions=config.n_positions,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        activation_function="gelu_new",
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout,
        layer_norm_epsilon=config.layer_norm_epsilon,
        bos_token_id=special,
        eos_token_id=special,
        attn_implementation=attn_implementation,
    )


def from_hf(model_or_directory: GPT2LMHeadModel | str | Path) -> GPT:
    """A :class:`~attnlab.GPT` with the weights of a Hugging Face GPT-2.

    Args:
        model_or_directory: a ``transformers.GPT2LMHeadModel``, or a local directory written by
            its ``save_pretrained`` (loaded with ``local_files_only=True``; never the Hub).

    Returns:
        the model on the same device, in the same dtype, in eval mode (like ``from_pretrained``).

    Examples:
        >>> hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4))
        >>> gpt = GPT.from_hf(hf)
    """
    from transformers import GPT2LMHeadModel

    from attnlab.models.gpt import GPT

    if isinstance(model_or_directory, (str, Path)):
        path = Path(model_or_directory)
        if not path.is_dir():
            raise ArgumentError(
                f"model_or_directory must be a GPT2LMHeadModel or a local directory, got {str(path)!r} "
                "(not a directory; attnlab never downloads from the Hub)"
            )
        check_directory(path)
        model_or_directory = GPT2LMHeadModel.from_pretrained(
            path, local_files_only=True, use_safetensors=True
        )
    if not isinstance(model_or_directory, GPT2LMHeadModel):
        raise ArgumentTypeError(
            "model_or_directory must be a transformers.GPT2LMHeadModel or a directory path, "
            f"got {type(model_or_directory).__name__}"
        )
    hf = model_or_directory
    config = config_from_hf(hf.config)
    with torch.device("meta"):  # no random init: every parameter is replaced below
        gpt = GPT(config)
    state = {}
    with torch.no_grad():
        for name, tensor in hf.state_dict().items():
            if name.endswith((".attn.bias", ".attn.masked_bias")):
                continue  # causal-mask buffers of older transformers versions
            t = tensor.t() if name.endswith(_CONV1D) else tensor
            state[name] = t.clone(memory_format=torch.contiguous_format)
    state["lm_head.weight"] = state["transformer.wte.weight"]
    gpt.load_state_dict(state, strict=True, assign=True)
    gpt.lm_head.weight = gpt.transformer.wte.weight  # assign=True made two Parameters: tie again
    return gpt.train(hf.training)


def _weight_files(path: Path) -> list[Path]:
    """The safetensors files of a Hugging Face directory (one, or the shards of its index)."""
    if (path / _WEIGHTS).is_file():
        return [path / _WEIGHTS]
    if (path / _INDEX).is_file():
        try:
            weight_map = json.loads((path / _INDEX).read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise ArgumentError(f"{path / _INDEX} is not a safetensors index") from None
        shards = [path / n for n in names if isinstance(n, str)]
        if len(shards) != len(names) or any(
            not s.resolve().is_relative_to(path.resolve()) or not s.is_file() for s in shards
        ):
            raise ArgumentError(f"{path / _INDEX} names shards that are not files of {path}")
        return shards
    pickled = [p.name for p in sorted(path.glob("*.bin")) + sorted(path.glob("*.pt"))]
    held = (
        f" (it holds {', '.join(pickled)}, a pickle, which attnlab never loads)" if pickled else ""
    )
    raise ArgumentError(
        f"{path} holds no safetensors weights{held}: attnlab needs {_WEIGHTS}; convert the model "
        f"with transformers' save_pretrained, which writes safetensors"
    )


def _stored_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Tensor names (without a ``transformer.`` prefix) and shapes, from the files' headers."""
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:  # type: ignore[no-untyped-call]
                for k in st.keys():
                    shapes[k.removeprefix("transformer.")] = tuple(st.get_slice(k).get_shape())
        except (SafetensorError, OSError) as exc:
            raise ArgumentError(f"{f} is not a readable safetensors file ({exc})") from None
    return shapes


def check_directory(path: str | Path) -> GPTConfig:
    """Check a Hugging Face GPT-2 directory before anything is allocated from it.

    Its weights must be safetensors (never a pickle), and the sizes of its ``config.json`` —
    vocabulary, positions, width, layers — must be the shapes the weights' headers record, so
    that a crafted config cannot make the process allocate a model of any size.

    Args:
        path: a directory with ``config.json`` and ``model.safetensors`` (or sharded safetensors).

    Returns:
        The :class:`~attnlab.models.config.GPTConfig` of the directory.

    Raises:
        ValueError: one line naming the file, the size and what the weights hold.
    """
    from transformers import GPT2Config

    path = Path(path)
    files = _weight_files(path)
    try:
        hf_config = GPT2Config.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, TypeError, RecursionError) as exc:
        raise ArgumentError(f"{path / 'config.json'} is not a GPT-2 config ({exc})") from None
    config = config_from_hf(hf_config)
    shapes = _stored_shapes(files)
    expected = {
        "wte.weight": (config.vocab_size, config.n_embd),
        "wpe.weight": (config.n_positions, config.n_embd),
        "ln_f.weight": (config.n_embd,),
    }
    for name, shape in expected.items():
        if shapes.get(name) != shape:
            raise ArgumentError(
                f"{path / 'config.json'} gives {name} the shape {shape} (vocab_size, n_positions, "
                f"n_embd) but the weights store {shapes.get(name, 'no such tensor')}"
            )
    layers = {n.split(".", 2)[1] for n in shapes if n.startswith("h.")}
    if len(layers) != config.n_layer:
        raise ArgumentError(
            f"{path / 'config.json'} gives n_layer = {config.n_layer} but the weights store "
            f"{len(layers)} layers"
        )
    return config


def to_hf(gpt: GPT, *, attn_implementation: str = "sdpa") -> GPT2LMHeadModel:
    """A ``transformers.GPT2LMHeadModel`` with the weights of a :class:`~attnlab.GPT`.

    Args:
        gpt: the model; it must be GPT-2 shaped (learned positions, biases, ``num_kv_heads``
            equal to ``n_head``).
        attn_implementation: Hugging Face's attention (``"sdpa"`` or ``"eager"``).

    Returns:
        the Hugging Face model on the same device and dtype, in the same train/eval mode.
    """
    from transformers import GPT2LMHeadModel

    hf_config = config_to_hf(gpt.config, attn_implementation=attn_implementation)
    ref = gpt.transformer.wte.weight
    hf = GPT2LMHeadModel(hf_config).to(device=ref.device, dtype=ref.dtype)  # type: ignore[call-arg]
    with torch.no_grad():
        state = {
            name: (t.t() if name.endswith(_CONV1D) else t).contiguous()
            for name, t in gpt.state_dict().items()
        }
        missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith((".attn.bias", ".attn.masked_bias"))]
    if missing or unexpected:
        raise ArgumentError(
            f"weights do not map onto GPT2LMHeadModel: missing {missing}, unexpected {unexpected}"
        )
    hf.tie_weights()
    return hf.train(gpt.training)
