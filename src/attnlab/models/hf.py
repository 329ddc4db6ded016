"""Hugging Face interop for every model family: weights in and out of ``transformers`` models and
of Hugging Face folders (``config.json`` + safetensors).

The family of a config (its ``model_type``: GPT-2, Llama, Mistral, Qwen2, GPT-NeoX) converts the
config and renames the weights (:mod:`attnlab.models.families`); attnlab's one decoder
(:class:`~attnlab.GPT`) runs them all.

``transformers`` is imported only to build or read a ``transformers`` model; reading a folder needs
only ``safetensors``. Nothing is ever downloaded here. A folder is read only from safetensors weights
(``model.safetensors``, or the shards a ``model.safetensors.index.json`` names), never from a
pickle (``pytorch_model.bin``), and its ``config.json`` sizes are checked against the shapes the
weights' headers record before anything is allocated (:func:`check_directory`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError, safe_open

from attnlab._checks import is_path_inside, read_small_json
from attnlab._files import replace_folder, safetensors_bytes, write_synced
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.config import GPTConfig
from attnlab.models.families import family_named, family_of

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

    from attnlab.models.gpt import GPT

__all__ = [
    "check_directory",
    "config_from_hf",
    "config_to_hf",
    "folder_headers",
    "from_hf",
    "hf_model_of",
    "model_from_state",
    "model_parts",
    "read_directory",
    "read_weights",
    "save_hf",
    "to_hf",
    "write_folder",
]

_WEIGHTS, _INDEX = "model.safetensors", "model.safetensors.index.json"
_SHARD = re.compile(r"model-\d+-of-\d+\.safetensors")  # transformers' shard names
_LAYER = re.compile(r"(?:^|\.)(?:h|layers)\.(\d+)\.")


def _as_dict(hf_config: PretrainedConfig | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(hf_config, Mapping):
        return dict(hf_config)
    to_dict = getattr(hf_config, "to_dict", None)
    if to_dict is None:
        raise ArgumentTypeError(
            f"hf_config must be a transformers config or a dict, got {type(hf_config).__name__}"
        )
    return dict(to_dict())


def config_from_hf(hf_config: PretrainedConfig | Mapping[str, Any]) -> GPTConfig:
    """The :class:`~attnlab.models.config.GPTConfig` of a Hugging Face config.

    Args:
        hf_config: a ``transformers`` config (``model.config``) or a ``config.json`` dict of a
            supported ``model_type`` (``gpt2``, ``llama``, ``mistral``, ``qwen2``, ``gpt_neox``).

    Returns:
        The equivalent attnlab configuration.

    Raises:
        ValueError: another ``model_type``, or an option attnlab does not implement (named).
    """
    data = _as_dict(hf_config)
    return family_of(data).config_from_hf(data)


def config_to_hf(config: GPTConfig, *, attn_implementation: str = "sdpa") -> PretrainedConfig:
    """The ``transformers`` config of a :class:`~attnlab.models.config.GPTConfig`, of the class
    of its ``family``.

    Args:
        config: the attnlab configuration.
        attn_implementation: the Hugging Face attention implementation to record (``"sdpa"``,
            the default, or ``"eager"``).

    Returns:
        The ``transformers`` config (``GPT2Config``, ``LlamaConfig``, …).

    Raises:
        ValueError: for options the family's Hugging Face class does not have.
    """
    from transformers import AutoConfig

    data = family_named(config.family).config_to_hf(config)
    model_type = data.pop("model_type")
    out = AutoConfig.for_model(model_type, **data)
    out._attn_implementation = attn_implementation  # as from_pretrained(attn_implementation=…)
    return out


def model_from_state(
    hf_config: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    *,
    dtype: torch.dtype | None = None,
) -> GPT:
    """A :class:`~attnlab.GPT` from a Hugging Face config and state dict (Hugging Face names).

    The model is built on the ``meta`` device (no random initialisation, no memory) and given
    the tensors as they are (converted to ``dtype`` when given); the rotary tables are computed
    where the weights are.

    Args:
        hf_config: the ``config.json`` dict.
        state: the weights under Hugging Face's names.
        dtype: convert the weights to this dtype; default: keep theirs.

    Returns:
        The model, in eval mode.

    Raises:
        ValueError: a tensor is missing, unused, or of the wrong shape (named).

    Shape:
        ``state[name]``: the shape Hugging Face's model gives it (``(out, in)`` for a linear
        weight; GPT-2's ``Conv1D`` weights ``(in, out)``).
    """
    from attnlab.models.gpt import GPT

    family = family_of(hf_config)
    config = family.config_from_hf(hf_config)
    with torch.device("meta"):  # no random init: every parameter is replaced below
        gpt = GPT(config)
    ours = family.state_from_hf(state, config)
    expected = gpt.state_dict()
    for name, t in ours.items():
        want = expected.get(name)
        if want is None or tuple(want.shape) != tuple(t.shape):
            shape = "no such tensor" if want is None else f"shape {tuple(want.shape)}"
            raise ArgumentError(
                f"weight {name} has shape {tuple(t.shape)}, the config gives the model {shape}"
            )
    ours = {
        n: (t if dtype is None else t.to(dtype)).contiguous() for n, t in ours.items()
    }  # fmt: skip
    if config.tie_embeddings:
        ours["lm_head.weight"] = ours["transformer.wte.weight"]
    gpt.load_state_dict(ours, strict=True, assign=True)
    if config.tie_embeddings:  # assign=True made two Parameters: tie again
        gpt.lm_head.weight = gpt.transformer.wte.weight
    weights = gpt.transformer.wte.weight
    for module in gpt.modules():
        reset = getattr(module, "reset_tables", None)
        if reset is not None:
            reset(weights.device)
    return gpt.eval()


def from_hf(
    model_or_directory: PreTrainedModel | str | Path, *, dtype: torch.dtype | None = None
) -> GPT:
    """A :class:`~attnlab.GPT` with the weights of a Hugging Face causal language model.

    Args:
        model_or_directory: a ``transformers`` model of a supported family
            (``GPT2LMHeadModel``, ``LlamaForCausalLM``, ``MistralForCausalLM``,
            ``Qwen2ForCausalLM``, ``GPTNeoXForCausalLM``), or a local folder as its
            ``save_pretrained`` writes it (never the Hub).
        dtype: convert the weights; default: keep theirs.

    Returns:
        The model on the same device, in the same dtype, in the model's train/eval mode (eval
        for a folder).

    Examples:
        >>> hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4))
        >>> gpt = GPT.from_hf(hf)
    """
    if isinstance(model_or_directory, (str, Path)):
        path = Path(model_or_directory)
        if not path.is_dir():
            raise ArgumentError(
                f"model_or_directory must be a transformers model or a local directory, got "
                f"{str(path)!r} (not a directory; attnlab never downloads from the Hub)"
            )
        config, state = read_directory(path)
        return model_from_state(config, state, dtype=dtype)
    config, state = model_parts(model_or_directory, "GPT2LMHeadModel, LlamaForCausalLM")
    gpt = model_from_state(config, state, dtype=dtype)
    return gpt.train(bool(getattr(model_or_directory, "training", False)))


def model_parts(model: object, examples: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The ``config.json`` dict and a detached copy of the weights of a ``transformers`` model.

    Args:
        model: the ``transformers`` model object.
        examples: the classes the error message names (``"BertModel"``).

    Returns:
        ``(config dict, state dict)`` under Hugging Face's names.

    Raises:
        ArgumentTypeError: ``model`` has no ``state_dict`` or no config.

    Shape:
        each tensor as the model holds it.
    """
    state_dict = getattr(model, "state_dict", None)
    hf_config = getattr(model, "config", None)
    if state_dict is None or hf_config is None or not hasattr(hf_config, "to_dict"):
        raise ArgumentTypeError(
            f"model_or_directory must be a transformers model (e.g. {examples}) or a directory "
            f"path, got {type(model).__name__}"
        )
    with torch.no_grad():
        state = {n: t.detach().clone() for n, t in state_dict().items()}
    return dict(hf_config.to_dict()), state


