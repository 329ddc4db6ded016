# %% [markdown]
# # 13 · Where tokens are: positional encodings
#
# Attention by itself does not know the order of its inputs: permute the keys and values
# together and every output stays the same, since $\mathrm{softmax}(q K^\top) V$ is a sum over the
# keys. Word order has to be put in from outside. Four ways are in use, and attnlab implements all
# of them (`attnlab.nn.positional`):
#
# | | where | what the model gets | used by |
# |---|---|---|---|
# | **sinusoidal** | added to the embeddings | a fixed table $\mathrm{PE}[pos]$ | the Transformer (Vaswani et al. 2017) |
# | **learned** | added to the embeddings | a trained table $W_p[pos]$ | BERT, GPT-2 (`wpe`) |
# | **rotary (RoPE)** | turns $q$ and $k$ | the angle $pos \cdot \theta_i$ | GPT-J, Llama, Mistral, Qwen (Su et al. 2021) |
# | **ALiBi** | added to the scores | the bias $-m_h\,(i - j)$ | BLOOM, MPT (Press et al. 2021) |
#
# For each we check the property that makes it work, with the library's own code, and then train
# three small causal language models that differ **only** in their positions, at one length $L$,
# and read them at $L$, $2L$, $4L$ and $8L$ tokens: Press et al.'s question, *train short, test
# long*.

# %%
FULL = False  # True: wider models trained 4x longer (a few minutes on 2 CPUs)

SEED = 0
L = 32  # the training length: sequences of L characters
EVAL = (L, 2 * L, 4 * L, 8 * L)  # the lengths the models are read at
LONGEST = EVAL[-1]
D, LAYERS, HEADS = 64, 2, 4  # model width, layers, heads (d_head = 16)
BATCH, LR, WARMUP = 32, 5e-3, 50
if FULL:
    D, STEPS = 128, 800
else:
    STEPS = 200
WINDOWS = 32  # validation windows of 8L characters: the same 8192 characters at every length

# %%
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

import attnlab as al
from attnlab.data.text import LMBatchSource
from attnlab.nn.positional import sinusoidal_table
from attnlab.tasks.lm import load_corpus
from attnlab.viz import Plot

torch.manual_seed(SEED)
torch.set_printoptions(precision=4, sci_mode=False)
START = time.perf_counter()

# %% [markdown]
# ## 1 · Sinusoidal: a fixed table
#
# Vaswani et al. (§3.5) add to the embedding of the token at position $pos$ the vector
#
# $$\mathrm{PE}(pos, 2i) = \sin(\omega_i\, pos), \qquad \mathrm{PE}(pos, 2i+1) = \cos(\omega_i\,
# pos), \qquad \omega_i = 10000^{-2i/d},$$
#
# a sine and a cosine for each of $d/2$ frequencies, from one turn every $2\pi$ positions
# ($i = 0$) to one every $2\pi \cdot 10000$. `sinusoidal_table(max_len, d)` builds it.

# %%
pe = sinusoidal_table(4 * L, D).double()  # (positions, d): float32 numbers, checked in float64
omega = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (d/2,)
pos = torch.arange(4 * L, dtype=torch.float64)[:, None]
assert torch.allclose(pe[:, 0::2], torch.sin(pos * omega), atol=1e-7)  # the equation, by hand
assert torch.allclose(pe[:, 1::2], torch.cos(pos * omega), atol=1e-7)
print(f"table {tuple(pe.shape)}; wavelengths 2π/ω_i from {2 * math.pi / omega[0]:.2f} "
      f"to {2 * math.pi / omega[-1]:.0f} positions")  # fmt: skip

# %% [markdown]
# Each pair of columns is a point going round a circle at its own speed; moving by $k$ positions
# turns every pair by the angle $\omega_i k$, whatever $pos$:
#
# $$\begin{pmatrix} \sin \omega_i(pos + k) \\ \cos \omega_i(pos + k) \end{pmatrix}
# = \begin{pmatrix} \cos \omega_i k & \sin \omega_i k \\ -\sin \omega_i k & \cos \omega_i k
# \end{pmatrix} \begin{pmatrix} \sin \omega_i\, pos \\ \cos \omega_i\, pos \end{pmatrix}.$$
#
# So $\mathrm{PE}(pos + k) = M_k\, \mathrm{PE}(pos)$ with one block-diagonal rotation $M_k$ for
# all positions — a *linear* function, which is what Vaswani et al. hoped would let attention
# "attend by relative positions". We build $M_k$ from the equation and apply it to every row of
# the table:

