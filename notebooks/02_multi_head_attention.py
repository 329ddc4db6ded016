# %% [markdown]
# # 2 · Multi-head attention: several heads look for different things
#
# One attention head averages the values of the tokens it attends to. To gather information from
# several places at once, the Transformer runs $h$ heads side by side, each with its own
# projections, and concatenates their outputs (Vaswani et al. 2017, §3.2.2; The Annotated
# Transformer, `MultiHeadedAttention`):
#
# $$\mathrm{MultiHead}(Q, K, V) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\,W^O,
#   \qquad \mathrm{head}_i = \mathrm{Attention}(Q W_i^Q,\; K W_i^K,\; V W_i^V)$$
#
# In this notebook you will
#
# - split the projections into heads and concatenate them again **by hand**, and check the result
#   against `attnlab.MultiHeadAttention` and `torch.nn.MultiheadAttention`;
# - train one layer with **one head** and with **several heads** (same width $d_\text{model}$) on
#   a task that needs two relations at once, and see that only several heads solve it — each head
#   specialising in one relation.

# %%
FULL = False  # True: longer sequences, a wider model, 1/2/4 heads (about a minute)

import itertools

import torch
import torch.nn.functional as F
from IPython.display import display
from torch import nn

import attnlab as al
from attnlab import viz

