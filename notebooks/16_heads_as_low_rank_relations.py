# %% [markdown]
# # 16 · Heads as low-rank relations
#
# An attention head compares every query token with every key token through one matrix. Write
# the head's projections as $q_i = x_i W_Q^{h\top}$ and $k_j = x_j W_K^{h\top}$ with
# $W_Q^h, W_K^h$ of shape $d_\text{head} \times d_\text{model}$; then its score is a **bilinear
# form** of the two tokens (Elhage et al. 2021, "A Mathematical Framework for Transformer
# Circuits"):
#
# $$s_{ij} = \frac{q_i \cdot k_j}{\sqrt{d_\text{head}}} = x_i\, M_{QK}^h\, x_j^\top,
#   \qquad M_{QK}^h = \frac{W_Q^{h\top} W_K^h}{\sqrt{d_\text{head}}}
#   \quad (d_\text{model} \times d_\text{model}).$$
#
# $M_{QK}^h$ is a product of two factors of width $d_\text{head}$, so its **rank is at most
# $d_\text{head}$**: a head can only tell tokens apart along $d_\text{head}$ directions of the
# residual stream. Multi-head attention with $h$ heads is an ensemble of $h$ such relations of
# rank $\le d_\text{model}/h$, each with its own softmax. In this notebook, on the pretrained
# SmolLM2-135M (30 layers, 9 query heads of width 64, $d_\text{model} = 576$):
#
# 1. check that the scores *are* this bilinear form;
# 2. measure the **singular values** of every head's $M_{QK}^h$ (`attnlab.inspect.qk_spectrum`):
#    their numerical rank, and how many directions carry most of the weight;
# 3. count parameters: one head of width $d_\text{model}$ against $h$ heads of width
#    $d_\text{model}/h$;
# 4. and a warning: **attention weight is not importance**. For the heads of a few layers, compare
#    the weight a head puts on a key with what happens to the prediction when that key is taken
#    away from that head.

# %%
FULL = False  # True: the weight-vs-effect test on every layer (a few minutes)

if FULL:
    ABLATE_LAYERS = list(range(30))
else:
    ABLATE_LAYERS = [10, 20, 29]  # three layers × 9 heads × every key
PROMPT, ANSWER = "When Mary and John went to the store, John gave a drink to", " Mary"

# %%
import math

import torch
from matplotlib.figure import Figure

import attnlab as al
from attnlab import viz
from attnlab.inspect import capture, head_weights, qk_spectrum
from attnlab.nn.hooks import hook_points
from attnlab.tasks.base import token_labels

torch.manual_seed(0)
model, tokenizer = al.load_pretrained("smollm2-135m")
model.eval()
cfg = model.config
L, H, H_KV = cfg.n_layer, cfg.n_head, cfg.num_kv_heads
D, E = cfg.n_embd, cfg.n_embd // cfg.n_head
print(
    f"SmolLM2-135M: {L} layers × {H} query heads of d_head = {E} "
    f"({H_KV} key/value groups), d_model = {D}"
)

# %% [markdown]
# ## 1 · The scores are a bilinear form
#
# SmolLM2 is a Llama: no projection biases, and a **rotary** position embedding that rotates
# $q_i$ by $R_i$ and $k_j$ by $R_j$ before the dot product, so the score is really
# $x_i W_Q^{h\top} R_{j-i} W_K^h x_j^\top / \sqrt{d_\text{head}}$ — a rotation sits between the
# two factors, and the rank bound holds at every offset. At offset 0, a token against itself,
# $R_0 = I$ and the score is exactly $x_i M_{QK}^h x_i^\top$. With grouped-query attention, head
# $h$ reads key group $g = h / (H / H_{kv})$ (three query heads per group here). The input $x$ is
# what the attention layer receives: the residual stream after the block's RMSNorm.

# %%
ids = torch.tensor(tokenizer.encode(PROMPT))  # (T,)
T = len(ids)
layer = 5
attn = model.transformer.h[layer].attn
inputs = []
hook = attn.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
path = f"transformer.h.{layer}.attn"
with torch.no_grad(), capture(model, names=[path], hooks=["hook_rot_q", "hook_rot_k"]) as cache:
    model(ids[None])
