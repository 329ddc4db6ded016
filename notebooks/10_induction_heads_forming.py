# %% [markdown]
# # 10 · Induction heads forming: the phase change
#
# Olsson et al. (2022), ["In-context Learning and Induction
# Heads"](https://transformer-circuits.pub/2022/in-context-learning-and-induction-heads/index.html),
# found that small Transformers, early in training, go through a **phase change**: within a short
# window of steps the loss on tokens that repeat earlier text falls sharply, and at the same steps
# *induction heads* appear — heads that, at a token `A`, look back at what followed an earlier `A`
# and predict it again: `[A][B] … [A] → [B]`. A model with one attention layer cannot build one;
# a model with two can, by composing two heads.
#
# This notebook trains both from scratch on the CPU and records, while they train, the attention of
# every head on a fixed probe of repeated random tokens (`attnlab.inspect.capture`,
# `attnlab.inspect.roles.role_scores`, `attnlab.viz.probe_history.ProbeHistory`).
#
# You will learn:
#
# - the mechanism: a previous-token head in layer 0 and an induction head in layer 1 that reads it
#   through its keys (K-composition);
# - how to measure it during training: loss on the repeated half vs the first half, and the
#   induction score of every head;
# - why a one-layer model is a control that never forms one.

# %%
FULL = False  # True: a wider model trained longer (a few minutes on a laptop CPU)

SEED = 0
V, T = 64, 32  # vocabulary, sequence length
if FULL:
    D, HEADS, STEPS, BATCH, LR, EVERY = 128, 4, 1500, 64, 3e-3, 50
else:
    D, HEADS, STEPS, BATCH, LR, EVERY = 128, 4, 500, 32, 3e-3, 25
SKIP = 0.5  # share of the filler tokens that follow the skip rule x[t] = π(x[t − 2])
N_PROBE = T // 2  # the probe: r + r with |r| = 16

# %%
import math

import matplotlib.figure
import numpy as np
import torch
import torch.nn.functional as F

import attnlab as al
from attnlab.inspect import capture
from attnlab.inspect.roles import repeated_tokens, role_scores
from attnlab.viz import Plot
from attnlab.viz.evolution import attention_evolution
from attnlab.viz.probe_history import ProbeHistory

torch.manual_seed(SEED)

# %% [markdown]
# ## 1 · Data where copying pays
#
# Each training sequence of $T = 32$ tokens is filler with a repeated segment inside it: a segment
# $r$ of random length $L \in [6, 16]$ starting at a random place $P$, then $r$ again,
#
# $$x = (\underbrace{x_0 \dots x_{P-1}}_{\text{filler}},\ r_1 \dots r_L,\ r_1 \dots r_L,\
# \underbrace{\dots}_{\text{filler}}).$$
#
# Because $L$ and $P$ change from sequence to sequence, no fixed offset finds the earlier copy:
# the only way to predict $r_{i+1}$ in the second copy is to find where the current token $r_i$
# occurred before and read the token after it — an induction head. The filler is there so that
# there is something else to learn: its tokens follow a skewed unigram distribution
# ($p_k \propto 1/\sqrt{k}$) and, half of the time, a **skip rule** $x_t = \pi(x_{t-2})$ for a
# fixed permutation $\pi$, which a head that reads the previous token can use.

# %%
unigram = 1.0 / torch.arange(1, V + 1).double().sqrt()
unigram /= unigram.sum()
PERM = torch.randperm(V, generator=torch.Generator().manual_seed(7))


