# %% [markdown]
# # 5 · Flash-style attention, gradient checkpointing and bf16
#
# Exact attention $\operatorname{softmax}(QK^\top/\sqrt d)\,V$ written as three steps materialises
# the $T \times T$ weight matrix: memory grows with $T^2$. FlashAttention (Dao et al. 2022) computes
# the *same numbers* one block of keys at a time with an **online softmax** (Milakov & Gimelshein
# 2018), so nothing of size $T \times T$ ever exists. In this notebook you will
#
# 1. write the online softmax out — the running maximum and running sum over key blocks — and
#    check that it equals exact attention, and see what a softmax taken *per block* gets wrong;
# 2. use attnlab's `backend="blockwise"` (the same algorithm, tiled over queries too), check its
#    outputs and gradients against `math` and `sdpa`, and **measure** the peak memory of each
#    backend as $T$ grows (`attnlab.inspect.memory.peak_memory`: what the operating system
#    actually handed the process);
# 3. trade compute for memory in training with **gradient checkpointing** (Chen et al. 2016):
#    the same loss and gradients, less memory;
# 4. run under **bf16 autocast** and see which dtype each step of attention computes in.

# %%
FULL = False  # True: longer sequences and a bigger model (a few minutes, ~1 GB of memory)

HEADS, D_HEAD = (4, 64) if FULL else (2, 32)  # small heads keep the memory curves quick
MEM_LENS = [512, 1024, 2048, 4096] if FULL else [256, 512, 1024, 2048]
CKPT_LENS = [256, 512, 1024] if FULL else [128, 256, 512]  # training lengths for checkpointing
CKPT_LAYERS = 8 if FULL else 6

# %%
import math

import torch
from matplotlib.figure import Figure
from torch.overrides import TorchFunctionMode

import attnlab as al
from attnlab import viz
from attnlab.inspect import flops
from attnlab.inspect.memory import peak_memory, stabilize_allocator
from attnlab.viz.costs import memory_figure

# before anything big is allocated: freed buffers go back to the OS, so the resident set
# follows the live tensors (see attnlab.inspect.memory)
assert stabilize_allocator()
_ = torch.manual_seed(0)

# %% [markdown]
# ## 1. The online softmax
#
# For one query $q$ and keys split into blocks $K_1, K_2, \dots$, keep three running quantities:
# the maximum score seen so far $m$, the sum of exponentials $\ell$ (relative to $m$) and the
# un-normalised output $o$. For each block $b$ with scores $s_b = q K_b^\top/\sqrt d$:
#
# $$m' = \max\big(m,\ \max_j s_{b,j}\big), \qquad
#   \ell' = e^{m - m'}\,\ell + \sum_j e^{s_{b,j} - m'}, \qquad
#   o' = e^{m - m'}\,o + \sum_j e^{s_{b,j} - m'}\, v_{b,j}$$
#
# and at the end $\text{out} = o / \ell$. When the maximum rises, everything accumulated so far is
# rescaled by $e^{m - m'}$, so the exponentials never overflow and only one block of scores exists
# at any time. Written out for all queries at once (each row has its own $m$, $\ell$, $o$):


# %%
def online_softmax_attention(q, k, v, block):
    """softmax(q kᵀ / √d) v, one block of `block` keys at a time."""
    t_q, d = q.shape
    m = torch.full((t_q, 1), -math.inf, dtype=q.dtype)  # running max, per query row
    l = torch.zeros(t_q, 1, dtype=q.dtype)  # running sum of exponentials  # noqa: E741
    o = torch.zeros(t_q, v.shape[1], dtype=q.dtype)  # running un-normalised output
    for start in range(0, k.shape[0], block):
        s = q @ k[start : start + block].T / math.sqrt(d)  # (T_q, block): one tile of scores
        m_new = torch.maximum(m, s.max(dim=1, keepdim=True).values)
        p = torch.exp(s - m_new)  # (T_q, block), every entry <= 1
        rescale = torch.exp(m - m_new)  # shrinks what was accumulated under the old max
        l = rescale * l + p.sum(dim=1, keepdim=True)  # noqa: E741
        o = rescale * o + p @ v[start : start + block]
        m = m_new
    return o / l


q, k, v = (torch.randn(50, 16, dtype=torch.float64) * 3 for _ in range(3))  # big scores
exact = torch.softmax(q @ k.T / math.sqrt(16), dim=-1) @ v  # the T_q x T_k weights, at once
for block in (1, 7, 16, 50):
    err = (online_softmax_attention(q, k, v, block) - exact).abs().max().item()
    print(f"key blocks of {block:2d}: max |online - exact| = {err:.1e}")
    assert err < 1e-12

