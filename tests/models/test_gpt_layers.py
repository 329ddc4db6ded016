"""The decoder block's parts (attnlab.models.gpt_layers)."""

from __future__ import annotations

import torch

import attnlab as al
from attnlab.models.gpt_layers import GPTMLP


def test_mlp_dropout_is_skipped_only_where_it_changes_nothing() -> None:
    """In evaluation the dropout module is not called (a decoding step saves two calls a
    layer), unless a hook listens on it; in training it drops."""
    torch.manual_seed(0)
    cfg = al.GPTConfig(vocab_size=10, n_positions=8, n_embd=16, n_layer=1, n_head=2, dropout=0.5)
    mlp = GPTMLP(cfg)
    x = torch.randn(2, 3, 16)
    mlp.eval()
    want = mlp.c_proj(mlp.act(mlp.c_fc(x)))
    assert torch.equal(mlp(x), want)
    seen: list[torch.Tensor] = []
    handle = mlp.dropout.register_forward_hook(lambda m, a, out: seen.append(out))
    assert torch.equal(mlp(x), want) and len(seen) == 1
    handle.remove()
    mlp.train()
    torch.manual_seed(1)
    dropped = mlp(x)
    assert not torch.equal(dropped, want)
    assert ((dropped == 0) | torch.isclose(dropped, 2 * want)).all()
