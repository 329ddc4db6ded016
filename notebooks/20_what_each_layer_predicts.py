# %% [markdown]
# # 20 · What each layer predicts
#
# A decoder writes into one residual stream, block after block, and reads its prediction off the
# end: $\text{logits} = W_U\,\mathrm{Norm}_f(h_L)$. The **logit lens** (nostalgebraist 2020)
# applies that same read-out to the stream *after every block*, $W_U\,\mathrm{Norm}_f(h_\ell)$, and
# asks what the model would predict if it stopped there. Early layers were never trained to be
# read this way, so the **tuned lens** (Belrose et al. 2023) learns one affine *translator* per
# layer, $h_\ell \mapsto h_\ell + A_\ell h_\ell + b_\ell$, chosen so the layer's read-out matches
# the model's final distribution (it minimises $\mathrm{KL}(p_L \,\|\, p_\ell)$ on text), and reads
# that instead. Belrose et al. report the tuned lens at or below the logit lens in KL at every
# layer of every model they tried. This notebook asks the same of SmolLM2-135M:
#
# 1. the logit lens on "The capital of France is": at which layer " Paris" becomes the top token,
#    and its rank layer by layer;
# 2. a tuned lens trained on the bundled tinyshakespeare text, and the same question through it;
# 3. per layer, the KL to the final distribution and the bits per token of each lens on held-out
#    text.
#
# The command line does the same:
#
# ```
# attnlab inspect smollm2-135m --text "The capital of France is" --lens logit
# attnlab inspect smollm2-135m --train-tuned-lens runs/smollm2-lens --data tinyshakespeare \
#     --steps 32 --batch-size 2 --seq-len 64 --lr 1e-3 --eval-tokens 512
# attnlab inspect smollm2-135m --text "The capital of France is" --lens tuned:runs/smollm2-lens
# attnlab plot lens --model smollm2-135m --text "The capital of France is" --lens tuned:runs/smollm2-lens
# ```

# %%
FULL = False  # True: the tuned lens of the command above, 32 steps of 2 × 64 tokens (~10 CPU-min)

if FULL:
    TRAIN = dict(steps=32, batch_size=2, seq_len=64, lr=1e-3)
    EVAL_TOKENS, EVAL_WIDTH = 512, 64  # held-out tokens, in rows of 64 (what the CLI scores)
else:
    # two steps of one 8-token window: enough to see the translators move, far from converged
    TRAIN = dict(steps=2, batch_size=1, seq_len=8, lr=1e-3)
    EVAL_TOKENS, EVAL_WIDTH = 16, 16  # one row of held-out text

# %%
import torch
from matplotlib.figure import Figure

import attnlab as al
from attnlab import viz
from attnlab.data import corpora
from attnlab.inspect import lens_comparison, logit_lens, train_tuned_lens
from attnlab.viz.lens import lens_figure

torch.manual_seed(0)
model, tokenizer = al.load_pretrained("smollm2-135m")
model.eval()
PROMPT = "The capital of France is"
ids = torch.tensor(tokenizer.encode(PROMPT))  # (T,)
tokens = [tokenizer.decode([int(i)]) for i in ids]
(paris,) = tokenizer.encode(" Paris")
print(f"{len(tokens)} tokens: {tokens}; ' Paris' is token {paris}")

# %% [markdown]
# ## 1 · The logit lens
#
# `logit_lens` runs the model once, records the embeddings and every block's output, and gives
# each to the model's own final norm and unembedding. Its rows are the embeddings (`embed`), then
# the stream after block 0, 1, …, 29; the last row *is* the model's output, bit for bit.


# %%
def paris_rank(lens):
    """The rank of ' Paris' (1 = top) at the last position, one entry a row."""
    z = lens.logits[:, 0, -1].double()  # (L + 1, vocab)
    return ((z > z[:, paris : paris + 1]).sum(-1) + 1).tolist()


logit = logit_lens(model, ids)
assert torch.equal(logit.logits[-1], logit.final)  # the last row is the model's output
rank_logit = paris_rank(logit)
first = logit.first_top(paris)
print(f"logit lens: ' Paris' first top-1 at row {first} ({logit.layers[first]!r}: "
      f"{'the output' if first == len(logit.layers) - 1 else 'a hidden layer'})")  # fmt: skip