# %% [markdown]
# Equal to rounding, for any block size — including one key at a time. FlashAttention adds the
# engineering: tiles sized for on-chip memory, queries tiled too, and a backward pass that
# recomputes each tile's weights from the saved log-sum-exp $m + \log \ell$ instead of storing
# them.
#
# ### Without the running sum: a softmax per block is not attention
#
# A tempting shortcut computes the "flash concept" as: split the keys into blocks, take an
# ordinary softmax over each block, multiply by that block's values, and combine the blocks'
# outputs — here by averaging them (summing would be worse still). Each block is then normalised
# by its *own* sum $\ell_b = \sum_{j \in b} e^{s_j - m_b}$, so every block gets the same total
# weight $1/n_\text{blocks}$, whether it holds the largest score or only tiny ones. Exact
# attention divides every exponential by the *one* sum over all keys. Next to it, attnlab's
# blockwise kernel (`attnlab.nn.backends.blockwise_attention`, its online softmax written in
# PyTorch, `tile_kernel="python"`) with the same key blocks; both against exact attention:


# %%
from attnlab.nn.backends import blockwise_attention
from attnlab.nn.mask_spec import normalize_mask


def per_block_softmax_attention(q, k, v, block):
    """Each key block normalised on its own, the blocks' outputs averaged: NOT attention."""
    outs = []
    for start in range(0, k.shape[0], block):
        s = q @ k[start : start + block].T / math.sqrt(q.shape[1])  # (T_q, block)
        outs.append(torch.softmax(s, dim=1) @ v[start : start + block])  # sums to 1 per block
    return torch.stack(outs).mean(0)


def online(q, k, v, block):  # attnlab's kernel: running max m, running sum l, rescaling
    q4, k4, v4 = (t[None, None] for t in (q, k, v))  # (1, 1, T, d)
    masking = normalize_mask(q4, k4, None, False)
    out, _ = blockwise_attention(
        q4, k4, v4, masking, q.shape[1] ** -0.5, 0.0, False, block_size=block,
        tile_kernel="python",
    )  # fmt: skip
    return out[0, 0]


blocks = [1, 2, 5, 10, 25, 50]
errors = {"per-block softmax": [], "online softmax (attnlab blockwise)": []}
for block in blocks:
    naive_err = (per_block_softmax_attention(q, k, v, block) - exact).abs().max().item()
    online_err = (online(q, k, v, block) - exact).abs().max().item()
    errors["per-block softmax"].append(naive_err)
    errors["online softmax (attnlab blockwise)"].append(online_err)
    print(
        f"key blocks of {block:2d}: max |error| per-block {naive_err:.2f}, online {online_err:.1e}"
    )
q32, k32, v32 = q.float(), k.float(), v.float()
err32 = (online(q32, k32, v32, 7) - exact).abs().max().item()
naive32 = (per_block_softmax_attention(q32, k32, v32, 7) - exact).abs().max().item()
print(f"float32, blocks of 7: online {err32:.1e} (float32 rounding), per-block {naive32:.2f}")
assert max(errors["online softmax (attnlab blockwise)"]) < 1e-12 and err32 < 1e-4
assert max(errors["per-block softmax"][:-1]) > 0.5  # wrong as soon as there are two blocks
assert errors["per-block softmax"][-1] < 1e-12  # one block of all 50 keys is exact attention

fig = Figure(figsize=(5.8, 3.2), layout="constrained")
ax = fig.add_subplot()
for (name, errs), style in zip(errors.items(), ("o-", "s-")):
    ax.plot(blocks, [max(e, 1e-17) for e in errs], style, label=name)
ax.annotate("one block: exact (0, drawn at 1e-17)", (50, 1e-17), (3, 1e-16), fontsize=7,
            arrowprops={"arrowstyle": "->", "lw": 0.6})  # fmt: skip
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("keys per block (T_k = 50)")
ax.set_ylabel("max |out − exact attention|")
ax.set_title("A softmax per block vs the online softmax (float64)", fontsize=10)
ax.legend(fontsize=8)
ax.grid(True, alpha=0.3)
viz.Plot(
    fig,
    {
        "blocks": torch.tensor(blocks).numpy(),
        **{n: torch.tensor(e).numpy() for n, e in errors.items()},
    },
)

