# %% [markdown]
# # 12 · Who answers: activation patching
#
# Ask SmolLM2-135M (the 30-layer Llama bundled with attnlab, 9 query heads a layer) to complete
# "The capital of France is": it answers " Paris". Ask it about Germany and it answers " Berlin".
# Somewhere inside, the country has to travel from the word " France" to the last position, where
# the next token is predicted. **Activation patching** finds where: run the *corrupted* prompt
# (Germany), put one activation of the *clean* run (France) in its place, and see how much of the
# clean answer comes back (Meng et al. 2022, "Locating and Editing Factual Associations in GPT";
# Wang et al. 2023, "Interpretability in the Wild"; Heimersheim & Nanda 2024, "How to use and
# interpret activation patching").
#
# - the metric: the **logit difference** of " Paris" and " Berlin" at the last position;
# - **patching each head** (layers × heads): which heads carry the country to the answer;
# - **patching the residual stream** at each position (layers × positions): where the
#   information sits, layer by layer;
# - **direct logit attribution**: how much each head writes straight into the answer's logit.

# %%
FULL = False  # True: patch every layer (the small size patches the last layers only)

if FULL:
    HEAD_LAYERS = list(range(30))  # every layer's heads
    RESID_LAYERS = list(range(30))  # the residual stream entering every layer
else:
    HEAD_LAYERS = list(range(20, 30))  # the last 10 layers
    RESID_LAYERS = list(range(16, 30))  # the last 14 layers

CLEAN, CORRUPTED = "The capital of France is", "The capital of Germany is"
ANSWER, WRONG = " Paris", " Berlin"

# %%
import torch
from matplotlib.figure import Figure

import attnlab as al
from attnlab import viz
from attnlab.inspect import capture
from attnlab.inspect.attribution import direct_logit_attribution
from attnlab.inspect.patching import logit_difference, patch_heads, patch_residual
from attnlab.tasks.base import token_labels

torch.manual_seed(0)
model, tokenizer = al.load_pretrained("smollm2-135m")
model.eval()
L, H = model.config.n_layer, model.config.n_head

# %% [markdown]
# ## 1 · Two prompts, one token apart
#
# Patching swaps activations position by position, so the two prompts must have the same number
# of tokens: " France" and " Germany" are one token each. Each answer must be one token too.

# %%
clean = torch.tensor(tokenizer.encode(CLEAN))  # (T,)
corrupted = torch.tensor(tokenizer.encode(CORRUPTED))  # (T,)
labels = token_labels(tokenizer, clean.tolist())
print("clean:    ", " | ".join(labels))
print("corrupted:", " | ".join(token_labels(tokenizer, corrupted.tolist())))
assert clean.shape == corrupted.shape and int((clean != corrupted).sum()) == 1
country = int((clean != corrupted).nonzero())  # the position of the country
(paris,), (berlin,) = tokenizer.encode(ANSWER), tokenizer.encode(WRONG)

with torch.no_grad():
    clean_logits = model(clean[None]).logits  # (1, T, V)
    corrupted_logits = model(corrupted[None]).logits
for name, logits in (("clean", clean_logits), ("corrupted", corrupted_logits)):
    p = torch.softmax(logits[0, -1].float(), -1)
    best = p.topk(4)
    shown = ", ".join(
        f"{t!r} {v:.2f}"
        for t, v in zip(token_labels(tokenizer, best.indices.tolist()), best.values)
    )
    print(f"{name:>9} → {shown}")

# %% [markdown]
# The metric is the logit difference at the last position,
#
# $$m(x) = \text{logit}_x[\,T-1, \text{" Paris"}\,] - \text{logit}_x[\,T-1, \text{" Berlin"}\,],$$
#
# the difference of the two log-probabilities (the softmax's normaliser cancels). A patched run
# is reported between the two baselines,
#
# $$\text{score} = \frac{m_\text{patched} - m_\text{corrupted}}{m_\text{clean} - m_\text{corrupted}},$$
#
# so 1 means that activation alone turns " Berlin" back into " Paris", 0 that it changes nothing.


