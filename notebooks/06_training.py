# %% [markdown]
# # 6 · Training: the Noam schedule, label smoothing, and attention as it learns
#
# The Transformer paper trains with two tricks that are easy to state and easy to get wrong:
# a learning rate that warms up and then decays ("Noam", Vaswani et al. 2017, §5.3) and label
# smoothing (§5.4, after Szegedy et al. 2016). This notebook draws both from attnlab's own code,
# then trains an encoder-decoder to **reverse strings** — the first example of
# [The Annotated Transformer](https://nlp.seas.harvard.edu/annotated-transformer/) — with the
# library's trainer, exactly as `attnlab train reverse` does. While it trains we record the
# attention of one fixed probe string, and watch the anti-diagonal of cross-attention (output
# position *i* reads input position *n − 1 − i*) emerge from uniform noise. At the end we ask
# which heads the model needs: head importance and the pruning curve of Michel et al. (2019),
# "Are Sixteen Heads Really Better than One?".
#
# You will learn:
#
# - the Noam schedule, through the real `NoamLR` scheduler, and why it warms up;
# - what a label-smoothed target looks like and why its loss never reaches 0;
# - how a task (`attnlab.tasks`) hands the `Trainer` a model, batches, a loss and an evaluation;
# - held-out exact-match accuracy with greedy decoding (`attnlab.generate`);
# - attention during training: `AttentionProbe`, `attention_evolution`, `head_entropy_curves`;
# - head importance by ablation and by gradient, and what pruning heads costs.

# %%
FULL = False  # True: the full-size run of `attnlab demo` (about two minutes on a laptop CPU)

SEED = 0
if FULL:  # the demo: the task's defaults, 1200 steps, the rate cooled to 0 over the last third
    STEPS, PROBE, N_EVAL = 1200, "abcdefghij", 500
    TASK = dict(num_symbols=10, max_len=16, num_heldout=500)
    TASK |= dict(d_model=128, layers=2, heads=4, d_ff=256, batch_size=64, warmup=200, lr_factor=0.5)
else:  # short strings over 8 letters, one layer each side: learned in about 10 s on one thread
    STEPS, PROBE, N_EVAL = 400, "abcdefgh", 200
    TASK = dict(num_symbols=8, max_len=8, num_heldout=200)
    TASK |= dict(d_model=64, layers=1, heads=4, d_ff=128, batch_size=64, warmup=100, lr_factor=1.0)
COOLDOWN = STEPS // 3
TASK |= dict(cooldown=COOLDOWN, cooldown_end=STEPS)
PROBE_EVERY = max(1, STEPS // 24)  # the probe is recorded 25 times
EVAL_EVERY = STEPS // 4

# %%
import tempfile

import numpy as np
import torch

import attnlab as al
from attnlab import tasks, viz
from attnlab.data.batching import pad_batch
from attnlab.inspect import head_importance, masked_heads, pruning_curve, pruning_order
from attnlab.tasks import get_task
from attnlab.tasks.probe import load_probe_history
from attnlab.tasks.train_options import run_args
from attnlab.training import NoamLR, label_smoothed_cross_entropy
from attnlab.training.rng import seed_everything
from attnlab.training.schedules import noam_rate
from attnlab.viz.pruning import importance_figure, pruning_figure
from attnlab.viz.training import label_smoothing_figure, training_curves
from attnlab.viz.viewer import view

seed_everything(SEED)  # Python's, NumPy's and PyTorch's generators

# %% [markdown]
# ## 1 · The Noam schedule
#
# Adam with β = (0.9, 0.98), ε = 10⁻⁹, and a rate that grows linearly for `warmup` steps and then
# falls as the inverse square root of the step:
#
# $$\text{lrate}(s) = d_\text{model}^{-0.5}\cdot\min\left(s^{-0.5},\; s\cdot\text{warmup}^{-1.5}\right)$$
#
# The two branches meet at `s = warmup`, where the rate peaks at $(d_\text{model}\cdot
# \text{warmup})^{-0.5}$. Early on, Adam's moment estimates rest on a few gradients and its steps
# are unreliable; the warm-up keeps them small until the statistics settle, and the decay then
# lets the weights converge. `attnlab.training.NoamLR` is an ordinary PyTorch scheduler; we step
# it through a real optimizer and compare with the formula.

# %%
d_model, warmup, n_steps = 512, 4000, 10000
opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1.0, betas=(0.9, 0.98), eps=1e-9)
sched = NoamLR(opt, d_model=d_model, warmup_steps=warmup)
rates = []
for _ in range(n_steps):
    rates.append(opt.param_groups[0]["lr"])  # the rate this step uses
    opt.step()
    sched.step()
