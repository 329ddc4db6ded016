"""Pretrained models from wherever they are: :func:`load_pretrained`.

Sources, tried in this order:

1. a ``transformers`` model object (``LlamaForCausalLM``, ``GPT2LMHeadModel``, …): its weights;
2. a bundled name, ``"smollm2-135m"``: the GGUF file an installed package ships
   (:func:`attnlab.models.gguf.bundled_model_path`); ``"minilm-l6"``: the encoder folder an
   installed package ships zipped (:func:`attnlab.models.bundled.bundled_encoder_folder`);
3. a ``.gguf`` file: read with the ``gguf`` package, dequantised, its tokenizer and chat template
   from its metadata (:mod:`attnlab.models.gguf`); the dequantised weights are cached on disk the
   first time, and later loads of the same file read them from there
   (:mod:`attnlab.models.weight_cache`; ``cache=False`` skips it);
4. a Hugging Face folder: ``config.json`` + safetensors (never a pickle), its tokenizer from
   ``tokenizer.json`` / ``tokenizer_config.json`` (:mod:`attnlab.models.hf`);
5. a Hub id (``"HuggingFaceTB/SmolLM2-135M"``): downloaded into the Hugging Face cache when the
   network allows; offline, a one-line error.

The model is attnlab's one decoder (:class:`~attnlab.GPT`) with the family's parts, or for an
encoder family (BERT, RoBERTa, DistilBERT, ELECTRA: :func:`attnlab.models.families.is_encoder`) its
:class:`~attnlab.models.encoder.Encoder`, for an encoder-decoder family (Marian:
:func:`attnlab.models.seq2seq_hf.is_seq2seq`) attnlab's :class:`~attnlab.Transformer`, equal to
the ``transformers`` class of the same weights.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, NamedTuple

import torch

from attnlab._checks import check_device
from attnlab.errors import ArgumentError, ArgumentTypeError, AttnlabError
from attnlab.models.config import GPTConfig
from attnlab.models.encoder import Encoder
from attnlab.models.gpt import GPT
from attnlab.models.transformer import Transformer

__all__ = ["Pretrained", "is_pretrained_source", "load_pretrained", "pretrained_config"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class Pretrained(NamedTuple):
    """What :func:`load_pretrained` returns: ``model, tokenizer = load_pretrained(...)``.

    Attributes:
        model: the :class:`~attnlab.GPT` (an encoder family:
            :class:`~attnlab.models.encoder.Encoder`; an encoder-decoder family:
            :class:`~attnlab.Transformer`), in eval mode.
        tokenizer: its tokenizer (a :class:`~attnlab.data.pretrained_tokenizer.PretrainedTokenizer`
            with the chat template, when the source has one), or ``None`` (a ``transformers``
            model object, a folder without ``tokenizer.json``).
    """

    model: GPT | Encoder | Transformer
    tokenizer: Any


def is_pretrained_source(source: object) -> bool:
    """Whether ``source`` names a pretrained model rather than an attnlab run: a bundled name,
    a ``.gguf`` file, a Hugging Face folder (``config.json`` of a supported ``model_type``,
    no attnlab ``manifest.json``) or a Hub id that is not a local path.

    Args:
        source: what the user gave.

    Returns:
        Whether :func:`load_pretrained` is the reader for it.
    """
    from attnlab.models.bundled import BUNDLED_ENCODERS
    from attnlab.models.gguf import BUNDLED_MODELS

    if not isinstance(source, (str, Path)):
        return not isinstance(source, (bytes, int, float)) and hasattr(source, "state_dict")
    text = str(source)
    if text in BUNDLED_MODELS or text in BUNDLED_ENCODERS or text.lower().endswith(".gguf"):
        return True
    path = Path(text)
    if path.exists():
        return _hf_folder(path)
    return _is_hub_id(text)


def _is_hub_id(text: str) -> bool:
    """``owner/name`` that is no local path (its ``owner`` is no folder here: a mistyped run
    path ``runs/demo`` is not sent to the Hub)."""
    return bool(_HUB_ID.match(text)) and not Path(text).parent.exists()


def _hf_folder(path: Path) -> bool:
    """A folder with a ``config.json`` of a supported ``model_type`` and no ``manifest.json``;
    also one whose ``config.json`` cannot be read (a link to a device, a FIFO, a giant, not
    JSON), which the folder's reader then refuses in one line naming it."""
    from attnlab._checks import read_small_json
    from attnlab.models.families import supported_model_types

    config = path / "config.json"
    if not path.is_dir() or not os.path.lexists(config) or (path / "manifest.json").exists():
        return False
    try:
        data = read_small_json(config)
    except ArgumentError:
        return True
    return data.get("model_type") in supported_model_types()