def to_hf(gpt: GPT, *, attn_implementation: str = "sdpa") -> PreTrainedModel:
    """The ``transformers`` model of a :class:`~attnlab.GPT`'s family, with its weights.

    Args:
        gpt: the model.
        attn_implementation: Hugging Face's attention (``"sdpa"`` or ``"eager"``).

    Returns:
        The Hugging Face model on the same device and dtype, in the same train/eval mode.

    Raises:
        ValueError: the config has options its family's Hugging Face class cannot hold.
    """
    import transformers

    family = family_named(gpt.config.family)
    hf_config = config_to_hf(gpt.config, attn_implementation=attn_implementation)
    ref = gpt.transformer.wte.weight
    cls = getattr(transformers, family.hf_class)
    hf = cls(hf_config).to(device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        state = family.state_to_hf(gpt.state_dict(), gpt.config)
        if "embed_out.weight" in state and "embed_out.weight" not in hf.state_dict():
            state["lm_head.weight"] = state.pop("embed_out.weight")  # NeoX in transformers 5
        missing, unexpected = hf.load_state_dict(
            {n: t.contiguous() for n, t in state.items()}, strict=False
        )
    missing = [m for m in missing if not m.endswith((".attn.bias", ".attn.masked_bias"))]
    if gpt.config.tie_embeddings:
        missing = [m for m in missing if m not in ("lm_head.weight", "embed_out.weight")]
    if missing or unexpected:
        raise ArgumentError(
            f"weights do not map onto {family.hf_class}: missing {missing}, unexpected {unexpected}"
        )
    hf.tie_weights()
    return hf.train(gpt.training)  # type: ignore[no-any-return]


def save_hf(gpt: GPT, directory: str | Path) -> Path:
    """Write a :class:`~attnlab.GPT` as a Hugging Face folder: ``config.json`` (its family's)
    and ``model.safetensors`` (Hugging Face's names), which ``transformers``'
    ``AutoModelForCausalLM.from_pretrained`` loads with the same logits.

    The folder is replaced as a whole (:func:`attnlab._files.replace_folder`): a process killed
    at any moment leaves the old model or the new one, never new weights under an old config,
    and no temporary file in it. Its ``config.json`` and safetensors weights (``model.safetensors``,
    or an index and its ``model-…-of-….safetensors`` shards) are replaced; its other files (a
    tokenizer, a README) are kept.

    Args:
        gpt: the model.
        directory: the folder (made when missing).

    Returns:
        The folder.
    """
    family = family_named(gpt.config.family)
    data = family.config_to_hf(gpt.config)
    data["torch_dtype"] = str(gpt.transformer.wte.weight.dtype).removeprefix("torch.")
    state = family.state_to_hf(gpt.state_dict(), gpt.config)  # a tied head written once
    return write_folder(directory, data, state)


def write_folder(
    directory: str | Path, config: Mapping[str, Any], state: Mapping[str, torch.Tensor]
) -> Path:
    """Replace a Hugging Face folder's ``config.json`` and safetensors weights at once
    (:func:`attnlab._files.replace_folder`; its other files are kept): what :func:`save_hf`
    and the encoders' ``save_encoder_hf`` write.

    Args:
        directory: the folder (made when missing).
        config: the ``config.json`` dict.
        state: the weights under Hugging Face's names.

    Returns:
        The folder.

    Shape:
        each tensor as it is, written contiguous from the CPU.
    """
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in state.items()}
    text = (json.dumps(dict(config), indent=2) + "\n").encode("utf-8")

    def write(stage: Path) -> None:
        write_synced(stage / _WEIGHTS, safetensors_bytes(tensors, {"format": "pt"}))
        write_synced(stage / "config.json", text)

    replace_folder(directory, write, _model_file, last="config.json")
    return Path(directory)


