# %% [markdown]
# # 9 · Induction heads in a real model
#
# Give a language model a sequence of random tokens, then the same sequence again. The first time
# it can only guess; the second time it can *look back*: the token after the current one's
# earlier occurrence is the next token. Olsson et al. (2022, "In-context Learning and Induction
# Heads") found the heads that do this in every Transformer they looked at and called them
# **induction heads**. This notebook finds them in a real pretrained model — SmolLM2-135M, a
# 30-layer Llama with 9 query heads a layer, bundled with attnlab — and shows they do the work:
#
# - the **induction score** of every head on repeated random tokens (`attnlab.inspect.head_roles`);
# - the **in-context learning gap**: the loss on the second copy falls far below the loss on the
#   first;
# - **ablation**: removing the few top induction heads closes most of that gap, removing as many
#   random heads does not.

# %%
FULL = False  # True: longer sequences, a larger batch and more random draws (a few minutes)

SEED = 0
K = 6  # the heads ablated
if FULL:
    SEQ_LEN, BATCH, DRAWS, KS = 200, 8, 20, [1, 2, 4, 6, 8, 12, 16]
else:
    # batch 8: the same heads and conclusions; the sweep of section 5 at three K (each K not 6
    # costs 4 forwards of SmolLM2)
    SEQ_LEN, BATCH, DRAWS, KS = 40, 4, 8, [2, 6, 10]

# %%
import numpy as np
import torch
from matplotlib.figure import Figure

import attnlab as al
from attnlab import viz
from attnlab.inspect import capture, head_roles
from attnlab.inspect.roles import ordinary_token_range, repeated_tokens

torch.manual_seed(SEED)
model, tokenizer = al.load_pretrained("smollm2-135m")
model.eval()
cfg = model.config
L, H = cfg.n_layer, cfg.n_head
print(f"SmolLM2-135M: {L} layers × {H} query heads ({cfg.num_kv_heads} key/value heads)")

# %% [markdown]
# ## 1 · The test: random tokens, repeated
#
# Each row is $x = r\,r$: $n$ distinct tokens $r_0 \dots r_{n-1}$ drawn uniformly from the
# ordinary part of the vocabulary (no special token), then the same $n$ again
# (`repeated_tokens`). Nothing in $r$ can be predicted from language; everything in the second
# copy can be predicted from the first.
#
# **Which convention?** We put nothing before $r$ (`bos=None`, `--roles-bos none`: Olsson et al.'s
# plain test). TransformerLens prepends the tokenizer's BOS by default
# (`HookedTransformer.from_pretrained(..., default_prepend_bos=True)`, `to_tokens(prepend_bos=True)`),
# so the induction scores published from TransformerLens are measured on $[\text{bos}]\,r\,r$.
# A token before $r$ changes where heads park unused weight (it becomes the sink instead of
# $r_0$), and with it single scores. Measured with `attnlab inspect smollm2-135m --roles --json`
# (50 tokens a copy, batch 8): SmolLM2's own BOS (`<|im_start|>`, id 1; `--roles-bos tokenizer`)
# moves no head by more than 0.07, `<|endoftext|>` (`--roles-bos 0`) by up to 0.28 (layer 8
# head 0, duplicate-token 0.71 without → 0.43); the top induction heads stay the top ones. To
# compare with TransformerLens numbers, measure as it does: `head_roles(model, ...,
# bos=tokenizer.bos_id)`; `roles.convention` says which was used.

# %%
special = [i for i in (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id) if i is not None]
token_range = ordinary_token_range(cfg.vocab_size, [*special, *range(17)])  # SmolLM2: 0–16 special
ids = repeated_tokens(SEQ_LEN, batch=BATCH, token_range=token_range, seed=SEED)  # (B, 2n)
print(f"token range {token_range}; input {tuple(ids.shape)}")
print("row 0 starts:", repr(tokenizer.decode(ids[0, :8].tolist())), "…")
assert torch.equal(ids[:, :SEQ_LEN], ids[:, SEQ_LEN:])