hook.remove()
x = inputs[0][0].double()  # (T, d_model): the normed residual stream entering the layer
q = cache.activations[f"{path}.hook_rot_q"][0].double()  # (H, T, d_head), rotated
k = cache.activations[f"{path}.hook_rot_k"][0].double()  # (H_kv, T, d_head)
w = head_weights(attn)  # per query head: W_Q^h, W_K^g, W_V^g (d_head × d_model), W_O^h
worst = 0.0
for h in range(H):
    m_qk = w.query[h].double().T @ w.key[h].double() / math.sqrt(E)  # (d_model, d_model)
    s_model = (q[h] * k[h // (H // H_KV)]).sum(-1) / math.sqrt(E)  # s_ii from the model  (T,)
    s_form = torch.einsum("td,de,te->t", x, m_qk, x)  # x_i M x_iᵀ                         (T,)
    worst = max(worst, float((s_model - s_form).abs().max() / s_form.abs().max()))
print(
    f"layer {layer}, {H} heads, {T} tokens: "
    f"max |s_ii(model) − x_i M_QK x_iᵀ| / max|s| = {worst:.1e}"
)
assert worst < 1e-4  # float32 model against the float64 form

# %% [markdown]
# ## 2 · The spectrum of every head
#
# `qk_spectrum` computes the singular values $\sigma_1 \ge \dots$ of $M_{QK}^h$ for every layer
# and head, in float64, without forming the $576 \times 576$ matrix (only its $d_\text{head}$
# possibly nonzero values: the rest are exactly 0). From them three ranks:
#
# - the **numerical rank**: $\sigma_i > \sigma_1 \cdot d_\text{model} \cdot \varepsilon$, with
#   $\varepsilon$ the precision the weights are stored in — at most $d_\text{head} = 64$;
# - the **effective rank** (Roy & Vetterli 2007) $\exp(-\sum_i p_i \log p_i)$ with
#   $p_i = \sigma_i / \sum_k \sigma_k$: $r$ for $r$ equal values, smaller when a few dominate;
# - the **90% energy rank**: the fewest $\sigma_i$ holding 90% of $\sum_i \sigma_i^2$.

# %%
spec = qk_spectrum(model)
rank, eff, energy = spec.rank(), spec.effective_rank(), spec.energy_rank("qk", 0.9)
print(f"numerical rank of M_QK: min {int(rank.min())}, max {int(rank.max())} (bound d_head = {E})")
print(
    f"effective rank: mean {float(eff.mean()):.1f}, min {float(eff.min()):.1f}, "
    f"max {float(eff.max()):.1f}; 90% energy rank: mean {float(energy.double().mean()):.1f}, "
    f"min {int(energy.min())}"
)
per_layer = eff.mean(1)
print(
    "mean effective rank per layer:",
    " ".join(f"{i}:{v:.0f}" for i, v in enumerate(per_layer.tolist())),
)
lowest = int(eff.argmin())
print(
    f"the most concentrated head: L{lowest // H}.H{lowest % H}, "
    f"effective rank {float(eff.min()):.1f}"
)
ov_eff = spec.effective_rank("ov")
print(
    f"OV circuit W_Vᵀ W_Oᵀ: numerical rank max {int(spec.rank('ov').max())}, "
    f"effective rank mean {float(ov_eff.mean()):.1f}"
)
assert (rank <= E).all() and (spec.rank("ov") <= E).all() and (eff <= E).all()
viz.head_spectrum_figure(spec, layers=[0, 15, 29])

# %% [markdown]
# Every head of SmolLM2 uses all of its 64 directions — none is rank-deficient in the numerical
# sense — but not equally. The spectra fall by one to more than three orders of magnitude from
# $\sigma_1$ to $\sigma_{64}$, and the effective rank averages about 52 of 64. Layer 0 stands out:
# its heads' spectra fall steeply, and their effective rank is the lowest in the model (the printout
# above gives the numbers per layer). The OV circuits, what a head *writes*, are spread more evenly.
# A rank is not a role: a head with a steep spectrum compares tokens along a few directions of the
# residual stream, and which directions those are is a different question (notebooks 09 and 12 find
# heads by what they do).
#
# ## 3 · One big head or $h$ small ones
#
# The projections $W_Q, W_K, W_V, W_O$ of a layer are four $d_\text{model} \times d_\text{model}$
# matrices however they are cut into heads: splitting them into $h$ heads costs no parameters.
# What changes is the shape of the relations: one head of width $d_\text{model}$ is **one**
# relation of rank up to $d_\text{model}$ with one softmax per query; $h$ heads are **$h$**
# relations of rank up to $d_\text{model}/h$, each with its own softmax — $h$ different
# distributions over the keys per query.

# %%
for heads in (1, H):
    layer_h = al.MultiHeadAttention(D, heads, bias=False)
    params = sum(p.numel() for p in layer_h.parameters())
    s = qk_spectrum(layer_h)  # a fresh, randomly initialised layer
    ranks = sorted(set(s.rank().flatten().tolist()))
    print(
        f"{heads} head(s) of d_head = {D // heads:3d}: {params:,} parameters in W_Q, W_K, W_V, "
        "W_O; "
        f"{heads} relation(s) of rank ≤ {D // heads} (numerical rank {ranks}), "
        f"{heads} softmax(es) per query"
    )
gqa = 2 * D * D + 2 * D * (H_KV * E)
print(
    f"SmolLM2's layer with {H_KV} key/value groups: {gqa:,} parameters "
    f"({gqa / (4 * D * D):.0%} of 4·d²)"
)

# %% [markdown]
# The same 1,327,104 parameters either way. (The big head's numerical rank prints a little below
# 576: the product of two random $576 \times 576$ matrices has a few singular values under the
# float32 tolerance.) Nine relations of rank 64 add up to at most rank
# 576, the same as one — but the one big head has to put every comparison it makes into a single
# distribution over the keys, while nine heads can attend to nine different places at once
# (notebook 02 trains both on a task that needs two relations). Grouped-query attention then
# shares $W_K$, $W_V$ between three query heads, which saves parameters and cache memory; every
# query head keeps its own $W_Q^h$ and so its own relation.
#
# ## 4 · Attention weight is not importance
#
# Attention maps are tempting to read as explanations: a head that puts 0.99 of its weight on a
# token must be "using" it. Test that directly (after Serrano & Smith 2019, "Is Attention
# Interpretable?"). SmolLM2 completes the prompt below with " Mary". For the heads of a few
# layers and every key $j$, at the last position only:
#
# - the **weight** $a_j$ the head puts on key $j$;
# - the **effect** of taking key $j$ away from that head: its output becomes
#   $z' = \sum_{s \ne j} a_s v_s / \sum_{s \ne j} a_s$ (the softmax renormalised without $j$),
#   and the effect is $|\Delta \text{loss}|$, the change of $-\log p(\text{" Mary"})$.
#
# Every intervention changes only the last position, so the prefix runs once: its keys and values
# go into a KV cache, copied to one row per intervention, and only the last token is run again,
# one row per (layer, head, key) with that head's output replaced through `hook_z`.

# %%
labels = token_labels(tokenizer, ids.tolist())
(answer,) = tokenizer.encode(ANSWER)
paths = [f"transformer.h.{i}.attn" for i in ABLATE_LAYERS]
with torch.no_grad(), capture(model, names=paths, hooks=["hook_v"]) as cache:
    clean_logits = model(ids[None]).logits[0, -1].double()
clean_loss = -float(torch.log_softmax(clean_logits, -1)[answer])
print(f"p({ANSWER!r} | prompt) = {math.exp(-clean_loss):.3f}")

rows = [(li, h, j) for li in range(len(paths)) for h in range(H) for j in range(T)]
weight, written, replacement = torch.empty(len(rows)), torch.empty(len(rows)), {}
for li, path in enumerate(paths):
    a = cache.attentions[path][0, :, -1].double()  # (H, T): the last query's weights
    v = cache.activations[f"{path}.hook_v"][0].double().repeat_interleave(H // H_KV, 0)  # (H, T, e)
    w_o = head_weights(model.transformer.h[ABLATE_LAYERS[li]].attn).output.double()  # (H, d, e)
    v_norm = torch.einsum("hte,hde->htd", v, w_o).norm(dim=-1)  # ‖W_O^h v_j‖          (H, T)
    for r, (lr, h, j) in enumerate(rows):
        if lr == li:
            keep = a[h].clone()
            keep[j] = 0.0
            replacement[r] = (keep @ v[h]) / keep.sum()  # softmax without key j
            weight[r], written[r] = a[h, j], a[h, j] * v_norm[h, j]


def take_away(li):
    def patch(module, args, z):  # z (rows, H, 1, d_head): row r + 1 is intervention r
        z = z.clone()
        for r, (lr, h, _) in enumerate(rows):
            if lr == li:
                z[r + 1, h, -1] = replacement[r].to(z.dtype)
        return z

    return patch


points = hook_points(model)
kv = model.new_cache(1, T)
with torch.no_grad():
    model(ids[None, :-1], cache=kv)  # the prefix, once
    kv.reorder(torch.zeros(len(rows) + 1, dtype=torch.long))  # row 0 clean, one row per removal
    handles = [
        points[f"{p}.hook_z"].register_forward_hook(take_away(li)) for li, p in enumerate(paths)
    ]
    try:
        last = model(ids[-1:].expand(len(rows) + 1, 1), cache=kv).logits[:, -1].double()
    finally:
        for handle in handles:
            handle.remove()
loss = -torch.log_softmax(last, -1)[:, answer]  # (rows + 1,)
assert abs(float(loss[0]) - clean_loss) < 1e-4  # the cached clean row is the clean run
effect = (loss[1:] - loss[0]).abs().float()


def spearman(u, v):
    """Pearson correlation of the ranks (the values are continuous: no ties to average)."""
    ru, rv = (t.argsort().argsort().double() for t in (u, v))
    ru, rv = ru - ru.mean(), rv - rv.mean()
    return float(ru @ rv / (ru.norm() * rv.norm()))


heavy = weight >= 0.1
rho_all, rho_heavy = spearman(weight, effect), spearman(weight[heavy], effect[heavy])
print(
    f"weight vs ablation effect: spearman {rho_all:.2f} over {len(rows)} (head, key) pairs; "
    f"{rho_heavy:.2f} over the {int(heavy.sum())} with weight >= 0.1"
)
print(
    f"weight × ‖W_O v‖ vs effect: spearman {spearman(written, effect):.2f} over all, "
    f"{spearman(written[heavy], effect[heavy]):.2f} over the same {int(heavy.sum())}"
)
first = torch.tensor([j == 0 for _, _, j in rows])
print(
    f"key 0 ({labels[0]!r}) holds {float(weight[first].sum() / weight.sum()):.0%} of the weight "
    f"and {float(effect[first].sum() / effect.sum()):.0%} of the summed effect"
)
for title, by, n in (
    ("weights and their effects", weight, 6),
    ("effects and their weights", effect, 4),
):
    print(f"the largest {title}:")
    for r in by.argsort(descending=True)[:n].tolist():
        li, h, j = rows[r]
        print(
            f"  L{ABLATE_LAYERS[li]}.H{h} → {labels[j]!r:10} weight {float(weight[r]):.3f}, "
            f"|Δloss| {float(effect[r]):.4f}"
        )

# %%
fig = Figure(figsize=(6.4, 3.8), layout="constrained")
ax = fig.add_subplot()
floor = 1e-6  # |Δloss| below this is drawn on the floor of the log scale
for mask, colour, name in (
    (~first, "#2166ac", "other keys"),
    (first, "#b2182b", f"key 0 {labels[0]!r}"),
):
    ax.scatter(
        weight[mask], effect[mask].clamp(min=floor), s=10, alpha=0.6, color=colour, label=name
    )
ax.set_yscale("log")
ax.set_xlabel("attention weight a_j of the head on key j (last position)")
ax.set_ylabel("|Δ loss| when j is taken from that head")
ax.set_title(
    f"Weight vs effect, layers {ABLATE_LAYERS if len(ABLATE_LAYERS) < 6 else 'all'}: "
    f"spearman {rho_all:.2f} (all), {rho_heavy:.2f} (weight ≥ 0.1)",
    fontsize=9,
)
ax.axvline(0.1, color="grey", lw=0.8, ls=":")
ax.legend(fontsize=8)
ax.grid(True, alpha=0.3)
viz.Plot(fig, {"weight": weight.numpy(), "effect": effect.numpy()})

# %% [markdown]
# Read the two correlations together. Over all pairs the rank correlation is high, and the
# scatter shows why: a key with almost no weight is almost never missed — low weight does predict
# low effect. Among the keys that *do* get weight (right of the dotted line) the order falls
# apart: in the small run, the heaviest weights of all, 0.97–0.99 on the first token, change the
# loss by a few thousandths, while a weight of 0.79 on " John" (L20.H0) changes it about twenty
# times more. The first token, the "attention sink" of notebook 11, takes a large share of the
# weight and a smaller share of the effect. Weighting by the size of what the head would write,
# $a_j \lVert W_O^h v_j \rVert$ (Kobayashi et al. 2020, "Attention is Not Only a Weight"), orders
# the heavy pairs better, though still far from perfectly. This is one prompt and a few layers,
# so it shows that weight and importance can come apart, not how often they do.
#
# **What we found.** Each head is a bilinear relation of rank at most $d_\text{head}$; in
# SmolLM2-135M every head uses all 64 directions but leans on fewer (effective rank about 52 on
# average, under 22 for every head of layer 0); splitting $d_\text{model}$ into heads costs nothing
# and buys several relations with separate softmaxes. And a head's attention weight says where it
# looks, not whether what it reads there matters — for that, intervene (notebooks 09 and 12). From
# the command line, `attnlab inspect smollm2-135m --qk-spectrum` prints the effective ranks of every
# head.
#
# **Next:** [notebook 17](17_attention_flow_agreement.ipynb) follows the weights through the
# layers — attention rollout and flow — and scores them against blank-out, as Abnar & Zuidema
# did.
