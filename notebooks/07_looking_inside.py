# %% [markdown]
# # 7 · Looking inside: capture, diagnose, find the NaN, view, count the cost
#
# A trained Transformer is a stack of attention layers whose weights say, for every position,
# where it looked. This notebook opens one up with `attnlab.inspect`:
#
# - **capture** every layer's attention weights by module path — the idea of TransformerLens's
#   hook points and activation cache — without changing what the model computes;
# - **diagnose** the heads: entropy, largest weight, row sums, and the two suspicious patterns
#   (uniform heads that select nothing, one-token heads that copy one key);
# - **find a NaN at its source**: one corrupted weight turns every later activation into NaN, and
#   `find_nonfinite` / `watch_nonfinite` name the module where it started;
# - **view** the weights in the interactive HTML viewer (in the spirit of BertViz), inline;
# - **count the cost**: FLOPs and memory of GPT-2 small term by term, after nanoGPT's
#   `transformer_sizing.ipynb`, and how attention's share grows with the sequence length.
#
# We train the small string-reversing encoder-decoder of notebook 06 again (seconds at the small
# size), so this notebook runs on its own.

# %%
FULL = False  # True: the full-size model of `attnlab demo` (about two minutes on a laptop CPU)

SEED = 0
if FULL:  # the demo's model and run
    STEPS, TEXT = 1200, "jbdhaegcfi"
    TASK = dict(num_symbols=10, max_len=16, num_heldout=500)
    TASK |= dict(d_model=128, layers=2, heads=4, d_ff=256, batch_size=64, warmup=200, lr_factor=0.5)
else:  # notebook 06's small model (8 letters, one layer each side), 400 steps
    STEPS, TEXT = 400, "bdhaegcf"
    TASK = dict(num_symbols=8, max_len=8, num_heldout=200)
    TASK |= dict(d_model=64, layers=1, heads=4, d_ff=128, batch_size=64, warmup=100, lr_factor=1.0)
