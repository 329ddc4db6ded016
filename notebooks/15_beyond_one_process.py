# %% [markdown]
# # 15 · Beyond one process: tensor and context parallelism
#
# Everything so far ran in one process. A model too wide for one device, or a sequence too long
# for one device's attention, has to be spread over several — and the point of doing it right is
# that **nothing changes but where the numbers are computed**: the loss, the gradients and the
# trained weights are those of one process. attnlab spreads a model in two ways, both on PyTorch's
# own engine (`torch.distributed`, DTensor, `torchrun`):
#
# - **tensor parallelism** (Megatron-LM, Shoeybi et al. 2019): every rank holds $1/N$ of each
#   layer's attention heads and feed-forward units and sees the whole sequence;
#   `attnlab train lm ... --tensor-parallel N` (`attnlab.distributed.tensor_parallel`);
# - **context (sequence) parallelism** with ring attention (Liu et al. 2023): every rank holds
#   $1/C$ of each sequence and the whole model; keys and values travel around a ring of ranks;
#   `attnlab train lm ... --context-parallel C` (`attnlab.distributed.context_parallel`).
#
# You will learn:
#
# - which slices of $W_{qkv}$, $W_O$ and the MLP each rank holds, read from attnlab's
#   tensor-parallel plan, and where the one all-reduce per sub-layer happens;
# - how a causal sequence is split so that every rank does the same work (the *zigzag* layout),
#   which key/value blocks travel at each step of the ring, and which (query, key) blocks each
#   rank computes;
# - that two processes started with `torchrun` train with the same per-step loss as one.

# %%
FULL = False  # True: a wider, deeper model and longer runs (same comparison, ~2× the time)

if FULL:
    MODEL = dict(n_layer=4, n_head=4, n_embd=64, block_size=64, batch_size=8)
    STEPS = 20
else:  # 2 layers of width 16: the three runs are dominated by starting the processes
    MODEL = dict(n_layer=2, n_head=4, n_embd=16, block_size=16, batch_size=4)
    STEPS = 6
N = 2  # tensor-parallel ranks drawn and run
RING = 4  # context-parallel ranks drawn (the run below uses 2)

# %%
import builtins
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import torch
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import attnlab as al
from attnlab import cli, tasks
from attnlab.distributed import (
    HeadParallel,
    qkv_row_order,
    ring_pieces,
    sequence_positions,
    tp_plan,
)
from attnlab.tasks.train_options import LMOptions
from attnlab.viz import Plot

RANK_COLORS = [np.array(to_rgb(c)) for c in ("C0", "C1", "C2", "C3")]
SHARED = np.array(to_rgb("0.8"))  # replicated: every rank holds it

# %% [markdown]
# ## 1 · Tensor parallelism: heads and hidden units split, one all-reduce per sub-layer
#
# The feed-forward block is $\mathrm{FFN}(x) = \mathrm{act}(x W_1) W_2$. Split $W_1$ by its
# **columns** (hidden units) and $W_2$ by the matching **rows**,
#
# $$W_1 = \big[W_1^{(0)}\; W_1^{(1)}\big], \qquad W_2 = \begin{bmatrix} W_2^{(0)} \\ W_2^{(1)}
# \end{bmatrix}, \qquad \mathrm{FFN}(x) = \sum_{r} \mathrm{act}\big(x W_1^{(r)}\big)\, W_2^{(r)},$$
#
# because an elementwise activation never mixes hidden units. Rank $r$ computes its term from the
# whole $x$, and one **all-reduce** (a sum over the ranks, after which every rank holds the result)
# gives $\mathrm{FFN}(x)$; the bias of $W_2$ is added once, after it. A gated MLP (SwiGLU,
# $\mathrm{act}(x W_{\text{gate}}) \odot x W_1$) splits $W_{\text{gate}}$ like $W_1$.
#
# Attention is the same with heads in place of hidden units. The output is a sum over heads,
#
# $$\mathrm{MHA}(x) = \sum_{h} \mathrm{softmax}\!\Big(\frac{x W^Q_h (x W^K_h)^\top}{\sqrt{d_h}}
# \Big)\, x W^V_h\, W^O_h,$$
#
# and every head attends on its own: rank $r$ keeps the query, key and value columns of its heads
# ("column parallel") and the rows of $W^O$ that read them ("row parallel"); one all-reduce sums
# the ranks' parts. In the backward pass the gradient with respect to $x$ is a sum over ranks in
# the same way and is all-reduced where the column-parallel layer takes its input (Megatron's
# operator $f$; the forward all-reduce is its $g$). Per block: two all-reduces of a
# $B \times T \times d$ activation in the forward pass (after attention, after the MLP), and in
# the backward pass the same kind of sum where the column-parallel layers read their input.
#
# `torch.nn.Linear` stores its weight as `(out, in)`, so "columns of $W_1$" are **rows** of
# `c_fc.weight`: `ColwiseParallel` is `Shard(0)` of the weight (and of the bias), `RowwiseParallel`
# is `Shard(1)` (its bias replicated). Here is attnlab's plan for a small GPT block — 4 query heads
# sharing 2 key/value heads (GQA) and a gated MLP — read from `tp_plan`:

