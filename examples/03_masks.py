"""Step 3 — masks: padding hides keys that are not tokens, the look-ahead mask hides the future.

attnlab's one convention: a boolean mask means True = may attend. The decoder's self-attention
uses both masks combined.
"""

import torch
from _common import parse_args

import attnlab as al
from attnlab import viz as figures

args = parse_args(__doc__.splitlines()[0])
torch.manual_seed(0)
tokens = "<s> the cat sat <pad> <pad>".split()
vocab = {t: i for i, t in enumerate(dict.fromkeys(["<pad>", *tokens]))}
ids = torch.tensor([[vocab[t] for t in tokens]])

pad = al.masks.padding_mask(ids, pad_id=vocab["<pad>"])  # (B, 1, 1, T)
causal = al.masks.causal_mask(len(tokens))  # (T, T), bottom-right aligned
both = al.masks.combine(pad, causal)
print("padding mask:", pad[0, 0, 0].int().tolist())
print("look-ahead + padding:\n", both[0, 0].int().numpy())

mha = al.MultiHeadAttention(8, 2).eval()
x = torch.randn(1, len(tokens), 8)
_, w = mha(x, mask=both, need_weights=True)
print("weights of head 0 (zeros where masked):\n", w[0, 0].detach().numpy().round(3))
assert (w[0, :, :, 4:] == 0).all(), "padding must get no attention"

print("wrote", figures.mask_panel(tokens).save(args.out / "03_masks.png"))
heat = figures.attention_heatmap(
    w[0, 0].detach(),
    query_tokens=tokens,
    key_tokens=tokens,
    mask=both[0, 0],
    title="masked attention, head 0",
)
print("wrote", heat.save(args.out / "03_masked_heatmap.png"))
