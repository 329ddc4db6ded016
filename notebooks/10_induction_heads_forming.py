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
# every head on fixed probes in which a random segment recurs at a random offset
# (`attnlab.inspect.capture`, `attnlab.inspect.roles.role_scores`,
# `attnlab.viz.probe_history.ProbeHistory`).
#
# You will learn:
#
# - the mechanism: a previous-token head in layer 0 and an induction head in layer 1 that reads it
#   through its keys (K-composition);
# - how to measure it during training: the loss on the repeated tokens vs the others, and the
#   induction score of every head, on probes whose repeat offset changes from row to row;
# - why the data and the positions must not offer a positional shortcut;
# - why a one-layer model is a control that never forms one.

# %%
FULL = False  # True: a wider model trained longer (a few minutes on a laptop CPU)

SEED = 0
V, T = 64, 32  # vocabulary, sequence length
D, HEADS, BATCH, LR, WARMUP = 64, 2, 32, 1.5e-3, 100
if FULL:
    STEPS, EVERY = 2000, 25
else:
    STEPS, EVERY = 500, 25
N_PROBE = 64  # probe sequences

# %%
import matplotlib.figure
import numpy as np
import torch
import torch.nn.functional as F

import attnlab as al
from attnlab.inspect import capture
from attnlab.inspect.roles import role_scores
from attnlab.viz import Plot
from attnlab.viz.evolution import attention_evolution
from attnlab.viz.probe_history import ProbeHistory

_ = torch.manual_seed(SEED)

# %% [markdown]
# ## 1 · Data where copying pays, and only by content
#
# Each training sequence is $T = 32$ uniformly random tokens (vocabulary $V = 64$) in which a
# segment $r$ of random length $n \in [6, 16]$, starting at a random place $a$, recurs later at a
# random place $c \ge a + n$:
#
# $$x = (\dots,\ \underbrace{r_1 \dots r_n}_{a},\ \dots,\ \underbrace{r_1 \dots r_n}_{c},\ \dots).$$
#
# Everything outside the second copy is unpredictable (about $\ln 64 = 4.16$ nats a token). In the
# second copy $r_{i+1}$ is predictable, but only by finding where $r_i$ occurred before and reading
# the token after it — an induction head. Two details keep the model from a cheaper trick:
#
# - the offset $c - a$ changes from sequence to sequence. With a fixed offset (e.g. $r + r$ with
#   $|r| = 16$) a head can simply attend $15$ positions back, a purely positional rule that
#   already scores as "induction" on an $r + r$ probe — even in layer 0, where content-based
#   induction is impossible;
# - the models use rotary positions (`positions="rope"`): attention depends on positions only
#   through their difference, so there is no absolute position to key a shortcut on.


