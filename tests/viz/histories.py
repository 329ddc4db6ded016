"""Fake but plausible probe histories: attention that sharpens into distinct head roles.

At step 0 every head is near-uniform (small random logits, as with freshly initialised weights);
by the last step each head has grown into its role, with a strength that rises like
``1 − exp(−step / τ)`` at a per-head pace:

* GPT (causal): head 0 looks at the previous token, head 1 at the first token (a "sink"),
  head 2 at itself, head 3 stays diffuse;
* encoder-decoder (reversing a sequence): cross-attention of target position ``i`` moves onto source
  position ``S − 1 − i``.
"""

from __future__ import annotations

import torch

from attnlab.nn.masks import causal_mask
from attnlab.viz.probe_history import ProbeHistory

GPT_WORDS = "<bos> the cat sat on the mat and the dog".split()
SOURCE = "a b c d e f g".split()
TARGET = "<s> g f e d c b".split()


def _softmax(logits: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    return torch.softmax(logits, dim=-1)


def gpt_history(steps: list[int] | None = None, *, layers: int = 2, seed: int = 0) -> ProbeHistory:
    steps = steps if steps is not None else [0, 50, 100, 200, 400, 800, 1600]
    g = torch.Generator().manual_seed(seed)
    t = len(GPT_WORDS)
    allowed = causal_mask(t)
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    roles = torch.stack(
        [
            (j == (i - 1).clamp(min=0)).float(),  # previous token
            (j == 0).float().expand(t, t),  # first token
            (j == i).float(),  # itself
            torch.zeros(t, t),  # diffuse
        ]
    )  # (4, T, T)
    pace = torch.tensor([150.0, 400.0, 900.0, 1.0])
    strength = torch.tensor([7.0, 5.0, 4.0, 0.0])
    history = ProbeHistory.new(tokens=GPT_WORDS)
    noise = [torch.randn(4, t, t, generator=g) for _ in range(layers)]
    for step in steps:
        record = {}
        for layer in range(layers):
            grown = strength * (1 - torch.exp(-step / pace)) * (1.0 - 0.3 * layer)
            logits = grown[:, None, None] * roles + 0.3 * noise[layer]
            record[f"transformer.h.{layer}.attn"] = _softmax(logits, allowed)[None]  # (1, H, T, T)
        history.record(step, record)
    return history


def seq2seq_history(steps: list[int] | None = None, *, seed: int = 0) -> ProbeHistory:
    steps = steps if steps is not None else [0, 100, 200, 400, 800]
    g = torch.Generator().manual_seed(seed)
    s, t = len(SOURCE), len(TARGET)
    i = torch.arange(t)[:, None]
    j = torch.arange(s)[None, :]
    mirror = (j == (s - 1 - i).clamp(min=0)).float()  # (T, S)
    history = ProbeHistory.new(source=SOURCE, target=TARGET)
    enc_noise = torch.randn(2, s, s, generator=g)
    dec_noise = torch.randn(2, t, t, generator=g)
    cross_noise = torch.randn(2, t, s, generator=g)
    for step in steps:
        grow = 1 - torch.exp(torch.tensor(-step / 300.0))
        record = {
            "encoder.layers.0.self_attn": _softmax(0.5 * enc_noise * (1 + 3 * grow))[None],
            "decoder.layers.0.self_attn": _softmax(
                0.5 * dec_noise * (1 + 3 * grow), causal_mask(t)
            )[None],
            "decoder.layers.0.cross_attn": _softmax(
                torch.stack([8 * grow * mirror, 3 * grow * mirror]) + 0.3 * cross_noise
            )[None],
        }
        history.record(
            step,
            record,
            {
                "encoder.layers.0.self_attn": "self",
                "decoder.layers.0.self_attn": "self",
                "decoder.layers.0.cross_attn": "cross",
            },
        )
    return history