# %% [markdown]
# The per-block version is off by 6 to 9 — as large as the values themselves, whose standard
# deviation is 3 here — for every block size except one block holding all 50 keys, where it *is*
# the softmax. The online softmax is
# exact to float64 rounding at every block size (float32 rounding in float32). What fixes it is
# not the maximum alone: subtracting a maximum only keeps $e^{s}$ from overflowing and cancels in
# any one softmax. It is that the online softmax keeps **one** running sum $\ell$ and one
# un-normalised output $o$ for all the keys seen so far, and rescales both by $e^{m - m'}$
# whenever the maximum rises: at the end every exponential has been taken relative to the same,
# global maximum, $\ell$ is the full softmax denominator and $o / \ell$ divides by it once. (The
# per-block results can be repaired after the fact only by keeping each block's $m_b$ and
# $\ell_b$ and weighting block $b$ by $e^{m_b} \ell_b / \sum_c e^{m_c} \ell_c$ — the same
# log-sum-exp bookkeeping, done at the end.)
#
# ## 2. `backend="blockwise"`: same numbers, less memory
#
# attnlab's `blockwise` backend is this algorithm in PyTorch (`attnlab/nn/backends/blockwise.py`):
# query blocks of 64 rows against key blocks, causal tiles above the diagonal skipped, and a
# FlashAttention-style backward. It must agree with the explicit `math` backend and PyTorch's fused
# `sdpa` — outputs and gradients, with and without a causal mask, for grouped-query heads, at a
# length that is not a multiple of the block:


# %%
def attention_and_grads(backend, q, k, v, **kw):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = al.scaled_dot_product_attention(q, k, v, backend=backend, **kw)
    out.backward(torch.ones_like(out))
    return out.detach(), q.grad, k.grad, v.grad


q = torch.randn(2, 8, 333, 32)  # (B, H, T, d_head): 8 query heads
k, v = torch.randn(2, 2, 333, 32), torch.randn(2, 2, 333, 32)  # 2 key/value heads (GQA)
for causal in (False, True):
    ref = attention_and_grads("math", q, k, v, is_causal=causal)
    for backend in ("blockwise", "sdpa"):
        got = attention_and_grads(backend, q, k, v, is_causal=causal)
        errs = [(g - r).abs().max().item() for g, r in zip(got, ref)]
        print(
            f"causal={causal!s:5} {backend:9s} vs math: output {errs[0]:.1e}, "
            f"dQ {errs[1]:.1e}, dK {errs[2]:.1e}, dV {errs[3]:.1e}"
        )
        assert max(errs) < 1e-4

# %% [markdown]
# Now the memory. `peak_memory(fn)` runs `fn` once and returns how far the process's **peak
# resident set** grew (Linux's `VmHWM`, reset through `/proc/self/clear_refs`): every tensor,
# temporary and allocator overhead the operating system had to provide, not an estimate. One
# forward pass of $H$ heads of width $d_h$, for each backend and length (each run once first, so
# that loading kernels is not counted). The dashed line is the calculator's prediction for the
# `math` backend's $B \cdot H \cdot T^2$ weight matrix
# (`attnlab.inspect.flops(...).memory["attention_matrix"]`).

# %%
backends = ("math", "sdpa", "blockwise")
peaks: dict[str, list[int]] = {b: [] for b in backends}
one_layer = al.GPTConfig(n_positions=max(MEM_LENS), n_embd=HEADS * D_HEAD, n_head=HEADS, n_layer=1)
matrix = [flops(one_layer, t).memory["attention_matrix"] for t in MEM_LENS]

with torch.no_grad():
    for t in MEM_LENS:
        q, k, v = (torch.randn(1, HEADS, t, D_HEAD) for _ in range(3))
        for backend in backends:
            run = lambda: al.scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend)  # noqa: E731, B023
            run()  # warm-up
            peaks[backend].append(peak_memory(run))

print(f"{'T':>6s} " + " ".join(f"{b:>10s}" for b in backends) + f" {'T×T matrix':>11s}   (MiB)")
for i, t in enumerate(MEM_LENS):
    row = " ".join(f"{peaks[b][i] / 2**20:10.1f}" for b in backends)
    print(f"{t:6d} {row} {matrix[i] / 2**20:11.1f}")
memory_figure(
    MEM_LENS,
    peaks,
    expected={"math": matrix},
    title=f"Peak memory of one causal forward ({HEADS} heads, d_h = {D_HEAD}, fp32)",
)

# %% [markdown]
# `math` holds the full weight matrix (in fact about two of them: the scores and the softmax
# output exist at once), so it quadruples with every doubling of $T$ and sits above the
# prediction. `blockwise` and `sdpa` (PyTorch's fused flash kernel on CPU) grow only linearly —
# their tiles are a fixed number of rows — and at the longest length use a small fraction of
# `math`'s memory:

