# %% [markdown]
# # 21 · Patching at scale
#
# Exact activation patching ([notebook 12](12_who_answers.ipynb)) runs the corrupted prompt once
# for every site it scores, with the clean activation put in place of the corrupted one: 270
# heads of SmolLM2-135M cost 270 forward passes a prompt pair (about a minute of CPU).
# **Attribution patching** (Nanda 2023; Syed et al. 2023) replaces them by a first-order Taylor
# expansion around the corrupted run,
#
#     m(a ← a_clean) ≈ m_corrupted + ∇_a m|_corrupted · (a_clean − a_corrupted),
#
# one forward of each prompt and one backward, for every head at once. It is exact where the
# metric is linear in the patched activation and wrong where the patch moves a nonlinearity far
# (a softmax that saturates, a norm). This notebook measures how wrong on SmolLM2, then uses
# **path patching** (Wang et al. 2022) to ask which earlier heads feed the heads that answer.
#
# The prompts are the IOI set of [notebook 19](19_which_explanation_to_trust.ipynb) ("When Mary
# and John went to the store, John gave a drink to" → " Mary"), each with a corrupted twin that
# uses two other names; the metric is the logit difference answer − foil at the last position,
# and every score is normalised, `(m_patched − m_corrupted) / (m_clean − m_corrupted)`: 1 means
# the head alone restores the clean answer. The same numbers come from the command line:
#
# ```
# attnlab patch smollm2-135m --clean "…" --corrupted "…" --answer " Mary" --wrong " John" \
#     --method exact|attribution|path [--receivers 23.3 --via q] --json
# ```

# %%
FULL = False  # True: all 8 IOI prompts, exact patching of all 30 layers, every sender (~6 min CPU)

if FULL:
    PROMPTS = 8
    EXACT_LAYERS = None  # every layer
    SENDERS = None  # path patching from every head before the receivers (path_patch_heads)
else:
    PROMPTS = 2
    # the layer where the answering heads are (23) and the one where attribution broke down at
    # full size (16): exact patching costs one batched forward a layer and a prompt
    EXACT_LAYERS = [16, 23]
    SENDERS = 3  # path patching from the 3 earlier heads attribution ranks highest, one prompt

# %%
import numpy as np
import torch
from matplotlib.figure import Figure

import attnlab as al
from attnlab import viz
from attnlab.data import prompt_sets
from attnlab.inspect import (
    attribution_patch,
    logit_difference,
    patch_heads,
    path_patch,
    path_patch_heads,
)

torch.manual_seed(0)
model, tokenizer = al.load_pretrained("smollm2-135m")
model.eval()
L, H = model.config.n_layer, model.config.n_head


def ids(text: str) -> torch.Tensor:
    return torch.tensor(tokenizer.encode(text))


pairs = []
for p in prompt_sets.load("ioi")[:PROMPTS]:
    answer, foil = tokenizer.encode(p.answer)[0], tokenizer.encode(p.foil)[0]
    metric = lambda logits, a=answer, f=foil: logit_difference(logits, a, f)  # noqa: E731
    pairs.append((p, ids(p.prompt), ids(p.corrupted), metric))
print(f"SmolLM2-135M: {L} layers × {H} heads; {len(pairs)} IOI prompt(s)")

# %% [markdown]
# ## 1 · Attribution against exact patching
#
# For each prompt: `attribution_patch` (every head, one backward) and `patch_heads` (exact; at
# the small size only layers 16 and 23, at full size all 30). The scatter puts each head's exact
# score against its estimate, one point per head and prompt, coloured by layer; on the diagonal
# the estimate is exact.

# %%
exact, estimate, runs = [], [], []
for p, clean, corrupted, metric in pairs:
    attribution = attribution_patch(model, clean, corrupted, metric)
    result = patch_heads(model, clean, corrupted, metric, layers=EXACT_LAYERS)
    layers = [int(r) for r in result.rows]
    exact.append(result.normalized.double())
    estimate.append(attribution.heads().normalized[layers].double())
    runs.append(attribution)
    print(f"{p.prompt!r}: m_clean {result.clean:.2f}, m_corrupted {result.corrupted:.2f}")
exact, estimate = torch.stack(exact), torch.stack(estimate)  # (prompts, layers, H)


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    rank = lambda x: x.flatten().argsort().argsort().double()  # noqa: E731
    return pearson(rank(a), rank(b))


print(f"layers {layers}: Pearson {pearson(exact, estimate):.3f}, "
      f"Spearman {spearman(exact, estimate):.3f}, "
      f"signs agree {float((exact.sign() == estimate.sign()).double().mean()):.0%}")  # fmt: skip