# %%
for k in (1, 5, 40):
    c, s = torch.cos(omega * k), torch.sin(omega * k)  # (d/2,)
    m_k = torch.zeros(D, D, dtype=torch.float64)
    for i in range(D // 2):  # the 2×2 rotation of pair i
        m_k[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.stack([torch.stack([c[i], s[i]]),
                                                                 torch.stack([-s[i], c[i]])])  # fmt: skip
    moved = pe[:-k] @ m_k.T  # M_k PE(pos), every pos at once
    err = (moved - pe[k:]).abs().max().item()
    print(f"k = {k:2d}: max |M_k PE(pos) − PE(pos + k)| over {len(moved)} positions = {err:.1e}")
    assert err < 1e-6  # float32 rounding of the table's entries

# %% [markdown]
# The same fact makes the dot product of two encodings a function of their distance only:
#
# $$\mathrm{PE}(m) \cdot \mathrm{PE}(n) = \sum_i \sin \omega_i m \sin \omega_i n + \cos \omega_i m
# \cos \omega_i n = \sum_i \cos \omega_i (m - n).$$
#
# The matrix $\mathrm{PE}\,\mathrm{PE}^\top$ has constant diagonals, peaks at $m = n$ (value
# $d/2$) and falls off with $|m - n|$, not monotonically.

# %%
gram = pe @ pe.T  # (4L, 4L)
formula = torch.cos((pos - pos.T)[..., None] * omega).sum(-1)
print(f"max |PE(m)·PE(n) − Σ cos ω_i(m − n)| = {(gram - formula).abs().max():.1e}")
diagonals = [torch.diagonal(gram, k) for k in range(4 * L)]
spread = max((d.max() - d.min()).item() for d in diagonals)
print(f"largest spread along one diagonal: {spread:.1e}; PE(m)·PE(m) = {gram[0, 0]:.2f} = d/2")
assert spread < 1e-5

fig = Figure(figsize=(13, 4))
ax1, ax2, ax3 = fig.subplots(1, 3, width_ratios=[1.25, 1, 1.1])
im = ax1.imshow(pe.T, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
ax1.set(xlabel="position pos", ylabel="dimension", title="the sinusoidal table PE (transposed)")
fig.colorbar(im, ax=ax1)
im = ax2.imshow(gram, cmap="RdBu_r", vmin=-D / 2, vmax=D / 2)
ax2.set(xlabel="position n", ylabel="position m", title="PE(m) · PE(n)")
fig.colorbar(im, ax=ax2)
ax3.plot(gram[0].numpy())
ax3.set(xlabel="distance k", ylabel="PE(pos) · PE(pos + k)", title="dot product vs distance")
fig.tight_layout()
Plot(fig, {"table": pe.numpy(), "gram": gram.numpy()})

# %% [markdown]
# ## 2 · Learned: a table of trained vectors, and its end
#
# GPT-2 learns the table instead: `GPTConfig(positions="learned")` (the default) gives the model
# `transformer.wpe`, a `LearnedPositionalEmbedding` of `n_positions` rows, one trained vector per
# position, added to the token embedding: $h_0 = W_e[x_t] + W_p[t]$. It can learn anything the
# fixed table offers, and more, but only for the rows it has: a position past `n_positions` has
# no vector at all, and a row that training never reached (positions beyond the training length)
# keeps its random initial value.

# %%
corpus = load_corpus("tinyshakespeare")  # packaged with attnlab; characters, 90 % / 10 % split
V = corpus.tokenizer.vocab_size
learned = al.GPT(al.GPTConfig(vocab_size=V, n_positions=L, n_embd=D, n_layer=LAYERS,
                              n_head=HEADS))  # fmt: skip
print("wpe:", learned.transformer.wpe, "-", tuple(learned.transformer.wpe.weight.shape))
try:
    learned(corpus.val[None, : 2 * L])
except ValueError as error:
    print(f"ValueError: {error}")

# %% [markdown]
# The other three have no such table: the sinusoidal one is defined for every position (we give
# it $8L$ rows), rotary embeddings only need $\cos$ and $\sin$ of $pos \cdot \theta_i$, and ALiBi
# needs nothing but the distance.
#
# ## 3 · Rotary (RoPE): the score sees only $m - n$
#
# Su et al. (2021) move the position out of the embeddings and into the scores. Each head turns
# its query at position $m$ and its key at position $n$, pair of dimensions by pair of dimensions,
# by the angles $m\theta_i$ and $n\theta_i$ ($\theta_i = 10000^{-2i/d_\text{head}}$):
#
# $$\tilde q_m = R(m)\, q, \qquad \tilde k_n = R(n)\, k, \qquad
# \tilde q_m^\top \tilde k_n = q^\top R(m)^\top R(n)\, k = q^\top R(n - m)\, k,$$
#
# since rotations compose and $R(m)^\top = R(-m)$. The score depends on the positions only
# through $m - n$. `RotaryEmbedding(d_head)` is the layer a `positions="rope"` model calls on its
# queries and keys. We place one query $q$ and one key $k$ at every pair $(m, n)$,
# $0 \le m, n < 64$, and compare the scores along each diagonal $m - n = \text{const}$.

# %%
d_head = D // HEADS
rotary = al.RotaryEmbedding(d_head, max_len=4 * L)
g = torch.Generator().manual_seed(SEED)
q, k = torch.randn(2, 1, 1, 1, d_head, generator=g, dtype=torch.float64)  # (B, H, T, d_head)
n_pos = 64
at = torch.arange(n_pos)
q_rot = rotary(q.expand(1, 1, n_pos, d_head), at)[0, 0]  # (64, d_head): q placed at m = 0 … 63
k_rot = rotary(k.expand(1, 1, n_pos, d_head), at)[0, 0]  # k placed at n = 0 … 63
scores = q_rot @ k_rot.T  # (m, n)


def diagonal_spread(s: torch.Tensor) -> float:
    """The largest max − min of the scores along one diagonal m − n = const."""
    return max((torch.diagonal(s, o).max() - torch.diagonal(s, o).min()).item()
               for o in range(-len(s) + 1, len(s)))  # fmt: skip


# the equation in float64, for the pairing (x_2i, x_2i+1): RoFormer's, and the library's default
theta = 10000.0 ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
angle = at[:, None].double() * theta  # (64, d_head / 2)


def turn(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[0::2], x[1::2]
    return torch.stack([x1 * angle.cos() - x2 * angle.sin(),
                        x2 * angle.cos() + x1 * angle.sin()], -1).flatten(-2)  # fmt: skip


exact = turn(q[0, 0, 0]) @ turn(k[0, 0, 0]).T
print(f"library vs the equation in float64: max |Δscore| = {(scores - exact).abs().max():.1e}")
print(f"score scale: max |q̃_m·k̃_n| = {scores.abs().max():.2f}")
print(f"spread along the diagonals: library {diagonal_spread(scores):.1e} (its cos/sin tables "
      f"are float32), the equation in float64 {diagonal_spread(exact):.1e}")  # fmt: skip
assert diagonal_spread(exact) < 1e-13 and diagonal_spread(scores) < 1e-5
assert (scores - exact).abs().max() < 1e-5

# %% [markdown]
# Computed in float64 from the equation, every diagonal is constant to $10^{-15}$, rounding
# level; `RotaryEmbedding` stores its $\cos$ and $\sin$ tables in float32 (they are computed in
# float64 and rounded, for speed and to match converted checkpoints), so its scores agree with the
# equation, and along a diagonal, to float32 precision. The left panel shows the scores of all
# $64 \times 64$ placements — lines of one colour parallel to the diagonal; the right one three
# rows of it against $m - n$, which fall on one curve.

# %%
fig = Figure(figsize=(11, 4.2))
ax1, ax2 = fig.subplots(1, 2, width_ratios=[1, 1.2])
lim = scores.abs().max().item()
im = ax1.imshow(scores, cmap="RdBu_r", vmin=-lim, vmax=lim)
ax1.set(xlabel="key position n", ylabel="query position m",
        title="RoPE: score of the same q, k at (m, n)")  # fmt: skip
fig.colorbar(im, ax=ax1)
for m, style in ((10, "o"), (35, "x"), (63, ".")):
    ax2.plot(m - at, scores[m], style, label=f"query at m = {m}", ms=5)
ax2.set(xlabel="m − n", ylabel="score", title="rows of the left panel vs m − n")
ax2.legend()
fig.tight_layout()
Plot(fig, {"scores": scores.numpy()})

# %% [markdown]
# ## 4 · ALiBi: a penalty for distance, one slope per head
#
# Press et al. (2021) add no position to the vectors at all. Head $h$ of $H$ subtracts from the
# score of query $i$ and key $j \le i$ a penalty proportional to their distance,
#
# $$s_{ij} = \frac{q_i^\top k_j}{\sqrt{d_\text{head}}} - m_h\,(i - j), \qquad
# m_h = 2^{-8h/H}, \quad h = 1 \dots H,$$
#
# a geometric sequence of slopes: with 8 heads $\tfrac12, \tfrac14, \dots, \tfrac1{256}$. A steep
# head sees only the last few tokens; a flat one sees far back. The bias is the same matrix at
# any length — it has no table to run out of.

# %%
for h in (4, 8):
    slopes = al.alibi_slopes(h)
    expected = 2.0 ** (-8.0 * torch.arange(1, h + 1) / h)
    print(f"H = {h}: slopes {[round(v, 4) for v in slopes.tolist()]}")
    assert torch.allclose(slopes, expected)
bias = al.alibi_bias(HEADS, 16)  # (H, T, T): −m_h (i − j); positive above the diagonal, masked
causal = al.masks.causal_mask(16)
print(f"bias of head 1, query 5: {bias[0, 5, :6].tolist()}")

fig = Figure(figsize=(13, 3.4))
axes = fig.subplots(1, HEADS)
low = bias.masked_fill(~causal, 0).min().item()
for h, ax in enumerate(axes):
    im = ax.imshow(bias[h].masked_fill(~causal, float("nan")), cmap="magma", vmin=low, vmax=0)
    ax.set(title=f"head {h + 1}: $m = 2^{{-{8 * (h + 1) // HEADS}}}$", xlabel="key j")
axes[0].set_ylabel("query i")
fig.colorbar(im, ax=list(axes))
Plot(fig, {"bias": bias.numpy()})

# %% [markdown]
# ## 5 · Train short, test long
#
# Three causal character-level models on tinyshakespeare, identical but for the positions:
# 2 layers, $d = 64$, 4 heads, trained for `STEPS` steps of AdamW on random windows of
# $L = 32$ characters (the same initial weights where they have the same shapes, and the same
# batches: `LMBatchSource` is a function of the seed and the step).
#
# - **sinusoidal**: a `positions="learned"` GPT whose `wpe` holds the fixed table of §1
#   (frozen). Its entries are of size 1 while GPT-2's embeddings start at 0.02, so, as Vaswani et
#   al. do, the token embeddings are multiplied by $\sqrt{d}$ on the way in;
# - **rope**: `positions="rope"`; **alibi**: `positions="alibi"`.
#
# A learned table cannot be read past its rows (§2); one with $8L$ rows trained at $L$ would run,
# with rows $L \dots 8L-1$ left at their random initial values — we leave it out.
#
# Each is then read on the same 8192 validation characters cut into windows of
# $E = L, 2L, 4L, 8L$,
# scored by the mean next-character loss over every position of the window (Press et al.'s
# measure; $\ln 65 = 4.17$ is a uniform guess).

# %%
train_batches = LMBatchSource(corpus.train, L, BATCH, seed=SEED)
held_out = corpus.val[: WINDOWS * LONGEST + 1]
KINDS = ("sinusoidal", "rope", "alibi")


def make_model(kind: str) -> al.GPT:
    torch.manual_seed(SEED)
    positions = "learned" if kind == "sinusoidal" else kind
    model = al.GPT(al.GPTConfig(vocab_size=V, n_positions=LONGEST, n_embd=D, n_layer=LAYERS,
                                n_head=HEADS, positions=positions))  # fmt: skip
    if kind == "sinusoidal":
        wpe = model.transformer.wpe.weight
        wpe.data.copy_(sinusoidal_table(LONGEST, D))
        wpe.requires_grad_(False)
        model.transformer.wte.register_forward_hook(lambda m, i, out: out * math.sqrt(D))
    return model


def train(model: al.GPT) -> list[float]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.99), weight_decay=0.0)
    losses = []
    for step in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = LR * min(1.0, (step + 1) / WARMUP)
        b = train_batches.batch(step)
        loss = F.cross_entropy(model(b.input_ids).logits.flatten(0, 1), b.targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@torch.inference_mode()
def position_losses(model: al.GPT, length: int) -> torch.Tensor:
    """The loss at each position of the windows of ``length`` characters, averaged over them."""
    model.eval()
    x = held_out[:-1].view(-1, length)  # (windows, length)
    y = held_out[1:].view(-1, length)  # the next characters
    ce = F.cross_entropy(model(x).logits.transpose(1, 2), y, reduction="none")  # (windows, length)
    return ce.mean(0)


models, curves, per_position = {}, {}, {}
for kind in KINDS:
    start = time.perf_counter()
    models[kind] = make_model(kind)
    curves[kind] = train(models[kind])
    per_position[kind] = {e: position_losses(models[kind], e) for e in EVAL}
    print(f"{kind:<10} trained in {time.perf_counter() - start:5.1f} s, "
          f"last 20 steps' loss {np.mean(curves[kind][-20:]):.3f}")  # fmt: skip

# %% [markdown]
# The loss at each length (the mean over every position of the windows):

# %%
loss = {kind: {e: per_position[kind][e].mean().item() for e in EVAL} for kind in KINDS}
print(f"{'':<11}" + "".join(f"{f'E = {e}':>10}" for e in EVAL) + f"{'4L / L':>9}{'8L / L':>9}")
for kind in KINDS:
    row = "".join(f"{loss[kind][e]:10.3f}" for e in EVAL)
    ratios = "".join(f"{loss[kind][e] / loss[kind][L]:9.3f}" for e in (4 * L, 8 * L))
    print(f"{kind:<11}{row}{ratios}")
beyond = {kind: per_position[kind][4 * L][L:].mean().item() for kind in KINDS}
print("windows of 4L, positions L … 4L−1 only (never trained):  " +
      ", ".join(f"{kind} {beyond[kind]:.3f}" for kind in KINDS))  # fmt: skip
a, r, s = (loss[kind] for kind in ("alibi", "rope", "sinusoidal"))
print(f"extrapolation at 4L: alibi {a[4 * L]:.3f}, rope {r[4 * L]:.3f}, "
      f"sinusoidal {s[4 * L]:.3f} (loss at L: alibi {a[L]:.3f}, rope {r[L]:.3f}, "
      f"sinusoidal {s[L]:.3f})")  # fmt: skip
print(f"kernel time so far: {time.perf_counter() - START:.0f} s")
assert a[4 * L] < 1.02 * a[L] and a[4 * L] < min(r[4 * L], s[4 * L])  # ALiBi: flat, and best
assert r[4 * L] > 1.03 * r[L] and s[4 * L] > 1.03 * s[L]  # the others: worse than at L

# %% [markdown]
# At the training length the rotary model is the best (2.22 nats) and ALiBi close (2.30); the
# sinusoidal model lags (2.49 — a fixed table of size 1 dominates the embeddings and 200 steps do
# not make up for it). Past $L$ the order changes. ALiBi's loss does not rise at all: 2.30, 2.30
# and 2.30 at $2L$, $4L$ and $8L$ ($4L/L$ = 1.00). The sinusoidal model loses 0.35 nats at $4L$
# (×1.14); RoPE, still close at $2L$ (2.30), loses 0.29 at $4L$ and 0.51 at $8L$ (×1.23). On the
# positions the models never saw in training alone ($L \dots 4L-1$ of the $4L$ windows) the
# losses are 2.29 (ALiBi), 2.59 (RoPE) and 2.95 (sinusoidal).
#
# Left: the loss against the length read. Right: where it goes wrong — the loss at each position
# of the $8L$ windows (a moving average over 16 positions); the dotted line is the training length.

# %%


def smooth(x: torch.Tensor, n: int = 16) -> np.ndarray:
    return np.convolve(x.numpy(), np.ones(n) / n, mode="valid")


fig = Figure(figsize=(12, 4.4))
ax1, ax2 = fig.subplots(1, 2)
for kind in KINDS:
    ax1.plot(EVAL, [loss[kind][e] for e in EVAL], "o-", label=kind)
    ax2.plot(np.arange(15, LONGEST), smooth(per_position[kind][LONGEST]), label=kind)
ax1.set_xscale("log", base=2)
ax1.minorticks_off()
ax1.set(xticks=EVAL, xticklabels=[f"{e}\n({e // L}L)" for e in EVAL],
        xlabel="evaluation length E", ylabel="mean loss over the window (nats)",
        title=f"trained at L = {L}, read at E")  # fmt: skip
ax1.legend()
ax2.axvline(L, color="gray", ls=":", label="training length L")
ax2.set(xlabel="position in a window of 8L", ylabel="loss (nats, mean over 16 positions)",
        title="loss at each position, E = 8L")  # fmt: skip
ax2.set_ylim(top=ax2.get_ylim()[1] + 0.25)  # room for the legend
ax2.legend(loc="upper left", ncols=4, fontsize="small")
fig.tight_layout()
Plot(fig, {k: per_position[k][LONGEST].numpy() for k in KINDS})

# %% [markdown]
# The sinusoidal model's loss jumps at the first position past $L$; the rotary model's stays
# where it was until about $2L$ and then rises to the sinusoidal level; ALiBi's stays flat across
# all 256 positions. The same curves in stretches of $L$ positions:

# %%
print(f"{'positions':<11}" + "".join(f"{f'{i * L}–{(i + 1) * L - 1}':>9}" for i in range(8)))
for kind in KINDS:
    stretch = per_position[kind][LONGEST].view(8, L).mean(-1)
    print(f"{kind:<11}" + "".join(f"{v:9.3f}" for v in stretch.tolist()))

# %% [markdown]
# **What we saw.** Each encoding does what its equation says — the sinusoidal table moves by one
# rotation $M_k$ (to $10^{-7}$, the table's float32 rounding), rotary scores depend on $m - n$
# only (to $10^{-14}$ in float64, to float32 precision with the library's tables), ALiBi's slopes
# are $2^{-8h/H}$ — and they differ in what happens past the training length. Trained at
# $L = 32$ characters, the ALiBi model reads windows of $2L$, $4L$ and $8L$ at the loss it has at
# $L$; the sinusoidal model is worse from the first position past $L$ on; the rotary model, the
# best at $L$, holds up to about $2L$ and then climbs towards the sinusoidal model's level; the
# learned table cannot be run past its rows at all. This is Press et al.'s Figure 1 at toy scale:
# 3 small models of 200 steps, one seed in this notebook (seeds 1 and 2, run outside it with the
# same set-up, gave the same order: $4L/L$ = 1.002 and 0.998 for ALiBi, 1.13 and 1.11 for RoPE,
# 1.11 and 1.14 for sinusoidal).
#
# **Further:** `RopeScaling("linear" | "llama3")` (`attnlab.nn.rope`) stretches the rotary
# wavelengths so that a trained model reads longer contexts, as Llama 3.1 does; Kazemnejad et al.
# (2023) find that a causal model with *no* positions at all extrapolates better than several of
# these.
#
# **Next:** [notebook 14](14_efficient_attention.ipynb) turns from where tokens are to what
# attention costs: computing it in less time and memory than the $T \times T$ scores take.