# %% [markdown]
# ## 2 · Which heads do induction?
#
# `head_roles` runs the model once on such rows, captures every head's attention weights $A$ and
# scores each head (means over the rows that have a target):
#
# - **previous token**: $\operatorname{mean}_t A[t, t-1]$ — the weight on the token just before;
# - **induction**: $\operatorname{mean}_{t \ge n} A[t, t-n+1]$ — at a token of the second copy,
#   the weight on the token *after* its first occurrence;
# - duplicate token ($A[t, t-n]$) and copying (does the head's OV circuit raise the logit of the
#   token it attends to?).
#
# A perfect head scores 1. The map below shows every head of the 30 layers.

# %%
roles = head_roles(model, seq_len=SEQ_LEN, batch=BATCH, token_range=token_range, seed=SEED)
top = roles.top("induction", K)
print(f"top {K} induction heads:")
for layer, _, head, score in top:
    prev = float(roles.previous[layer, head])
    copy = float(roles.copying[layer, head])
    print(
        f"  L{layer}.H{head}: induction {score:.2f}, previous token {prev:.2f}, copying {copy:.2f}"
    )
print(
    "top previous-token heads:", [f"L{i}.H{h} {s:.2f}" for i, _, h, s in roles.top("previous", 4)]
)
print("measured with", roles.convention)  # no BOS; TransformerLens' default would prepend one
assert top[0][3] > 0.5  # a real induction head: most of its weight on the token to copy
viz.head_roles_figure(roles, title=f"SmolLM2-135M: head roles on {SEQ_LEN} random tokens repeated")

# %% [markdown]
# The induction heads sit in the middle-to-late layers (17–23), the previous-token heads earlier:
# the order the mechanism needs. Here is the top induction head's attention on one short
# repeated row: in the second copy each query looks at one key, $n-1$ positions back — the
# diagonal stripe below the main diagonal. In the first copy, with nothing to copy, it parks its
# weight on the first token (an "attention sink", where a head looks when it has nothing to do).

# %%
n_show = 16
short = repeated_tokens(n_show, batch=1, token_range=token_range, seed=SEED + 1)  # (1, 2·16)
layer, path, head, _ = top[0]
with torch.no_grad(), capture(model, names=[path]) as cache:
    model(short)
w = cache.attentions[path][0, head]  # (T, T)
stripe = torch.stack([w[t, t - n_show + 1] for t in range(n_show, 2 * n_show)]).mean()
print(f"L{layer}.H{head}: mean weight on t − n + 1 in the second copy {stripe:.2f}")
viz.attention_heatmap(w, title=f"L{layer}.H{head} on {n_show} random tokens repeated")

# %% [markdown]
# **How it works** (Olsson et al. 2022; Elhage et al. 2021, "A Mathematical Framework for
# Transformer Circuits"). Two heads in two layers:
#
# 1. a **previous-token head** in an earlier layer writes, at position $s$, the identity of the
#    token before it, $x_{s-1}$, into the residual stream;
# 2. the **induction head** builds its *keys* from that output. At the current position $t$ its
#    query asks for "a position whose previous token was $x_t$"; the key of position $s$ answers
#    when $x_{s-1} = x_t$. This is **K-composition**: the key side of a later head reads what an
#    earlier head wrote, so the QK circuit matches $x_t$ against $x_{s-1}$ — something no single
#    attention layer can do. Its OV circuit then **copies** the attended token $x_s$ into the
#    prediction: $[A][B] \dots [A] \to [B]$.
#
# One head alone cannot: at layer 0 the residual stream of $s$ holds only $x_s$.

# %% [markdown]
# ## 3 · The in-context learning gap
#
# The loss of each prediction, $-\log p(x_{t+1} \mid x_{\le t})$, averaged over the batch. For
# the $i$-th token of $r$ we compare its loss in the first copy with its loss in the second
# ($i \ge 1$ in both: $r_0$ in the second copy follows $r_{n-1}$, which had no successor before).
# The **gap** is the mean first-copy loss minus the mean second-copy loss, in nats.


