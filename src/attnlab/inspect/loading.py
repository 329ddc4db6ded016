"""Rebuild a model (and its tokenizer) from a run folder, a checkpoint or a GPT-2 directory.

Accepted paths:

* a run folder (its latest checkpoint), its ``checkpoints`` folder, or one checkpoint directory
  written by :mod:`attnlab.training.checkpoint` — the model is built from ``config.json``'s
  ``"model"`` entry (a :func:`~attnlab.models.config.config_to_dict` dict) and the tokenizer read
  from the checkpoint's ``tokenizer.json`` when there is one;
* a Hugging Face GPT-2 directory (``config.json`` with ``"model_type": "gpt2"``), loaded with
  :meth:`attnlab.GPT.from_hf`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.data.tokenizers import tokenizer_from_json
from attnlab.models.config import GPTConfig, TransformerConfig, config_from_dict
from attnlab.models.gpt import GPT
from attnlab.models.transformer import Transformer
from attnlab.training.checkpoint import (
    CheckpointError,
    load_config,
    load_model_weights,
    read_checkpoint_file,
    resolve_checkpoint,
)

__all__ = ["LoadedModel", "load_model"]

TOKENIZER_FILES = ("tokenizer.json", "src_tokenizer.json")


@dataclass
class LoadedModel:
    """A model ready to run, in eval mode.

    Attributes:
        model: an :class:`attnlab.GPT` or :class:`attnlab.Transformer`.
        config: its config.
        tokenizer: the saved tokenizer (``encode``/``decode``), or ``None``.
        path: the checkpoint (or GPT-2) directory it came from.
    """

    model: nn.Module
    config: GPTConfig | TransformerConfig
    tokenizer: Any
    path: Path

    @property
    def is_seq2seq(self) -> bool:
        """Whether the model is the encoder-decoder."""
        return isinstance(self.config, TransformerConfig)


def load_model(path: str | os.PathLike[str], *, device: str | torch.device = "cpu") -> LoadedModel:
    """Load the model of a run folder, a checkpoint directory or a GPT-2 directory.

    Args:
        path: see the module docstring.
        device: where to put the model. Default ``"cpu"``.

    Returns:
        A :class:`LoadedModel` (model in eval mode).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the folder holds no loadable model (one line naming the reason).
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such run or checkpoint folder: {p}")
    hf = _hf_gpt2_dir(p)
    if hf is not None:
        gpt = GPT.from_hf(hf)
        tokenizer = None
        if (hf / "tokenizer.json").is_file():
            tokenizer = tokenizer_from_json((hf / "tokenizer.json").read_text(encoding="utf-8"))
        return LoadedModel(gpt.to(device).eval(), gpt.config, tokenizer, hf)
    ckpt = resolve_checkpoint(p)
    run_config = load_config(ckpt)
    model_dict = run_config.get("model") if isinstance(run_config, dict) else None
    if not isinstance(model_dict, dict):
        raise CheckpointError(f"checkpoint {ckpt}: config.json has no 'model' entry to build from")
    config = _config_of(model_dict, ckpt)
    model: nn.Module = GPT(config) if isinstance(config, GPTConfig) else Transformer(config)
    load_model_weights(ckpt, model)
    tokenizer = None
    for name in TOKENIZER_FILES:
        try:
            text = read_checkpoint_file(ckpt, name).decode("utf-8")
        except CheckpointError:
            continue
        tokenizer = tokenizer_from_json(text)
        break
    return LoadedModel(model.to(device).eval(), config, tokenizer, ckpt)


def _config_of(data: dict[str, Any], ckpt: Path) -> GPTConfig | TransformerConfig:
    kind = data.get("kind")
    if kind is None:  # no class name saved: tell the two apart by their fields
        kind = "GPTConfig" if "n_embd" in data else "TransformerConfig"
    classes = {"GPTConfig": GPTConfig, "TransformerConfig": TransformerConfig}
    if kind not in classes:
        raise CheckpointError(
            f"checkpoint {ckpt}: model kind must be GPTConfig or TransformerConfig, got {kind!r}"
        )
    return config_from_dict(classes[kind], data)  # type: ignore[no-any-return]


def _hf_gpt2_dir(p: Path) -> Path | None:
    cfg = p / "config.json"
    if not p.is_dir() or not cfg.is_file() or (p / "manifest.json").exists():
        return None
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return p if isinstance(data, dict) and data.get("model_type") == "gpt2" else None