print("rank of ' Paris' by row (embed, after 0 … 29):", rank_logit)
lens_figure(logit, tokens, lambda i: tokenizer.decode([i]),
                title="logit lens on SmolLM2-135M")  # fmt: skip

# %% [markdown]
# Read bottom to top. The embeddings row predicts each position's *own* token with probability
# ≈ 1 ("The" after "The", " capital" after " capital"): SmolLM2 ties its unembedding to its
# embedding, so an embedding read back is closest to itself (at " France" the top token is a
# special token, `<filename>`, drawn blank). The middle rows say almost nothing about the text:
# punctuation and spaces ("," and "␣") at most positions, and from block 11 up the first
# position flattens to " the" at probability 0.03 — the attention sink of notebooks 11 and 18,
# whose stream is no longer a prediction. " of" after " capital" appears from block 18, " is"
# after " France" from block 25 (but for block 26); at the last position the lens shows " the"
# (blocks 24, 26, 27) and " capital" (block 28, 0.20) before the output's " Paris" (0.77).
#
# ## 2 · A tuned lens
#
# `train_tuned_lens` starts from the identity translator (where it *is* the logit lens) and
# trains all 30 translators together by Adam on random windows of text, the model frozen. The
# data here is tinyshakespeare's first 90 %, as the command line takes it; its last 10 % is held
# out for section 3. At the small size this runs **two steps on one 8-token window**: the
# translators have barely moved and the lens is *not* converged — read its numbers as "what two
# steps do", not as the tuned lens. `FULL = True` trains the command line's lens (4096 tokens,
# itself a small fraction of the roughly $250 \cdot 2^{18}$ tokens Belrose et al. train on).

