"""Step 1 — attention is three matrix products and a softmax.

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V          (Vaswani et al. 2017, §3.2.1)

We compute it by hand for a few token vectors, check it against attnlab's function, and draw
the step panel x → QKᵀ/√d → softmax weights → output.
"""

import torch
from _common import parse_args

import attnlab as al
from attnlab import viz as figures

args = parse_args(__doc__.splitlines()[0])
torch.manual_seed(0)
tokens = "the cat sat on the mat".split()
d = 4 if args.small else 8
x = torch.randn(len(tokens), d)
w_q, w_k, w_v = (torch.randn(d, d) / d**0.5 for _ in range(3))

q, k, v = x @ w_q, x @ w_k, x @ w_v  # (T, d) each
scores = q @ k.T / d**0.5  # (T, T)
weights = torch.softmax(scores, dim=-1)  # each row sums to 1
out = weights @ v  # (T, d)

ref = al.scaled_dot_product_attention(q[None, None], k[None, None], v[None, None])[0, 0]
print("weights (rows sum to 1):\n", weights.numpy().round(3))
print("row sums:", weights.sum(-1).numpy().round(6))
print(f"max |by hand - attnlab| = {(out - ref).abs().max():.2e}")

plot = figures.step_panel(x, q, k, v, tokens=tokens, title="one head, step by step")
print("wrote", plot.save(args.out / "01_steps.png"))