def batch(n: int, g: torch.Generator) -> torch.Tensor:
    """``n`` training sequences, shape ``(n, T)``: filler with one repeated segment."""
    x = torch.multinomial(unigram.expand(n, V), T, replacement=True, generator=g)  # (n, T)
    rule = torch.rand(n, T, generator=g) < SKIP
    made = torch.zeros(n, T, dtype=torch.bool)
    for t in range(2, T):  # x_t = π(x_{t−2}), never chained
        use = rule[:, t] & ~made[:, t - 2]
        x[:, t] = torch.where(use, PERM[x[:, t - 2]], x[:, t])
        made[:, t] = use
    for i in range(n):
        L = int(torch.randint(6, T // 2 + 1, (1,), generator=g))
        P = int(torch.randint(0, T - 2 * L + 1, (1,), generator=g))
        x[i, P + L : P + 2 * L] = x[i, P : P + L]  # the second copy of r
    return x


example = batch(1, torch.Generator().manual_seed(1))[0]
print(" ".join(f"{int(v):2d}" for v in example))

# %% [markdown]
# Two fixed inputs are measured every `EVERY` steps:
#
# - an **evaluation set** of sequences $r + r$ with $|r| = 16$ drawn from the unigram
#   distribution: the mean loss on the first half (nothing to copy) and on the repeated half
#   (everything can be copied). Their difference is Olsson et al.'s in-context learning score;
# - the **probe** of `attnlab.inspect.roles.repeated_tokens`: 16 *distinct* random tokens, twice.
#   On it `role_scores` gives each head's induction score
#   $\mathrm{ind}(h) = \operatorname{mean}_{t \ge n} A_h[t,\ t - n + 1]$, the weight the second
#   copy puts on the token after the earlier occurrence of the current token (1: a perfect
#   induction head), and its previous-token score $\operatorname{mean}_t A_h[t, t-1]$.

# %%
g_eval = torch.Generator().manual_seed(999)
r = torch.multinomial(unigram.expand(128, V), N_PROBE, replacement=True, generator=g_eval)
evaluation = torch.cat([r, r], 1)  # (128, 32)
probe = repeated_tokens(N_PROBE, batch=8, token_range=(0, V), seed=123)  # (8, 32)
print("probe row 0:", probe[0].tolist())

# %% [markdown]
# ## 2 · Two attention-only models, trained the same way
#
# `GPTConfig(mlp="none")` builds blocks with attention only, so the residual stream is
# $x_{l+1} = x_l + \sum_h \mathrm{head}_h(\mathrm{LN}(x_l))$ and everything the model computes is
# attention. A plain AdamW loop (a warm-up of 50 steps, then a cosine decay) is all they need; every
# `EVERY` steps `log` captures the probe's attention, scores every head and keeps the weights in a
# `ProbeHistory`.


# %%
def make_model(layers: int) -> al.GPT:
    torch.manual_seed(SEED)
    cfg = al.GPTConfig(
        vocab_size=V, n_positions=T, n_embd=D, n_layer=layers, n_head=HEADS, mlp="none"
    )
    return al.GPT(cfg)


@torch.no_grad()
def measure(model: al.GPT, history: ProbeHistory, step: int) -> dict:
    model.eval()
    with capture(model) as cache:
        model(probe)
    scores = {name: role_scores(w, probe) for name, w in cache.attentions.items()}
    history.record(step, cache.attentions, cache.kinds)
    logits = model(evaluation).logits[:, :-1]  # (B, T − 1, V): token t predicts t + 1
    ce = F.cross_entropy(logits.transpose(1, 2), evaluation[:, 1:], reduction="none")  # (B, T−1)
    model.train()
    return {
        "step": step,
        "first": float(ce[:, : N_PROBE - 1].mean()),  # targets 1 … n − 1: nothing to copy
        "repeated": float(ce[:, N_PROBE:].mean()),  # targets n + 1 … 2n − 1: all copyable
        "induction": {n: s["induction"].numpy() for n, s in scores.items()},
        "previous": {n: s["previous"].numpy() for n, s in scores.items()},
    }


def train(layers: int) -> tuple[al.GPT, list[dict], ProbeHistory]:
    model = make_model(layers)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.98), weight_decay=0.0)
    g = torch.Generator().manual_seed(SEED + 1)  # both models see the same batches
    history = ProbeHistory.new(tokens=[str(int(v)) for v in probe[0]])
    logs, running = [], []
    for step in range(STEPS + 1):
        if step % EVERY == 0 or step == STEPS:
            logs.append(measure(model, history, step))
            logs[-1]["train"] = float(np.mean(running)) if running else float("nan")
            running = []
        if step == STEPS:
            break
        warm = min(1.0, (step + 1) / 50)
        cosine = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / STEPS))
        for group in opt.param_groups:
            group["lr"] = LR * warm * cosine
        x = batch(BATCH, g)
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        running.append(loss.item())
    return model, logs, history