rates = np.array(rates)
formula = noam_rate(np.arange(1, n_steps + 1), d_model, warmup)
peak = int(rates.argmax()) + 1
print(
    f"peak {rates.max():.3e} at step {peak}; (d_model · warmup)^-0.5 = {(d_model * warmup) ** -0.5:.3e}"
)
print(f"max |NoamLR − formula| = {np.abs(rates - formula).max():.1e}")
assert np.abs(rates - formula).max() < 1e-12
assert peak == warmup

# %% [markdown]
# `viz.noam_curve` draws the same function for the three settings of The Annotated Transformer: a
# wider model gets a smaller rate, a longer warm-up a lower and later peak.

# %%
viz.noam_curve(((512, 4000), (512, 8000), (256, 4000)), steps=20000)

# %% [markdown]
# ## 2 · Label smoothing
#
# With smoothing ε over a vocabulary of $V$ classes, the one-hot target $q$ of a position becomes
#
# $$q'(k) = (1-\varepsilon)\,q(k) + \frac{\varepsilon}{V},\qquad
# \mathcal{L} = H(q', p) = -\sum_k q'(k)\,\log p(k)$$
#
# (PyTorch's `label_smoothing`; padding positions are left out of the mean). Plain cross-entropy
# ($\varepsilon = 0$) keeps rewarding confidence all the way to $p(\text{target}) = 1$. The
# smoothed loss is lowest where $p = q'$, at confidence $1 - \varepsilon + \varepsilon/V$, and
# there it equals the entropy $H(q')$: a model trained with smoothing can never drive its loss
# below $H(q')$, and is pushed back from certainty. The paper notes it "hurts perplexity ... but
# improves accuracy and BLEU". Below, $V$ is the vocabulary of our reverse task (the letters and
# `<pad> <unk> <bos> <eos>`).

# %%
reverse = get_task("reverse")  # the task of `attnlab train reverse` (attnlab.tasks.algorithmic)
run_dir = tempfile.mkdtemp(prefix="attnlab-reverse-")
# its options: a typed dataclass, with the command line's defaults (`--d-model` is d_model)
options = tasks.AlgorithmicOptions(
    task="reverse", out=run_dir, steps=STEPS, seed=SEED, eval_every=EVAL_EVERY,
    probe=PROBE, probe_every=PROBE_EVERY, **TASK,
)  # fmt: skip
data = reverse.make_task(options)  # the strings: attnlab.data.toy_sequences.SequenceTask
tok = data.tokenizer
V, EPS = tok.vocab_size, options.label_smoothing

smoothing = label_smoothing_figure(V, EPS)
q_smooth = torch.from_numpy(smoothing.data["smoothed"])
floor = float(smoothing.data["entropy"])
# the drawn q' is what the trainer's loss uses: H(q', p) by hand == label_smoothed_cross_entropy
logits = torch.randn(5, V, dtype=torch.float64)
by_hand = -(torch.roll(q_smooth, 3) * logits.log_softmax(-1)).sum(-1)  # target class 3
library = label_smoothed_cross_entropy(logits, torch.full((5,), 3), smoothing=EPS, reduction="none")
print(
    f"V = {V}, ε = {EPS}: H(q') = {floor:.4f} nats, lowest loss at p(target) = "
    f"{float(smoothing.data['best_confidence']):.4f}"
)
print(
    f"max |H(q', p) by hand − label_smoothed_cross_entropy| = {(by_hand - library).abs().max():.1e}"
)
assert (by_hand - library).abs().max() < 1e-12
assert smoothing.data["smoothed_loss"].min() >= floor - 1e-9
smoothing