# %%
last = len(MEM_LENS) - 1
assert all(p >= m for p, m in zip(peaks["math"], matrix))  # at least one T x T matrix
assert peaks["math"][last] > 3 * peaks["math"][last - 1]  # ~4x per doubling: quadratic
for backend in ("blockwise", "sdpa"):
    ratio = peaks["math"][last] / max(peaks[backend][last], 1)
    print(f"math / {backend} at T = {MEM_LENS[last]}: {ratio:.0f}x")
    assert ratio > 8
assert peaks["blockwise"][last] < 3 * peaks["blockwise"][last - 1]  # ~2x per doubling: linear

# %% [markdown]
# ## 3. Gradient checkpointing
#
# Training needs more than the forward pass: autograd keeps every intermediate a backward step
# will read — for each block the LayerNorm outputs, Q/K/V, the attention weights (with `math`),
# the MLP's hidden layer. Gradient checkpointing (Chen et al. 2016, "Training Deep Nets with
# Sublinear Memory Cost") keeps only each block's **input** and recomputes the block's forward
# inside the backward pass: roughly one more forward of compute, for activation memory of one
# block instead of all of them.
#
# attnlab's `GPT` does it per block with `torch.utils.checkpoint.checkpoint(use_reentrant=False)`,
# switched on by `GPTConfig(gradient_checkpointing=True)` or the attribute
# `model.gradient_checkpointing = True`, and only while training (`model.train()`, gradients
# enabled): evaluation and decoding never pay for it. First, it must not change the result. In
# float64, with dropout (the recomputation replays the same random mask):

# %%
cfg = al.GPTConfig(vocab_size=100, n_positions=64, n_embd=64, n_layer=4, n_head=4, dropout=0.1)
torch.manual_seed(0)
model = al.GPT(cfg).double().train()
ids = torch.randint(0, 100, (4, 64))


def loss_and_grads(model):
    model.zero_grad()
    torch.manual_seed(1)  # the same dropout masks in both runs
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


plain_loss, plain_grads = loss_and_grads(model)
model.gradient_checkpointing = True
ckpt_loss, ckpt_grads = loss_and_grads(model)
grad_diff = max((ckpt_grads[n] - plain_grads[n]).abs().max().item() for n in plain_grads)
print(f"loss {plain_loss:.12f} without, {ckpt_loss:.12f} with checkpointing")
print(f"max |grad difference| over {len(plain_grads)} parameters: {grad_diff:.1e}")
assert abs(ckpt_loss - plain_loss) < 1e-12 and grad_diff < 1e-12
# a checkpointed block really runs twice: once forward, once again inside backward (a pre-hook:
# the recomputation stops as soon as it has rebuilt what backward needs, before the block returns)
calls = []
hook = model.transformer.h[0].register_forward_pre_hook(lambda *a: calls.append(1))
model(ids, labels=ids).loss.backward()
model.eval()
with torch.no_grad():
    model(ids)  # evaluation: no checkpointing, one call
hook.remove()
print(f"block 0 ran {len(calls) - 1} times in a training step, once in evaluation")
assert len(calls) == 3

# %% [markdown]
# Now the memory saved: peak memory of one training step (forward + backward) of a GPT using the
# explicit `math` attention, with and without checkpointing, as the sequence grows.

# %%
cfg = al.GPTConfig(
    vocab_size=256, n_positions=max(CKPT_LENS), n_embd=128, n_layer=CKPT_LAYERS, n_head=4,
    backend="math",
)  # fmt: skip
torch.manual_seed(0)
gpt = al.GPT(cfg).train()
step_peaks: dict[str, list[int]] = {"off": [], "on": []}
for t in CKPT_LENS:
    batch = torch.randint(0, 256, (2, t))

    def step(batch=batch):
        gpt.zero_grad(set_to_none=True)
        gpt(batch, labels=batch).loss.backward()

    for mode in ("off", "on"):
        gpt.gradient_checkpointing = mode == "on"
        step()  # warm-up
        step_peaks[mode].append(peak_memory(step))
for i, t in enumerate(CKPT_LENS):
    off, on = step_peaks["off"][i] / 2**20, step_peaks["on"][i] / 2**20
    print(
        f"T = {t:4d}: {off:6.1f} MiB without, {on:6.1f} MiB with checkpointing ({1 - on / off:.0%} saved)"
    )
assert step_peaks["on"][-1] < 0.6 * step_peaks["off"][-1]
memory_figure(
    CKPT_LENS,
    step_peaks,
    title=f"Peak memory of a training step ({CKPT_LAYERS}-block GPT, batch 2, math attention)",
    legend_title="gradient checkpointing",
)