per_layer = [pearson(exact[:, i], estimate[:, i]) for i in range(len(layers))]
for layer, r, err in zip(layers, per_layer, (exact - estimate).abs().amax(dim=(0, 2))):
    print(f"  layer {layer:2d}: Pearson {r:+.2f}, max |exact − estimate| {err:.3f}")
worst = (exact - estimate).abs().mean(0).flatten().argsort(descending=True)[:4]
for w in worst.tolist():
    i, h = divmod(w, H)
    print(f"  head {layers[i]}.{h}: exact {[round(x, 3) for x in exact[:, i, h].tolist()]}, "
          f"estimate {[round(x, 3) for x in estimate[:, i, h].tolist()]}")  # fmt: skip

# %%
fig = Figure(figsize=(9, 3.8))
ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.1, 1]})
if len(layers) <= 10:  # a colour per layer, told apart in a legend
    for i, layer in enumerate(layers):
        ax.scatter(exact[:, i].flatten(), estimate[:, i].flatten(), s=14, color=f"C{i}",
                   label=f"layer {layer}")  # fmt: skip
    ax.legend(fontsize=7)
else:  # every layer: a colour scale
    layer_of = torch.tensor(layers)[None, :, None].expand_as(exact)
    points = ax.scatter(exact.flatten(), estimate.flatten(), c=layer_of.flatten(), s=10,
                        cmap="viridis", vmin=0, vmax=L - 1)  # fmt: skip
    fig.colorbar(points, ax=ax, label="layer")
lo = float(min(exact.min(), estimate.min())) - 0.05
hi = float(max(exact.max(), estimate.max())) + 0.05
ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
ax.set_xlabel("exact patching (normalised)")
ax.set_ylabel("attribution patching (normalised)")
ax.set_title(f"every head of layers {layers if len(layers) < 5 else '0–29'}, "
             f"{len(pairs)} prompt(s)", fontsize=9)  # fmt: skip
bx.bar(range(len(layers)), per_layer, color=["C3" if r < 0.9 else "C0" for r in per_layer])
every = 1 if len(layers) <= 10 else 5  # 30 layers: a label every fifth
bx.set_xticks(range(0, len(layers), every), [str(x) for x in layers[::every]])
bx.axhline(0, color="grey", lw=0.6)
bx.set_ylim(min(-0.5, min(per_layer) - 0.1), 1.05)
bx.set_xlabel("layer")
bx.set_ylabel("Pearson over the layer's heads × prompts")
bx.set_title("where the estimate breaks down (red: < 0.9)", fontsize=9)
for a in (ax, bx):
    a.grid(True, alpha=0.3)
fig.tight_layout()
viz.Plot(fig, {"exact": exact.numpy(), "estimate": estimate.numpy(),
               "pearson_per_layer": np.array(per_layer)})  # fmt: skip

# %% [markdown]
# **What the scatter shows.** *At full size* (all 270 heads, the 8 IOI prompts, measured with the
# scripts of the issue and the same calls as above): Pearson 0.960–0.996 and Spearman
# 0.968–0.998 per prompt, signs agree on 97–99 % of the heads; pooled over the prompts
# (normalised scores) Pearson 0.978, Spearman 0.982. Averaged over the prompts head by head,
# Pearson 0.991. On the France/Germany pair of notebook 12 (logit " Paris" − " Berlin") it is
# 0.993 and 0.986. Attribution patching ranks the heads almost as exact patching does, for a
# fiftieth of the CPU (0.8 s a prompt against 1.4 s a layer, 30 layers).
#
# **Where it breaks down.** Per layer the agreement is 0.95–1.00 everywhere but two places:
#
# - **layer 16**, Pearson −0.34 over its heads. Head 16.0 alone: on the second prompt exact
#   patching gives +0.54 and the estimate −0.30, on the seventh −0.45 and −0.02. Its effect runs
#   through the later layers' attention softmaxes, which the patch moves far from where the
#   gradient was taken; the sign of the estimate is then wrong, not only its size. The small run
#   above keeps layer 16 for this reason (two prompts show the first of those).
# - **layer 23**, where the answer is written: the ranking is right (Pearson 0.99) but the
#   estimate overshoots the heads that matter most, 23.3 mean 0.856 exact against 1.068
#   estimated, 23.0 0.417 against 0.512. The logit difference saturates (the corrupted run's
#   logits are far from the clean ones), so the tangent at the corrupted point overestimates the
#   real rise.
#
# The small run above shows both on two prompts: layer 16's Pearson is negative (head 16.0, exact
# +0.47 and estimated −0.26 on the second prompt) and layer 23's points lie above the diagonal.
# The second prompt's two baselines are only 1.15 apart (5.27 and 4.12: in the corrupted run,
# where neither name occurs, SmolLM2 already prefers " Sarah" to " Tom"), so its normalised
# scores are large (23.3: 2.96) — read pooled correlations of normalised scores with care.
#
# Layers 0–1 err by up to 0.14. In the residual stream (the estimate of `patch_residual`, row
# `resid` of the result) the first prompt agrees at Pearson 0.963 overall, but at the second
# " John" (the repeated name, position 9) the estimate is wrong in layers 0–24 (layer 1: −0.05
# against 0.44): patching a whole residual stream at an early layer is the largest move there is.
# Read attribution patching as a fast first pass that finds the heads to patch exactly, not as
# the effect itself.

