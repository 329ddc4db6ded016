"""The attention heatmap of one decoded example (cross-attention of an encoder-decoder)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.inspect.capture import capture
from attnlab.viz.figures import attention_heatmap, head_grid

__all__ = ["save_cross_attention"]


@torch.no_grad()
def save_cross_attention(
    model: nn.Module,
    src: Sequence[int],
    output: Sequence[int],
    *,
    src_tokens: Sequence[str],
    out_tokens: Sequence[str],
    path: str | Path,
    heads_path: str | Path | None = None,
    viewer_path: str | Path | None = None,
) -> Path:
    """Teacher-force ``output`` and draw the last decoder layer's cross-attention.

    The decoder input is ``<bos> y_1 … y_n`` and the rows are labelled with the token each
    position *produces* (``y_1 … y_n <eos>``), so row ``i`` shows where the model looked to write
    output token ``i``. The PNG shows the mean over heads; ``heads_path`` also draws every head.

    Args:
        model: an encoder-decoder in eval mode.
        src: source ids (no specials).
        output: decoded ids (no specials).
        src_tokens: labels of the source positions.
        out_tokens: labels of the produced tokens (``len(output) + 1``: the last is ``<eos>``).
        path: the ``.png`` to write.
        heads_path: optional ``.png`` of every head.
        viewer_path: optional ``.html``: the interactive viewer of every layer and head
            (:mod:`attnlab.viz.viewer`; decoder rows labelled with the tokens the decoder reads).

    Returns:
        ``path``.
    """
    cfg: Any = model.config
    device = next(model.parameters()).device
    src_t = torch.tensor([list(src)], dtype=torch.long, device=device)
    tgt_in = torch.tensor([[cfg.bos_id, *output]], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        with capture(model) as cache:
            model(src_t, tgt_in)
    finally:
        model.train(was_training)
    name = f"decoder.layers.{cfg.num_decoder_layers - 1}.cross_attn"
    weights = cache.attentions[name][0].float().cpu()  # (H, T, S)
    title = f"{name}: mean over {weights.shape[0]} heads"
    attention_heatmap(
        weights.mean(0), query_tokens=list(out_tokens), key_tokens=list(src_tokens), title=title
    ).save(path)
    if heads_path is not None:
        head_grid(
            weights, query_tokens=list(out_tokens), key_tokens=list(src_tokens), title=name
        ).save(heads_path)
    if viewer_path is not None:
        from attnlab.viz.viewer import viewer_data, write_viewer

        data = viewer_data(
            cache.attentions,
            source=list(src_tokens),
            target=["<bos>", *list(out_tokens)[:-1]],
            kinds=cache.kinds,
            title="attnlab demo: reversing a string",
        )
        write_viewer(data, viewer_path)
    return Path(path)