# %%
def metric(logits: torch.Tensor) -> torch.Tensor:
    return logit_difference(logits, paris, berlin)


m_clean, m_corrupted = float(metric(clean_logits)), float(metric(corrupted_logits))
print(f"logit[' Paris'] − logit[' Berlin']: clean {m_clean:+.2f}, corrupted {m_corrupted:+.2f}")
assert m_clean > 2 and m_corrupted < -2

# %% [markdown]
# ## 2 · Patching each head
#
# For layer $l$ and head $h$ the corrupted prompt runs with the head's output
# $z_{l,h} = \mathrm{softmax}(q k^\top / \sqrt{d})\, v$ (before the output projection) replaced
# by the clean run's, at every position. Everything downstream sees the patched value. All the
# heads of a layer are patched in one batch, one head a row (`patch_heads`).

# %%
heads = patch_heads(model, clean, corrupted, metric, layers=HEAD_LAYERS)
print("the heads that move the answer most:")
for site in heads.top(5):
    print(
        f"  L{site['layer']}.H{site['head']}: m = {site['patched']:+.2f}, "
        f"score {site['normalized']:+.2f}"
    )
best = heads.top(1)[0]
best_layer, best_head = int(best["layer"]), best["head"]
assert (best_layer, best_head) == (23, 4) and best["normalized"] > 0.5
viz.patching_figure(heads, title=f"Patching each head's output, {CORRUPTED!r} ← {CLEAN!r}")

# %% [markdown]
# One head stands out: **L23.H4** alone restores most of the clean logit difference (red). A few
# heads push the other way (blue: L23.H3, L24.H4, L29.H0): put in their clean output, the answer
# moves further from " Paris" — they partly cancel what L23.H4 writes, while L29.H1 and L29.H2
# add to it. Every other head, in the map's layers, does next to nothing on its own.
#
# Where does L23.H4 look? Its attention from the last position, and the same patch restricted to
# that one position:

# %%
path = f"transformer.h.{best_layer}.attn"
with torch.no_grad(), capture(model, names=[path]) as cache:
    model(clean[None])
row = cache.attentions[path][0, best_head, -1]  # (T,): the last query's weights
print(
    f"L{best_layer}.H{best_head} at the last position looks at:",
    ", ".join(f"{t!r} {w:.2f}" for t, w in zip(labels, row.tolist())),
)
last_only = patch_heads(model, clean, corrupted, metric, layers=[best_layer], position=-1)
score_last = float(last_only.normalized[0, best_head])
print(f"patched at the last position only: score {score_last:+.2f}")
assert abs(score_last - best["normalized"]) < 0.05  # all of its effect is at the last position

fig = Figure(figsize=(5.5, 2.6), layout="constrained")
ax = fig.add_subplot()
ax.bar(range(len(labels)), row.numpy(), color="#b2182b")
ax.set_xticks(range(len(labels)))
ax.set_xticklabels([repr(t) for t in labels], fontsize=8)
ax.set_ylabel("attention weight")
ax.set_ylim(0, 1)
ax.set_title(f"L{best_layer}.H{best_head}: where the last position ({labels[-1]!r}) looks")
viz.Plot(fig, {"weights": row.numpy()})

# %% [markdown]
# At the last position, L23.H4 reads the country token and writes what it found there into the
# stream that predicts the next token: a "mover" head that moves the subject's attribute to where
# it is needed.
#
# ## 3 · Patching the residual stream, position by position
#
# Now the whole residual stream $h_l[t]$ entering layer $l$ at one position $t$ is replaced by the
# clean one (`patch_residual`; `final` adds the stream after the last layer):
#
# $$h_l[t] \leftarrow h_l^\text{clean}[t].$$

