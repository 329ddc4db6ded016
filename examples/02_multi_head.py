"""Step 2 — multi-head attention, and why heads differ.

Each head projects the tokens with its own W_i^Q, W_i^K, so it compares them in a different
subspace and attends to different things. We look at every head of one layer and measure how
different their weights are (mean total-variation distance between heads' rows).
"""

import torch
from _common import parse_args

import attnlab as al
from attnlab import viz as figures

args = parse_args(__doc__.splitlines()[0])
torch.manual_seed(0)
tokens = "the quick brown fox jumps over the lazy dog".split()
d_model, heads = (16, 4) if args.small else (64, 8)
mha = al.MultiHeadAttention(d_model, heads).eval()
x = torch.randn(1, len(tokens), d_model)
out, w = mha(x, need_weights=True)  # w: (B, H, T, T), one matrix per head
w = w.detach()[0]

tv = 0.5 * (w[:, None] - w[None, :]).abs().sum(-1).mean(-1)  # (H, H)
print("output shape:", tuple(out.shape), "weights shape:", tuple(w.shape))
print("mean distance between heads' attention rows (0 = identical, 1 = disjoint):")
print(tv.numpy().round(3))
print(
    "entropy per head (nats):", (-(w * w.clamp_min(1e-12).log()).sum(-1)).mean(-1).numpy().round(3)
)

plot = figures.head_grid(w, query_tokens=tokens, key_tokens=tokens, title="every head of one layer")
print("wrote", plot.save(args.out / "02_heads.png"))