def load_pretrained(
    source: Any,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    cache: bool = True,
) -> Pretrained:
    """A pretrained decoder or encoder and its tokenizer (see the module docstring for the
    sources).

    Args:
        source: a ``transformers`` model, ``"smollm2-135m"``, ``"minilm-l6"``, a ``.gguf``
            file, a Hugging Face folder or a Hub id.
        dtype: the weights' dtype. Default float32 (a GGUF's quantised weights dequantised).
        device: where to put the model. Default ``"cpu"``.
        cache: a GGUF source (a bundled name, a ``.gguf`` file): read its dequantised weights
            from the cache of :mod:`attnlab.models.weight_cache`, written there by the first
            load (default ``True``); ``False`` dequantises the file and leaves the cache alone.
            Other sources read no cache.

    Returns:
        ``(model, tokenizer)``, a :class:`Pretrained`; the model in eval mode.

    Raises:
        FileNotFoundError: a path that does not exist and is no Hub id.
        ValueError: a source of an unsupported family, a file that is not what it claims, a
            Hub id that cannot be downloaded, a ``device`` this machine lacks (one line each).
        TypeError: ``dtype`` or ``device`` of the wrong type.

    Examples:
        >>> model, tokenizer = load_pretrained("smollm2-135m")
        >>> ids = tokenizer.encode("The capital of France is")
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ArgumentTypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if not isinstance(cache, bool):
        raise ArgumentTypeError(f"cache must be a bool, got {type(cache).__name__}")
    device = check_device("device", device)  # before anything is read
    if not isinstance(source, (str, Path)):
        from attnlab.models.families import is_encoder
        from attnlab.models.hf import from_hf
        from attnlab.models.seq2seq_hf import is_seq2seq, transformer_from_hf

        config = getattr(source, "config", None)
        if config is not None and hasattr(config, "to_dict") and is_encoder(config.to_dict()):
            from attnlab.models.encoder_hf import encoder_from_hf

            return Pretrained(encoder_from_hf(source, dtype=dtype).to(device).eval(), None)
        if config is not None and hasattr(config, "to_dict") and is_seq2seq(config.to_dict()):
            return Pretrained(transformer_from_hf(source, dtype=dtype).to(device).eval(), None)
        return Pretrained(from_hf(source, dtype=dtype).to(device).eval(), None)
    model, tokenizer = _from_path(str(source), dtype, cache)
    return Pretrained(model.to(device).eval(), tokenizer)


def _from_path(
    text: str, dtype: torch.dtype, cache: bool
) -> tuple[GPT | Encoder | Transformer, Any]:
    from attnlab.models import gguf
    from attnlab.models.bundled import BUNDLED_ENCODERS, bundled_encoder_folder

    if text in BUNDLED_ENCODERS:
        return _from_folder(bundled_encoder_folder(text), dtype)
    if text in gguf.BUNDLED_MODELS:
        return _from_gguf(gguf.bundled_model_path(text), dtype, cache)
    path = Path(text)
    if text.lower().endswith(".gguf"):
        gguf.check_gguf_path(path)  # a directory or a FIFO is named as what it is
        return _from_gguf(path, dtype, cache)
    if path.is_dir():
        return _from_folder(path, dtype)
    if path.exists():
        raise ArgumentError(
            f"{path} is neither a Hugging Face folder (config.json + safetensors) nor a .gguf file"
        )
    if _is_hub_id(text):
        return _from_folder(_download(text), dtype)
    names = ", ".join(sorted([*gguf.BUNDLED_MODELS, *BUNDLED_ENCODERS]))
    raise FileNotFoundError(
        f"no such model: {text!r} is not a file or folder, a bundled name ({names}) or a "
        "Hugging Face Hub id (owner/name)"
    )


def pretrained_config(source: str | Path) -> GPTConfig:
    """The :class:`~attnlab.models.config.GPTConfig` of a pretrained source, without reading
    its weights (a GGUF's metadata, a folder's ``config.json`` checked against the weights'
    headers): what ``attnlab flops MODEL`` needs.

    Args:
        source: a bundled name, a ``.gguf`` file, a Hugging Face folder or a Hub id.

    Returns:
        The config.
    """
    from attnlab.models import gguf
    from attnlab.models.bundled import BUNDLED_ENCODERS
    from attnlab.models.hf import check_directory, config_from_hf

    text = str(source)
    if text in BUNDLED_ENCODERS:
        raise ArgumentError(
            f"source must be a decoder (a GPTConfig's model), got the bundled encoder {text!r}"
        )
    if text in gguf.BUNDLED_MODELS:
        return config_from_hf(gguf.read_gguf_config(gguf.bundled_model_path(text)))
    if text.lower().endswith(".gguf"):
        gguf.check_gguf_path(Path(text))
        return config_from_hf(gguf.read_gguf_config(text))
    if Path(text).is_dir():
        return check_directory(text)
    if _is_hub_id(text):
        return check_directory(_download(text))
    raise FileNotFoundError(f"no such model: {text!r}")


def _from_gguf(path: Path, dtype: torch.dtype, cache: bool) -> tuple[GPT, Any]:
    from attnlab.models.hf import model_from_state
    from attnlab.models.weight_cache import read_gguf_cached

    read = read_gguf_cached(path, cache=cache)
    return model_from_state(read.hf_config, read.state, dtype=dtype), read.tokenizer


def _from_folder(path: Path, dtype: torch.dtype) -> tuple[GPT | Encoder | Transformer, Any]:
    from attnlab._checks import read_small_json
    from attnlab.data.pretrained_tokenizer import tokenizer_from_folder
    from attnlab.models.families import is_encoder
    from attnlab.models.hf import model_from_state, read_directory
    from attnlab.models.seq2seq_hf import is_seq2seq, transformer_from_hf

    model: GPT | Encoder | Transformer
    data = read_small_json(path / "config.json") if os.path.lexists(path / "config.json") else {}
    if is_encoder(data):
        from attnlab.models.encoder_hf import encoder_from_hf

        model = encoder_from_hf(path, dtype=dtype)
    elif is_seq2seq(data):
        model = transformer_from_hf(path, dtype=dtype)
    else:
        config, state = read_directory(path, dtype=dtype)
        model = model_from_state(config, state)
    tokenizer = tokenizer_from_folder(path) if os.path.lexists(path / "tokenizer.json") else None
    return model, tokenizer


def _download(repo: str) -> Path:
    """A Hub model's config, safetensors and tokenizer files, into the Hugging Face cache."""
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(
            repo, allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.jinja"]
        )
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AttnlabError(
            f"{repo!r} is not a local file or folder, and it could not be downloaded from the "
            f"Hugging Face Hub ({type(exc).__name__}: {reason[:160]})"
        ) from None
    return Path(folder)