# %%
resid = patch_residual(model, clean, corrupted, metric, layers=RESID_LAYERS, final=True)
norm = resid.normalized  # (rows, T)
at_country, at_last = norm[:, country], norm[:, -1]
for row_label, a, b in zip(resid.rows, at_country.tolist(), at_last.tolist()):
    print(
        f"  entering layer {row_label:>5}: {labels[country]!r} {a:+.2f}   {labels[-1]!r} {b:+.2f}"
    )
moved = next(int(r) for r, b in zip(resid.rows, at_last.tolist()) if r != "final" and b > 0.5)
print(f"the last position carries the answer from the stream entering layer {moved} on")
assert 20 <= moved <= 26
assert at_country[0] > 0.9 and at_last[-1] > 0.9
viz.patching_figure(resid, tokens=labels, title="Patching the residual stream at each position")

# %% [markdown]
# The positions before the country (" The capital of") are the same in both prompts: patching
# them changes nothing (at the small size only the last layers are patched; `FULL = True` shows
# every layer, and the same picture below layer 16). Up to layer 23 everything the model needs sits at the " France" position:
# put that one clean vector in and the answer is " Paris" again. From the stream entering layer
# 24 on, the same vector does nothing — the country has been read out of it — and the last
# position carries the answer instead. The handover is layer 23, the layer of L23.H4: the head
# found by patching heads is the one that moves the country to the end.
#
# ## 4 · Direct logit attribution
#
# The final residual stream is a sum of what each part wrote: the embedding, every head (through
# its slice of the output projection $W_O$) and every MLP. With the final RMSNorm's scale fixed,
# each part's contribution to the logit difference is
#
# $$\text{DLA}(c) = \frac{\gamma \odot c}{\sigma} \cdot \left(W_U[\text{" Paris"}] -
# W_U[\text{" Berlin"}]\right),$$
#
# and the parts add up to the model's logit difference exactly. Patching measured each head's
# *total* effect (through every later layer); this is only its *direct* one.

# %%
dla = direct_logit_attribution(model, clean, paris, against=berlin)
print(f"logit difference {dla.logit:+.3f}; sum of every part {dla.total:+.3f}")
print(
    f"heads {float(dla.heads.sum()):+.2f}, MLPs {float(dla.mlp.sum()):+.2f}, embedding {dla.embed:+.2f}"
)
share = dla.top(1)[0]["dla"] / dla.logit
print(f"L{best_layer}.H{best_head} alone: {100 * share:.0f}% of the logit difference")
for h in dla.top(5):
    print(f"  L{h['layer']}.H{h['head']}: {h['dla']:+.2f}")
assert abs(dla.total - dla.logit) < 1e-3 * max(1.0, abs(dla.logit))
assert (dla.top(1)[0]["layer"], dla.top(1)[0]["head"]) == (best_layer, best_head)
viz.attribution_figure(
    dla, k=12, title=f"Direct logit attribution: logit[{ANSWER!r}] − logit[{WRONG!r}], clean prompt"
)

# %% [markdown]
# L23.H4 writes about half of the logit difference directly: it is not only the head that moves
# the country, its output already points at " Paris" rather than " Berlin". The last layer's
# heads L29.H1 (+) and L29.H0 (−) pull in both directions, the same pair that patching showed.
#
# **What we found.** In SmolLM2-135M the answer to "The capital of France is" is carried by one
# head: L23.H4 looks from the last position at " France" and writes the answer into the last
# position's stream — both patching methods and the direct attribution agree. The induction heads
# of [notebook 9](09_induction_heads.ipynb) were found by what their attention looks like; this
# head was found by what it *does*. From the command line, `attnlab patch smollm2-135m --clean
# "The capital of France is" --corrupted "The capital of Germany is" --answer " Paris" --wrong
# " Berlin" -o heads.png` prints the same tables and draws the map.
#
# **Next:** [notebook 13](13_positions.ipynb) turns from what a trained model does to how
# attention knows where tokens are: sinusoidal, learned, rotary (RoPE) and ALiBi positions, and
# which of them reads past the length it was trained on.
