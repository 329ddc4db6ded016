"""Step 6 — look at the attention: capture every layer's weights, draw them, open the viewer.

``attnlab.inspect.capture`` records each attention layer's weights (B, H, T_q, T_k) by module
path while the model runs, without changing what it computes. We draw layers × heads and write
the self-contained HTML viewer (open it in any browser, no network needed).
"""

import torch
from _common import parse_args

import attnlab as al
from attnlab import viz as figures
from attnlab.inspect import capture
from attnlab.viz.viewer import viewer_data, write_viewer

args = parse_args(__doc__.splitlines()[0])
torch.manual_seed(0)
text = "attention is all you need"
chars = sorted(set(text))
ids = torch.tensor([[chars.index(c) for c in text]])
cfg = al.GPTConfig(
    vocab_size=len(chars), n_positions=64, n_embd=32 if args.small else 64, n_layer=2, n_head=4
)
model = al.GPT(cfg).eval()

with torch.no_grad(), capture(model) as cache:
    plain = model(ids).logits
print("captured layers:", {name: tuple(w.shape) for name, w in cache.attentions.items()})
with torch.no_grad():
    assert torch.equal(model(ids).logits, plain), "capturing must not change the output"
first = next(iter(cache.attentions.values()))[0]
print("row sums of layer 0, head 0:", first[0].sum(-1).numpy().round(4)[:8], "…")

grid = figures.layer_head_grid(cache.attentions, title="layers × heads")
print("wrote", grid.save(args.out / "06_layers_heads.png"))
tokens = list(text)
heat = figures.attention_heatmap(
    first[1], query_tokens=tokens, key_tokens=tokens, title="layer 0, head 1"
)
print("wrote", heat.save(args.out / "06_heatmap.svg"))
page = write_viewer(
    viewer_data(cache.attentions, tokens=tokens, kinds=cache.kinds), args.out / "06_view.html"
)
print("wrote", page, "— open it in a browser")
