# %% [markdown]
# # 18 · Sinks are loud but say little
#
# [Notebook 11](11_attention_sinks.ipynb) found that SmolLM2-135M's upper layers put a large
# share of their attention on the first token: 0.43 of the weight, averaged over the heads of
# layers 12–29 and over 1008 queries of Shakespeare, on one token of 1024. Does that token
# *contribute* that much to what those layers write? The weight $\alpha_{ij}$ says where a head
# looks; what it moves from token $j$ to position $i$ is the weight times a vector,
#
# $$\mathrm{Attn}(x)_i = \sum_j \sum_h \alpha^h_{ij}\, f_h(x_j) + b_O,
#   \qquad f_h(x_j) = W_O^h\, v^h_j ,$$
#
# so a weight of 0.9 on a token whose $f_h(x_j)$ is short moves little (Kobayashi et al. 2020,
# "Attention is Not Only a Weight: Analyzing Transformers with Vector Norms"). We measure the
# first token's share of each layer's mixing under four of `attnlab.inspect.mixing`'s methods:
#
# - `weights`: $\alpha_{ij}$, the mean over heads (rows sum to 1);
# - `norm` (Kobayashi 2020): $\lVert \sum_h \alpha^h_{ij} f_h(x_j) \rVert$, what token $j$ adds
#   to position $i$, by its length;
# - `norm_residual` (Kobayashi et al. 2021): the same with the residual stream counted as
#   position $i$'s own part, $T_i(x_i) \mathrel{+}= x_i$;
# - `alti` (Ferrando et al. 2022): the parts $T_i(x_j)$ scored by how close each comes to the
#   block's output $y_i$, $c_{ij} \propto \max(0, \lVert y_i \rVert_1 - \lVert y_i - T_i(x_j)
#   \rVert_1)$, rows summing to 1.
#
# For the three that do not sum to 1 the **share** of the first token in row $i$ is
# $m_{i0} / \sum_j m_{ij}$; as in notebook 11 it is averaged over the queries $i \ge$ `SKIP`
# (query 0 sees only token 0).
#
# **The text.** Notebook 11's, tinyshakespeare from its first token ("First"), but shorter: the
# decompositions hold one $T \times T \times d_\text{model}$ tensor of parts per layer —
# 2.4 GB in float32 at 1024 tokens — so we read 256 tokens at full size and 32 at the small
# size. The first token's weight share depends on the length (a query that sees fewer keys puts
# more on the first); we print it at the length we use.

# %%
FULL = False  # True: 256 tokens of Shakespeare (about 5 minutes on 2 CPUs; small: 32 tokens)

TOKENS, SKIP = (256, 16) if FULL else (32, 8)
LATE = slice(12, 30)  # notebook 11's sink layers, 12–29
METHODS = ("weights", "norm", "norm_residual", "alti")

# %%
import time

import torch
from matplotlib.figure import Figure

import attnlab as al
from attnlab.data.corpora import load_text
from attnlab.inspect import mixing
from attnlab.inspect.mixing import record_layers, value_norms
from attnlab.viz import Plot

torch.manual_seed(0)
model, tokenizer = al.load_pretrained("smollm2-135m")
model.eval()
text = load_text("tinyshakespeare")
ids = torch.tensor([tokenizer.encode(text[:4000])])[:, :TOKENS]  # (1, T)
print(f"{ids.shape[1]} tokens, from {[tokenizer.decode([i]) for i in ids[0, :4].tolist()]}")

# %% [markdown]
# ## 1 · The first token's share, layer by layer, by each method
#
# Each `mixing(model, ids, method)` runs the model once and reads what every attention layer
# computed (its weights, its values, $W_O$, the residual stream around it); `per_layer` is
# $(L, B, T_q, T_k)$.

# %%
start = time.perf_counter()
mixed = {method: mixing(model, ids, method, heads=method == "norm") for method in METHODS}
share = {}
for method, mix in mixed.items():
    m = mix.per_layer[:, 0, SKIP:]  # (L, T − SKIP, T): the rows i ≥ SKIP
    share[method] = (m[..., 0] / m.sum(-1)).mean(-1)  # (L,): the first token's share of a row
print(f"{len(METHODS)} methods in {time.perf_counter() - start:.1f} s; queries {SKIP}…{TOKENS - 1}")
print("layer  " + "  ".join(f"{m:>13}" for m in METHODS))
for layer in range(len(share["weights"])):
    print(f"{layer:5d}  " + "  ".join(f"{share[m][layer]:13.3f}" for m in METHODS))
late = {m: share[m][LATE].mean().item() for m in METHODS}
print(
    "first-token share, layers 12–29: "
    + ", ".join(f"{m} {v:.3f}" for m, v in late.items())
    + f" ({TOKENS} tokens)"
)

# %% [markdown]
# ## 2 · Why: the first token's value vectors are short
#
# Kobayashi et al. traced the gap to $\lVert f_h(x_j) \rVert$: the tokens that take much weight
# (in BERT, `[CLS]`, `[SEP]` and punctuation) have small value vectors, so weight × length is
# small. `value_norms(run)` gives $\lVert W_O^h v^h_j \rVert$ from the values each layer
# computed (`record_layers` runs the model once and keeps every layer's resolved call). We
# compare the first token's with the mean over the others, per layer (mean over heads). The
# per-head product $\sum_h \alpha^h_{ij} \lVert f_h(x_j) \rVert$ — weight × length, before the
# heads' vectors are added up and may cancel — is the `norm` method's `per_head`, summed: its
# share isolates what the lengths alone do to the weights.

# %%
with torch.no_grad():
    runs, _ = record_layers(model, lambda: model(ids))