# %% [markdown]
# The same in numbers, for 5 classes: the loss of more and more confident predictions of the
# right class. Without smoothing it falls towards 0; with ε = 0.1 it turns up again past 0.92.

# %%
target = torch.tensor([0])
for eps in (0.0, 0.1):
    losses = []
    for confidence in (0.2, 0.6, 0.9, 0.99, 0.999):
        p = torch.full((1, 5), (1 - confidence) / 4)
        p[0, 0] = confidence
        losses.append(float(label_smoothed_cross_entropy(p.log(), target, smoothing=eps)))
    print(f"ε = {eps}: loss at confidence 0.2 … 0.999 =", [round(v, 3) for v in losses])
    if eps > 0:
        assert losses[-1] > losses[2]  # certainty costs more than 0.9 confidence

# %% [markdown]
# ## 3 · The task and the trainer
#
# The reverse task draws random strings over a small alphabet; the encoder reads the string
# followed by `<eos>` (a landmark: output *i* copies input *n − 1 − i*, a distance from the end),
# the decoder reads `<bos>` and the reversed string and must predict the next letter, then `<eos>`.
# One string in ten (by a hash of the string) is held out and never appears in a training batch.

# %%
batch = data.batch(0, 4)  # the training batch of step 0 (it depends on (seed, step) only)
for s, t_in, t_out in zip(batch.src.tolist(), batch.tgt_in.tolist(), batch.targets.tolist()):
    print(
        f"encoder reads {tok.decode(s, skip_special=False)!r:<28} decoder reads "
        f"{tok.decode(t_in, skip_special=False)!r:<28} and predicts {tok.decode(t_out, skip_special=False)!r}"
    )
heldout = data.heldout()
trained_on = [s[: s.index(tok.eos_id)] for s in data.batch(1, 1000).src.tolist()]
print(f"{len(heldout)} held-out strings, e.g. {[tok.decode(s) for s in heldout[:5]]}")
assert all(data.is_heldout(s) for s in heldout)
assert not any(data.is_heldout(s) for s in trained_on)  # never in a training batch

# %% [markdown]
# `attnlab train reverse` asks the task for a `TaskSetup` — the model, a resumable batch source,
# the optimizer factory (Adam + `--lr-factor` × the Noam rate, cooled linearly to 0 over the last
# third of the run), the label-smoothed loss and the evaluation (exact match of greedy decoding on
# the held-out strings) — and hands it to `attnlab.training.Trainer`. `attnlab.tasks.train` is
# that wiring, the one the command line calls: it takes the task's typed options (here
# `AlgorithmicOptions`), seeds the generators, builds the set-up and trains, with two callbacks:
# the progress bar (`RichProgress`) and, since `probe` is set, `AttentionProbe`, which records the
# attention of the probe string every few steps from step 0 on (in eval mode, without gradients,
# random states restored: recording never changes the training). The equivalent command line:

# %%
print(
    "attnlab train reverse --out RUN --steps", STEPS, "--seed", SEED,
    " ".join(f"--{k.replace('_', '-')} {v}" for k, v in TASK.items()),
    f"--eval-every {EVAL_EVERY} --probe {PROBE} --probe-every {PROBE_EVERY}",
)  # fmt: skip
result = tasks.train(options)  # seeds, builds the task's set-up, runs the Trainer
model, setup = result.model, result.setup
print(
    f"{type(model).__name__}: {sum(p.numel() for p in model.parameters()):,} parameters; "
    f"{model.config.num_encoder_layers} + {model.config.num_decoder_layers} layers, "
    f"d_model {model.config.d_model}, {model.config.num_heads} heads"
)
accuracy = result.eval_metrics["exact_match"]
print(
    f"{result.step} steps in {result.elapsed:.1f} s; last loss {result.losses[-1]:.4f}; "
    f"held-out exact match {100 * accuracy:.1f}%"
)
assert accuracy >= 0.95

