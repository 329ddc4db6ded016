"""Tiny models for the decoding tests."""

from __future__ import annotations

import math

import torch

from attnlab import GPT, GPTConfig, Transformer, TransformerConfig


def tiny_gpt(
    vocab_size: int = 61,
    *,
    n_positions: int = 64,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    **overrides: object,
) -> GPT:
    """A 2-layer GPT whose weights are scaled up so that greedy outputs vary (GPT-2's init on a
    model this small mostly repeats the last token)."""
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=vocab_size, n_positions=n_positions, n_embd=32, n_layer=2, n_head=4, **overrides
    )
    model = GPT(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("transformer.h.") and name.endswith("weight") and ".ln_" not in name:
                p.mul_(20.0)
        model.transformer.wte.weight.mul_(8.0)
        if model.transformer.wpe is not None:
            model.transformer.wpe.weight.mul_(8.0)
    return model.to(dtype).eval()


def tiny_transformer(vocab_size: int = 23, *, dtype: torch.dtype = torch.float64) -> Transformer:
    """A 2+2-layer encoder-decoder (pad 0, bos 1, eos 2)."""
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=vocab_size,
        tgt_vocab_size=vocab_size,
        d_model=32,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        d_ff=64,
        dropout=0.0,
        max_len=32,
    )
    return Transformer(cfg).to(dtype).eval()


@torch.no_grad()
def greedy_without_cache(
    model: GPT, ids: torch.Tensor, n: int, **forward_kw: object
) -> torch.Tensor:
    """Greedy decoding the slow way: the whole sequence through ``forward`` at every step, no
    cache — the reference that cached decoding must reproduce."""
    for _ in range(n):
        nxt = model(ids, **forward_kw).logits[:, -1].argmax(-1)  # type: ignore[arg-type]
        ids = torch.cat([ids, nxt[:, None]], dim=1)
    return ids


def filtered_softmax(
    z: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None
) -> torch.Tensor:
    """π = softmax(filter(z / τ)), written out: top-k keeps z >= the k-th largest, top-p keeps a
    token when the mass of the more likely ones is below p."""
    z = z / temperature
    if top_k is not None:
        z = torch.where(z >= z.sort(descending=True).values[..., top_k - 1 : top_k], z, -math.inf)
    if top_p is not None:
        p = z.softmax(-1)
        sorted_p, order = p.sort(-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p
        keep = torch.zeros_like(p, dtype=torch.bool).scatter(-1, order, before < top_p)
        z = torch.where(keep, z, -math.inf)
    return z.softmax(-1)