TASK |= dict(cooldown=STEPS // 3, cooldown_end=STEPS)

# %%
import copy
import dataclasses
import tempfile
from pathlib import Path

import torch

import attnlab as al
from attnlab import tasks, viz
from attnlab.inspect import (
    capture,
    diagnose,
    diagnose_model,
    find_nonfinite,
    flops,
    watch_nonfinite,
)
from attnlab.tasks.figures import layer_labels
from attnlab.viz.costs import flops_figure
from attnlab.viz.viewer import view

out_dir = Path(tempfile.mkdtemp(prefix="attnlab-07-"))  # every file this notebook writes

# %% [markdown]
# ## 1 · A small trained model
#
# `attnlab train reverse`, as in notebook 06: `attnlab.tasks.train` lets the task build model,
# batches, optimizer and loss, and the `Trainer` run them.

# %%
result = tasks.train("reverse", out=out_dir / "run", steps=STEPS, seed=SEED, **TASK)
model, setup = result.model, result.setup  # the trained model, and what the task built
accuracy = result.eval_metrics["exact_match"]
print(f"{STEPS} steps in {result.elapsed:.1f} s: held-out exact match {100 * accuracy:.1f}%")
assert accuracy >= 0.95

# %% [markdown]
# ## 2 · Capture the attention
#
# The task's text path gives exactly what the model reads for a string (the source ends with
# `<eos>`) and what it writes (its own greedy output, teacher-forced back in so we see the
# decoder's attention while writing it). `attnlab.inspect.capture` records every attention layer's
# weights $\mathrm{softmax}(QK^\top/\sqrt{d_k})$, shape `(B, H, T_q, T_k)`, keyed by module path.
# Capturing never changes the result: the output is bit-for-bit the same.

# %%
inputs = setup.io.inputs(model, TEXT)  # source ids, the decoded target, their token labels
src, tgt_in = inputs.tensors()  # (1, S), (1, T)
print(f"{TEXT!r} → {inputs.output!r}")
print("source:", list(inputs.source_tokens))
print("target rows write:", list(inputs.target_tokens))
assert inputs.output == TEXT[::-1]

model.eval()
with torch.no_grad():
    plain = model(src, tgt_in).logits
with torch.no_grad(), capture(model) as cache:
    captured = model(src, tgt_in).logits
assert torch.equal(plain, captured), "capturing must not change the output"
for name, w in cache.attentions.items():
    print(f"{name:<30} {cache.kinds[name]:<5} {tuple(w.shape)}")
sums = torch.cat([w.sum(-1).flatten() for w in cache.attentions.values()])
print(f"every row sums to 1: max |Σ_j w_ij − 1| = {(sums - 1).abs().max():.1e}")
assert (sums - 1).abs().max() < 1e-5

# %% [markdown]
# All layers and heads at once: one row per layer, one column per head, each panel labelled with
# its own queries and keys (encoder: source × source; decoder self-attention: target × target,
# causal; cross-attention: target × source).

# %%
labels = {n: layer_labels(inputs, n, k) for n, k in cache.kinds.items()}
viz.layer_head_grid(
    cache.attentions,
    query_tokens={n: q for n, (q, _) in labels.items()},
    key_tokens={n: k for n, (_, k) in labels.items()},
    title=f"reverse {TEXT!r}: every layer and head",
)

# %% [markdown]
# One cross-attention head up close: the row of output letter *i* puts its weight on input
# letter *n − 1 − i* — the anti-diagonal the model learned in notebook 06.

# %%
cross = cache.names("cross")[-1]
n = len(TEXT)
w = cache.attentions[cross][0]  # (H, T, S)
anti = torch.stack([w[:, i, n - 1 - i] for i in range(n)], -1).mean(-1)  # (H,)
head = int(anti.argmax())
print(f"{cross}: mean weight on the anti-diagonal per head {anti.numpy().round(3)}")
assert anti[head] > 0.9
q_tok, k_tok = labels[cross]
viz.attention_heatmap(w[head], query_tokens=q_tok, key_tokens=k_tok, title=f"{cross}, head {head}")

# %% [markdown]
# ## 3 · Diagnose the heads
#
# `diagnose` checks every head of a capture. For each query row $p$ it measures the entropy
# $H(p) = -\sum_j p_j \log p_j$ (0: all weight on one key; $\log n$: uniform over $n$ keys), the
# largest weight and $|\sum_j p_j - 1|$, and names three patterns that deserve a look even when
# every number is finite: a **uniform** head (every row within 1% of $\log n$: it selects
# nothing), a **one-token** head (every row puts ≥ 0.99 on one key) and a **sink** (a one-token
# head whose key is the first token — normal in pretrained models, notebook 11). Patterns are
# reported (`h.status`, `report.notes()`), not failures: `report.ok` is false only when something
# is *broken* — a NaN/inf, a row that does not sum to 1, or a **collapsed** model, one whose
# every head is uniform or a sink, so that no head's weights depend on the tokens.
# `diagnose_model` runs the model once with capture and also watches for non-finite values.
#
# First a model that has learned nothing: a freshly initialised GPT (weights of std 0.02) reading
# "attention is all you need". Its scores are all near 0, so every head is uniform: collapsed.

# %%
text = "attention is all you need"
chars = sorted(set(text))
ids = torch.tensor([[chars.index(c) for c in text]])  # (1, T)
torch.manual_seed(SEED)
gpt = al.GPT(
    al.GPTConfig(vocab_size=len(chars), n_positions=64, n_embd=32, n_layer=2, n_head=4)
).eval()
with torch.no_grad():
    _, fresh = diagnose_model(gpt, ids)
print(f"{len(fresh.heads)} heads, {sum(h.uniform for h in fresh.heads)} uniform; ok = {fresh.ok}")
print(fresh.problems()[0])
assert all(h.status == "uniform" for h in fresh.heads) and fresh.collapsed and not fresh.ok

# %% [markdown]
# The trained reverse model is another story: its heads have sharpened, and none is uniform.
# `diagnose` reads the capture of section 2 directly.

# %%
report = diagnose(cache)
print(f"{'layer':<30} head  entropy  max weight  status")
for h in report.heads:
    print(
        f"{h.layer:<30} {h.head:>4}  {h.entropy_mean:7.3f}  {h.max_weight_mean:10.3f}  {h.status}"
    )
print("problems:", report.problems() or "none", "— ok:", report.ok)
assert report.origin is None and report.first_nonfinite is None and report.ok
assert not any(h.uniform for h in report.heads)
assert all(h.row_sum_error < 1e-5 for h in report.heads)

# %% [markdown]
# ## 4 · Where does a NaN come from?
#
# One bad number spreads: a NaN in one weight of the last encoder layer's feed-forward network
# makes that hidden unit NaN at every position, then the encoder's output, then the decoder's
# cross-attention, the logits and the loss. Looking at the attention weights alone points at the
# wrong place — the first non-finite *attention weight* is in the decoder. `find_nonfinite` hooks
# every module and reports the first one, in the order modules finish, whose output holds a
# NaN/inf: there, and only there, the value was made.

# %%
last = len(model.encoder.layers) - 1  # the encoder's last layer
broken = copy.deepcopy(model)
with torch.no_grad():
    broken.encoder.layers[last].ff.linear1.weight[3, 5] = float("nan")
origin = find_nonfinite(broken, src, tgt_in)
print(origin)
assert origin.module == f"encoder.layers.{last}.ff.linear1" and origin.produced
assert origin.parameter == f"encoder.layers.{last}.ff.linear1.weight"
assert origin.parameter_index == (3, 5)
assert origin.layer_name == f"encoder layer {last}"

with torch.no_grad():
    _, sick = diagnose_model(broken, src, tgt_in)
print("first non-finite attention weight:", sick.first_nonfinite)
print("first non-finite module output:   ", sick.origin)
assert not sick.ok and sick.origin.module == origin.module
assert sick.first_nonfinite.layer.startswith("decoder")  # the symptom, far from the cause

# %% [markdown]
# A NaN need not live in the weights. Here a forward hook writes `inf` into one activation of the
# decoder's feed-forward layer during a training step's loss; `watch_nonfinite` (a context
# manager: its hooks go when the block ends) catches it at the module and position where it
# appeared. The trainer would stop here with a `DivergenceError` before taking the step.

# %%
batch = setup.batches.next_batch()


def corrupt(module, args, output):
    output = output.clone()
    output[0, 2, 7] = float("inf")  # sequence 0, position 2, channel 7
    return output


hook = model.decoder.layers[0].ff.linear2.register_forward_hook(corrupt)
try:
    with watch_nonfinite(model) as watch:
        loss = setup.loss_fn(model, batch).loss
finally:
    hook.remove()
print(f"loss = {loss.item()}")
print(watch.origin)
assert not torch.isfinite(loss)
assert watch.origin.module == "decoder.layers.0.ff.linear2"
assert watch.origin.index == (0, 2, 7) and watch.origin.value == "inf"
with torch.no_grad():
    assert torch.isfinite(setup.loss_fn(model, batch).loss)  # the hook is gone

# %% [markdown]
# ## 5 · The viewer
#
# `viz.view` turns the capture into the self-contained HTML viewer: choose a layer and a head (or
# the mean over heads), hover a token to see where it looks. In a notebook it shows inline; `.save`
# writes the same page as one file that opens in any browser without a network (`attnlab view RUN
# --text ...` writes it from the command line).

# %%
viewer = view(
    cache,
    source=list(inputs.source_tokens),
    target=list(inputs.target_tokens),
    title=f"attnlab · reverse {TEXT!r}",
)
page = viewer.save(out_dir / "reverse.html")
print(f"wrote {page.name}: {page.stat().st_size:,} bytes")
assert page.stat().st_size > 10_000
viewer

# %% [markdown]
# ## 6 · What attention costs
#
# `attnlab.inspect.flops` counts the matrix multiplications of a forward pass term by term (a
# multiply-add is 2 FLOPs), after nanoGPT's `transformer_sizing.ipynb`. Per layer, for $T$ tokens
# of width $d$ (and $d_\text{ff} = 4d$):
#
# $$\underbrace{2T\cdot d\cdot 3d}_{Q,K,V} + \underbrace{2\cdot 2T^2 d}_{QK^\top,\ \text{weights}\cdot V}
# + \underbrace{2T d^2}_{\text{output}} + \underbrace{2\cdot 2T\cdot d\cdot 4d}_{\text{MLP}}
# = 24\,T d^2 + 4\,T^2 d,$$
#
# plus $2TdV$ for the lm head once. A training step is about 3× the forward pass (the backward
# computes two products of the same size per matmul). GPT-2 small: 12 layers, $d = 768$, 12 heads,
# vocabulary 50257, 1024 positions — `al.GPTConfig()`'s defaults.

# %%
gpt2 = al.GPTConfig()
L, d, V, T = gpt2.n_layer, gpt2.n_embd, gpt2.vocab_size, gpt2.n_positions
sizing = flops(gpt2, seq_len=T)
by_formula = L * (24 * T * d**2 + 4 * T**2 * d) + 2 * T * d * V
print(
    f"GPT-2 small, one {T}-token sequence: {sizing.forward_total / 1e9:.1f} GFLOP forward, "
    f"{sizing.train_total / 1e9:.1f} GFLOP per training step"
)
print(f"by the formula above: {by_formula / 1e9:.1f} GFLOP")
assert sizing.forward_total == by_formula
with torch.device("meta"):  # the real model's shapes, without allocating 500 MB
    n_params = sum(p.numel() for p in al.GPT(gpt2).parameters())
print(f"parameters: {sizing.params['total']:,} (the model itself: {n_params:,})")
assert sizing.params["total"] == n_params
for kind, value in sizing.grouped().items():
    print(f"  {kind:<8} {value / 1e9:7.1f} GFLOP  ({100 * value / sizing.forward_total:4.1f}%)")

# %% [markdown]
# What that means on this machine: the training step of `benchmarks/train_step.py` (batch 8 × 256)
# costs about $6N$ FLOPs per token plus attention, and a 2-core CPU multiplies fp32 matrices at
# about 190 GFLOP/s — so no implementation can train GPT-2 small faster than ~250 tokens/s here.
#
# Memory: the parameters, their gradients and AdamW's two moments; and the KV cache that decoding
# keeps, $2 \cdot L \cdot B \cdot H_{kv} \cdot d_h \cdot T$ numbers — which grouped-query
# ($H_{kv} = 4$) and multi-query ($H_{kv} = 1$) attention shrink.

# %%
step = flops(gpt2, seq_len=256, batch=8)
per_token = step.train_total / (8 * 256)
print(
    f"training: {per_token / 1e6:.0f} MFLOP per token (6N = {6 * n_params / 1e6:.0f} M); "
    f"at 190 GFLOP/s at most {190e9 / per_token:.0f} tokens/s"
)
assert 200 < 190e9 / per_token < 300
gqa = flops(gpt2, seq_len=T, num_kv_heads=4)
mib = 2**20
for key in ("parameters", "gradients", "adam_state", "training_state"):
    print(f"  {key:<15} {sizing.memory[key] / mib:8.1f} MiB")
for name, size in gqa.kv_cache.items():
    print(f"  KV cache {name} ({gqa.kv_heads[name]:>2} kv heads) at T = {T}: {size / mib:6.1f} MiB")
assert gqa.kv_cache["MHA"] == 2 * L * 1 * d * T * 4  # H · d_h = d, 4 bytes each
assert gqa.kv_cache["MHA"] == 3 * gqa.kv_cache["GQA"] == 12 * gqa.kv_cache["MQA"]

# %% [markdown]
# Against the sequence length: the projections and the MLP grow like $T$, the scores and
# weights·V like $T^2$, so attention overtakes them where $4T^2d = 24Td^2$, at $T = 6d = 4608$ for
# GPT-2 small. GPT-2's 1024 positions stop well short of that; to see the crossing we stretch its
# position table to 16384 (the same model otherwise; the table adds 12M parameters). On the right,
# memory: the KV cache grows like $T$, the $T \times T$ weights of one layer that the explicit
# `"math"` backend holds grow like $T^2$ — the reason for the fused and blockwise kernels.

# %%
long = dataclasses.replace(gpt2, n_positions=16384)
costs = flops_figure(
    long,
    [2**k for k in range(6, 15)],
    title="GPT-2 small's sizes (position table stretched to 16384): cost against T",
)
crossover = float(costs.data["crossover"][0])
print(f"attention FLOPs = projections + MLP at T ≈ {crossover:.0f} (6 · d_model = {6 * d})")
assert abs(crossover - 6 * d) < 1
costs

# %% [markdown]
# **Where next:** `attnlab inspect RUN --text ...` prints the same per-head health for a saved run,
# `attnlab view RUN --text ...` writes the viewer, and `attnlab flops --preset gpt2 --seq-len 1024
# --kv-heads 4` prints the table above.
#
# **Next:** [notebook 8](08_language_model_and_translation.ipynb): a character language model,
# and English → Japanese translation.