# %%
cfg = al.GPTConfig(
    vocab_size=40, n_positions=16, n_embd=8, n_layer=1, n_head=4, num_kv_heads=2, mlp="gated"
)
model = al.GPT(cfg)
plan = tp_plan(model)
for path, style in plan.items():
    print(f"{path:<28} {style!r}")

# %% [markdown]
# `ColwiseParallel` takes a replicated input and leaves its output sharded along the last
# dimension (each rank's heads or units); `RowwiseParallel` takes that sharded input and returns
# `Replicate()` — its partial sums become whole by the all-reduce. `HeadParallel` (attnlab's) is
# applied to the attention layer *before* its `c_attn` is sharded: the fused
# $[W^Q; W^K; W^V]$ has its rows in the order q-heads, k-heads, v-heads, and a plain `Shard(0)`
# would hand rank 0 all of $W^Q$ and rank 1 all of $W^K, W^V$. So the rows are permuted first,
# by `qkv_row_order`, to $[W^Q_0; W^K_0; W^V_0; W^Q_1; W^K_1; W^V_1]$; then `Shard(0)` hands
# rank $r$ exactly its heads. Everything else (embeddings, norms, the LM head) is replicated.
#
# From the plan and this rule we work out, for every parameter of the block, what each rank holds:

# %%


def style_of(module: str) -> list[object]:
    """The plan's styles that apply to a module (its path matched against the plan's patterns)."""
    return [s for pattern, s in plan.items() if fnmatch(module, pattern)]