# %%
def batch(n: int, g: torch.Generator) -> torch.Tensor:
    """``n`` training sequences, shape ``(n, T)``: random tokens, one segment recurring later."""
    x = torch.randint(0, V, (n, T), generator=g)
    for i in range(n):
        L = int(torch.randint(6, T // 2 + 1, (1,), generator=g))
        a = int(torch.randint(0, T - 2 * L + 1, (1,), generator=g))
        c = int(torch.randint(a + L, T - L + 1, (1,), generator=g))
        x[i, c : c + L] = x[i, a : a + L]
    return x


example = batch(1, torch.Generator().manual_seed(1))[0]
print(" ".join(f"{int(v):2d}" for v in example))

# %% [markdown]
# The models are measured every `EVERY` steps on one fixed set of **probes**: $T$ *distinct*
# random tokens in which a segment of random length $n \in [8, 16]$ recurs at a random offset (so a
# token's earlier occurrence is unique). On them:
#
# - the mean loss on the **repeated** tokens (the targets $r_2 \dots r_n$ of the second copy, all
#   copyable) and on the **other** tokens (nothing to copy);
# - `role_scores` gives each head's induction score
#   $\mathrm{ind}(h) = \operatorname{mean}_{t} \sum_{s + 1 < t,\ x_s = x_t} A_h[t,\ s + 1]$ over
#   the positions $t$ whose token occurred before: the weight on the token *after* the earlier
#   occurrence (1: a perfect induction head), and its previous-token score
#   $\operatorname{mean}_t A_h[t, t-1]$.


# %%
def make_probes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int, int]]]:
    """Distinct tokens with one recurring segment per row; mask of the copyable targets."""
    g = torch.Generator().manual_seed(seed)
    rows, masks, where = [], [], []
    for _ in range(n):
        x = torch.randperm(V, generator=g)[:T].clone()
        L = int(torch.randint(8, T // 2 + 1, (1,), generator=g))
        a = int(torch.randint(0, T - 2 * L + 1, (1,), generator=g))
        c = int(torch.randint(a + L, T - L + 1, (1,), generator=g))
        x[c : c + L] = x[a : a + L]
        mask = torch.zeros(T - 1, dtype=torch.bool)  # target t + 1 predicted at position t
        mask[c : c + L - 1] = True  # targets r_2 … r_L of the second copy
        rows.append(x)
        masks.append(mask)
        where.append((a, c, L))
    return torch.stack(rows), torch.stack(masks), where


probe, copyable, where = make_probes(N_PROBE, seed=5)
a0, c0, n0 = where[0]
print(f"probe row 0 (segment of {n0} at {a0}, again at {c0}):", probe[0].tolist())
print("repeat offsets c − a of the probes:", sorted({c - a for a, c, _ in where}))

# %% [markdown]
# ## 2 · Two attention-only models, trained the same way
#
# `GPTConfig(mlp="none")` builds blocks with attention only, so the residual stream is
# $x_{l+1} = x_l + \sum_h \mathrm{head}_h(\mathrm{LN}(x_l))$ and everything the model computes is
# attention. A plain AdamW loop (learning rate $1.5 \cdot 10^{-3}$ after a warm-up of 100 steps)
# is all they need; every `EVERY` steps `log` captures the probe's attention, scores every head
# and keeps the weights in a `ProbeHistory`.


# %%
def make_model(layers: int) -> al.GPT:
    torch.manual_seed(SEED)
    cfg = al.GPTConfig(
        vocab_size=V,
        n_positions=T,
        n_embd=D,
        n_layer=layers,
        n_head=HEADS,
        positions="rope",
        mlp="none",
    )
    return al.GPT(cfg)


@torch.no_grad()
def measure(model: al.GPT, history: ProbeHistory, step: int) -> dict:
    model.eval()
    with capture(model) as cache:
        logits = model(probe).logits[:, :-1]  # (B, T − 1, V): token t predicts t + 1
    scores = {name: role_scores(w, probe) for name, w in cache.attentions.items()}
    history.record(step, cache.attentions, cache.kinds)
    ce = F.cross_entropy(logits.transpose(1, 2), probe[:, 1:], reduction="none")  # (B, T − 1)
    model.train()
    return {
        "step": step,
        "other": float(ce[~copyable].mean()),  # nothing to copy
        "repeated": float(ce[copyable].mean()),  # the second copy: all copyable
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
        for group in opt.param_groups:
            group["lr"] = LR * min(1.0, (step + 1) / WARMUP)
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
            f"{name} step {e['step']:5d}: train {e['train']:.3f}  other {e['other']:.3f}  "
            f"repeated {e['repeated']:.3f}  induction (best head per layer) "
            f"{[round(float(v.max()), 2) for v in e['induction'].values()]}"
        )

# %% [markdown]
# ## 3 · The phase change
#
# Top: the induction score of the best head of each layer on the random-offset probes. Bottom: the
# loss on the repeated tokens and on the others. The dotted line marks the step where the
# two-layer model's layer-1 score rose most between two measurements.
#
# The two-layer model first learns slowly, for some three hundred steps: the repeated-token loss
# creeps down (like the one-layer model's, from raising tokens already seen) and its layer-1 score
# rises to about 0.2, the level the one-layer control also reaches with diffuse attention. Then,
# within about fifty steps, the layer-1 score jumps towards 1 and the repeated-token loss falls by
# more than two nats, while the loss on the other tokens, which cannot be predicted, does not fall
# (it stays a little above $\ln 64$). Layer 0's induction score stays near zero throughout — it
# cannot do content-based induction — and the one-layer control never jumps.


# %%
def curve(logs: list[dict], key: str, layer: str | None = None) -> np.ndarray:
    if layer is None:
        return np.array([e[key] for e in logs])
    return np.array([e[key][layer].max() for e in logs])


steps = curve(logs2, "step")
ind2, ind1 = curve(logs2, "induction", LAST2), curve(logs1, "induction", LAST1)
ind0 = curve(logs2, "induction", LAST1)  # layer 0 of the 2-layer model
jump = int(steps[1:][np.argmax(np.diff(ind2))])

fig = matplotlib.figure.Figure(figsize=(8, 6.5), layout="constrained")
top, bottom = fig.subplots(2, 1, sharex=True)
top.plot(steps, ind2, "C0-o", ms=3, label="2-layer: best layer-1 head")
top.plot(steps, ind0, "C0:", label="2-layer: best layer-0 head")
top.plot(steps, ind1, "C3-o", ms=3, label="1-layer (control): best head")
top.set_ylabel("induction score")
top.set_ylim(0, 1)
top.legend(loc="upper left")
for model_logs, color, name in ((logs2, "C0", "2-layer"), (logs1, "C3", "1-layer")):
    bottom.plot(steps, curve(model_logs, "other"), color + "--", label=f"{name}: other tokens")
    bottom.plot(steps, curve(model_logs, "repeated"), color + "-", label=f"{name}: repeated")
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
# The attention on probe row 0 was recorded at every measurement (its segment and offset are
# printed in section 1). Layer 1 of the two-layer model, from the first record to the last
# (queries down, keys across): in the second copy an **induction stripe** appears — position $t$
# attends to $t - (c - a) + 1$, a short off-diagonal line $c - a - 1$ below the diagonal, only
# over the rows of the second copy.

# %%
attention_evolution(history2, layer=LAST2, max_steps=4, max_tokens=32)

# %% [markdown]
# Layer 0 supplies what it needs: a **previous-token head**, the line just below the diagonal.

# %%
attention_evolution(history2, layer="transformer.h.0.attn", max_steps=3, max_tokens=32)

# %% [markdown]
# ## 5 · The mechanism: K-composition
#
# Write the residual stream at position $s$ after layer 0 as $x_s^{(1)} = e_{x_s} +
# \sum_h o_h(s)$ (with rotary positions nothing positional is added to the stream; queries and keys
# are rotated by their position). A previous-token head $h_0$ attends from $s$ to $s - 1$ and writes
# $o_{h_0}(s) \approx W_O^{h_0} W_V^{h_0} e_{x_{s-1}}$: position $s$ now carries the identity of
# the token *before* it. An induction head $h_1$ of layer 1 scores key $s$ for query $t$ by
#
# $$ x_t^{(1)\top} W_Q^{h_1\top} W_K^{h_1}\, x_s^{(1)} \;\ni\;
#    e_{x_t}^{\top} W_Q^{h_1\top} W_K^{h_1} W_O^{h_0} W_V^{h_0}\, e_{x_{s-1}}, $$
#
# large when $x_{s-1} = x_t$: its *keys* read the output of $h_0$ — **K-composition** (Elhage et al.
# 2021, "A Mathematical Framework for Transformer Circuits"). Its OV circuit then copies
# $x_s$, the token after the earlier occurrence, into the logits. With one layer the keys hold only
# $e_{x_s}$ (rotated by its position), never $x_{s-1}$: the best a one-layer model can do is raise
# the tokens already seen, which is why its repeated-token loss only falls to about the log of the
# number of tokens seen so far, far above the two-layer model's.
#
# Which heads of a trained model matter can also be measured by removing them: the head-pruning
# curve of [notebook 6](06_training.ipynb) shows what is lost as heads go.

# %%
best = int(np.argmax(logs2[-1]["induction"][LAST2]))
prev0 = logs2[-1]["previous"]["transformer.h.0.attn"]
print(f"layer-1 induction scores at the end: {np.round(logs2[-1]['induction'][LAST2], 2)}")
print(f"layer-0 previous-token scores at the end: {np.round(prev0, 2)}")
print(
    f"in-context gain (other − repeated tokens): 2-layer "
    f"{logs2[-1]['other'] - logs2[-1]['repeated']:.2f}, "
    f"1-layer {logs1[-1]['other'] - logs1[-1]['repeated']:.2f} nats"
)
print(f"layer-0 induction score of the 2-layer model at the end: {ind0[-1]:.2f}")
print(f"induction score: 2-layer {ind2[-1]:.2f} (step 0: {ind2[0]:.2f}), 1-layer {ind1[-1]:.2f}")

# %% [markdown]
# **Next:** [notebook 11](11_attention_sinks.ipynb): attention sinks, and streaming past the
# context with a sink cache.
