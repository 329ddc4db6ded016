# %% [markdown]
# # 4 · GPT-2's attention
#
# GPT-2 (Radford et al. 2019, *Language Models are Unsupervised Multitask Learners*) is a stack of
# pre-norm decoder blocks whose attention differs from the encoder-decoder's in a few concrete
# ways. nanoGPT's `model.py` (Karpathy) writes them in ~300 lines; attnlab's `GPT` keeps GPT-2's
# parameter names, so that Hugging Face weights map one to one. In this notebook you will
#
# 1. see that the **fused `c_attn` projection** (one matmul for Q, K and V) equals three separate
#    projections, and rebuild one attention layer by hand with its **causal mask**;
# 2. measure GPT-2's **weight initialisation** (std 0.02, residual projections scaled by
#    $1/\sqrt{2\,n_\text{layer}}$) in attnlab's parameters, and watch the residual stream grow
#    with depth without the scaling;
# 3. load **Hugging Face GPT-2 weights** from a local folder and get the same logits;
# 4. shrink the **KV cache** with grouped-query (GQA, Ainslie et al. 2023) and multi-query
#    attention (MQA, Shazeer 2019), and measure its bytes against the calculator's formula.

# %%
FULL = False  # True: deeper model for the residual stream, longer decoding (about a minute)

DEPTH = 48 if FULL else 24  # blocks of the model whose residual stream we follow
DECODE_LENS = [16, 32, 64, 128, 256] if FULL else [16, 32, 64]  # tokens in the KV cache

# %%
import math
import tempfile

import torch

import attnlab as al
from attnlab import viz
from attnlab.inspect import kv_cache_bytes
from attnlab.viz.costs import memory_figure, residual_growth_figure

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## 1. One matmul for Q, K and V
#
# GPT-2 stores the three projections of a layer side by side in one matrix `c_attn`
# ($d \times 3d$), so one matrix multiplication produces all three, which are then split:
#
# $$[\,Q \;|\; K \;|\; V\,] = x\,W_\text{attn} + b_\text{attn},\qquad
#   W_\text{attn} = [\,W^Q \;|\; W^K \;|\; W^V\,]$$
#
# attnlab's `c_attn` is an `nn.Linear` (weight of shape `(out, in)` = `(3d, d)`), so the three
# blocks are its row slices. Each block alone is an ordinary projection:

# %%
cfg = al.GPTConfig(vocab_size=100, n_positions=64, n_embd=64, n_layer=2, n_head=4)
model = al.GPT(cfg).eval()
attn = model.transformer.h[0].attn  # GPTSelfAttention
d, H, d_head = cfg.n_embd, cfg.n_head, cfg.d_head
print(attn.c_attn)

x = torch.randn(2, 8, d)  # (B, T, d_model): a block's input after ln_1
q, k, v = attn.c_attn(x).split(d, dim=-1)  # fused: one (B, T, 3d) matmul, then split

W, b = attn.c_attn.weight, attn.c_attn.bias  # (3d, d), (3d,)
separate = []
for i in range(3):  # W^Q, W^K, W^V as three separate nn.Linear layers
    proj = torch.nn.Linear(d, d)
    with torch.no_grad():
        proj.weight.copy_(W[i * d : (i + 1) * d])
        proj.bias.copy_(b[i * d : (i + 1) * d])
    separate.append(proj(x))

diff = max((a - s).abs().max().item() for a, s in zip((q, k, v), separate))
print(f"max |fused - separate| over Q, K, V: {diff:.2e}")
assert diff < 1e-6

# %% [markdown]
# Why fuse? One `(B·T, d) @ (d, 3d)` matmul reads `x` once and keeps the matrix unit busy with a
# bigger product than three `(d, d)` ones: the same arithmetic, fewer passes over memory.
#
# ## 2. The causal mask, by hand
#
# A language model predicts token $t+1$ from tokens $\le t$, so query $i$ may only attend to keys
# $j \le i$. The mask adds $-\infty$ above the diagonal before the softmax:
#
# $$\text{head}_h = \operatorname{softmax}\!\Big(\frac{Q_h K_h^\top}{\sqrt{d_h}} + M\Big) V_h,
#   \qquad M_{ij} = \begin{cases} 0 & j \le i \\ -\infty & j > i \end{cases}$$
#
# $$\text{out} = \operatorname{Concat}(\text{head}_1, \dots, \text{head}_H)\, W_\text{proj} + b_\text{proj}$$

# %%
T = x.shape[1]


def heads(t: torch.Tensor) -> torch.Tensor:
    return t.view(2, T, H, d_head).transpose(1, 2)  # (B, T, d) -> (B, H, T, d_head)