def owner_of_rows(module: str, rows: int) -> np.ndarray:
    """Which rank holds each row of a column-parallel weight, in the single-process row order."""
    attn = module.rpartition(".")[0]
    if any(isinstance(s, HeadParallel) for s in style_of(attn)):  # the fused QKV, re-laid out
        order = qkv_row_order(cfg.n_head, cfg.kv_heads, cfg.n_embd // cfg.n_head, N).numpy()
    else:
        order = np.arange(rows)
    owner = np.empty(rows, dtype=int)
    owner[order] = np.arange(rows) // (rows // N)  # Shard(0) of the permuted rows
    return owner


def owners(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """For each element of a parameter: the rank holding it, or -1 where every rank does."""
    module, _, kind = name.rpartition(".")
    styles = style_of(module)
    out = -np.ones(shape, dtype=int)
    if any(isinstance(s, ColwiseParallel) for s in styles):  # weight and bias: Shard(0)
        rows = owner_of_rows(module, shape[0])
        out[...] = rows.reshape(-1, *([1] * (len(shape) - 1)))
    elif any(isinstance(s, RowwiseParallel) for s in styles) and kind == "weight":  # Shard(1)
        out[...] = np.arange(shape[1]) // (shape[1] // N)
    return out


held = {name: owners(name, tuple(p.shape)) for name, p in model.named_parameters()}
print(f"{'parameter':<32} {'shape':>8}  " + "  ".join(f"rank {r}" for r in range(N)))
for name, own in held.items():
    if ".h.0." in name:
        per_rank = [int(((own == r) | (own == -1)).sum()) for r in range(N)]
        print(f"{name:<32} {own.shape!s:>8}  " + "  ".join(f"{n:6d}" for n in per_rank))
total = sum(o.size for o in held.values())
for r in range(N):
    mine = sum(int(((o == r) | (o == -1)).sum()) for o in held.values())
    print(f"rank {r} holds {mine} of the model's {total} parameters ({mine / total:.0%})")
block = {n: o for n, o in held.items() if ".h.0." in n}
split = sum(int((o >= 0).sum()) for o in block.values()) / sum(o.size for o in block.values())
print(f"of the block's own parameters {split:.0%} are split, {1 - split:.0%} replicated")

# %% [markdown]
# In this toy the embedding table is a large part of the model, so each rank still holds most of
# it; in the block itself all but the norms and the two output biases are split, and in a real
# model (width in the thousands) the blocks are nearly everything: a rank holds close to $1/N$.
#
# The figure draws every weight of the block as `torch.nn.Linear` stores it, `(out, in)`, one cell
# per number, coloured by the rank that holds it (grey: every rank). `c_attn` is drawn twice: in
# the single-process order, where the ranks' rows interleave (rank 0 holds query heads 0–1 and
# key/value head 0, whose rows are not contiguous), and re-laid out, where `Shard(0)` cuts it in
# two. The row-parallel matrices' outputs are partial sums, added by the all-reduce:
#
# ```
# x ─┬─ rank 0: ln_1 → c_attn rows of heads 0,1 → attention → c_proj columns 0:4 ─┐
#    └─ rank 1: ln_1 → c_attn rows of heads 2,3 → attention → c_proj columns 4:8 ─┴─ all-reduce Σ → + b → x
# ```

# %%


def colour(own: np.ndarray) -> np.ndarray:
    """An RGB image of an owner map."""
    img = np.tile(SHARED, (*own.shape, 1))
    for r in range(N):
        img[own == r] = RANK_COLORS[r]
    return img


d_head, kv = cfg.n_embd // cfg.n_head, cfg.kv_heads
qkv_names = (
    [f"q{h}" for h in range(cfg.n_head)]
    + [f"k{h}" for h in range(kv)]
    + [f"v{h}" for h in range(kv)]
)
relaid = qkv_row_order(cfg.n_head, kv, d_head, N).numpy()
panels = [
    ("attn.c_attn", "c_attn (W_qkv), one-process rows", None),
    ("attn.c_attn", "c_attn re-laid out: Shard(0)", relaid),
    ("attn.c_proj", "attn.c_proj (W_O): Shard(1)\noutput: partial sums → all-reduce", None),
    ("mlp.c_gate", "mlp.c_gate: Shard(0)", None),
    ("mlp.c_fc", "mlp.c_fc: Shard(0)", None),
    ("mlp.c_proj", "mlp.c_proj: Shard(1)\noutput: partial sums → all-reduce", None),
]
fig = Figure(figsize=(13, 8))
grid = fig.add_gridspec(2, 4, height_ratios=[1, 1.6], width_ratios=[1, 1, 1.2, 2.2])
places = [grid[0, 0], grid[0, 1], grid[0, 2], grid[1, 0], grid[1, 1], grid[1, 2:]]
for (short, title, order), place in zip(panels, places, strict=True):
    weight, bias = held[f"transformer.h.0.{short}.weight"], held[f"transformer.h.0.{short}.bias"]
    if order is not None:
        weight, bias = weight[order], bias[order]
    gap = np.ones((weight.shape[0], 1, 3))  # a white column, then the bias
    ax = fig.add_subplot(place)
    ax.imshow(np.concatenate([colour(weight), gap, colour(bias[:, None])], 1), interpolation="none")
    for x in np.arange(0.5, weight.shape[1] - 1):  # one cell per number
        ax.axvline(x, color="white", lw=0.3)
    for y in np.arange(0.5, weight.shape[0] - 1):
        ax.axhline(y, color="white", lw=0.3 if "c_attn" not in short or (y + 0.5) % d_head else 1.5)
    ax.set_title(title, fontsize=10)
    ax.set_xticks([(weight.shape[1] - 1) / 2, weight.shape[1] + 1], ["weight: in", "bias"])
    ax.set_ylabel("out")
    if "c_attn" in short:  # one label per head's rows
        rows = np.arange(weight.shape[0]) if order is None else order
        heads = [qkv_names[i // d_head] for i in rows]
        ax.set_yticks(np.arange(0, weight.shape[0], d_head) + (d_head - 1) / 2)
        ax.set_yticklabels(heads[::d_head], fontsize=8)
    else:
        ax.set_yticks([])
ax = fig.add_subplot(grid[0, 3])
ax.axis("off")
ax.text(0, 0.5, "forward, on each rank r:\n"
        "  x (whole, replicated) → ln_1 → c_attn rows of r's heads\n"
        "  → attention of r's heads → c_proj columns of r's heads\n"
        "  → partial sum  ─ all-reduce Σ_r ─→  + bias → x + …\n"
        "the same for ln_2 → c_gate, c_fc (r's units) → c_proj\n\n"
        "backward: the gradient of x is all-reduced where\n"
        "c_attn and c_fc/c_gate read it", va="center", family="monospace", fontsize=8.5)  # fmt: skip
handles = [Patch(color=c) for c in [*RANK_COLORS[:N], SHARED]]
fig.legend(handles, [f"rank {r}" for r in range(N)] + ["every rank"], loc="upper right", ncol=3)
fig.suptitle(f"One GPT block (d = {cfg.n_embd}, {cfg.n_head} query / {kv} key-value heads, "
             f"gated MLP of {cfg.ff_width}) over {N} tensor-parallel ranks", x=0.4)  # fmt: skip
fig.tight_layout(rect=(0, 0, 1, 0.95))
Plot(fig, {k: v for k, v in held.items() if ".h.0." in k})

# %% [markdown]
# In the one-process layout (left) the rows of `c_attn` alternate between the ranks — q0 q1 to
# rank 0, q2 q3 to rank 1, then k0 to rank 0, k1 to rank 1, and the same for v — and with GQA the
# query heads of rank 0 read key/value head 0 = $\lfloor h / (H/H_{kv}) \rfloor$, which is
# rank 0's own: no rank ever needs another's keys. Re-laid out (second panel) each rank's rows are
# one block. The MLP's `c_gate` and `c_fc` are cut by rows, `c_proj` by columns, and the cut is
# the same hidden units in all three. A checkpoint keeps the one-process order: the permutation
# is undone when the shards are gathered (`tensor_parallel.full_state_dict`), so a run saved on 2
# ranks resumes on 4 or on one.

# %% [markdown]
# ## 2 · Context parallelism: the sequence split, keys and values around a ring
#
# Now every rank holds the whole model and $T/C$ tokens of each sequence. Embeddings, norms, the
# MLP and the loss are per token and need nothing from the others (a token's positional embedding
# is read at its *global* position, `sequence_positions`). Attention needs every earlier key. The
# ranks form a ring; at step $i = 0 \dots C-1$ rank $r$ holds the key/value block of rank
#
# $$s(r, i) = (r - i) \bmod C,$$
#
# its own first, then each step the block its left neighbour held before — and attends its
# queries to it. The partial results of the steps are merged exactly as flash attention merges
# key blocks (notebook 5): with a running maximum and the log-sum-exp $\ell$ of each query,
#
# $$\ell = \log\big(e^{\ell_a} + e^{\ell_b}\big), \qquad
# o = e^{\ell_a - \ell}\, o_a + e^{\ell_b - \ell}\, o_b,$$
#
# so after $C$ steps every query has attended to the whole sequence, with no $T \times T$ matrix
# anywhere. The backward pass sends the blocks around again, and each key's and value's gradient
# home to its rank.
#
# **Causal balance.** If rank $r$ held the $r$-th contiguous stretch, the last rank's queries
# would see every block and rank 0's only its own: the ring waits for the slowest. attnlab's
# default `"zigzag"` layout cuts the sequence into $2C$ chunks and gives rank $r$ chunks $r$ and
# $2C-1-r$ — an early and a late one. Below, for a ring of `RING` ranks and $T = 4\cdot$`RING`
# tokens, which global positions each rank holds, and from `ring_pieces` (the kernel calls the
# ring makes) the (query, key) pairs each rank computes at each step:

# %%
T = 4 * RING
T_LOCAL = T // RING
causal = torch.ones(T, T, dtype=torch.bool).tril()


def step_pairs(rank: int, step: int, layout: str) -> tuple[torch.Tensor, int]:
    """The (query, key) pairs, in global positions, that ``rank`` computes at ring step ``step``,
    and the rank whose keys and values it holds then."""
    source = (rank - step) % RING
    q_pos = sequence_positions(T, rank=rank, world_size=RING, layout=layout)
    k_pos = sequence_positions(T, rank=source, world_size=RING, layout=layout)
    done = torch.zeros(T, T, dtype=torch.bool)
    for p in ring_pieces(rank, source, RING, T_LOCAL, layout=layout, is_causal=True):
        i = torch.arange(p.q0, p.q1)[:, None]
        j = torch.arange(p.k0, p.k1)[None, :]
        seen = (j - p.k0 <= i - p.q0) if p.causal else torch.ones(len(i), j.shape[1], dtype=bool)
        done[q_pos[i], k_pos[j]] |= seen
    return done, source


work = {}
for layout in ("contiguous", "zigzag"):
    print(f"{layout}: positions held")
    for r in range(RING):
        print(
            f"  rank {r}: {sequence_positions(T, rank=r, world_size=RING, layout=layout).tolist()}"
        )
    count = torch.zeros(T, T, dtype=torch.int64)
    work[layout] = np.zeros((RING, RING), dtype=int)  # [rank, step]: pairs computed
    for r in range(RING):
        for i in range(RING):
            done, _ = step_pairs(r, i, layout)
            count += done
            work[layout][r, i] = int(done.sum())
    assert torch.equal(count, causal.long())  # every visible pair once, no hidden pair
print(f"\nring step i: rank r holds the keys and values of rank (r - i) mod {RING}")
for i in range(RING):
    print(f"  step {i}: " + ", ".join(f"rank {r} ← {(r - i) % RING}" for r in range(RING)))
print(f"\npairs computed [rank × step] (the causal triangle has {int(causal.sum())}; "
      f"{int(causal.sum()) // RING} per rank if balanced)")  # fmt: skip
for layout, w in work.items():
    slowest = int(w.max(0).sum())  # each step waits for the busiest rank
    print(f"{layout:>10}: per rank {w.sum(1).tolist()}, per step max {w.max(0).tolist()} "
          f"→ the ring's time ∝ {slowest}")  # fmt: skip
speedup = work["contiguous"].max(0).sum() / work["zigzag"].max(0).sum()
print(f"zigzag finishes the ring {speedup:.2f}× sooner")

# %% [markdown]
# Every visible pair is computed exactly once over all ranks and steps, none of the hidden ones
# (the `assert`). With the contiguous layout rank 0 computes only its own causal square and rank
# 3 the most; with zigzag every rank computes the same number of pairs at every step: a causal
# square at step 0, then either its two query chunks against the visitor's early chunk
# (the visitor comes from a lower rank) or its late chunk against both of the visitor's.

# %%
fig = Figure(figsize=(12, 4.2))
axes = fig.subplots(1, 3, width_ratios=[1.3, 1, 1])
strip = np.zeros((2, T, 3))
for row, layout in enumerate(("contiguous", "zigzag")):
    for r in range(RING):
        where = sequence_positions(T, rank=r, world_size=RING, layout=layout).numpy()
        strip[row, where] = RANK_COLORS[r]
        for x in where:
            axes[0].text(x, row, str(r), ha="center", va="center", color="white", fontsize=9)
axes[0].imshow(strip, aspect="auto", interpolation="none")
for x in np.arange(0.5, T - 1):
    axes[0].axvline(x, color="white", lw=0.5)
axes[0].axhline(0.5, color="white", lw=4)
axes[0].set(yticks=[0, 1], yticklabels=["contiguous", "zigzag"], xlabel="position in the sequence",
            title=f"which rank holds each token ({RING} ranks)")  # fmt: skip
axes[0].set_xticks(range(0, T, 2))
for ax, layout in zip(axes[1:], ("contiguous", "zigzag"), strict=True):
    w = work[layout]
    bottom = np.zeros(RING)
    for i in range(RING):
        ax.bar(range(RING), w[:, i], bottom=bottom, color=str(0.2 + 0.2 * i), label=f"step {i}")
        bottom += w[:, i]
    ax.axhline(causal.sum() / RING, color="k", ls=":", lw=1, label="balanced")
    ax.set(xlabel="rank", ylabel="(query, key) pairs computed", ylim=(0, work["contiguous"].sum(1).max() * 1.1),
           title=f"{layout}: ring time ∝\n{'+'.join(map(str, w.max(0)))} = {w.max(0).sum()}")  # fmt: skip
    ax.set_xticks(range(RING))
axes[2].legend(fontsize=8)
fig.tight_layout()
Plot(fig, {f"work_{k}": v for k, v in work.items()})

# %% [markdown]
# The zigzag ring, step by step. Each panel is the $T \times T$ causal score matrix in global
# positions (light grey: the visible pairs). At step $i$ rank $r$ (row) holds the key/value block
# of rank $s(r, i)$: the pale band is that block against $r$'s queries — what the rank *could*
# compute — and the solid cells are what it does compute (`ring_pieces`): the causal square of its
# own block at step 0, afterwards always $2c^2$ pairs, $c = T/2C$ the length of a chunk.

# %%
fig = Figure(figsize=(2.6 * RING, 2.6 * RING + 0.4))
axes = fig.subplots(RING, RING)
for r in range(RING):
    q_pos = sequence_positions(T, rank=r, world_size=RING, layout="zigzag")
    for i in range(RING):
        done, source = step_pairs(r, i, "zigzag")
        k_pos = sequence_positions(T, rank=source, world_size=RING, layout="zigzag")
        img = np.ones((T, T, 3))
        img[causal.numpy()] = 0.88
        band = np.zeros((T, T), dtype=bool)
        band[np.ix_(q_pos.numpy(), k_pos.numpy())] = True
        img[band] = 0.65 + 0.35 * RANK_COLORS[source]  # the visiting block, pale
        img[done.numpy()] = RANK_COLORS[r]
        ax = axes[r, i]
        ax.imshow(img, interpolation="nearest")
        for x in np.arange(T // (2 * RING), T, T // (2 * RING)) - 0.5:  # the 2C chunks
            ax.axhline(x, color="white", lw=0.5)
            ax.axvline(x, color="white", lw=0.5)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"rank {r} ← K/V of rank {source}: {int(done.sum())}", fontsize=9)
        if r == RING - 1:
            ax.set_xlabel(f"step {i}: keys")
        if i == 0:
            ax.set_ylabel("queries")
fig.suptitle(f"Zigzag ring attention, {RING} ranks, T = {T}: the pairs each rank computes per "
             "step (solid) within the visiting key/value block (pale)")  # fmt: skip
fig.tight_layout(rect=(0, 0, 1, 0.97))
Plot(fig, {"work": work["zigzag"]})

# %% [markdown]
# ## 3 · Two processes, the same loss
#
# Now the real thing: `attnlab train lm` on a small text, once in one process, once under
# `torchrun --nproc_per_node 2` with `--tensor-parallel 2`, once with `--context-parallel 2`
# (zigzag). Both runs use gloo on the CPU, and their two processes form a
# (data, context, tensor) mesh of $1 \times 1 \times 2$ and $1 \times 2 \times 1$: no data
# parallelism, so every optimizer step sees the same global batch as the one process, and the
# same seed builds the same initial weights. What may differ is only the order in which float32
# numbers are added (the all-reduces, the ring's merges): the losses should agree to within a
# few units of float32 rounding, $\approx 2.4 \times 10^{-7}$ at a loss of 3.
#
# The two `torchrun` launches run at the same time (most of their time is starting Python and
# importing torch in three processes each); meanwhile the one-process run trains here, through
# `attnlab.tasks.train` — the function the command line calls — with the same options. At the
# small size (`FULL = False`) those six start-ups would be nearly all of the work, so each pair of
# workers is instead forked from this kernel, which has imported torch and attnlab already: each
# worker gets the environment `torchrun` gives its workers (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
# `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, one thread) and runs the same command line,
# `attnlab.cli.main` — what `torchrun`'s agent starts once its rendezvous is done. Only the agent
# is left out; the two processes, their gloo group and what they compute are the same.

# %%
TEXT = "to be or not to be, that is the question: whether 'tis nobler in the mind to suffer\n"
work_dir = Path(tempfile.mkdtemp(prefix="attnlab-nb15-"))
data = work_dir / "input.txt"
data.write_text(TEXT * 30, encoding="utf-8")
OPTIONS = dict(steps=STEPS, seed=3, dropout=0.0, warmup=1, lr=1e-2, eval_iters=1, **MODEL)
LM = ["train", "lm", "--data", str(data)]
for key, value in OPTIONS.items():
    LM += [f"--{key.replace('_', '-')}", str(value)]
source_root = str(Path(al.__file__).resolve().parents[1])  # so the workers import this attnlab
env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
       "PYTHONPATH": os.pathsep.join([source_root, os.environ.get("PYTHONPATH", "")])}  # fmt: skip
print("attnlab " + " ".join(LM).replace(str(work_dir), "$TMP"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(name: str, *options: str) -> subprocess.Popen:
    """Start ``torchrun --nproc_per_node 2 -m attnlab train lm ... OPTIONS --out TMP/NAME``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
           "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           "-m", "attnlab", *LM, *options, "--out", str(work_dir / name)]  # fmt: skip
    print(f"torchrun --nproc_per_node 2 -m attnlab train lm … {' '.join(options)}")
    with open(work_dir / f"{name}.log", "w") as log:  # the process keeps its own handle
        return subprocess.Popen(  # its own session: a kill reaches the agent and its workers
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


class Workers:
    """The two workers ``torchrun`` would start, forked from this kernel (the small size)."""

    def __init__(self, name: str, *options: str) -> None:
        argv, port = [*LM, *options, "--out", str(work_dir / name)], str(free_port())
        print(f"2 workers, as torchrun starts them: attnlab train lm … {' '.join(options)}")
        (work_dir / f"{name}.log").write_text("")  # both ranks append to it

        def worker(rank: int) -> None:
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                              LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                              OMP_NUM_THREADS="1")  # fmt: skip
            torch.set_num_threads(1)
            # no notebook here (rich would send its output to this kernel's page): plain text
            # in a log file, as a torchrun worker writes
            builtins.__dict__.pop("get_ipython", None)
            log = open(work_dir / f"{name}.log", "a", buffering=1)  # open until the exit
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            sys.stdout = sys.stderr = log
            sys.exit(cli.main(argv))

        fork = multiprocessing.get_context("fork")
        self.ranks = [fork.Process(target=worker, args=(rank,)) for rank in range(2)]
        for process in self.ranks:
            process.start()

    def wait(self, timeout: float) -> int:
        end = time.monotonic() + timeout
        for process in self.ranks:
            process.join(max(0.0, end - time.monotonic()))
        if any(p.exitcode is None for p in self.ranks):
            raise subprocess.TimeoutExpired("the forked workers", timeout)
        return max(abs(p.exitcode or 0) for p in self.ranks)

    def kill(self) -> None:
        for process in self.ranks:
            if process.exitcode is None:
                process.kill()


def launch(name: str, *options: str) -> subprocess.Popen | Workers:
    return torchrun(name, *options) if FULL else Workers(name, *options)


def train_lines(name: str) -> list[dict]:
    lines = (work_dir / name / "metrics.jsonl").read_text().splitlines()
    return [x for x in map(json.loads, lines) if x["kind"] == "train"]


start = time.perf_counter()
launched = {
    "tensor-parallel": ("tensor", launch("tensor", "--tensor-parallel", "2")),
    "context-parallel": ("context", launch("context", "--context-parallel", "2")),
}
torch.set_num_threads(1)
one = LMOptions(data=str(data), out=work_dir / "one", **OPTIONS)
tasks.train(one, progress=False, report=None)
print(f"one process: {time.perf_counter() - start:.1f} s")
runs = {"one process": train_lines("one")}
for label, (name, proc) in launched.items():
    try:
        code = proc.wait(timeout=300)
    finally:
        if isinstance(proc, Workers):
            proc.kill()
        elif proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the agent and its workers
    if code:
        raise RuntimeError(f"{label} failed:\n{(work_dir / f'{name}.log').read_text()[-3000:]}")
    runs[label] = train_lines(name)
    print(f"{label}: {time.perf_counter() - start:.1f} s")
shutil.rmtree(work_dir)  # the runs' folders: their metrics are read

# %%
loss = {k: np.array([x["loss"] for x in v]) for k, v in runs.items()}
norm = {k: np.array([x["grad_norm"] for x in v]) for k, v in runs.items()}
tokens = {k: [x["tokens"] for x in v] for k, v in runs.items()}
ref = loss["one process"]
print(f"{'step':>4} {'one process':>12} {'tensor-par.':>12} {'context-par.':>12}")
for s in range(STEPS):
    print(f"{s + 1:4d} " + " ".join(f"{loss[k][s]:12.7f}" for k in runs))
delta = {k: np.abs(loss[k] - ref) for k in ("tensor-parallel", "context-parallel")}
for k in delta:
    rel_norm = np.abs(norm[k] / norm["one process"] - 1).max()
    assert tokens[k] == tokens["one process"]  # the same global batch at every step
    print(f"{k}: max |Δloss| {delta[k].max():.2e}, max relative Δ grad norm {rel_norm:.1e}")
print(f"two processes vs one: tensor-parallel max |Δloss| {delta['tensor-parallel'].max():.2e}, "
      f"context-parallel {delta['context-parallel'].max():.2e}")  # fmt: skip
assert ref[-1] < ref[0]  # it trains
assert all((d / ref).max() < 1e-5 for d in delta.values())  # as tests/distributed/test_mesh.py

# %%
fig = Figure(figsize=(11, 4))
ax1, ax2 = fig.subplots(1, 2)
steps = np.arange(1, STEPS + 1)
ax1.plot(steps, ref, "k-", lw=3, alpha=0.3, label="one process")
ax1.plot(steps, loss["tensor-parallel"], "o", color="C0", label="2 processes, tensor-parallel")
ax1.plot(
    steps, loss["context-parallel"], "x", color="C1", ms=9, label="2 processes, context-parallel"
)
ax1.set(xlabel="optimizer step", ylabel="training loss", title="attnlab train lm: loss per step")
ax1.legend()
ulp = np.spacing(ref.astype(np.float32))  # the gap between float32 numbers at each loss
width = 0.38
for off, (k, c) in zip(
    (-width / 2, width / 2), (("tensor-parallel", "C0"), ("context-parallel", "C1")), strict=True
):
    ax2.bar(steps + off, delta[k] / ulp, width, color=c, label=k)
ax2.set(xlabel="optimizer step", ylabel="|Δloss| / float32 spacing at the loss",
        title="two processes − one process")  # fmt: skip
ax2.set_ylim(0, 1.4 * max(1.0, *((d / ulp).max() for d in delta.values())))
ax2.legend(loc="upper left", ncol=2)
fig.tight_layout()
Plot(fig, {"loss_" + k.replace(" ", "_"): v for k, v in loss.items()})

# %% [markdown]
# **What we saw.** Tensor parallelism splits every attention layer by heads and every MLP by
# hidden units: the column-parallel `c_attn`, `c_gate`, `c_fc` by rows of the stored weight
# (`c_attn`'s rows re-laid out first so each rank's query, key and value heads are one block), the
# row-parallel `c_proj`s by columns, and the all-reduce sits where a row-parallel output becomes
# whole. Context parallelism splits the sequence; in the zigzag layout each rank's early and late
# chunk make every step of the causal ring the same work (with 4 ranks and 16 tokens: 10 pairs at
# step 0 and 8 at each later step on every rank, against up to 16 per step contiguous, so the
# ring ends 1.7× sooner), and the exact log-sum-exp merge makes the result that of one process.
# Two processes (started by `torchrun` at full size, forked as it starts them at the small size)
# trained with the one process's losses: at the small size the tensor-parallel run matched to the last bit at five of six steps and by one float32 spacing
# ($2.4 \times 10^{-7}$) at the other; the context-parallel loss — the ranks' halves of the
# sequence summed — by half a spacing at every step.
#
# **Further:** both compose: `torchrun --nproc_per_node 4 -m attnlab train lm ...
# --context-parallel 2 --tensor-parallel 2` runs a $1 \times 2 \times 2$ mesh, and more processes
# add data parallelism on top (`tests/distributed/test_mesh.py` resumes a one-process checkpoint
# that way). `--parallel fsdp` shards parameters, gradients and optimizer state instead (FSDP2).
# `attnlab.distributed.ring_attention` is the ring on its own, for any tensors spread over a
# process group.
#
# **Next:** [notebook 16](16_heads_as_low_rank_relations.ipynb) looks inside a single head: its
# $W^Q_h W^{K\top}_h$ and $W^V_h W^O_h$ as low-rank maps between tokens.
