# %% [markdown]
# # 3 · Masks: padding, the future, and rows that see nothing
#
# A mask decides which keys each query may look at. The Transformer needs two (Vaswani et al.
# 2017, §3.2.3; The Annotated Transformer, `subsequent_mask`):
#
# - a **padding mask** hides the `<pad>` tokens that fill short sequences up to the batch length;
# - a **look-ahead (causal) mask** stops a decoder position from seeing the tokens after it.
#
# In this notebook you will build both with `attnlab.masks`, combine them, apply them in
# attention, and see the numerical traps: the classic additive $-10^9$ overflows to $-\infty$ in
# float16, and a query row that may see no key at all turns into NaN in a plain softmax. attnlab
# has one convention for all of it: a boolean mask means **`True` = may attend** (as PyTorch's
# `scaled_dot_product_attention`), and a row that sees no key gives **zeros**, never NaN.

# %%
FULL = False  # True: check the fully-masked-row rule on many random masks (seconds)

import torch

import attnlab as al
from attnlab import viz

TRIALS = 200 if FULL else 10  # random masks per backend and dtype in the last check
BACKENDS = ("math", "sdpa", "blockwise")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
torch.set_printoptions(precision=3, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Padding and look-ahead masks
#
# A batch holds sequences of different lengths, padded with `<pad>` (id 0 here).
# `padding_mask(tokens, pad_id)` is `True` where a key is a real token, shaped $(B, 1, 1, T)$ so it
# broadcasts over heads and queries. `causal_mask(T)` is $(T, T)$ with `mask[i, j] = j <= i`.
# `combine` keeps a key only where every mask allows it.

# %%
tokens = "<s> the cat sat <pad> <pad>".split()
vocab = {t: i for i, t in enumerate(dict.fromkeys(["<pad>", *tokens]))}
ids = torch.tensor([[vocab[t] for t in tokens]])  # (B=1, T=6)
T = len(tokens)

pad = al.masks.padding_mask(ids, pad_id=vocab["<pad>"])  # (B, 1, 1, T)
causal = al.masks.causal_mask(T)  # (T, T)
both = al.masks.combine(pad, causal)  # (B, 1, T, T)
print("padding mask", tuple(pad.shape), pad[0, 0, 0].int().tolist())
print("look-ahead mask\n", causal.int())
print("combined", tuple(both.shape), "\n", both[0, 0].int())
assert torch.equal(both[0, 0], pad[0, 0, 0] & causal)

# %%
viz.mask_panel(tokens)

# %% [markdown]
# With fewer queries than keys — one decoding step with a KV cache — attnlab aligns the causal
# mask **bottom-right**: the queries are the *last* $T_q$ positions, and query $i$ sees keys
# $j \le i + (T_k - T_q)$. (PyTorch's `is_causal` aligns top-left.)

# %%
print(al.masks.causal_mask(2, 5).int())
assert al.masks.causal_mask(1, 5).all()  # the newest token sees the whole cache

# %% [markdown]
# ## Masks in attention
#
# Hidden keys get $-\infty$ before the softmax, so they get weight exactly 0:
#
# $$A = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}} + M\right),\qquad
#   M_{ij} = \begin{cases} 0 & \text{may attend} \\ -\infty & \text{hidden} \end{cases}$$
#
# A multi-head layer takes the mask as it is (it broadcasts over the heads):

# %%
mha = al.MultiHeadAttention(8, 2).eval()
x = torch.randn(1, T, 8)
with torch.no_grad():
    out, w = mha(x, mask=both, need_weights=True)  # w: (B, H, T, T)
print("weights of head 0 (zeros where masked):\n", w[0, 0])
assert (w[0, :, :, 4:] == 0).all(), "padding gets no attention"
assert (w[0, :, ~causal] == 0).all(), "the future gets no attention"
viz.attention_heatmap(
    w[0, 0],
    query_tokens=tokens,
    key_tokens=tokens,
    mask=both[0, 0],
    title="masked attention, head 0",
)

# %% [markdown]
# The padding *queries* (rows 4, 5) still attend to the real tokens: the padding mask hides
# keys, not queries. Their outputs are ignored later (the loss skips padding targets).
#
# ## Boolean or additive
#
# A floating mask is added to the scores. `to_additive(mask, dtype)` turns a boolean mask into
# `0` where allowed and the dtype's **finite minimum** where hidden — `finfo(float16).min` is
# $-65504$ — and attnlab treats that value exactly like $-\infty$. Both forms give the same result:

# %%
additive = al.masks.to_additive(both, torch.float32)
print("additive mask, row 2:", [f"{b:.4g}" for b in additive[0, 0, 2].tolist()])
with torch.no_grad():
    out_add = mha(x, mask=additive)
print(f"max |bool − additive| = {(out - out_add).abs().max():.1e}")
assert (out - out_add).abs().max() < 1e-6
for dtype in DTYPES:
    print(f"{dtype!s:>15}: finfo.min = {torch.finfo(dtype).min:.4g}")

# %% [markdown]
# ## The $-10^9$ trap in float16
#
# The Annotated Transformer hides keys with `scores.masked_fill(mask == 0, -1e9)`. In float32
# that is fine. But float16 cannot hold $-10^9$ (its largest magnitude is 65504):

# %%
print("-1e9 as float16:", torch.tensor(-1e9).half().item())
print("-1e9 as bfloat16:", torch.tensor(-1e9).bfloat16().item())
scores16 = torch.randn(3, 4).half()
try:
    scores16.masked_fill(torch.ones(3, 4, dtype=torch.bool), -1e9)
except RuntimeError as err:
    print("masked_fill(…, -1e9) on float16:", err)

# %% [markdown]
# A $-10^9$ bias that reaches float16 (e.g. built in float32 and cast, as mixed precision does) is
# $-\infty$. A row with at least one visible key is still fine — $e^{-\infty} = 0$. But a row
# that may see **no** key is all $-\infty$, and $\mathrm{softmax}$ computes
# $e^{-\infty - (-\infty)} = e^{\text{NaN}}$: the whole row is NaN, and so is every gradient that
# passes through it. Such rows are real: with **left** padding and a causal mask, the first
# position (a pad) may see only itself, which is padding.

# %%
left = torch.tensor([[0, 0, 5, 6, 7, 8]])  # a left-padded sequence
visible = al.masks.combine(al.masks.padding_mask(left, 0), al.masks.causal_mask(6))[0, 0]
print("visible keys per query:", visible.sum(-1).tolist())  # rows 0, 1 see nothing

s = torch.randn(6, 6)
bias_1e9 = torch.zeros(6, 6).masked_fill(~visible, -1e9)  # the classic additive mask, float32
p32 = torch.softmax(s + bias_1e9, -1)
p16 = torch.softmax((s + bias_1e9).half().float(), -1)  # the same scores after a trip to fp16
print("float32, −1e9:  row 0 =", p32[0], " row 2 =", p32[2])
print("float16, −1e9 → −inf:  row 0 =", p16[0], " row 2 =", p16[2])
assert torch.allclose(p32[0], torch.full((6,), 1 / 6))  # float32: uniform over the hidden keys
assert p16[:2].isnan().all() and not p16[2:].isnan().any()  # float16: NaN exactly where empty

# %% [markdown]
# In float32 the empty rows come out *uniform* — the query averages all keys, padding included,
# a silent error rather than a crash. The dtype's minimum avoids the overflow of the constant,
# but in plain float16 arithmetic the sum $s + (-65504)$ still overflows for any score
# $s \lesssim -16$:

# %%
low16 = torch.finfo(torch.float16).min
print(f"float16: -20 + ({low16:.0f}) =", (torch.tensor(-20.0).half() + low16).item())

# %% [markdown]
# ## What attnlab does
#
# attnlab never lets a hidden key or an empty row reach a softmax as $-\infty$:
#
# - a boolean mask, `to_additive`'s minimum and $-\infty$ are all **hidden**: they leave the
#   additive bias and become a boolean "may attend" mask;
# - the scores are accumulated in float32 for float16/bfloat16 inputs (as the fused kernels do);
# - a row that may see no key is found before the kernel runs, computed as if it saw every key
#   and then set to **zero** — output, weights and gradients (`docs/design.md`, "Conventions").
#
# The same left-padded example, in float16, with all three ways of writing the mask and every
# backend:

# %%
q = torch.randn(1, 1, 6, 4)
k = torch.randn(1, 1, 6, 4)
v = torch.randn(1, 1, 6, 4)
masks16 = {
    "bool": visible,
    "to_additive": al.masks.to_additive(visible, torch.float16),
    "-1e9 in float16": torch.zeros(6, 6).masked_fill(~visible, -1e9).half(),  # −inf
}
for backend in BACKENDS:
    for name, m in masks16.items():
        qh, kh, vh = (t.half().requires_grad_() for t in (q, k, v))
        z, a = al.scaled_dot_product_attention(qh, kh, vh, m, backend=backend, need_weights=True)
        z.float().sum().backward()
        grads = torch.cat([t.grad.flatten() for t in (qh, kh, vh)])
        print(
            f"{backend:>9} {name:>16}: output rows 0-1 = {z[0, 0, :2].abs().max().item()},"
            f" weights rows 0-1 = {a[0, 0, :2].abs().max().item()},"
            f" NaN anywhere: {bool(z.isnan().any() or a.isnan().any() or grads.isnan().any())}"
        )
        assert (z[0, 0, :2] == 0).all() and (a[0, 0, :2] == 0).all()
        assert (qh.grad[0, 0, :2] == 0).all()  # an empty row passes no gradient back
        assert not (z.isnan().any() or a.isnan().any() or grads.isnan().any())
        assert torch.allclose(a[0, 0, 2:].float().sum(-1), torch.ones(4), atol=1e-2)

# %% [markdown]
# The weights, drawn with the mask (grey = hidden): rows 0 and 1 are entirely grey and their
# weights are zero.

# %%
_, a = al.scaled_dot_product_attention(q, k, v, visible, need_weights=True)
assert (a[0, 0, :2] == 0).all()
left_tokens = ["<pad>", "<pad>", "I", "like", "green", "tea"]
viz.attention_heatmap(
    a[0, 0],
    query_tokens=left_tokens,
    key_tokens=left_tokens,
    mask=visible,
    title="left padding + causal: rows 0-1 see no key",
)

# %% [markdown]
# A finite bias is a bias, though: in float32, $-10^9$ is a (very negative) number, not a hidden
# key — attnlab adds it like any other bias (ALiBi's slopes, relative positions). A row made only
# of $-10^9$ is the softmax of the scores themselves, since adding one constant to a whole row
# changes no weight. Plain float32 arithmetic would lose the scores ($s - 10^9$ rounds to
# $-10^9$) and give equal weights; attnlab moves each row's largest bias to 0 before adding, so the
# weights are those of the float64 equation. Write masks as booleans (or with `to_additive`) and
# the meaning does not depend on the dtype:

# %%
z32, a32 = al.scaled_dot_product_attention(q, k, v, bias_1e9, need_weights=True)
_, a_free = al.scaled_dot_product_attention(q, k, v, need_weights=True)  # no mask at all
print("float32 −1e9 bias, weights row 0:", a32[0, 0, 0])
print("no mask,           weights row 0:", a_free[0, 0, 0])
print(
    "plain float32 (s − 1e9) softmax: ",
    torch.softmax((q @ k.transpose(-2, -1))[0, 0, 0] / 2 - 1e9, -1),
)
assert torch.allclose(a32[0, 0, 0], a_free[0, 0, 0], atol=1e-6)
z_bool = al.scaled_dot_product_attention(q, k, v, visible)
assert torch.allclose(z32[0, 0, 2:], z_bool[0, 0, 2:], atol=1e-6)  # rows with a key: the same

# %% [markdown]
# Finally the rule on random masks, every backend and dtype: rows that see no key are zero, the
# others agree with a float64 softmax over the visible keys.

# %%
gen = torch.Generator().manual_seed(1)
worst = {}
for dtype in DTYPES:
    for backend in BACKENDS:
        err = 0.0
        for _ in range(TRIALS):
            q, k, v = (torch.randn(2, 2, 7, 8, generator=gen) for _ in range(3))
            allowed = torch.rand(2, 1, 7, 7, generator=gen) < 0.3  # many rows see nothing
            empty = ~allowed.any(-1)  # (2, 1, 7)
            s = (q.double() @ k.double().transpose(-2, -1)) / 8**0.5
            ref = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
            ref = ref @ v.double()
            z = al.scaled_dot_product_attention(
                q.to(dtype), k.to(dtype), v.to(dtype), allowed, backend=backend
            )
            assert not z.isnan().any()
            assert (z.transpose(1, 2)[empty.expand(2, 2, 7).transpose(1, 2)] == 0).all()
            err = max(err, (z.double() - ref).abs().max().item())
        worst[(str(dtype), backend)] = err
        print(f"{dtype!s:>15} {backend:>9}: max |attnlab − float64| = {err:.1e}")
        assert err < {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]

# %% [markdown]
# **Next:** with attention, heads and masks in place, [notebook 4](04_gpt2_attention.ipynb) meets
# them in GPT-2, and the notebooks after it train the encoder-decoder Transformer.