# %% [markdown]
# The trainer logged every step to `RUN/metrics.jsonl`. The loss falls fast and then settles on
# the floor of label smoothing, $H(q')$ (dashed): the model is as right as the smoothed target
# lets it be. The learning rate warms up for `--warmup` steps, decays as $1/\sqrt{s}$ and is cooled
# to 0 over the last third; the held-out accuracy climbs to (nearly) 100%.

# %%
curves = training_curves(run_dir, loss_floor=floor, title="attnlab train reverse")
last = np.nanmean(curves.data["loss"][-20:])
print(f"mean loss of the last 20 steps {last:.4f}; the floor H(q') = {floor:.4f}")
assert floor <= last < floor + 0.05
assert curves.data["eval/exact_match"][-1] == accuracy
curves

# %% [markdown]
# ## 4 · Held-out accuracy with `attnlab.generate`
#
# The task's evaluation decodes greedily; here is the same by hand. `al.generate` encodes the
# (padded) sources once and decodes all of them together with a KV cache, from `<bos>` until every
# row has written `<eos>`. A string counts only when every letter and the end are right.

# %%
src = pad_batch([data.model_input(s) for s in heldout], tok.pad_id)  # (N, S)
# (N, 1 + n): <bos> y_1 … y_n <eos>, then <pad> once a row has stopped
out = al.generate(model, src, max_new_tokens=data.max_target_len)


def answer(row):
    """The letters a decoded row wrote: after <bos>, up to its first <eos>."""
    row = row[1:]
    return row[: row.index(tok.eos_id)] if tok.eos_id in row else row


predictions = [answer(r) for r in out.tolist()]
right = [p == data.target(s) for p, s in zip(predictions, heldout)]
by_hand = sum(right) / len(right)
print(f"exact match by hand: {sum(right)}/{len(right)} = {100 * by_hand:.1f}%")
for i in sorted(range(len(heldout)), key=lambda i: -len(heldout[i]))[:6]:
    mark = "✓" if right[i] else "✗"
    print(f"  {mark} {tok.decode(heldout[i]):<10} → {tok.decode(predictions[i])}")
assert by_hand == accuracy  # the trainer's evaluation and generate agree

# %% [markdown]
# ## 5 · Attention during training
#
# `AttentionProbe` wrote the probe's weights of every layer at each recorded step; `load_probe_history`
# reads them back as a `ProbeHistory`. `attention_evolution` shows the last cross-attention layer:
# rows are training steps, columns heads, each panel target positions (labelled by the letter they
# wrote) down and source positions across. At step 0 every head is uniform; within a few hundred
# steps the heads find the **anti-diagonal** — to write the *i*-th output letter, look at input
# letter *n − 1 − i*.

# %%
history = load_probe_history(run_dir)
cross = [n for n in history.layers if history.kinds[n] == "cross"][-1]
w = history.attentions[cross]  # (S, H, T_q, T_k)
n = len(PROBE)
anti = torch.stack([w[:, :, i, n - 1 - i] for i in range(n)], dim=-1).mean(-1)  # (S, H)
print(f"{cross}: mean weight on the anti-diagonal per head")
print(
    f"  step {history.steps[0]:>4}: {anti[0].numpy().round(3)}  (uniform would be {1 / w.shape[-1]:.3f})"
)
print(f"  step {history.steps[-1]:>4}: {anti[-1].numpy().round(3)}")
assert anti[0].max() < 2 / w.shape[-1]  # step 0: near uniform
assert anti[-1].max() > 0.9  # trained: a head reads the mirrored position
viz.attention_evolution(history, max_steps=6)

# %% [markdown]
# The mean row entropy of every head, per layer: all start on the dashed line of uniform attention
# and separate as heads take roles — cross-attention heads that point at one letter fall towards
# 0 nats, while others keep averaging.

# %%
entropy = viz.head_entropy_curves(history)
ent = entropy.data["entropy"]  # (L, S, H)
layer = list(entropy.data["layers"]).index(cross)
print(
    f"{cross} entropy per head, first → last step: {ent[layer, 0].round(2)} → {ent[layer, -1].round(2)}"
)
assert ent[layer, -1].min() < 0.5 * ent[layer, 0].min()
entropy