# %%
@torch.inference_mode()
def copy_losses(head_mask: torch.Tensor | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-token loss of r_1 … r_{n-1} in the first and in the second copy, batch mean."""
    logits = model(ids, head_mask=head_mask).logits.float()  # (B, 2n, V)
    logp = torch.log_softmax(logits[:, :-1], -1)  # predicts x_{t+1}             (B, 2n − 1, V)
    nll = -logp.gather(-1, ids[:, 1:, None])[..., 0].mean(0)  # loss of x_{t+1}       (2n − 1,)
    n = SEQ_LEN
    return nll[: n - 1].numpy(), nll[n:].numpy()  # r_1…r_{n−1}, first copy / second copy


def gap(losses: tuple[np.ndarray, np.ndarray]) -> float:
    return float(losses[0].mean() - losses[1].mean())


base = copy_losses()
print(
    f"loss on the first copy {base[0].mean():.2f} nats, on the second {base[1].mean():.2f} "
    f"(uniform guessing: ln V = {np.log(cfg.vocab_size):.2f}); gap {gap(base):.2f} nats"
)
assert gap(base) > 3.0


def losses_figure(curves: dict[str, np.ndarray], title: str) -> viz.Plot:
    fig = Figure(figsize=(10.0, 3.4), layout="constrained")
    ax = fig.add_subplot()
    i = np.arange(1, SEQ_LEN)
    for label, y in curves.items():
        ax.plot(i, y, label=label, linewidth=1.4)
    ax.set_xlabel("index i of the token in r")
    ax.set_ylabel("loss (nats)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title, fontsize=10)
    return viz.Plot(fig, {k: np.asarray(v) for k, v in curves.items()})


losses_figure(
    {"first copy": base[0], "second copy": base[1]},
    f"Loss per token of r: the second copy is predicted in context (gap {gap(base):.1f} nats)",
)

# %% [markdown]
# The first copy is *worse* than guessing uniformly: the model is confident about language, and
# random tokens are not language. From the first tokens of the second copy on, the loss drops to a
# few nats — the model learned the sequence in context, after seeing it once.
#
# ## 4 · Remove the induction heads
#
# `GPT.forward(head_mask=...)` multiplies head $h$ of layer $l$'s output by `head_mask[l, h]`
# (0 removes it, as in notebook 06's head pruning). We remove the top $K$ induction heads, and
# for comparison $K$ heads drawn at random (several seeded draws, never an induction head of the
# top $K$), and measure the gap each time.


# %%
def mask_without(heads: list[tuple[int, int]]) -> torch.Tensor:
    mask = torch.ones(L, H)
    for layer, head in heads:
        mask[layer, head] = 0.0
    return mask


def random_heads(k: int, draw: int, avoid: set[tuple[int, int]]) -> list[tuple[int, int]]:
    g = torch.Generator().manual_seed(1000 + draw)
    pool = [(i, h) for i in range(L) for h in range(H) if (i, h) not in avoid]
    return [pool[j] for j in torch.randperm(len(pool), generator=g)[:k].tolist()]


induction = [(layer, head) for layer, _, head, _ in roles.top("induction", K)]
ablated = copy_losses(mask_without(induction))
random_runs = [copy_losses(mask_without(random_heads(K, d, set(induction)))) for d in range(DRAWS)]
random_gaps = np.array([gap(r) for r in random_runs])
closed = 1 - gap(ablated) / gap(base)
closed_random = 1 - random_gaps / gap(base)

print(f"{'heads removed':<28} {'gap (nats)':>10} {'gap closed':>11}")
print(f"{'none':<28} {gap(base):10.2f} {0:10.0%}")
print(f"{f'top {K} induction':<28} {gap(ablated):10.2f} {closed:10.0%}")
print(
    f"{f'{K} random ({DRAWS} draws)':<28} {random_gaps.mean():6.2f} ± {random_gaps.std():.2f} "
    f"{closed_random.mean():6.0%} ± {closed_random.std():.0%}"
)
print(
    f"gap closed: top-{K} induction {closed:.3f}, random {closed_random.mean():.3f} "
    f"(max {closed_random.max():.3f})"
)
assert closed > 0.5 and closed > closed_random.max()

# %%
fig = Figure(figsize=(6.0, 3.6), layout="constrained")
ax = fig.add_subplot()
names = ["none", f"top {K}\ninduction", f"{K} random\n({DRAWS} draws)"]
heights = [gap(base), gap(ablated), random_gaps.mean()]
ax.bar(names, heights, color=["#777777", "#b2182b", "#2166ac"])
ax.errorbar([2], [random_gaps.mean()], yerr=[random_gaps.std()], color="black", capsize=6)
ax.scatter(np.full(DRAWS, 2) + np.linspace(-0.15, 0.15, DRAWS), random_gaps, color="black", s=8,
           zorder=3, label="each random draw")  # fmt: skip
for x, v in enumerate(heights):
    low = v < 0.2 * max(heights)  # a short bar: the value above it, else inside its foot
    ax.text(x, v + 0.1 if low else 0.3, f"{v:.2f}", ha="center", va="bottom", fontsize=9,
            color="black" if low else "white")  # fmt: skip
ax.set_ylabel("gap: first-copy − second-copy loss (nats)")
ax.set_title(f"In-context learning gap with {K} heads removed", fontsize=10)
ax.legend(fontsize=8, loc="upper left")
viz.Plot(fig, {"gap": np.array(heights), "random": random_gaps})

# %% [markdown]
# Per token: with the induction heads gone the second copy is predicted almost as badly as the
# first; removing random heads barely moves it.

# %%
losses_figure(
    {
        "first copy": base[0],
        "second copy": base[1],
        f"second copy, top {K} induction heads removed": ablated[1],
        f"second copy, {K} random heads removed (mean)": np.mean([r[1] for r in random_runs], 0),
    },
    "Loss per token of r, with and without the induction heads",
)

# %% [markdown]
# ## 5 · How many heads?
#
# The same comparison for several $K$: the top-$K$ heads by induction score against $K$ random
# heads (fewer draws here; for $K = 6$ the runs above, its first draws). A handful of heads
# carries the in-context copying; the rest of the 270 heads can go a few at a time without it.

# %%
draws = max(3, DRAWS // 3)
sweep_top, sweep_random = [], []
for k in KS:
    if k == K:  # measured above: the same heads, and the same first draws
        sweep_top.append(closed)
        rand = list(closed_random[:draws])
    else:
        top_k = [(layer, head) for layer, _, head, _ in roles.top("induction", k)]
        sweep_top.append(1 - gap(copy_losses(mask_without(top_k))) / gap(base))
        rand = [1 - gap(copy_losses(mask_without(random_heads(k, d, set(top_k))))) / gap(base)
                for d in range(draws)]  # fmt: skip
    sweep_random.append((np.mean(rand), np.std(rand)))
    print(f"K = {k:>2}: gap closed {sweep_top[-1]:.0%} (induction), {np.mean(rand):.0%} (random)")

fig = Figure(figsize=(6.0, 3.4), layout="constrained")
ax = fig.add_subplot()
ax.plot(KS, sweep_top, "o-", color="#b2182b", label="top-K induction heads")
mean, std = np.array(sweep_random).T
ax.errorbar(KS, mean, yerr=std, fmt="s--", color="#2166ac", capsize=4,
            label=f"K random heads ({draws} draws)")  # fmt: skip
ax.set_xlabel("heads removed, K")
ax.set_ylabel("fraction of the gap closed")
ax.set_ylim(-0.1, 1.05)
ax.legend(fontsize=8)
ax.set_title("Removing heads: induction heads against random ones", fontsize=10)
viz.Plot(fig, {"K": np.array(KS), "top": np.array(sweep_top), "random": mean})

# %% [markdown]
# **In the learning path:** notebook 06 ([notebook 6](06_training.ipynb)) pruned the heads of a
# small trained model one at a time, least important first, and found that most of them could go
# for free while a few carried the task — the pruning curve. The same holds here, in a real model
# and for a behaviour nobody trained for directly: a few induction heads out of 270 carry the
# in-context copying. [Notebook 7](07_looking_inside.ipynb) shows how to capture and inspect
# attention weights like those above. From the command line, `attnlab plot roles --model smollm2-135m -o roles.png`
# draws the head-role map.
#
# **Next:** [notebook 10](10_induction_heads_forming.ipynb): induction heads forming while a small
# model trains — the phase change.