scores = heads(q) @ heads(k).transpose(-2, -1) / math.sqrt(d_head)  # (B, H, T, T)
causal = al.masks.causal_mask(T)  # (T, T) bool, True = may attend
scores = scores.masked_fill(~causal, float("-inf"))
weights = scores.softmax(dim=-1)  # (B, H, T, T), zeros above the diagonal
z = (weights @ heads(v)).transpose(1, 2).reshape(2, T, d)  # concat heads: (B, T, d)
by_hand = attn.c_proj(z)

out, w_lib = attn(x, need_weights=True)  # GPTSelfAttention is causal by default
print(f"max |by hand - attnlab| output: {(by_hand - out).abs().max().item():.2e}")
print(f"max |by hand - attnlab| weights: {(weights - w_lib).abs().max().item():.2e}")
assert torch.allclose(by_hand, out, atol=1e-6) and torch.allclose(weights, w_lib, atol=1e-6)
assert (w_lib[..., ~causal] == 0).all()  # nothing above the diagonal

viz.attention_heatmap(
    w_lib[0, 0].detach(), mask=causal, title="layer 0, head 0 (random init): causal weights"
)

# %% [markdown]
# Grey cells are the future: every row sums to 1 over the keys at or before its own position.
# At initialisation the weights are nearly uniform over the visible keys (row $i$ ≈ $1/(i+1)$),
# because the scores of small random weights are all close to 0.
#
# ## 3. Weight initialisation
#
# GPT-2 initialises every linear and embedding weight from $\mathcal N(0, 0.02^2)$, biases at 0,
# and — §2.3 of the paper — "scale[s] the weights of residual layers at initialization by a factor
# of $1/\sqrt{N}$ where $N$ is the number of residual layers". Each block adds **two** branches
# (attention and MLP) to the residual stream, so nanoGPT uses $N = 2\,n_\text{layer}$:
#
# $$W_\text{c\_proj} \sim \mathcal N\!\Big(0, \big(0.02/\sqrt{2\,n_\text{layer}}\big)^2\Big)$$
#
# Measured on attnlab's GPT-2 small (124M parameters, 12 layers):

# %%
torch.manual_seed(0)
gpt2 = al.GPT(al.GPTConfig())  # GPT-2 small
L = gpt2.config.n_layer
groups = {
    "wte (token embedding)": [gpt2.transformer.wte.weight],
    "wpe (position embedding)": [gpt2.transformer.wpe.weight],
    "attn.c_attn": [blk.attn.c_attn.weight for blk in gpt2.transformer.h],
    "mlp.c_fc": [blk.mlp.c_fc.weight for blk in gpt2.transformer.h],
    "attn.c_proj (residual)": [blk.attn.c_proj.weight for blk in gpt2.transformer.h],
    "mlp.c_proj (residual)": [blk.mlp.c_proj.weight for blk in gpt2.transformer.h],
}
residual_std = 0.02 / math.sqrt(2 * L)
print(f"{'parameters':26s} {'measured std':>12s} {'expected':>10s}")
for name, params in groups.items():
    std = torch.cat([p.detach().flatten() for p in params]).std().item()
    expected = residual_std if "residual" in name else 0.02
    print(f"{name:26s} {std:12.5f} {expected:10.5f}")
    assert abs(std - expected) < 0.01 * expected, name
biases = torch.cat(
    [
        m.bias.flatten()
        for m in gpt2.modules()
        if isinstance(m, torch.nn.Linear) and m.bias is not None
    ]
)
assert (biases == 0).all()
del gpt2

# %% [markdown]
# Why the scaling matters: the residual stream $h_\ell$ is a **sum** of everything the blocks
# wrote into it, $h_L = h_0 + \sum_{\ell}(\text{attn}_\ell + \text{mlp}_\ell)$. Branches with
# independent random weights add their variances, so without the scaling
# $\operatorname{Var}(h_L) \approx \operatorname{Var}(h_0) + 2L\,\sigma^2_\text{branch}$ grows
# linearly with depth; with it each branch's variance is divided by $2L$ and the total stays
# bounded. Below: a deep, narrow GPT at initialisation, once as attnlab builds it and once with
# the `c_proj` weights redrawn at plain std 0.02. A forward hook on each block's
# `hook_resid_post` records the stream.

# %%
deep = al.GPTConfig(vocab_size=256, n_positions=64, n_embd=128, n_layer=DEPTH, n_head=4)
tokens = torch.randint(0, deep.vocab_size, (4, 64), generator=torch.Generator().manual_seed(1))


def stream_stds(gpt: al.GPT) -> list[float]:
    """std of the residual stream at the embedding and after every block."""
    seen: list[torch.Tensor] = []
    hooks = [
        gpt.transformer.h[0].hook_resid_pre.register_forward_hook(lambda m, a, o: seen.append(o))
    ]
    hooks += [
        blk.hook_resid_post.register_forward_hook(lambda m, a, o: seen.append(o))
        for blk in gpt.transformer.h
    ]
    with torch.no_grad():
        gpt(tokens)
    for h in hooks:
        h.remove()
    return [s.std().item() for s in seen]