# %% [markdown]
# The same history in the interactive viewer, with a step slider (`attnlab view RUN --training`
# writes this page to a file): pick a layer and a head, and drag through training.

# %%
view(viz.viewer_data_from_history(history, title="reverse: attention during training"))

# %% [markdown]
# ## 6 · Which heads does the model need?
#
# Michel et al. (2019) score a head $h$ by what removing it costs. *Ablation*: the held-out loss
# with that head's output zeroed, minus the full model's. *Gradient*: multiply each head's output by
# a gate $\xi_h$ and measure
#
# $$I_h = \mathbb{E}_x \left|\frac{\partial \mathcal{L}(x)}{\partial \xi_h}\right|_{\xi = 1}$$
#
# (normalised per layer). `attnlab.inspect.head_importance` computes both on the task's held-out
# batches (`attnlab inspect RUN --ablate` does the same). Removed one at a time, a few heads cost
# a lot and most cost almost nothing — even the cross-attention heads that read the anti-diagonal,
# because other heads (and, in the two-layer model, the other layer) do the same job. Removing
# *all* of cross-attention (`attnlab.inspect.masked_heads`) cuts the decoder off from the source.

# %%
evaluation = reverse.evaluation_set(
    run_args(options), setup.io, N_EVAL
)  # held-out batches + exact match
importance = head_importance(model, evaluation.batches)
H = importance.num_heads
top_layer, top_head = importance.order("ablation")[-1]
print(f"base held-out loss {importance.base_loss:.4f} over {importance.num_batches} batches")
print(
    f"most important single head: {top_layer} head {top_head} "
    f"(+{importance.ablation.max():.3f} nats when removed)"
)
# the heads that read the anti-diagonal (section 5) are covered by the others
readers = [h for h in range(H) if anti[-1, h] > 0.9]
cost = importance.ablation[importance.layers.index(cross)]
print(
    f"{cross}: heads {readers} read the anti-diagonal; removing one alone costs "
    f"{[round(float(cost[h]), 4) for h in readers]} nats"
)
assert readers and max(float(cost[h]) for h in readers) < 0.1
# ... but all of cross-attention together is the only way to the source
cross_layers = [p for p, k in zip(importance.layers, importance.kinds) if k == "cross"]
with masked_heads(model, {p: torch.zeros(H) for p in cross_layers}):
    without_cross = evaluation.metric(model)
print(f"exact match with every cross-attention head removed: {100 * without_cross:.1f}%")
assert without_cross < 0.05
importance_figure(importance)

# %% [markdown]
# The gradient estimate needs one backward pass instead of one pass per head. It mostly agrees on
# which heads matter:

# %%
importance_figure(importance, by="gradient")

# %% [markdown]
# Now remove heads one at a time, least important first, re-estimating the importance of the rest
# after each removal (`pruning_order`), and measure the held-out loss and exact match after each:
# the paper's Figure 3. The first heads go for free; as more go, exact match (which needs every
# letter right) falls well before the loss rises much, and with the last heads gone the model is
# guessing.

# %%
order = pruning_order(model, evaluation.batches, by="ablation")
curve = pruning_curve(model, evaluation.batches, order, metric=evaluation.metric)
print("pruned in order:", ", ".join(f"{p.replace('layers.', '')}[{h}]" for p, h in order))
print("exact match:", [round(m, 3) for m in curve.metric])
free = curve.total_heads // 6
assert abs(curve.loss[0] - importance.base_loss) < 1e-9
assert curve.metric[0] == sum(right[:N_EVAL]) / len(right[:N_EVAL])
assert curve.metric[free] >= curve.metric[0] - 0.05  # the first sixth of the heads costs < 5 points
assert curve.metric[-1] < 0.05  # no heads left: the source is out of reach
pruning_figure(curve, loss_label="held-out loss", metric_label="exact match")

# %% [markdown]
# **Next:** [notebook 7](07_looking_inside.ipynb) looks inside a trained model — capture every layer's attention, check the
# heads' health, find where a NaN comes from, browse the weights in the viewer, and count what
# attention costs.