def _model_file(name: str) -> bool:
    """Whether a file of a Hugging Face folder belongs to the model :func:`save_hf` replaces:
    ``config.json`` and the safetensors weights (one file, or an index and its shards)."""
    return name in ("config.json", _WEIGHTS, _INDEX) or _SHARD.fullmatch(name) is not None


def _weight_files(path: Path) -> list[Path]:
    """The safetensors files of a Hugging Face directory (one, or the shards of its index)."""
    if (path / _WEIGHTS).is_file():
        return [path / _WEIGHTS]
    if (path / _INDEX).is_file():
        index = read_small_json(path / _INDEX)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict):
            raise ArgumentError(f"{path / _INDEX} is not a safetensors index (no weight_map)")
        names = sorted({n for n in weight_map.values() if isinstance(n, str)})
        # the names are checked, not where their links lead: a Hugging Face cache's snapshot
        # links every file to ../../blobs/<sha>
        bad = [n for n in names if not is_path_inside(n) or not (path / n).is_file()]
        if bad or len(names) != len(set(map(repr, weight_map.values()))):
            shown = repr(bad[0]) if bad else "a name that is not a string"
            raise ArgumentError(
                f"{path / _INDEX} names shards that are not files of {path} ({shown})"
            )
        return [path / n for n in names]
    pickled = [p.name for p in sorted(path.glob("*.bin")) + sorted(path.glob("*.pt"))]
    held = (
        f" (it holds {', '.join(pickled)}, a pickle, which attnlab never loads)" if pickled else ""
    )
    raise ArgumentError(
        f"{path} holds no safetensors weights{held}: attnlab needs {_WEIGHTS}; convert the model "
        f"with transformers' save_pretrained, which writes safetensors"
    )