PAIRS = 6 if FULL else 4  # colours; each appears twice, so sequences have T = 2 · PAIRS tokens
NUMBERS = 16  # each token also carries a number 0 … 15
D_MODEL = 32 if FULL else 16
STEPS = 2000 if FULL else 800
HEADS = (1, 2, 4) if FULL else (1, 2)
BATCH = 128
torch.set_printoptions(precision=3, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Heads by hand
#
# `attnlab.MultiHeadAttention` keeps $W^Q, W^K, W^V$ stacked in one matrix `in_proj_weight`
# (as `torch.nn.MultiheadAttention` does) and computes $y = x W^\top + b$. With
# $d_\text{model} = 8$ and $h = 2$ heads, each head works in $d_\text{head} = 8 / 2 = 4$ dimensions:
# head $i$ reads columns $4i \dots 4i+3$ of $Q$, $K$ and $V$. We take the layer's own weights and
# redo its computation step by step.

# %%
d_model, num_heads = 8, 2
d_head = d_model // num_heads
mha = al.MultiHeadAttention(d_model, num_heads).eval()
with torch.no_grad():  # non-zero biases, so that the check covers them too
    mha.in_proj_bias.normal_(0, 0.1)
    mha.out_proj.bias.normal_(0, 0.1)
x = torch.randn(1, 5, d_model)  # (B, T, d_model)

w_q, w_k, w_v = mha.in_proj_weight.detach().chunk(3)  # each (d_model, d_model)
b_q, b_k, b_v = mha.in_proj_bias.detach().chunk(3)
q, k, v = x @ w_q.T + b_q, x @ w_k.T + b_k, x @ w_v.T + b_v  # (B, T, d_model)

heads = []
for i in range(num_heads):
    cols = slice(i * d_head, (i + 1) * d_head)  # head i's slice of the projections
    q_i, k_i, v_i = q[..., cols], k[..., cols], v[..., cols]  # (B, T, d_head)
    a_i = torch.softmax(q_i @ k_i.transpose(-2, -1) / d_head**0.5, dim=-1)  # (B, T, T)
    heads.append(a_i @ v_i)  # (B, T, d_head)
concat = torch.cat(heads, dim=-1)  # (B, T, h · d_head) = (B, T, d_model)
by_hand = concat @ mha.out_proj.weight.detach().T + mha.out_proj.bias.detach()  # Concat(…) W^O

with torch.no_grad():
    out, w = mha(x, need_weights=True)  # w: (B, H, T, T), one matrix per head
diff = (by_hand - out).abs().max().item()
print("output", tuple(out.shape), "weights", tuple(w.shape))
print(f"max |by hand − attnlab.MultiHeadAttention| = {diff:.2e}")
assert diff < 1e-6

# %% [markdown]
# ### One token, every head
#
# Say the five positions read "we sat by the bank". The last token's query, key and value are
# one row each of $Q$, $K$, $V$ ($d_\text{model} = 8$ numbers); head $i$ sees only its 4 of
# them. So "bank" asks a different question in each head — one head may look for "river", another
# for "money" — and the per-head slices are all there is to it:

# %%
sentence = ["we", "sat", "by", "the", "bank"]
bank = sentence.index("bank")
for name, proj in (("q", q), ("k", k), ("v", v)):
    per_head = proj[0, bank].view(num_heads, d_head)  # (H, d_head): row i is head i's slice
    for i in range(num_heads):
        print(f"head {i} {name}('bank') = {per_head[i]}")
        assert torch.equal(per_head[i], proj[0, bank, i * d_head : (i + 1) * d_head])

# %% [markdown]
# In attnlab the split is a reshape, not a loop: `(B, T, d_model)` → `(B, T, H, d_head)` →
# `(B, H, T, d_head)`, so all heads go through `scaled_dot_product_attention` at once. The way
# back, `(B, H, T, d_head)` → `(B, T, H·d_head)`, needs a **copy**: `transpose` only swaps two
# strides, so the numbers of one token are no longer next to each other in memory, and `view`
# (which never copies) refuses. `.contiguous()` makes the copy first (`reshape` does it when it
# must):

# %%
per_head = q.view(1, 5, num_heads, d_head).transpose(1, 2).contiguous()  # (B, H, T, d_head)
merged = per_head.transpose(1, 2)  # (B, T, H, d_head): the same memory, strides swapped
print("contiguous after transpose?", merged.is_contiguous(), "strides", merged.stride())
refused = False
try:
    merged.view(1, 5, d_model)
except RuntimeError as error:
    refused = True
    print("RuntimeError:", str(error).split(";")[0])
assert refused
merged = merged.contiguous().view(1, 5, d_model)  # copy into token-major order, then view
assert torch.equal(merged, q)

# %% [markdown]
# PyTorch's own layer computes the same thing; `MultiHeadAttention.from_torch` copies its weights.

# %%
torch_mha = nn.MultiheadAttention(d_model, num_heads, batch_first=True).eval()
ours = al.MultiHeadAttention.from_torch(torch_mha).eval()
with torch.no_grad():
    ref, ref_w = torch_mha(x, x, x, need_weights=True, average_attn_weights=False)
    got, got_w = ours(x, need_weights=True)
diff = max((ref - got).abs().max().item(), (ref_w - got_w).abs().max().item())
print(f"max |torch.nn.MultiheadAttention − attnlab| (output and weights) = {diff:.2e}")
assert diff < 1e-6

# %% [markdown]
# At initialisation the heads attend almost uniformly and differ only by chance. Two numbers
# summarise a layer: the **entropy** of each head's rows (uniform over $T$ keys: $\ln T$) and the
# mean **total-variation distance** between two heads' rows,
# $\tfrac12 \sum_j |A^{(a)}_{ij} - A^{(b)}_{ij}|$ (0 = identical, 1 = disjoint).


# %%
def entropy(weights: torch.Tensor) -> torch.Tensor:
    """Mean row entropy per head (nats): (B, H, T_q, T_k) → (H,)."""
    return -(weights * weights.clamp_min(1e-12).log()).sum(-1).mean((0, 2))


def head_distance(weights: torch.Tensor) -> torch.Tensor:
    """Mean total-variation distance between heads' rows: (B, H, T_q, T_k) → (H, H)."""
    return 0.5 * (weights[:, :, None] - weights[:, None, :]).abs().sum(-1).mean((0, 3))


words = "the quick brown fox jumps over the lazy dog".split()
layer = al.MultiHeadAttention(16, 4).eval()
with torch.no_grad():
    _, w0 = layer(torch.randn(1, len(words), 16), need_weights=True)
print(
    f"entropy per head: {entropy(w0)}  (uniform: ln {len(words)} = {torch.tensor(9.0).log():.3f})"
)
print("distance between heads:\n", head_distance(w0))
assert (entropy(w0) > 0.85 * torch.tensor(float(len(words))).log()).all()  # close to uniform
viz.head_grid(w0[0], query_tokens=words, key_tokens=words, title="four untrained heads")

# %% [markdown]
# ## A task that needs two relations at once
#
# Each token has a **colour** (a letter) and a **number**; every colour appears exactly twice in
# a sequence. At each position the model must output two numbers:
#
# 1. the number of the **previous token** (position $i - 1$, wrapping around) — a relation by
#    *position*;
# 2. the number of the **other token with the same colour** (its partner) — a relation by
#    *content*.
#
# ```
# tokens   B3  A7  C0  B12  D5  A1  C9  D14
# previous D14 B3  A7  C0   B12 D5  A1  C9
# partner  B12 A1  C9  B3   D14 A7  C0  D5
# ```

# %%
T = 2 * PAIRS
COLOURS = "ABCDEFGH"[:PAIRS]


def make_batch(size: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """colours, numbers (B, T) and the targets (B, T, 2): previous number, partner's number."""
    colours = torch.argsort(torch.rand(size, T, generator=gen), dim=-1) // 2  # each colour twice
    numbers = torch.randint(0, NUMBERS, (size, T), generator=gen)
    same = colours[:, :, None] == colours[:, None, :]  # (B, T, T)
    partner = (same & ~torch.eye(T, dtype=torch.bool)).int().argmax(-1)  # (B, T)
    previous = numbers.roll(1, dims=1)
    return colours, numbers, torch.stack([previous, numbers.gather(1, partner)], -1), partner


def labels(colours: torch.Tensor, numbers: torch.Tensor) -> list[str]:
    return [f"{COLOURS[c]}{n}" for c, n in zip(colours.tolist(), numbers.tolist())]


colours, numbers, target, partner = make_batch(1, torch.Generator().manual_seed(0))
print("tokens  ", labels(colours[0], numbers[0]))
print("previous", target[0, :, 0].tolist())
print("partner ", target[0, :, 1].tolist())

# %% [markdown]
# The model is the smallest that can do it: an embedding (colour + number + position), **one
# attention layer** with a residual connection, and a linear read-out of both numbers — a
# one-layer *attention-only* Transformer (Elhage et al. 2021, "A Mathematical Framework for
# Transformer Circuits"):
#
# $$h = E_\text{colour} + E_\text{number} + E_\text{position}, \qquad
#   \text{logits} = \big(h + \mathrm{MultiHead}(h)\big)\, W_\text{out}$$
#
# Only the attention layer can bring information from other positions. With one head, the output
# at $i$ is *one* weighted average $\sum_j a_{ij} v_j$ of values made by *one* $W^V$: the numbers
# of the previous token and of the partner land in the same subspace, mixed. With two heads each
# relation gets its own $W_i^V$ and its own slice of $W^O$.

#
# `nn.Embedding` is a lookup table: `E(ids)` returns rows `ids` of `E.weight`, the same numbers
# as the one-hot vectors of the ids times the table, without the multiplication:

# %%
table = nn.Embedding(NUMBERS, D_MODEL)
ids = torch.tensor([3, 0, 3])
one_hot = F.one_hot(ids, NUMBERS).float()  # (3, NUMBERS)
print(
    f"max |E(ids) − one_hot(ids) @ E.weight| = "
    f"{(table(ids) - one_hot @ table.weight).abs().max().item():.1e}"
)
assert torch.equal(table(ids), table.weight[ids])
assert torch.allclose(table(ids), one_hot @ table.weight)


# %%
class TwoRelations(nn.Module):
    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.colour = nn.Embedding(PAIRS, D_MODEL)
        self.number = nn.Embedding(NUMBERS, D_MODEL)
        self.position = al.LearnedPositionalEmbedding(T, D_MODEL)
        self.attn = al.MultiHeadAttention(D_MODEL, num_heads)
        self.out = nn.Linear(D_MODEL, 2 * NUMBERS)

    def forward(self, colours: torch.Tensor, numbers: torch.Tensor) -> torch.Tensor:
        h = self.colour(colours) + self.number(numbers) + self.position(torch.arange(T))
        h = h + self.attn(h)  # (B, T, d_model)
        return self.out(h).unflatten(-1, (2, NUMBERS))  # (B, T, 2, NUMBERS)


losses: dict[int, list[float]] = {}  # per number of heads: the training loss of every step


def train(num_heads: int, seed: int = 0) -> TwoRelations:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = TwoRelations(num_heads)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(STEPS):
        colours, numbers, target, _ = make_batch(BATCH, gen)
        loss = F.cross_entropy(model(colours, numbers).flatten(0, 2), target.flatten())
        losses.setdefault(num_heads, []).append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


test = make_batch(2000, torch.Generator().manual_seed(1234))  # held-out sequences
models, accuracy = {}, {}
for h in HEADS:
    models[h] = train(h)
    with torch.no_grad():
        correct = models[h](test[0], test[1]).argmax(-1) == test[2]  # (B, T, 2)
    accuracy[h] = {
        "previous": correct[..., 0].float().mean().item(),
        "partner": correct[..., 1].float().mean().item(),
        "both": correct.all(-1).float().mean().item(),
    }
    a = accuracy[h]
    print(
        f"{h} head(s), d_head = {D_MODEL // h:2d}: previous {a['previous']:.1%}  "
        f"partner {a['partner']:.1%}  both {a['both']:.1%}"
    )

assert accuracy[1]["both"] < 0.5  # one head gets one relation, not both
for h in HEADS[1:]:
    assert accuracy[h]["both"] > 0.95

# %% [markdown]
# The optimisation side of the same argument, from the losses of those runs: both models have the
# same parameters ($d_\text{model}$ split into 1 or 2 heads), the same data and the same steps.
# Each head gets its own softmax, so gradient descent can grow the two relations side by side;
# one softmax has to share its weight between them, and its loss stalls. The mean training loss
# over each quarter of the run:

# %%
quarters = [len(losses[1]) * q // 4 for q in range(5)]
for h in HEADS:
    means = [sum(losses[h][a:b]) / (b - a) for a, b in itertools.pairwise(quarters)]
    print(f"{h} head(s): " + "  ".join(f"{m:.3f}" for m in means))
assert sum(losses[2][-50:]) < 0.5 * sum(losses[1][-50:])

# %% [markdown]
# One head gets one of the two numbers right, and the other little more often than chance
# ($1/16$) plus the cases where the previous token happens to be the partner; two heads solve
# both. Now we look inside: `attnlab.inspect.capture` records every attention layer's weights
# while the model runs, by module path (here `"attn"`).

# %%
with al.inspect.capture(models[2]) as cache:
    models[2](test[0], test[1])
w2 = cache["attn"]  # (B, H, T, T)
ex = 0
toks = labels(test[0][ex], test[1][ex])
viz.head_grid(w2[ex], query_tokens=toks, key_tokens=toks, title="two heads after training")

# %% [markdown]
# Each head does one job: one attends from every token to the token before it (the shifted
# diagonal), the other to the token of the same colour. Measured over all held-out sequences —
# the mean weight each head puts on the previous position and on the partner:

# %%
rows = torch.arange(T)
prev_pos = (rows - 1) % T


def relation_weights(w: torch.Tensor, partner: torch.Tensor) -> torch.Tensor:
    """(B, H, T, T) → (H, 2): mean weight on the previous token and on the partner."""
    on_prev = w[:, :, rows, prev_pos]  # (B, H, T)
    on_partner = w.gather(-1, partner[:, None, :, None].expand(-1, w.shape[1], -1, 1))[..., 0]
    return torch.stack([on_prev.mean((0, 2)), on_partner.mean((0, 2))], -1)


rel = relation_weights(w2, test[3])
for i, (p, c) in enumerate(rel.tolist()):
    print(f"head {i}: weight on previous token {p:.2f}, on partner {c:.2f}")
print("distance between the trained heads:\n", head_distance(w2))
# one head per relation
assert rel[:, 0].max() > 0.9 and rel[:, 1].max() > 0.9
assert rel[:, 0].argmax() != rel[:, 1].argmax()

# %% [markdown]
# The single head, for contrast, does attend to both tokens — it splits its weight between the
# previous token and the partner. But what it hands on is one average of two values made by the
# same $W^V$: the two numbers are mixed in one subspace, and the read-out can recover only one of
# them. This is the paper's argument for several heads: "with a single attention head, averaging
# inhibits this" (§3.2.2).

# %%
with al.inspect.capture(models[1]) as cache:
    models[1](test[0], test[1])
w1 = cache["attn"]
p, c = relation_weights(w1, test[3])[0].tolist()
print(f"one head: weight on previous token {p:.2f}, on partner {c:.2f}")
assert min(p, c) > 0.3  # both relations, mixed in one head
viz.attention_heatmap(w1[ex, 0], query_tokens=toks, key_tokens=toks, title="the single head")

# %% [markdown]
# The bottleneck in numbers, with the learning taken out: 8 tokens whose values are one-hot
# vectors (all of a token's identity), and every ordered pair (previous token $a$, partner $b$),
# $a \ne b$. One head that attends half to each hands on $(v_a + v_b)/2$, the same for $(a, b)$
# and $(b, a)$: which number came from which relation is lost, whatever the read-out. Two heads
# of half the width, each attending to one token through its own $W_i^V$, hand on
# $[v_a W_1^V;\ v_b W_2^V]$, and no pair is confused:

# %%
values = torch.eye(8)  # token j's value: one-hot, 8 numbers
pairs = [(a, b) for a in range(8) for b in range(8) if a != b]
one_head = {tuple((0.5 * values[a] + 0.5 * values[b]).tolist()) for a, b in pairs}
w_v1, w_v2 = torch.randn(8, 4), torch.randn(8, 4)  # two heads, d_head = 4 each
two_heads = {tuple(torch.cat([values[a] @ w_v1, values[b] @ w_v2]).tolist()) for a, b in pairs}
print(
    f"{len(pairs)} ordered pairs: one head hands on {len(one_head)} distinct outputs, "
    f"two heads {len(two_heads)}"
)
assert len(one_head) == len(pairs) // 2 and len(two_heads) == len(pairs)

# %% [markdown]
# With more heads than relations (`FULL = True` trains 4), the spare heads duplicate one of the
# two patterns or share a relation — redundancy that Michel et al. (2019) exploit to prune heads.
# A wider model with a feed-forward layer after attention can make one head split its weight
# unequally between both tokens and untangle the mixture afterwards; separate heads are the
# direct way, and what trained Transformers are seen to use.

# %%
if FULL:
    with al.inspect.capture(models[HEADS[-1]]) as cache:
        models[HEADS[-1]](test[0], test[1])
    for i, (p, c) in enumerate(relation_weights(cache["attn"], test[3]).tolist()):
        print(f"head {i} of {HEADS[-1]}: previous {p:.2f}, partner {c:.2f}")
    display(
        viz.head_grid(
            cache["attn"][ex], query_tokens=toks, key_tokens=toks, title=f"{HEADS[-1]} heads"
        )
    )

# %% [markdown]
# **Next:** [notebook 3](03_masks.ipynb) hides keys from queries — padding and the future — with
# masks.