lengths = torch.stack([value_norms(r)[0].mean(0) for r in runs])  # (L, T): mean over heads
first, others = lengths[:, 0], lengths[:, 1:].mean(-1)
ratio = first / others
per_head = mixed["norm"].per_head[:, 0, :, SKIP:].sum(1)  # (L, T − SKIP, T): Σ_h α‖f‖
product = (per_head[..., 0] / per_head.sum(-1)).mean(-1)  # Σ_h α‖f‖: the first token's share
print("layer  ‖f(x_0)‖  mean ‖f(x_j)‖ j≥1   ratio   share of Σ_h α‖f‖")
for layer in range(len(runs)):
    print(
        f"{layer:5d}  {first[layer]:8.3f}  {others[layer]:17.3f}  {ratio[layer]:6.3f}"
        f"  {product[layer]:17.3f}"
    )
print(
    f"value norms, layers 12–29: first token {first[LATE].mean():.3f}, others "
    f"{others[LATE].mean():.3f} (ratio {ratio[LATE].mean():.3f}); share of Σ_h α‖f‖ "
    f"{product[LATE].mean():.3f}"
)

# %%
fig = Figure(figsize=(12, 5.5))
ax1, ax2 = fig.subplots(1, 2)
layers = range(len(runs))
style = {"weights": "o-", "norm": "s-", "norm_residual": "^-", "alti": "d-"}
for method in METHODS:
    ax1.plot(layers, share[method], style[method], ms=4, label=f"{method} ({late[method]:.3f})")
ax1.plot(layers, product, ":", color="gray",
         label=r"$\sum_h \alpha^h \|f_h\|$ (before the heads add up)")  # fmt: skip
ax1.axvspan(LATE.start - 0.5, LATE.stop - 0.5, color="C1", alpha=0.08, label="layers 12–29")
ax1.set(xlabel="layer", ylabel="first token's share of a row", ylim=(0, 1),
        title=f"SmolLM2-135M, {TOKENS} tokens of Shakespeare (mean over queries ≥ {SKIP})")  # fmt: skip
ax1.legend(fontsize=8, title="method (mean, layers 12–29)", title_fontsize=8, ncol=3,
           loc="upper center", bbox_to_anchor=(0.5, -0.14))  # fmt: skip
ax2.semilogy(layers, first, "o-", ms=4, color="C3", label="first token")
ax2.semilogy(layers, others, "o-", ms=4, color="C0", label="mean of the others")
ax2.axvspan(LATE.start - 0.5, LATE.stop - 0.5, color="C1", alpha=0.08)
ax2.set(xlabel="layer", ylabel=r"$\|W_O^h v^h_j\|$, mean over heads",
        title="the length of what a head would move from a token")  # fmt: skip
ax2.legend(fontsize=8)
fig.tight_layout()
Plot(fig, {"share": torch.stack([share[m] for m in METHODS]).numpy(), "lengths": lengths.numpy()})

# %% [markdown]
# **What the figure shows.** Left: in the layers where the first token takes much of the
# weight (3–9 and 12–29), it takes a much smaller share of what those layers move. From weight
# to contribution the share falls at every step: weights → weight × length (dotted: the value
# norms alone cut it by more than half) → `norm`, the length of the summed vector (the heads'
# parts partly cancel) → with the residual stream counted (`norm_residual`: each position's own
# stream is long next to what attention adds) → ALTI (near zero: a short part lies far from
# $y_i$ in $L_1$ and scores almost nothing). Right: in those layers the first token's
# $\lVert W_O^h v^h_0 \rVert$ is a quarter of the other tokens', Kobayashi et al.'s explanation
# read from what the model computed; in the layers that leave it alone (0–2, 10–11) it is as long
# as theirs. Layer 24 is the exception in both panels: its first-token vectors are the longest of
# the sink layers, and its `norm` share (0.36) is the highest.
#
# The full run (`FULL = True`, 256 tokens, queries 16…255, kernel 130 s on a shared 2-core
# machine), layers 12–29: **weights 0.465, norm 0.155, norm_residual 0.044, alti 0.002**;
# weight × length 0.184; the first token's value norm 9.7 against 40.5 for the others (ratio
# 0.25; query 0 sees only itself, so its vectors do not depend on the length). Notebook 11's
# 0.43 was at 1024 tokens: the weight share falls with the length (0.58 at 32 tokens, 0.47 at
# 256). On the IOI prompt "When Mary and John went to the store, John gave a drink to"
# (14 tokens, every query after the first) the same measurement gave weights 0.671, norm 0.328,
# norm_residual 0.072, alti 0.004.
#
# **What it does not show.** These are shares of one layer's *mixing*, not of the prediction:
# none of the four is causal. Notebook 16 measured the causal side on the IOI prompt — taking
# the first token away from a head that gives it 0.97–0.99 of its weight changes the loss by a
# few thousandths — which agrees with the small contributions here, but this notebook does not
# test it; [notebook 19](19_which_explanation_to_trust.ipynb) scores the methods against
# ablations. A small share is not no role: a head that parks its weight on a short vector
# writes almost nothing, which may be how a head "switches off" where it has nothing to read —
# then what matters is the weight *kept away* from the other tokens, which no share of the
# first token's contribution measures (a reading this notebook does not test). `norm_residual` and
# ALTI count the residual stream, so their shares are smaller for every token, not only the
# first: the drop from `norm` to them says how much attention adds to the stream at all, not
# something about the sink. And it is one model and one text, at two lengths.
#
# **Next:** [notebook 19](19_which_explanation_to_trust.ipynb): which explanation to trust —
# every method scored against the model's own causal answer.