# %% [markdown]
# ## 2 · Which heads feed the heads that answer
#
# Wang et al. (2022) found in GPT-2 small a circuit for IOI: **name movers** (9.9, 9.6, 10.0) that
# attend to the indirect object at the last position and copy its name to the logits;
# **S-inhibition heads** (7.3, 7.9, 8.6, 8.10) that tell the name movers, through their
# *queries*, which name not to copy; and duplicate-token and induction heads before them.
# SmolLM2 is another model. Its answering heads are the ones with the largest exact score above:
# at full size 23.3 (0.86), 23.0 (0.42), 23.1 (0.21), 23.7 (0.14), with 24.4 (−0.37) pushing the
# other way and 29.1/29.0 (+0.30/−0.25) at the last layer — a block of heads in one layer, about
# three quarters of the way up, as GPT-2's name movers are in layers 9–10 of 12.
#
# Path patching asks what reaches them: the sender's clean output is put into the corrupted run,
# every other head is frozen at its corrupted value (the MLPs recompute), and only the receivers'
# **queries** see the change (`path_patch(…, via="q")`). A sender that scores high tells the
# answering heads what to look for, as the S-inhibition heads do in GPT-2.
#
# The corrupted prompt matters here. The set's twin ("When Anna and Paul …, Paul gave a drink
# to") swaps the names but keeps the structure: one name repeated, in the same place. Whatever
# tells the answering heads *which position* holds the repeated name is the same in both runs, so
# no head can move their queries: at full size on the first prompt, no sender among the 207 heads
# of layers 0–22 moves 23.3 and 23.0 through their queries by more than 0.3 % (22.5, 0.0027);
# through their values the largest are 11.4 (−0.074), 11.5 (+0.058), 10.8 (−0.045), 10.6 (+0.041)
# — the same four heads that feed 23.4's values on France/Germany. Wang et al. corrupt with
# **three** names instead ("ABC": … Mary and John …, Paul gave a drink to), which removes the
# repetition; that is the twin built below, token for token (the repeated name replaced by the
# set's corrupted one, same length). At full size every head of layers 0–22 is a sender
# (`path_patch_heads`), averaged over the 8 prompts; at the small size only the three heads below
# layer 23 that attribution patching of the ABC pair ranks highest on the first prompt (section 1
# makes attribution a fair way to pick candidates).

# %%
answer_layer = 23
receivers = [(answer_layer, int(h)) for h in exact[:, layers.index(answer_layer)].mean(0).argsort(
    descending=True)[:2]]  # fmt: skip
print("receivers (the two answering heads of layer 23 with the largest exact score):", receivers)


def abc(clean: torch.Tensor, corrupted: torch.Tensor, foil: str) -> torch.Tensor:
    """The clean prompt with its repeated name (the last occurrence of the foil) replaced by the
    corrupted twin's name at that position: three different names, as many tokens."""
    t = max(i for i, x in enumerate(clean.tolist()) if x == tokenizer.encode(foil)[0])
    out = clean.clone()
    out[t] = corrupted[t]
    return out


abc_pairs = [(p, clean, abc(clean, corrupted, p.foil), metric)
             for p, clean, corrupted, metric in pairs]  # fmt: skip
print("ABC twin:", repr(tokenizer.decode(abc_pairs[0][2].tolist())))
if SENDERS is None:
    path = torch.stack([
        path_patch_heads(model, clean, corrupted, receivers, metric, via="q").normalized.double()
        for p, clean, corrupted, metric in abc_pairs
    ]).mean(0)  # fmt: skip
    senders = [(la, h) for la in range(answer_layer) for h in range(H)]
    scores = [float(path[la, h]) for la, h in senders]
    abc_pairs = abc_pairs[:1]  # the whole effects below: the first prompt's