model2, logs2, history2 = train(2)
model1, logs1, history1 = train(1)
LAST2, LAST1 = "transformer.h.1.attn", "transformer.h.0.attn"
for name, logs in (("2-layer", logs2), ("1-layer", logs1)):
    last = "transformer.h.1.attn" if name == "2-layer" else "transformer.h.0.attn"
    for e in logs[:: max(1, len(logs) // 8)] + logs[-1:]:
        print(
            f"{name} step {e['step']:5d}: train {e['train']:.3f}  first half {e['first']:.3f}  "
            f"repeated half {e['repeated']:.3f}  induction (last layer, best head) "
            f"{e['induction'][last].max():.2f}"
        )

# %% [markdown]
# ## 3 · The phase change
#
# Top: the induction score of the best head of the last layer. Bottom: the loss on the first half
# and on the repeated half of the evaluation set. The dotted line marks the step where the
# two-layer model's induction score rose most between two measurements.


# %%
def curve(logs: list[dict], key: str, layer: str | None = None) -> np.ndarray:
    if layer is None:
        return np.array([e[key] for e in logs])
    return np.array([e[key][layer].max() for e in logs])


steps = curve(logs2, "step")
ind2, ind1 = curve(logs2, "induction", LAST2), curve(logs1, "induction", LAST1)
jump = int(steps[1:][np.argmax(np.diff(ind2))])

fig = matplotlib.figure.Figure(figsize=(8, 6.5), layout="constrained")
top, bottom = fig.subplots(2, 1, sharex=True)
top.plot(steps, ind2, "C0-o", ms=3, label="2-layer: best layer-1 head")
top.plot(steps, ind1, "C3-o", ms=3, label="1-layer (control): best head")
top.set_ylabel("induction score")
top.set_ylim(0, 1)
top.legend(loc="upper left")
for model_logs, color, name in ((logs2, "C0", "2-layer"), (logs1, "C3", "1-layer")):
    bottom.plot(steps, curve(model_logs, "first"), color + "--", label=f"{name}: first half")
    bottom.plot(steps, curve(model_logs, "repeated"), color + "-", label=f"{name}: repeated half")
bottom.set_ylabel("loss (nats / token)")
bottom.set_xlabel("training step")
bottom.legend(loc="lower left", fontsize=8)
for ax in (top, bottom):
    ax.axvline(jump, color="grey", ls=":")
top.annotate(f"largest jump: step {jump}", (jump, 0.92), xytext=(5, 0), textcoords="offset points")
fig.suptitle("Induction heads forming: score and in-context loss against the step")
Plot(fig, {"steps": steps, "induction_2": ind2, "induction_1": ind1})

# %% [markdown]
# ## 4 · The heads before and after
#
# The probe's attention was recorded at every measurement. Layer 1 of the two-layer model, from
# the first record to the last (queries down, keys across): the **induction stripe** appears — in
# the second copy, position $t$ attends to $t - n + 1$, an off-diagonal line $n - 1 = 15$ below
# the diagonal.

# %%
attention_evolution(history2, layer=LAST2, max_steps=4, max_tokens=32)

# %% [markdown]
# Layer 0 supplies what it needs: a **previous-token head**, the line just below the diagonal.

# %%
attention_evolution(history2, layer="transformer.h.0.attn", max_steps=3, max_tokens=32)

# %% [markdown]
# ## 5 · The mechanism: K-composition
#
# Write the residual stream at position $s$ after layer 0 as $x_s^{(1)} = e_{x_s} + p_s +
# \sum_h o_h(s)$. A previous-token head $h_0$ attends from $s$ to $s - 1$ and writes
# $o_{h_0}(s) \approx W_O^{h_0} W_V^{h_0} e_{x_{s-1}}$: position $s$ now carries the identity of
# the token *before* it. An induction head $h_1$ of layer 1 scores key $s$ for query $t$ by
#
# $$ x_t^{(1)\top} W_Q^{h_1\top} W_K^{h_1}\, x_s^{(1)} \;\ni\;
#    e_{x_t}^{\top} W_Q^{h_1\top} W_K^{h_1} W_O^{h_0} W_V^{h_0}\, e_{x_{s-1}}, $$
#
# large when $x_{s-1} = x_t$: its *keys* read the output of $h_0$ — **K-composition** (Elhage et al.
# 2021, "A Mathematical Framework for Transformer Circuits"). Its OV circuit then copies
# $x_s$, the token after the earlier occurrence, into the logits. With one layer the keys hold only
# $e_{x_s} + p_s$, never $x_{s-1}$: the best a one-layer model can do is raise every token already
# seen, which is why its repeated-half loss stays close to its first-half loss.
#
# Which heads of a trained model matter can also be measured by removing them: the head-pruning
# curve of [notebook 6](06_training.ipynb) shows what is lost as heads go.

# %%
best = int(np.argmax(logs2[-1]["induction"][LAST2]))
prev0 = logs2[-1]["previous"]["transformer.h.0.attn"]
print(f"layer-1 induction scores at the end: {np.round(logs2[-1]['induction'][LAST2], 2)}")
print(f"layer-0 previous-token scores at the end: {np.round(prev0, 2)}")
print(
    f"in-context gain (first − repeated half): 2-layer "
    f"{logs2[-1]['first'] - logs2[-1]['repeated']:.2f}, "
    f"1-layer {logs1[-1]['first'] - logs1[-1]['repeated']:.2f} nats"
)
print(f"induction score: 2-layer {ind2[-1]:.2f} (step 0: {ind2[0]:.2f}), 1-layer {ind1[-1]:.2f}")

# %% [markdown]
# **Next:** notebook 11.