# %% [markdown]
# Without checkpointing every block's activations are alive at the end of the forward pass; with
# it only the block inputs are, plus one block's recomputed activations during its backward.
# The saving grows with depth and with $T$ (the stored attention weights are $T^2$). It costs about
# one extra forward pass of time; the `sdpa` and `blockwise` backends already avoid storing the
# weights, so there the saving is the rest of each block's activations.
#
# ## 4. bf16 autocast
#
# Under `torch.autocast("cpu", dtype=torch.bfloat16)`, PyTorch runs matrix multiplications in
# bfloat16 (8 bits of mantissa instead of 23) and keeps precision-sensitive operations — the loss
# — in float32. Parameters stay float32. The loss should move by much less than training noise:

# %%
cfg = al.GPTConfig(vocab_size=256, n_positions=128, n_embd=128, n_layer=4, n_head=4)
torch.manual_seed(0)
gpt = al.GPT(cfg).eval()
ids = torch.randint(0, 256, (4, 128))
with torch.no_grad():
    ref = gpt(ids, labels=ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = gpt(ids, labels=ids)
rel = abs(low.loss.item() - ref.loss.item()) / ref.loss.item()
prob_diff = (low.logits.float().softmax(-1) - ref.logits.softmax(-1)).abs().max().item()
print(f"loss fp32 {ref.loss.item():.5f}, bf16 autocast {low.loss.item():.5f} (relative {rel:.1e})")
print(
    f"logits dtype {low.logits.dtype}, loss dtype {low.loss.dtype}; max |Δ probability| {prob_diff:.1e}"
)
assert low.logits.dtype == torch.bfloat16 and low.loss.dtype == torch.float32
assert rel < 0.01 and prob_diff < 0.01

# %% [markdown]
# Which dtype does **attention** compute in? A `TorchFunctionMode` (PyTorch's public hook on
# every torch function call) records each matrix product, softmax and exponential inside one
# attention call, with the dtypes going in and coming out, for each backend:


# %%
class DtypeLog(TorchFunctionMode):
    """Records (op, input dtypes, output dtype) of the ops that make up attention."""

    OPS = ("matmul", "softmax", "exp", "exp_", "scaled_dot_product_attention")

    def __init__(self):
        super().__init__()
        self.rows = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name in self.OPS and isinstance(out, torch.Tensor):
            ins = tuple(
                str(a.dtype).removeprefix("torch.") for a in args if isinstance(a, torch.Tensor)
            )
            row = (name, ins, str(out.dtype).removeprefix("torch."))
            if row not in self.rows:
                self.rows.append(row)
        return out


layer = gpt.transformer.h[0].attn
x = torch.randn(1, 100, 128)
out_dtypes = {}
for backend in ("math", "blockwise", "sdpa"):
    layer.backend = backend
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), DtypeLog() as log:
        out = layer(x)
    out_dtypes[backend] = out.dtype
    print(f"{backend}: output {out.dtype}")
    for name, ins, result in log.rows:
        print(f"    {name:30s} {' x '.join(ins):20s} -> {result}")
    if backend == "math":  # the scores and their softmax are float32, though autocast is on
        assert ("softmax", ("float32",), "float32") in log.rows, log.rows
layer.backend = cfg.backend
assert all(dt == torch.bfloat16 for dt in out_dtypes.values())

# %% [markdown]
# What this shows: the projections (`c_attn`) run in autocast's bfloat16 and hand attention
# **bfloat16** Q, K and V. `sdpa` passes them to PyTorch's fused kernel, which accumulates its dot
# products and softmax statistics in float32 internally and returns bfloat16. The `math` and
# `blockwise` backends upcast Q and K to float32 on purpose (scores and softmax in float32 for
# half types; `blockwise` then multiplies P·V with P rounded to bfloat16, as FlashAttention does,
# and accumulates in float32), and the log shows the score `matmul`, the `softmax` and the `exp`
# coming out **float32**: autocast
# would cast the operands of every `matmul` back down to bfloat16, so attnlab switches autocast off
# inside attention — under autocast it computes exactly as it does for bfloat16 inputs, and only
# its result goes back to bfloat16.
#
# **Summary.** The online softmax turns attention's $O(T^2)$ memory into $O(T)$ without changing
# a digit that matters; checkpointing does the same trade for the rest of the activations at the
# price of one more forward pass; bf16 autocast halves the bytes of every matmul. The next step
# (notebook 06) puts them to work in training.
#
# **Next:** [notebook 6](06_training.ipynb): training, and attention as it learns.
