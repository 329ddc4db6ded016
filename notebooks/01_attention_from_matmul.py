# %% [markdown]
# # 1 · Scaled dot-product attention from three matrix products
#
# Attention is three matrix products and a softmax (Vaswani et al. 2017, *Attention Is All You
# Need*, §3.2.1; The Annotated Transformer, "Attention"):
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V$$
#
# In this notebook you will
#
# - compute $Q$, $K$, $V$, the scores, the softmax weights and the output **by hand** for three
#   tokens of width 4, and check that `attnlab.scaled_dot_product_attention` gives the same numbers
#   with each of its backends (`"math"`, `"sdpa"`, `"blockwise"`);
# - see **why the scores are divided by $\sqrt{d_k}$**: without it the softmax saturates as $d_k$
#   grows and its gradient vanishes (the paper's footnote 4), measured for $d_k$ from 4 to 1024.

# %%
FULL = False  # True: 8x the samples and d_k up to 4096 (under a minute)

import math

import torch

import attnlab as al
from attnlab import viz
from attnlab.viz.scaling import (
    softmax_jacobian_norm,
    softmax_scaling_figure,
    softmax_scaling_stats,
)

D_KS = [2**i for i in range(2, 13 if FULL else 11)]  # 4 … 1024 (small) or 4 … 4096 (full)
SAMPLES = 4096 if FULL else 512  # random queries per d_k
NUM_KEYS = 16  # keys each query sees
torch.set_printoptions(precision=3, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## A toy input: 3 tokens of width 4
#
# Each token is a vector of $d_\text{model} = 4$ numbers; stacked they form $x$, shape
# $(T, d_\text{model}) = (3, 4)$. One attention head has three learned matrices
# $W^Q, W^K, W^V \in \mathbb{R}^{d_\text{model} \times d_k}$ (here $d_k = 4$):
#
# $$Q = x W^Q, \qquad K = x W^K, \qquad V = x W^V$$

# %%
tokens = ["the", "cat", "sat"]
T, d_model, d_k = len(tokens), 4, 4
x = torch.randn(T, d_model)  # (T, d_model)
w_q, w_k, w_v = (torch.randn(d_model, d_k) / math.sqrt(d_model) for _ in range(3))

q = x @ w_q  # (T, d_k): what each token is looking for
k = x @ w_k  # (T, d_k): what each token offers to be found by
v = x @ w_v  # (T, d_k): what each token hands over when it is attended to
print("x =\n", x)
print("Q =\n", q)

# %% [markdown]
# ## Scores, weights, output
#
# Every query is compared with every key by a dot product, scaled by $1/\sqrt{d_k}$:
#
# $$S = \frac{Q K^\top}{\sqrt{d_k}} \in \mathbb{R}^{T \times T}, \qquad
#   A_{ij} = \frac{e^{S_{ij}}}{\sum_{j'} e^{S_{ij'}}}, \qquad Z = A V$$
#
# Row $i$ of $A$ says how much token $i$ takes from each token $j$; it sums to 1, so $Z_i$ is a
# weighted average of the values.

# %%
scores = q @ k.T / math.sqrt(d_k)  # (T, T)
weights = torch.softmax(scores, dim=-1)  # (T, T), each row sums to 1
out = weights @ v  # (T, d_k)
print("S =\n", scores)
print("A =\n", weights)
print("row sums of A:", weights.sum(-1))
print("Z =\n", out)
assert torch.allclose(weights.sum(-1), torch.ones(T))

# %% [markdown]
# The same computation, drawn step by step by `viz.step_panel` (it recomputes $S$, $A$, $Z$ in
# float64 from the $Q$, $K$, $V$ we pass):

# %%
panel = viz.step_panel(x, q, k, v, tokens=tokens, title="one head, step by step")
assert abs(panel.data["weights"] - weights.double().numpy()).max() < 1e-6
panel

# %% [markdown]
# ## The same numbers from attnlab
#
# `attnlab.scaled_dot_product_attention` takes per-head tensors shaped
# $(B, H, T, d_k)$ — batch first, then heads — so we add two leading axes of size 1. Its
# `backend` chooses the kernel: `"math"` writes the equation out (the reference), `"sdpa"` calls
# PyTorch's fused kernel, `"blockwise"` is the online-softmax kernel of FlashAttention
# (Dao et al. 2022) in plain PyTorch. `need_weights=True` also returns $A$.

# %%
q4, k4, v4 = q[None, None], k[None, None], v[None, None]  # (B=1, H=1, T, d_k)
ref = al.scaled_dot_product_attention(q4, k4, v4)[0, 0]
diff = (out - ref).abs().max().item()
print(f"max |by hand − attnlab| = {diff:.2e}")
assert diff < 1e-6

for backend in ("math", "sdpa", "blockwise"):
    z, a = al.scaled_dot_product_attention(q4, k4, v4, backend=backend, need_weights=True)
    dz = (out - z[0, 0]).abs().max().item()
    da = (weights - a[0, 0]).abs().max().item()
    print(f"{backend:>9}: max |Δ output| = {dz:.2e}, max |Δ weights| = {da:.2e}")
    assert dz < 1e-6 and da < 1e-6

# %% [markdown]
# ## Why divide by $\sqrt{d_k}$?
#
# If the entries of $q$ and $k$ are independent with mean 0 and variance 1, their dot product
# $q \cdot k = \sum_{i=1}^{d_k} q_i k_i$ has mean 0 and **variance $d_k$** (§3.2.1, footnote 4).
# A quick check at $d_k = 1024$:

# %%
d = 1024
qs, ks = torch.randn(10_000, d), torch.randn(10_000, d)
dots = (qs * ks).sum(-1)
print(f"var(q·k) = {dots.var():.0f}  (d_k = {d});  var(q·k / √d_k) = {(dots / d**0.5).var():.3f}")
assert abs(dots.var().item() / d - 1) < 0.1

# %% [markdown]
# Scores with a spread of $\sqrt{d_k} = 32$ push the softmax onto its largest entry. A saturated
# softmax passes (almost) no gradient back to the scores: its Jacobian is
#
# $$\frac{\partial p}{\partial s} = \operatorname{diag}(p) - p\,p^\top,$$
#
# which is 0 when $p$ is one-hot. `softmax_jacobian_norm` computes its Frobenius norm from $p$ in
# closed form, $\lVert J\rVert_F^2 = \sum_i p_i^2 - 2\sum_i p_i^3 + \left(\sum_i p_i^2\right)^2$;
# first we check it against autograd's Jacobian:

# %%
s = torch.randn(NUM_KEYS, dtype=torch.float64) * 3
jac = torch.autograd.functional.jacobian(lambda t: torch.softmax(t, -1), s)  # (n, n)
by_autograd = torch.linalg.matrix_norm(jac).item()
closed_form = softmax_jacobian_norm(torch.softmax(s, -1)).item()
print(f"‖J‖_F autograd = {by_autograd:.6f}, closed form = {closed_form:.6f}")
assert abs(by_autograd - closed_form) < 1e-12

# %% [markdown]
# Now the measurement: for each $d_k$, random queries meet `NUM_KEYS` random keys (unit-variance
# entries). We record the spread of the scores, the mean largest softmax weight and the mean
# $\lVert \partial p / \partial s \rVert_F$, with the raw scores $q\cdot k$ and with
# $q \cdot k / \sqrt{d_k}$.

# %%
stats = softmax_scaling_stats(D_KS, num_keys=NUM_KEYS, samples=SAMPLES, seed=0)
print(" d_k | max weight: raw  scaled | ‖J‖_F: raw      scaled")
for i, dk in enumerate(stats.d_k):
    print(
        f"{dk:4d} |            {stats.max_weight[0, i]:.3f}  {stats.max_weight[1, i]:.3f}"
        f"  |        {stats.jacobian_norm[0, i]:.2e}  {stats.jacobian_norm[1, i]:.2e}"
    )

# unscaled: the softmax is nearly one-hot and its gradient is a small fraction of the scaled one
assert stats.max_weight[0, -1] > 0.9
assert stats.jacobian_norm[0, -1] < 0.2 * stats.jacobian_norm[1, -1]
# scaled: the same statistics whatever d_k
assert stats.max_weight[1].max() - stats.max_weight[1].min() < 0.05
assert abs(stats.score_std[1] - 1).max() < 0.1

# %%
softmax_scaling_figure(stats)

# %% [markdown]
# Left: the raw scores spread like $\sqrt{d_k}$ (a straight line on log axes), the scaled ones
# stay at 1. Middle: unscaled, the largest weight climbs towards 1 — each query looks at a single
# key. Right: the softmax gradient shrinks with it, so the queries and keys learn slowly; with
# the $1/\sqrt{d_k}$ scale all three curves are flat: the softmax behaves the same at every width.
#
# **Next:** one head compares tokens in one way. [Notebook 2](02_multi_head_attention.ipynb)
# runs several heads side by side and shows what they learn to do differently.