def _stored_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes, from the files' headers."""
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:  # type: ignore[no-untyped-call]
                for k in st.keys():
                    shapes[k] = tuple(st.get_slice(k).get_shape())
        except (SafetensorError, OSError) as exc:
            raise ArgumentError(f"{f} is not a readable safetensors file ({exc})") from None
    return shapes


def _read_config(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = read_small_json(path / "config.json")
    return data


def check_directory(path: str | Path) -> GPTConfig:
    """Check a Hugging Face folder before anything is allocated from it.

    Its weights must be safetensors (never a pickle), and the sizes of its ``config.json`` —
    vocabulary, positions, widths, layers — must be the shapes the weights' headers record
    (compared tensor by tensor with the model built on the ``meta`` device), so that a crafted
    config cannot make the process allocate a model of any size.

    Args:
        path: a directory with ``config.json`` and ``model.safetensors`` (or sharded safetensors).

    Returns:
        The :class:`~attnlab.models.config.GPTConfig` of the directory.

    Raises:
        ValueError: one line naming the file, the size and what the weights hold.
    """
    from attnlab.models.gpt import GPT

    path = Path(path)
    files = _weight_files(path)
    data = _read_config(path)
    family = family_of(data)
    try:
        config = family.config_from_hf(data)
    except (ValueError, TypeError) as exc:
        kind = ArgumentTypeError if isinstance(exc, TypeError) else ArgumentError
        detail = str(exc).removeprefix("config.json's ")
        raise kind(f"{path / 'config.json'}: {detail} ({family.name} config)") from None
    shapes = _stored_shapes(files)
    layers = {m.group(1) for n in shapes if (m := _LAYER.search(n))}
    if len(layers) != config.n_layer:
        key = "n_layer" if "n_layer" in data else "num_hidden_layers"
        raise ArgumentError(
            f"{path / 'config.json'} gives {key} = {config.n_layer} but the weights store "
            f"{len(layers)} layers"
        )
    stored = {n: torch.empty(s, device="meta") for n, s in shapes.items()}
    try:
        ours = family.state_from_hf(stored, config)
    except (ValueError, RuntimeError) as exc:
        raise ArgumentError(f"{path}: {exc}") from None
    with torch.device("meta"):
        expected = GPT(config).state_dict()
    for name, want in expected.items():
        got = ours.get(name)
        if name == "lm_head.weight" and config.tie_embeddings:
            continue
        if got is None or tuple(got.shape) != tuple(want.shape):
            shown = name.removeprefix("transformer.")
            held = "no such tensor" if got is None else tuple(got.shape)
            raise ArgumentError(
                f"{path / 'config.json'} gives {shown} the shape {tuple(want.shape)} but the "
                f"weights store {held}"
            )
    return config


def read_directory(
    path: str | Path, *, dtype: torch.dtype | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The ``config.json`` and the weights (Hugging Face's names) of a checked folder
    (:func:`check_directory` first).

    Args:
        path: the folder.
        dtype: convert each tensor as it is read; default: the stored dtype.

    Returns:
        ``(config dict, state dict)``.

    Shape:
        each tensor as the file stores it.
    """
    path = Path(path)
    check_directory(path)
    return _read_config(path), read_weights(path, dtype=dtype)


def read_weights(path: str | Path, *, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The safetensors weights of a folder (one file or the shards of its index), as stored.

    Args:
        path: the folder (checked by its reader first).
        dtype: convert each tensor as it is read; default: the stored dtype.

    Returns:
        The state dict under the file's names.

    Shape:
        each tensor as the file stores it.
    """
    state: dict[str, torch.Tensor] = {}
    for f in _weight_files(Path(path)):
        with safe_open(str(f), framework="pt") as st:  # type: ignore[no-untyped-call]
            for k in st.keys():
                t = st.get_tensor(k)
                state[k] = t if dtype is None else t.to(dtype)
    return state


def hf_model_of(
    class_name: str,
    config: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    *,
    like: torch.Tensor,
    training: bool,
    attn_implementation: str = "eager",
    init: Mapping[str, Any] | None = None,
    tied: tuple[str, ...] = (),
) -> PreTrainedModel:
    """A ``transformers`` model of a ``config.json`` dict given a state dict: what the encoders'
    and the encoder-decoders' exports build.

    Args:
        class_name: the ``transformers`` class (``"BertModel"``).
        config: the ``config.json`` dict (with its ``model_type``).
        state: the weights under Hugging Face's names.
        like: a tensor of the model's device and dtype.
        training: the mode to return it in.
        attn_implementation: Hugging Face's attention (``"eager"`` returns attention weights).
        init: keyword arguments of the class beside its config.
        tied: names the model ties, not missing when ``state`` leaves them out.

    Returns:
        The model.

    Raises:
        ArgumentError: the weights do not map onto the class (what is missing, what is left).

    Shape:
        ``state[name]``: as the class holds it.
    """
    import transformers

    data = dict(config)
    hf_config = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    hf_config._attn_implementation = attn_implementation
    cls = getattr(transformers, class_name)
    hf = cls(hf_config, **(init or {})).to(device=like.device, dtype=like.dtype)
    with torch.no_grad():
        missing, unexpected = hf.load_state_dict(
            {n: t.contiguous() for n, t in state.items()}, strict=False
        )
    missing = [n for n in missing if n not in tied]
    if missing or unexpected:
        raise ArgumentError(
            f"weights do not map onto {class_name}: missing {missing}, unexpected {unexpected}"
        )
    return hf.train(training)  # type: ignore[no-any-return]


def folder_headers(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Hugging Face folder's ``config.json`` and its weights as ``meta`` tensors of the shapes
    their safetensors headers record (nothing allocated): what the encoders' and the
    encoder-decoders' folder checks compare.

    Args:
        path: the folder.

    Returns:
        ``(config dict, {name: meta tensor})``.

    Raises:
        ArgumentError: not a folder (named), or weights that are not safetensors.

    Shape:
        each tensor the shape its header records.
    """
    if not path.is_dir():
        raise ArgumentError(f"path must be a Hugging Face folder, got {str(path)!r} (no directory)")
    files = _weight_files(path)
    data = _read_config(path)
    return data, {n: torch.empty(s, device="meta") for n, s in _stored_shapes(files).items()}