# %%
text = corpora.load_text("tinyshakespeare")
split = int(len(text) * 0.9)
wanted = TRAIN["steps"] * TRAIN["batch_size"] * TRAIN["seq_len"]
train_ids = torch.tensor(tokenizer.encode(text[:split][: 6 * wanted]))[:wanted]
held = torch.tensor(tokenizer.encode(text[split:][: 6 * EVAL_TOKENS]))[:EVAL_TOKENS]
held = held[: held.numel() // EVAL_WIDTH * EVAL_WIDTH].view(-1, EVAL_WIDTH)

history = []
tuned = train_tuned_lens(model, train_ids, **TRAIN, on_step=lambda s, kl: history.append(kl))
print(f"trained {TRAIN['steps']} steps of {TRAIN['batch_size']} × {TRAIN['seq_len']} tokens; "
      f"mean KL over the layers (nats): {' → '.join(f'{k:.2f}' for k in history)}")  # fmt: skip

tuned_view = logit_lens(model, ids, tuned=tuned)
rank_tuned = paris_rank(tuned_view)
first_tuned = tuned_view.first_top(paris)
print(f"tuned lens: ' Paris' first top-1 at row {first_tuned} "
      f"({tuned_view.layers[first_tuned] if first_tuned is not None else None!r})")  # fmt: skip
print("rank of ' Paris' by row (embed, after 0 … 29):", rank_tuned)
lens_figure(tuned_view, tokens, lambda i: tokenizer.decode([i]),
                title=f"tuned lens ({TRAIN['steps']} steps) on SmolLM2-135M")  # fmt: skip

# %% [markdown]
# The rank of " Paris" through both lenses, layer by layer (log scale; 1 is the top token):

# %%
fig = Figure(figsize=(7, 3.2))
ax = fig.subplots()
rows = range(len(logit.layers))
ax.plot(rows, rank_logit, "o-", ms=3, label="logit lens")
ax.plot(rows, rank_tuned, "s-", ms=3, label=f"tuned lens ({TRAIN['steps']} steps)")
ax.set_yscale("log")
ax.invert_yaxis()
ax.set_xticks(list(rows)[::3], [logit.layers[i] for i in list(rows)[::3]], fontsize=8)
ax.set_xlabel("row: the embeddings, then the stream after block n")
ax.set_ylabel("rank of ' Paris'")
ax.set_title(f"{PROMPT!r} → ' Paris'", fontsize=10)
ax.legend(fontsize=8)
ax.grid(True, alpha=0.3)
fig.tight_layout()
viz.Plot(fig, {"logit": rank_logit, "tuned": rank_tuned})

# %% [markdown]
# ## 3 · How far each layer is from the output
#
# `lens_comparison` scores both lenses on the held-out text: for each row, the mean
# $\mathrm{KL}(p_L \,\|\, p_\ell)$ to the model's final distribution and the cross-entropy against
# the true next token, both in bits per token. At the last row both are the model's own (the
# left panel stops one row before it, where the KL is 0).

# %%
table = lens_comparison(model, held, tuned)
print(f"{table.tokens} held-out tokens; the model itself: {table.bits_model:.3f} bits/token")
print(f"{'row':>6} {'KL logit':>9} {'KL tuned':>9} {'bits logit':>11} {'bits tuned':>11}")
for r in table.rows():
    print(f"{r['layer']:>6} {r['kl_logit']:9.3f} {r['kl_tuned']:9.3f} "
          f"{r['bits_logit']:11.3f} {r['bits_tuned']:11.3f}")  # fmt: skip
below = [r["layer"] for r in table.rows()[:-1] if r["kl_tuned"] <= r["kl_logit"]]
print(f"tuned KL at or below logit KL at {len(below)} of {len(table.layers) - 1} rows")

# %%
fig = Figure(figsize=(9, 3.4))
axes = fig.subplots(1, 2)
for ax, key, label in ((axes[0], "kl", "KL(final ‖ lens), bits/token"),
                       (axes[1], "bits", "cross-entropy, bits/token")):  # fmt: skip
    # KL is 0 at the last row by construction: drawn up to the row before it (log scale)
    xs = list(rows) if key == "bits" else list(rows)[:-1]
    ax.plot(xs, getattr(table, f"{key}_logit")[: len(xs)], "o-", ms=3, label="logit lens")
    ax.plot(xs, getattr(table, f"{key}_tuned")[: len(xs)], "s-", ms=3, label="tuned lens")
    if key == "bits":
        ax.axhline(table.bits_model, color="grey", lw=0.8, ls="--", label="the model")
    ax.set_yscale("log")
    ax.set_xticks(list(rows)[::5], [table.layers[i] for i in list(rows)[::5]], fontsize=8)
    ax.set_xlabel("row")
    ax.set_ylabel(label)
    ax.grid(True, alpha=0.3)
axes[0].legend(fontsize=8)
axes[1].legend(fontsize=8)
fig.suptitle(f"{table.tokens} held-out tokens of tinyshakespeare; tuned lens: "
             f"{TRAIN['steps']} steps", fontsize=10)  # fmt: skip
fig.tight_layout()
viz.Plot(fig, {"kl_logit": table.kl_logit.tolist(), "kl_tuned": table.kl_tuned.tolist(),
               "bits_logit": table.bits_logit.tolist(), "bits_tuned": table.bits_tuned.tolist()})  # fmt: skip

# %% [markdown]
# Robust facts only, true at every size: the last row of either lens is the model's output (KL 0,
# the model's bits), and " Paris" is SmolLM2's top next token for the prompt.

# %%
assert table.kl_logit[-1] == 0 and table.kl_tuned[-1] == 0
assert rank_logit[-1] == 1 == rank_tuned[-1]
print(f"' Paris' first top-1: logit lens row {first}, tuned lens row {first_tuned} "
      f"(of {len(logit.layers)}); tuned KL at or below logit KL at {len(below)} of "
      f"{len(table.layers) - 1} rows")  # fmt: skip

# %% [markdown]
# **What the lenses show.** *At full size* (the tuned lens of the command above: 32 steps of
# 2 × 64 tokens, 4096 training tokens, 493 s user + 87 s system CPU on a shared 2-core machine;
# mean KL over the layers 17.1 → 3.5 nats while training), on 512 held-out tokens of
# tinyshakespeare (the model itself: 5.950 bits/token):
#
# | row   | KL logit | KL tuned | bits logit | bits tuned |
# |-------|---------:|---------:|-----------:|-----------:|
# | embed | 150.742  | 28.546   | 155.850    | 32.906     |
# | 0     | 18.096   | 7.289    | 23.720     | 12.448     |
# | 5     | 20.664   | 6.658    | 25.923     | 11.515     |
# | 10    | 25.072   | 6.473    | 29.712     | 11.386     |
# | 15    | 23.713   | 5.871    | 28.523     | 10.802     |
# | 20    | 19.764   | 4.852    | 24.339     | 9.909      |
# | 23    | 15.782   | 3.786    | 20.595     | 9.369      |
# | 25    | 9.957    | 2.830    | 15.189     | 8.487      |
# | 27    | 6.246    | 2.025    | 11.545     | 7.827      |
# | 28    | 4.280    | 1.875    | 9.892      | 7.663      |
# | 29    | 0        | 0        | 5.950      | 5.950      |
#
# **Where SmolLM2 agrees with Belrose et al.** The tuned lens is below the logit lens at every
# row before the output (where both are the model's), in KL and in bits, as they report for every model they tried; the gap is widest in the
# middle (block 10: 25.1 against 6.5 bits of KL) and closes towards the output. The logit lens is
# not even monotone here: its KL *rises* from 18 bits after block 0 to 25 after block 10 before
# falling — the middle of SmolLM2's stream is further from its output vocabulary, read directly,
# than the first block's. The embeddings row is extreme (151 bits): SmolLM2's unembedding is tied
# to its embedding, so the raw embedding read back predicts its own input token with probability
# ≈ 1 (the bottom row of the first figure), confidently wrong about the next one.
#
# **Where it differs.** Even tuned, the late layers stay far from the output: 1.9 bits of KL one
# block before the end, and every tuned row costs at least 1.7 bits/token more than the model.
# This lens saw 4096 training tokens, Belrose et al.'s roughly $250 \cdot 2^{18}$; how much of
# that gap is undertraining is not measured here (the training KL was still falling: 4.2 nats
# at step 24, 3.5 at step 32). It is a first approximation, and on the prompt it
# shows tinyshakespeare's priors (" Lord", " ancient" in the middle rows). Nor does either lens
# find " Paris" early: at full size it is top-1 only at the output (probability 0.77) under both.
# Through the logit lens its rank is 92 after block 24, 7 after block 27, 3 after block 28, then
# 1; through the tuned lens it is already 2nd from block 24 to 27 and 3rd after block 28 — the
# tuned lens sees the answer a few blocks sooner, but only as a runner-up (the top tokens there
# are " capital", " City", " Bat").
#
# *At the small size* above (two steps on one 8-token window, scored on 16 held-out tokens), the
# run printed: mean training KL 13.44 → 11.10 nats; tuned KL at or below logit KL at all 30 rows
# (block 10: 27.0 against 20.9 bits; the embeddings 166 against 139, where the full-size lens
# reaches 28.5) — so the agreement with Belrose et al. shows even here, but the distance is
# not. On the prompt the half-trained lens is *worse* than the logit lens up to block 22 (rank of
# " Paris" 11376 after block 6, against 5012) and better only from block 23 (24 after block 24
# against 92; 2 after block 28 against 3), and its first position reads junk (" phthalm",
# probability 0.04, blocks 11–23). Two steps move the translators towards the late layers'
# answer without yet making the early ones useful: this lens is *not* converged, and its figure
# is what two steps do, not the tuned lens.
#
# **What this does not show.** One prompt, one answer: where " Paris" surfaces says little about
# where SmolLM2 recalls facts in general (a set of prompts, notebook 12's patching, would). The
# KL and bits are averaged over 512 tokens of Shakespeare, text unlike SmolLM2's training mix;
# a lens trained and scored on web text may sit elsewhere. And a lens reads what a layer *could*
# say through one linear map, not what the model uses: a low tuned-lens KL means the information is
# linearly there, not that later blocks read it.
#
# **What we found.** Read straight through the output head, SmolLM2's middle layers say little
# about its answer — worse than its first block; one affine map per layer, trained in minutes on
# a CPU, brings every layer closer to the output, as Belrose et al. found at larger scale, and
# shows " Paris" among the top three from block 24.
#
# **Next:** [notebook 21](21_patching_at_scale.ipynb) — which heads carry the answer, and how far
# one backward pass can stand in for patching every head.