torch.manual_seed(0)
scaled = al.GPT(deep).eval()
unscaled = al.GPT(deep).eval()
unscaled.load_state_dict(scaled.state_dict())  # the same weights ...
redraw = torch.Generator().manual_seed(3)
with torch.no_grad():
    for name, p in unscaled.named_parameters():
        if name.endswith("c_proj.weight"):  # ... but the residual projections at plain 0.02
            p.normal_(0.0, 0.02, generator=redraw)
stds = {
    f"scaled 0.02/√(2·{DEPTH})": stream_stds(scaled),
    "unscaled 0.02": stream_stds(unscaled),
}
for name, s in stds.items():
    print(
        f"{name:18s} embedding {s[0]:.4f}  after block {DEPTH}: {s[-1]:.4f}  (×{s[-1] / s[0]:.1f})"
    )
s_scaled, s_unscaled = stds.values()
assert s_unscaled[-1] > 2.5 * s_scaled[-1]
# without scaling the variance grows ~linearly with depth: the second half adds about as much
# variance as the first half did
half = DEPTH // 2
grow_1 = s_unscaled[half] ** 2 - s_unscaled[0] ** 2
grow_2 = s_unscaled[-1] ** 2 - s_unscaled[half] ** 2
print(
    f"unscaled variance added by blocks 1..{half}: {grow_1:.4f}, by blocks {half + 1}..{DEPTH}: {grow_2:.4f}"
)
assert 0.5 < grow_2 / grow_1 < 2.0
residual_growth_figure(stds, title=f"Residual stream of a {DEPTH}-block GPT at initialisation")

# %% [markdown]
# The unscaled stream grows like $\sqrt{\ell}$ (its variance linearly); the scaled one stays
# within a small factor of the embedding. Deeper stacks only widen the gap (`FULL = True`: 48
# blocks). Since every block reads the stream through a LayerNorm, the blow-up does not break
# the forward pass, but it makes the late blocks' contributions relatively smaller and changes
# the effective learning rate of each layer — GPT-2's scaling keeps a deep model's start the same
# as a shallow one's.
#
# ## 4. Hugging Face GPT-2 weights
#
# `GPT.from_hf` reads a `transformers.GPT2LMHeadModel` or a directory it was saved to (only
# `model.safetensors`; nothing is downloaded). Hugging Face's GPT-2 uses `Conv1D` layers whose
# weight is `(in, out)`, so `c_attn`, `c_proj` and `c_fc` are transposed on the way in. To stay
# offline, a **random** GPT-2 built from a `GPT2Config` and saved with `save_pretrained` stands in
# for the hub's `gpt2` folder; loading the real one is the same call on its folder.

# %%
import warnings

from tqdm import TqdmWarning

# tqdm's notebook bars need ipywidgets, which this offline set-up does not install
warnings.filterwarnings("ignore", "IProgress not found", TqdmWarning)
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()  # no "Writing model shards" bar from save_pretrained

torch.manual_seed(0)
# GPT2Config's default <|endoftext|> id (50256) is outside this 1000-token vocabulary
hf_config = GPT2Config(
    vocab_size=1000,
    n_positions=128,
    n_embd=64,
    n_layer=3,
    n_head=4,
    bos_token_id=999,
    eos_token_id=999,
)
hf_model = GPT2LMHeadModel(hf_config).eval()
folder = tempfile.mkdtemp()
hf_model.save_pretrained(folder)  # config.json + model.safetensors

ours = al.GPT.from_hf(folder).eval()
print(ours.config)
ids = torch.randint(0, 1000, (2, 50))
with torch.no_grad():
    theirs = hf_model(ids).logits
    mine = ours(ids).logits
max_diff = (theirs - mine).abs().max().item()
print(f"logits {tuple(mine.shape)}, max |HF - attnlab| = {max_diff:.2e}")
assert max_diff < 1e-4
assert (theirs.argmax(-1) == mine.argmax(-1)).all()

# %% [markdown]
# ## 5. MQA and GQA: a smaller KV cache
#
# When decoding, every layer keeps the keys and values of all past tokens (the KV cache) so that
# a new token costs one row of attention, not a full forward pass. Its size is
#
# $$\text{bytes} = 2 \cdot n_\text{layer} \cdot B \cdot H_{kv} \cdot d_h \cdot T \cdot \text{bytes per number}$$
#
# Multi-query attention (Shazeer 2019) gives all $H$ query heads **one** key/value head
# ($H_{kv} = 1$); grouped-query attention (Ainslie et al. 2023) gives each group of $G = H/H_{kv}$
# query heads one shared key/value head. Query head $h$ reads key/value head $\lfloor h/G \rfloor$:
# GQA is multi-head attention with each key/value head repeated $G$ times.

