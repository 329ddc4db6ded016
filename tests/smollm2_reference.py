"""Transformers' own load of the bundled SmolLM2 GGUF, the reference of the SmolLM2 tests, once per run.

``transformers`` dequantises a GGUF file with the ``gguf`` package's NumPy code (about 30 s on one
core), and ``make test``'s two pytest workers would each do it for every module that needs it. The
first process to need it loads the file that way and saves what transformers made — its float32
tensors and its config — into the run's shared temporary folder, under a
file lock; every later fixture, in any worker, loads those files: the same tensors, bit for bit
(``tests/models/test_gguf.py`` checks every one against attnlab's own reading of the GGUF).
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from filelock import FileLock
from safetensors.torch import save_model

from attnlab.models.gguf import bundled_model_path


def _run_folder(factory: pytest.TempPathFactory) -> Path:
    """This run's temporary folder, shared by its xdist workers (each has a subfolder of it)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def reference_folder(factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face folder of transformers' GGUF load of SmolLM2-135M, made once per run."""
    folder = _run_folder(factory) / "smollm2-transformers"
    with FileLock(f"{folder}.lock"):
        if not (folder / "config.json").is_file():
            import gguf
            from transformers import AutoModelForCausalLM

            path = bundled_model_path("smollm2-135m")
            # transformers parses the file's header (its 49k-token vocabulary, ~3.6 s) once for
            # the config and again for the tensors, and builds gguf's tensor-name map (~18 ms)
            # once per tensor: both are pure functions of their arguments (the reader is a
            # read-only memory map), so this load asks gguf once for each; transformers' own
            # code still reads, maps and dequantises every tensor
            reader = functools.lru_cache(maxsize=None)(gguf.GGUFReader)
            name_map = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)
            with (
                mock.patch.object(gguf, "GGUFReader", reader),
                mock.patch.object(gguf, "get_tensor_name_map", name_map),
            ):
                model = AutoModelForCausalLM.from_pretrained(
                    path.parent, gguf_file=path.name, dtype=torch.float32
                )
            partial = folder.with_name(folder.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            # transformers will not save_pretrained a model it read from GGUF: its config and its
            # tensors (the tied lm_head once), which from_pretrained reads back
            model.config.save_pretrained(partial)
            save_model(model, str(partial / "model.safetensors"))
            partial.rename(folder)  # complete or absent: a killed run leaves no half folder
    return folder


def transformers_smollm2(factory: pytest.TempPathFactory, **kwargs: Any) -> Any:
    """``AutoModelForCausalLM`` holding transformers' own float32 load of the bundled GGUF."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        reference_folder(factory), dtype=torch.float32, **kwargs
    )
