"""The attention figures of a trained run on one input: what the report and the commands draw.

Everything here starts from :class:`~attnlab.tasks.base.ModelInputs`, so a figure shows the
attention of exactly what the model read (special tokens included) and labels the target side with
what the model wrote.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import nn

from attnlab.inspect.capture import (
    ActivationCache,
    attention_modules,
    capture,
    capture_attention,
)
from attnlab.tasks.base import ModelInputs
from attnlab.viz.attention import attention_heatmap, head_grid
from attnlab.viz.viewer import ViewerData, viewer_data

__all__ = [
    "attention_size",
    "capture_inputs",
    "layer_labels",
    "layer_sequences",
    "save_attention_figures",
    "token_sequences",
    "viewer_for",
]

logger = logging.getLogger(__name__)


@torch.no_grad()
def capture_inputs(
    model: nn.Module, inputs: ModelInputs, *, attention_only: bool = False, **options: Any
) -> ActivationCache:
    """Run ``model`` once on ``inputs`` (eval mode) and capture its attention.

    Args:
        model: the run's model.
        inputs: from the task's :class:`~attnlab.tasks.base.TaskIO`.
        attention_only: stop the forward once every captured attention layer has run
            (:func:`attnlab.inspect.capture_attention`): no logits, for long inputs.
        **options: passed to :func:`attnlab.inspect.capture` (``names``, ``weights``, ``stats``).

    Returns:
        The :class:`~attnlab.inspect.ActivationCache`.
    """
    was_training = model.training
    model.eval()
    try:
        if attention_only:
            return capture_attention(model, lambda: inputs.forward(model), **options)
        with capture(model, **options) as cache:
            inputs.forward(model)
    finally:
        model.train(was_training)
    return cache


def attention_size(
    model: nn.Module, inputs: ModelInputs, names: Callable[[str], bool] | None = None
) -> tuple[int, int, int]:
    """How large a capture of the attention weights of ``inputs`` would be, before it is made.

    Args:
        model: the run's model.
        inputs: what it reads.
        names: which layers are captured (a module path → keep it), default every one.

    Returns:
        ``(layers, heads, T)``: the selected attention layers, their heads together and the
        longest sequence they attend over (a language model's tokens, the longer side of an
        encoder-decoder); the weights number at most ``heads · T²``.
    """
    lengths = (len(inputs.source_tokens), len(inputs.target_tokens))
    t = sum(lengths) if inputs.kind == "lm" else max(lengths)
    layers = [m for n, m in attention_modules(model).items() if names is None or names(n)]
    return len(layers), sum(m.num_heads for m in layers), t


def token_sequences(inputs: ModelInputs) -> dict[str, list[str]]:
    """The labelled token sequences of ``inputs``.

    Args:
        inputs: what the model read.

    Returns:
        ``{"tokens": ...}`` for a language model, or ``{"source": ..., "target": ...}`` for an
        encoder-decoder (target positions labelled by the token they wrote).
    """
    if inputs.kind == "lm":
        return {"tokens": list(inputs.tokens)}
    return {"source": list(inputs.source_tokens), "target": list(inputs.target_tokens)}


def layer_sequences(inputs: ModelInputs, name: str, kind: str) -> tuple[str, str]:
    """Which of :func:`token_sequences` label one attention layer's queries and keys.

    Encoder self-attention: source × source; decoder self-attention: target × target;
    cross-attention: target × source; a language model: its tokens × its tokens.

    Args:
        inputs: what the model read.
        name: the layer's module path (``"encoder.layers.0.self_attn"``, ...).
        kind: ``"self"`` or ``"cross"``.

    Returns:
        ``(query sequence, key sequence)``, keys of :func:`token_sequences`.
    """
    if inputs.kind == "lm":
        return "tokens", "tokens"
    if kind == "cross":
        return "target", "source"
    if name.startswith("encoder") or ".encoder." in name:
        return "source", "source"
    return "target", "target"


def layer_labels(
    inputs: ModelInputs, name: str, kind: str, cache: ActivationCache | None = None
) -> tuple[list[str], list[str]]:
    """The labels of one attention layer's queries and keys (see :func:`layer_sequences`): the
    rows and columns of its captured weights.

    A layer whose keys are projected along the sequence (Linformer, in ``cache.projected``)
    attends over the ``k`` rows of ``E K``, not over tokens: its key labels are
    ``"E·K row 0"`` … (:meth:`~attnlab.inspect.ActivationCache.key_labels`). The token labels
    of its keys (the columns of its effective weights ``A · F``) are those of the call
    without ``cache``.

    Args:
        inputs: what the model read.
        name: the layer's module path.
        kind: ``"self"`` or ``"cross"``.
        cache: the capture the weights come from, for the layers with projected keys; default
            ``None``: token labels on both sides.

    Returns:
        ``(query labels, key labels)``.
    """
    seqs = token_sequences(inputs)
    query, key = layer_sequences(inputs, name, kind)
    rows = None if cache is None else cache.key_labels(name)
    return seqs[query], seqs[key] if rows is None else rows


def viewer_for(inputs: ModelInputs, cache: ActivationCache, title: str) -> ViewerData:
    """The HTML viewer's data for a capture of ``inputs``.

    Args:
        inputs: what the model read.
        cache: the attention captured while it read them.
        title: the viewer's title.

    Returns:
        The viewer's data, every captured layer labelled by its tokens (a layer with projected
        keys, Linformer, by its ``"E·K row j"`` rows, with its effective weights ``A · F``); a
        language model's generated tokens are marked as such (``prompt_length``), with their
        probabilities and alternatives (``token_scores``).
    """
    if inputs.kind == "lm":
        return viewer_data(
            cache.attentions,
            tokens=list(inputs.tokens),
            kinds=cache.kinds,
            projected=cache.projected,
            title=title,
            prompt_length=len(inputs.source_tokens) if inputs.target_tokens else None,
            token_scores=[t.to_json() for t in inputs.token_scores] or None,
            bidirectional=inputs.bidirectional,
            special={"tokens": list(inputs.special_positions)}
            if inputs.special_positions
            else None,
        )
    return viewer_data(
        cache.attentions,
        source=list(inputs.source_tokens),
        target=list(inputs.target_tokens),
        kinds=cache.kinds,
        projected=cache.projected,  # Linformer layers: T × k over E·K rows, and A·F
        title=title,
    )


def save_attention_figures(
    model: nn.Module, inputs: ModelInputs, run_dir: Path, console: Console, *, title: str
) -> None:
    """Write ``attention.png`` (the last cross-attention layer, or the last layer, mean over heads),
    ``attention_heads.png`` (its heads) and ``attention.html`` (the viewer of every layer).

    A figure never loses the trained run: a failure is logged as a warning.

    Args:
        model: the trained model.
        inputs: the example to draw, as the task reads it.
        run_dir: the run folder the files go to.
        console: where to print the paths written.
        title: the figures' title.
    """
    try:
        cache = capture_inputs(model, inputs)
        names = cache.names("cross") or cache.names()
        name = names[-1]
        rows, cols = layer_labels(inputs, name, cache.kinds.get(name, "self"), cache)
        weights = cache.attentions[name][0].float().cpu()  # (H, T_q, T_k)
        path = run_dir / "attention.png"
        attention_heatmap(
            weights.mean(0), query_tokens=rows, key_tokens=cols,
            title=f"{name}: mean over {weights.shape[0]} heads",
        ).save(path)  # fmt: skip
        head_grid(weights, query_tokens=rows, key_tokens=cols, title=name).save(
            run_dir / "attention_heads.png"
        )
        from attnlab.viz.viewer import write_viewer

        write_viewer(viewer_for(inputs, cache, title), run_dir / "attention.html")
        console.print(f"attention heatmap: {path}", soft_wrap=True)
        console.print(f"attention viewer: {run_dir / 'attention.html'}", soft_wrap=True)
    except (ValueError, KeyError, OSError) as exc:
        logger.warning("could not draw the attention figures: %s", exc)