p, clean, corrupted, metric = abc_pairs[0]
whole = attribution_patch(model, clean, corrupted, metric).heads().normalized
if SENDERS is not None:
    before = whole[:answer_layer].abs().flatten()
    senders = [divmod(int(i), H) for i in before.argsort(descending=True)[:SENDERS]]
    scores = []
    for sender in senders:
        r = path_patch(model, clean, corrupted, sender, receivers, metric, via="q")
        scores.append((r.patched - r.corrupted) / (r.clean - r.corrupted))
    print(f"ABC pair: m_clean {r.clean:.2f}, m_corrupted {r.corrupted:.2f}")
total = {s: float(whole[s]) for s in senders}
order = sorted(range(len(senders)), key=lambda i: -abs(scores[i]))[:12]
for i in order:
    la, h = senders[i]
    print(f"  {la}.{h} → {receivers} via q: {scores[i]:+.3f}"
          f"   (its whole effect, attribution, prompt 1: {total[senders[i]]:+.3f})")  # fmt: skip

# %%
fig = Figure(figsize=(7, 3.2))
ax = fig.subplots()
labels = [f"{senders[i][0]}.{senders[i][1]}" for i in order]
ax.bar(np.arange(len(order)) - 0.2, [scores[i] for i in order], width=0.4, color="C0",
       label=f"path → {', '.join(f'{a}.{b}' for a, b in receivers)} (queries only)")  # fmt: skip
ax.bar(np.arange(len(order)) + 0.2, [total[senders[i]] for i in order], width=0.4, color="C7",
       label="whole effect (attribution, prompt 1)")  # fmt: skip
ax.set_xticks(range(len(order)), labels)
ax.axhline(0, color="grey", lw=0.6)
ax.set_xlabel("sender head (layer.head)")
ax.set_ylabel("normalised score, ABC corruption")
ax.set_title("which earlier heads feed the answering heads' queries", fontsize=9)
ax.legend(fontsize=7)
ax.grid(True, alpha=0.3)
fig.tight_layout()
viz.Plot(fig, {"path": np.array([scores[i] for i in order]),
               "total": np.array([total[senders[i]] for i in order])})  # fmt: skip

# %% [markdown]
# **What the bars show.** Each blue bar is the part of a sender's effect that travels through the
# two answering heads' queries alone; the grey bar beside it the sender's whole effect (both
# normalised on the ABC pair). A blue bar close to its grey one would be a pure
# S-inhibition-like head: one whose whole contribution is to tell the answering heads where to
# look.
#
# **What we found, and how it compares with the paper.** SmolLM2 has name-mover-like heads: the
# IOI answer is written mostly by a few heads of layer 23 (23.3 alone restores 86 % of the logit
# difference on average), and one head right after them (24.4) pushes against it, as the
# *negative* name movers of Wang et al. do (10.7, 11.10 in GPT-2). With the ABC corruption, the
# heads that feed their queries are few and a few layers below them: on the first prompt, over
# all 207 senders (`path_patch_heads`, the full run's call), 20.0 (+0.109) and 19.2 (+0.082)
# through the queries of 23.3 and 23.0, the next one a fifth of that (21.8, +0.020), and the
# same two lead on each of the first four prompts (20.0 +0.061 to +0.109, 19.2 +0.019 to
# +0.082, every other sender under 0.021 in absolute value); the small run above finds the same
# two among its three candidates, and they are the earlier heads with
# the largest whole effect on the ABC pair (0.36 and 0.30; 17.4, third at 0.20, sends nothing
# through the queries). They are S-inhibition-like in where they act — the answering heads'
# queries — but less than a third of their effect goes that way; the rest reaches the logits by
# other paths (other heads, or their own output read directly). In GPT-2 small the S-inhibition
# heads sit one or two layers below the name movers (7–8 under 9–10); in SmolLM2 three to four
# below (19–20 under 23), in a model of 30 layers rather than 12. With the name-swap twin the
# same question has no answer (every query path under 0.3 %): path patching finds only what the
# corruption changes. Two prompts and three senders are a sketch; the full run (8 prompts, 207
# senders a prompt, and `via="k"`, `via="v"` at the same cost) is the one to read; it is the
# experiment by which Wang et al. found the S-inhibition heads.
#
# This is the end of the path that began with attention as a matrix product in
# [notebook 01](01_attention_from_matmul.ipynb); [notebook 20](20_what_each_layer_predicts.ipynb)
# read what each layer predicts, this one which heads carry it.