# %%
q8 = torch.randn(1, 8, 10, 16)  # 8 query heads
k2, v2 = torch.randn(1, 2, 10, 16), torch.randn(1, 2, 10, 16)  # 2 key/value heads: G = 4
gqa = al.scaled_dot_product_attention(q8, k2, v2, is_causal=True)
mha = al.scaled_dot_product_attention(
    q8, k2.repeat_interleave(4, dim=1), v2.repeat_interleave(4, dim=1), is_causal=True
)
print(f"max |GQA - MHA with repeated K/V| = {(gqa - mha).abs().max().item():.2e}")
assert torch.allclose(gqa, mha, atol=1e-6)

# %% [markdown]
# Now three small GPTs that differ only in $H_{kv}$: 8 (MHA), 2 (GQA) and 1 (MQA). Each decodes
# greedily with a KV cache sized for $N$ tokens; we add up the bytes of the cache's actual
# buffers (`untyped_storage().nbytes()`) and compare them with `attnlab.inspect.kv_cache_bytes`.
# Decoding with the cache must give the logits of a full forward pass over the same tokens.

# %%
variants = {"MHA": 8, "GQA": 2, "MQA": 1}
base = dict(vocab_size=256, n_positions=max(DECODE_LENS), n_embd=128, n_layer=4, n_head=8)
prompt = torch.randint(0, 256, (1, 4), generator=torch.Generator().manual_seed(2))
measured: dict[str, list[int]] = {name: [] for name in variants}
predicted: dict[str, list[int]] = {name: [] for name in variants}
for name, kv_heads in variants.items():
    torch.manual_seed(0)
    gpt = al.GPT(al.GPTConfig(**base, num_kv_heads=kv_heads)).eval()
    for n in DECODE_LENS:
        cache = gpt.new_cache(batch=1, capacity=n)
        seq = prompt
        with torch.no_grad():
            logits = [gpt(prompt, cache=cache).logits[:, -1]]
            while seq.shape[1] < n:
                seq = torch.cat([seq, logits[-1].argmax(-1, keepdim=True)], dim=1)
                logits.append(gpt.decode_step(seq[:, -1:], cache))
            full = gpt(seq).logits[0, prompt.shape[1] - 1 :]  # the same positions, no cache
        assert cache.length == n
        step_diff = (torch.cat(logits) - full).abs().max().item()
        assert step_diff < 1e-4, (name, n, step_diff)
        actual = sum(
            c.k.untyped_storage().nbytes() + c.v.untyped_storage().nbytes() for c in cache.layers
        )
        measured[name].append(actual)
        predicted[name].append(kv_cache_bytes(gpt.config, n))
    print(f"{name} (H_kv = {kv_heads}): cache bytes {measured[name]}, formula {predicted[name]}")
    assert measured[name] == predicted[name]
    assert measured[name] == [
        2 * base["n_layer"] * kv_heads * gpt.config.d_head * n * 4 for n in DECODE_LENS
    ]
assert [measured[n][-1] for n in variants] == [
    8 * measured["MQA"][-1],
    2 * measured["MQA"][-1],
    measured["MQA"][-1],
]

memory_figure(
    DECODE_LENS,
    measured,
    expected=predicted,
    title="KV cache after decoding N tokens (4 layers, 8 query heads, d_h = 16, fp32)",
    ylabel="KV cache",
    xlabel="tokens in the cache N",
    legend_title="key/value heads",
)

# %% [markdown]
# The measured buffers equal the formula exactly and sit on the dashed predictions: the cache is
# linear in $N$ and in $H_{kv}$, so GQA with 2 key/value heads needs 1/4 and MQA 1/8 of the
# multi-head cache, for any length. For GPT-2 small (12 layers, 12 heads of 64) at 1024 tokens
# in fp32 that is the difference between:

# %%
gpt2_cfg = al.GPTConfig()
for name, kv_heads in {"MHA": 12, "GQA": 4, "MQA": 1}.items():
    mib = kv_cache_bytes(gpt2_cfg, 1024, num_kv_heads=kv_heads) / 2**20
    print(f"{name:3s} H_kv = {kv_heads:2d}: {mib:6.1f} MiB per sequence")

# %% [markdown]
# Fewer key/value heads also means fewer bytes to *read* at every decoding step, which is what
# bounds batch-1 decoding on a CPU (see `benchmarks/generate.py`). The cost is quality: MQA models
# are trained (or "uptrained", Ainslie et al. 2023) with the shared heads; taking an MHA model's
# heads away without training changes its outputs. The next notebook turns to the other memory
# cost of attention — the $T \times T$ weight matrix — and the FlashAttention way around it.
#
# **Next:** [notebook 5](05_flash_attention.ipynb): attention without the $T \times T$ matrix.
