# %% [markdown]
# # 19 · Which explanation to trust
#
# attnlab gives nine ways to say what a prediction took from each token
# (`attnlab.inspect.mixing`): the raw attention **weights**, their **rollout** and **flow**
# (Abnar & Zuidema 2020), the **norm** of what each token moves, alone and with the residual
# stream (Kobayashi et al. 2020, 2021), **ALTI** (Ferrando et al. 2022), **value zeroing**
# (Mohebbi et al. 2023), **gradient-weighted attention** (Chefer et al. 2021) and **integrated
# gradients** (Sundararajan et al. 2017). They disagree, often wildly. This notebook scores them
# two ways:
#
# 1. **Faithfulness** — does the model's prediction depend on the tokens an explanation ranks
#    highest? On SmolLM2-135M, for the next token of indirect-object prompts ("When Mary and John
#    went to the store, John gave a drink to" → " Mary") and factual-recall prompts ("The
#    capital of France is" → " Paris"):
#    - **AOPC comprehensiveness** (DeYoung et al. 2020, ERASER): how much the probability of the
#      prediction falls when the top 1, 5, 10, 20, 50 % of the tokens are blanked (higher: the
#      top tokens matter); **AOPC sufficiency**: how much it falls when *only* those are kept
#      (lower: they suffice);
#    - **τ-LOO, ρ-LOO**: Kendall's τ and Spearman's ρ between the explanation and leave-one-out,
#      the exact effect of blanking each token alone;
#    - **τ-patch**: Kendall's τ with exact per-token **patching** (notebook 12): each token's
#      embedding replaced by the one of a *corrupted* prompt (other names, another country),
#      measured on the logit difference answer − foil.
# 2. **Plausibility** — where the truth is known. An encoder-decoder trained to copy or reverse a
#    string writes every output token from one source position, so an alignment can be checked
#    exactly: its **top-1 accuracy** and **token F1** against the true source.
#
# Each table has a **random** row: an explanation that ranks tokens at random. A method is worth
# reading only where it clears that floor. The tables are the ones the command line prints:
#
# ```
# attnlab inspect smollm2-135m --faithfulness --prompt-set ioi      # or factual, or --prompts FILE
# attnlab inspect RUN --plausibility                               # a copy/reverse/sort run
# ```

# %%
FULL = False  # True: 8 prompts of each set, 32 IG steps, runs of 600 steps (tens of minutes)

METHODS = ["weights", "rollout", "norm", "norm_residual", "alti", "value_zeroing",
           "grad_weights", "integrated_gradients", "flow"]  # fmt: skip
if FULL:
    PROMPTS = 8  # of each set
    IG_STEPS = 32
    RANDOM_DRAWS = 5
    TRAIN = dict(steps=600, batch_size=32, eval_every=600)
    HELD_OUT = 200  # held-out strings of each task, all scored
else:
    PROMPTS = 1
    # the methods that cost one forward (or one backward) each; rollout, value zeroing,
    # integrated gradients and flow (a maximum flow per pair over 30 layers) at full size only
    METHODS = ["weights", "norm", "norm_residual", "alti", "grad_weights"]
    IG_STEPS = 4  # integrated gradients: 4 interpolation steps instead of 32
    RANDOM_DRAWS = 2  # random explanations averaged per prompt, instead of 5
    TRAIN = dict(steps=150, batch_size=32, eval_every=150)
    HELD_OUT = 40

# %%
import tempfile
from pathlib import Path

import torch
from matplotlib.figure import Figure

import attnlab as al
from attnlab import tasks, viz
from attnlab.data import prompt_sets
from attnlab.inspect import faithfulness_over_prompts
from attnlab.inspect.plausibility import (
    ALIGNMENT_METHODS,
    plausibility_of_batches,
    plausibility_table,
)
from attnlab.tasks.registry import get_task
from attnlab.tasks.run import load_run

torch.manual_seed(0)
model, tokenizer = al.load_pretrained("smollm2-135m")
model.eval()
BLANK = tokenizer.eos_id  # the token that replaces a removed one (what the CLI uses by default)
print(f"SmolLM2-135M, blank token {BLANK} ({tokenizer.decode([BLANK])!r})")

# %% [markdown]
# ## 1 · Faithfulness on SmolLM2
#
# `faithfulness_over_prompts` explains each prompt's next token with every method (the row of
# the last position: rolled out through the layers where the method rolls out, else the last
# layer's), blanks tokens in the order each method ranks them, and averages the measures over
# the prompts (mean ± standard deviation). Flow costs a maximum-flow problem per layer graph; it
# is capped at 32 tokens, which these prompts fit.

# %%
results = {}
for name in ("ioi", "factual"):
    prompts = prompt_sets.load(name)[:PROMPTS]
    results[name] = faithfulness_over_prompts(
        model, prompts, tokenizer.encode, METHODS, blank_id=BLANK, decode=tokenizer.decode,
        steps=IG_STEPS, random_draws=RANDOM_DRAWS,
    )  # fmt: skip
    print(f"── {name}: {prompts[0].prompt!r} → {results[name].predictions[0]!r}, …")
    print(results[name].table(), "\n")

# %% [markdown]
# The figure puts the two measures that rank *all* tokens side by side: agreement with
# leave-one-out (τ-LOO) and with patching (τ-patch), one point per method (± one standard
# deviation over the prompts), the random row a black cross. Up and to the right is better.

# %%
fig = Figure(figsize=(9, 3.6))
axes = fig.subplots(1, 2, sharey=True)
data = {}
for ax, (name, result) in zip(axes, results.items()):
    colours = [f"C{i}" for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)]  # C7 is grey: random's
    for i, row in enumerate(result.rows):
        random_row = row.method == "random"
        ax.errorbar(row.mean["kendall_tau"], row.mean["patching_tau"],
                    xerr=row.std["kendall_tau"], yerr=row.std["patching_tau"],
                    fmt="x" if random_row else "o", color="black" if random_row else colours[i],
                    label=row.method, capsize=2)  # fmt: skip
        data[f"{name}/{row.method}"] = [row.mean["kendall_tau"], row.mean["patching_tau"]]
    ax.axhline(0, color="grey", lw=0.6)
    ax.axvline(0, color="grey", lw=0.6)
    ax.set_title(f"{name}: {len(result.prompts)} prompt(s)", fontsize=9)
    ax.set_xlabel("τ with leave-one-out")
    ax.grid(True, alpha=0.3)
axes[0].set_ylabel("τ with per-token patching")
axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
fig.tight_layout()
viz.Plot(fig, data)

# %% [markdown]
# **What the tables show.** *At full size*, the command line's table (the same call; 8 IOI
# prompts of 13–15 tokens, SmolLM2 predicts the expected name on all 8; 32 IG steps, 5 random
# draws a prompt):
#
# ```
# attnlab inspect smollm2-135m --faithfulness --prompt-set ioi --methods \
#     weights,rollout,norm,norm_residual,alti,value_zeroing,grad_weights,integrated_gradients,flow
# ```
#
# | method               | AOPC comp. ↑  | AOPC suff. ↓  | τ-LOO ↑        | ρ-LOO ↑        | τ-patch ↑      |
# |----------------------|---------------|---------------|----------------|----------------|----------------|
# | weights              | 0.719 ± 0.143 | 0.720 ± 0.147 | 0.604 ± 0.118  | 0.772 ± 0.112  | 0.166 ± 0.119  |
# | rollout              | 0.715 ± 0.140 | 0.728 ± 0.153 | −0.006 ± 0.116 | −0.021 ± 0.134 | 0.003 ± 0.018  |
# | norm                 | 0.728 ± 0.153 | 0.725 ± 0.154 | 0.606 ± 0.096  | 0.765 ± 0.103  | 0.088 ± 0.092  |
# | norm_residual        | 0.728 ± 0.153 | 0.725 ± 0.154 | 0.606 ± 0.096  | 0.765 ± 0.103  | 0.088 ± 0.092  |
# | alti                 | 0.716 ± 0.141 | 0.728 ± 0.153 | 0.422 ± 0.069  | 0.520 ± 0.093  | 0.360 ± 0.052  |
# | value_zeroing        | 0.728 ± 0.153 | 0.722 ± 0.156 | 0.603 ± 0.071  | 0.762 ± 0.083  | 0.062 ± 0.094  |
# | grad_weights         | 0.719 ± 0.143 | 0.718 ± 0.149 | 0.652 ± 0.111  | 0.828 ± 0.105  | 0.341 ± 0.069  |
# | integrated_gradients | 0.663 ± 0.148 | 0.728 ± 0.154 | 0.146 ± 0.233  | 0.196 ± 0.316  | 0.061 ± 0.174  |
# | flow                 | 0.716 ± 0.141 | 0.728 ± 0.153 | 0.136 ± 0.117  | 0.176 ± 0.123  | 0.246 ± 0.007  |
# | random               | 0.495 ± 0.139 | 0.728 ± 0.153 | 0.003 ± 0.098  | −0.005 ± 0.116 | −0.027 ± 0.090 |
#
# On IOI every method's top tokens matter more than random ones (comprehensiveness 0.66–0.73
# against 0.50), but the measures that rank *every* token separate them: the last layer's
# weights, norm, value zeroing and gradient-weighted attention agree with leave-one-out
# (τ ≈ 0.6), rollout does no better than random (τ −0.01), and flow and integrated gradients
# (zero-embedding baseline) little better. Against patching — which tokens carry the names'
# difference — ALTI and gradient-weighted attention lead (τ ≈ 0.35), the last layer's raw
# weights and norms trail. No method leads on every column; the gradient-weighted attention
# comes closest.
#
# On the 8 factual prompts (5–6 tokens; SmolLM2 predicts the expected answer on 6 of 8),
# `attnlab inspect smollm2-135m --faithfulness --prompt-set factual --methods …` (the same nine):
#
# | method               | AOPC comp. ↑  | AOPC suff. ↓  | τ-LOO ↑        | ρ-LOO ↑        | τ-patch ↑      |
# |----------------------|---------------|---------------|----------------|----------------|----------------|
# | weights              | 0.470 ± 0.289 | 0.492 ± 0.260 | 0.175 ± 0.128  | 0.170 ± 0.180  | 0.093 ± 0.221  |
# | rollout              | 0.466 ± 0.296 | 0.499 ± 0.251 | −0.525 ± 0.212 | −0.605 ± 0.250 | −0.201 ± 0.337 |
# | norm                 | 0.474 ± 0.288 | 0.493 ± 0.260 | 0.292 ± 0.100  | 0.384 ± 0.113  | 0.093 ± 0.221  |
# | norm_residual        | 0.500 ± 0.249 | 0.481 ± 0.275 | 0.342 ± 0.090  | 0.459 ± 0.133  | 0.054 ± 0.113  |
# | alti                 | 0.463 ± 0.301 | 0.499 ± 0.251 | −0.217 ± 0.236 | −0.220 ± 0.303 | 0.122 ± 0.239  |
# | value_zeroing        | 0.473 ± 0.288 | 0.493 ± 0.260 | 0.267 ± 0.094  | 0.346 ± 0.074  | 0.093 ± 0.221  |
# | grad_weights         | 0.470 ± 0.289 | 0.492 ± 0.260 | 0.117 ± 0.227  | 0.104 ± 0.282  | −0.381 ± 0.486 |
# | integrated_gradients | 0.486 ± 0.268 | 0.491 ± 0.262 | 0.100 ± 0.283  | 0.118 ± 0.419  | −0.115 ± 0.341 |
# | flow                 | 0.466 ± 0.296 | 0.499 ± 0.251 | −0.525 ± 0.212 | −0.605 ± 0.250 | −0.201 ± 0.337 |
# | random               | 0.479 ± 0.276 | 0.489 ± 0.264 | 0.035 ± 0.099  | 0.056 ± 0.137  | −0.002 ± 0.227 |
#
# On prompts this short, blanking the top 1–3 of 5 tokens separates nothing (every row's
# comprehensiveness, random's included, is 0.46–0.50): the ERASER measures need longer inputs.
# The rank agreement still does: the norm-based methods and value zeroing agree with
# leave-one-out (τ 0.27–0.34), while rollout and flow rank the tokens *against* it (τ −0.53) —
# they pile the score on the first tokens ("The"), which matter least — and ALTI, which rolls out
# too, follows them (τ −0.22). With one changed token per prompt, τ-patch is noise here
# (standard deviations of 0.1–0.5). Two prompt sets, two different winners: the last layer's
# gradient-weighted attention on IOI, the residual-aware norm on factual recall.
#
# **What they do not show.** Sufficiency saturates on short prompts: with only the top 1–7 of
# 5–15 tokens kept and the rest blanked, the prediction's probability is near 0 for *every*
# method, so the column hardly separates them (the ERASER bins were designed for documents of
# hundreds of tokens). Leave-one-out with an end-of-text token is one choice of baseline among
# many (a padding token, a mean embedding, a random word): another blank moves τ-LOO. τ-patch is
# defined only through the positions where the corrupted prompt differs (one to three tokens
# here); everywhere else its importance is exactly 0, a tie, so it mostly says whether a method
# ranks the changed tokens high. And eight prompts of two templates are a sample, not the
# distribution: the standard deviations are as wide as many of the gaps.

# %% [markdown]
# ## 2 · Plausibility where the truth is known
#
# Train two small encoder-decoders with the command line (`attnlab train copy|reverse`: strings
# of up to 8 of 8 symbols, 2 + 2 layers of width 32, 4 heads), then score each method's source
# alignment on held-out strings — the table `attnlab inspect RUN --plausibility` prints. On copy
# the source of output token $i$ is source position $i$; on reverse it is position $n - 1 - i$.
# The encoder-decoder methods are the ones that can align a target position with source tokens
# (`ALIGNMENT_METHODS`): the cross-attention weights, their rollout through the encoder, the norm
# of what each source token moves, with the residual stream, and ALTI+; value zeroing and the
# gradient methods explain one stack's positions, not across the cross-attention.

# %%
RUNS = Path(tempfile.mkdtemp(prefix="attnlab19_"))
# `attnlab train TASK --num-symbols 8 --max-len 8 --d-model 32 --layers 2 --heads 4 --d-ff 64
# --label-smoothing 0 …` through its library call, without the report's figures
SIZE = dict(num_symbols=8, max_len=8, num_heldout=HELD_OUT, d_model=32, layers=2, heads=4,
            d_ff=64, label_smoothing=0.0, device="cpu", **TRAIN)  # fmt: skip
plausible = {}
for task_name in ("copy", "reverse"):
    out = RUNS / task_name
    tasks.train(task_name, out=str(out), progress=False, report=None, **SIZE)
    run = load_run(str(out))
    cfg = run.model.config
    held_out = get_task(task_name).evaluation_set(run.args, run.io, HELD_OUT)
    accuracy = held_out.metric(run.model.eval())
    rows = plausibility_of_batches(
        run.model, held_out.batches, ALIGNMENT_METHODS,
        ignore_ids=[cfg.pad_id, cfg.bos_id, cfg.eos_id],
    )  # fmt: skip
    plausible[task_name] = rows
    print(f"── {task_name}: exact match {accuracy:.2f} on {HELD_OUT} held-out strings")
    print(plausibility_table(rows), "\n")

# %%
fig = Figure(figsize=(8, 3.2))
ax = fig.subplots()
width = 0.38
names = [r.method for r in plausible["copy"]]
for k, (task_name, rows) in enumerate(plausible.items()):
    xs = [i + (k - 0.5) * width for i in range(len(rows))]
    ax.bar(xs, [r.top1 for r in rows], width, label=f"{task_name}: top-1", color=f"C{k}")
ax.set_xticks(range(len(names)), names, fontsize=8)
ax.set_ylabel("top-1 accuracy of the alignment")
ax.set_ylim(0, 1)
ax.legend(fontsize=8)
ax.grid(True, axis="y", alpha=0.3)
fig.tight_layout()
viz.Plot(fig, {t: [r.top1 for r in rows] for t, rows in plausible.items()})

# %% [markdown]
# Robust facts only: in each faithfulness table the best method's τ-LOO clears random's by a
# margin (and on IOI its comprehensiveness too), and on the trained runs the best alignment
# clears random by a wide margin.

# %%
for name, result in results.items():
    by = {r.method: r for r in result.rows}
    best = max(by[m].mean["kendall_tau"] for m in METHODS)
    assert best > by["random"].mean["kendall_tau"] + 0.1, (name, best)
by = {r.method: r for r in results["ioi"].rows}  # comprehensiveness separates on IOI only
assert (
    max(by[m].mean["comprehensiveness"] for m in METHODS)
    > by["random"].mean["comprehensiveness"] + 0.05
)
for task_name, rows in plausible.items():
    random_row = rows[-1]
    assert random_row.method == "random"
    best = max(r.top1 for r in rows[:-1])
    assert best > random_row.top1 + 0.1, (task_name, best, random_row.top1)
print("random is never the best row")

# %% [markdown]
# **What the plausibility tables show.** *At full size* (600 steps of 32 strings, exact match
# 98.0 % on copy and 95.5 % on reverse; 1133 target positions of 200 held-out strings):
#
# ```
# attnlab train copy --out runs/copy --num-symbols 8 --max-len 8 --num-heldout 200 \
#     --d-model 32 --layers 2 --heads 4 --d-ff 64 --label-smoothing 0 --steps 600 \
#     --batch-size 32 --eval-every 600 --device cpu
# attnlab inspect runs/copy --plausibility                   # the same two for reverse
# ```
#
# | method        | copy top-1 | copy F1 | reverse top-1 | reverse F1 |
# |---------------|-----------:|--------:|--------------:|-----------:|
# | weights       | 0.996      | 0.794   | 0.992         | 0.786      |
# | rollout       | 0.993      | 0.777   | 0.463         | 0.485      |
# | norm          | 0.996      | 0.794   | 0.994         | 0.784      |
# | norm_residual | 0.996      | 0.794   | 0.995         | 0.780      |
# | alti          | 0.971      | 0.792   | 0.981         | 0.814      |
# | random        | 0.178      | 0.177   | 0.189         | 0.186      |
#
# Once the model has learnt the task, the cross-attention points at the source almost every
# time, and the norm-based and ALTI+ alignments agree. Token F1 sits below top-1 because of
# repeated letters: a letter that occurs twice has two true sources, and the model attends to
# one. Rollout through the encoder is the exception on reverse (0.46): multiplying the encoder's
# self-attention in spreads each source position over its neighbours, and on reverse the encoder
# has learnt to move information between positions, so the rolled-out map blurs exactly where
# the cross-attention is sharp. The small-size run above trains only 150 steps and scores 40
# strings: the models are far from exact there, and the table says how plausible the alignments
# of a half-trained model are, not of a trained one.
#
# **What they do not show.** Copy and reverse are the easiest alignments there are: one source
# position per output token, found by position alone. A method that points at the right source
# here can still be wrong where the model combines several tokens (sort, translation), and a
# model may solve the task while its attention looks elsewhere (a decoder that has learnt
# positions could attend to a neighbour and still copy correctly through the residual stream).
# Plausibility measures agreement with *our* idea of the source, not with what the model used;
# faithfulness, above, measures the model, but only through blanking and patching, each with its
# own baseline. Neither alone says an explanation is right: read a method where both agree.
#
# **What we found.** No method is best everywhere, and the ranking depends on the question. On
# SmolLM2's IOI prompts, rolling the weights out through the layers (rollout, and flow) loses the
# agreement with leave-one-out that the last layer's own weights have, while ALTI and
# gradient-weighted attention agree best with patching; sufficiency, on prompts this short,
# separates nothing. On copy and reverse, once the model has learnt the task, the cross-attention
# weights, the norms and ALTI+ all point at the true source, and rollout through the encoder is
# the one that does not (on reverse). Read a heat map only after asking which of these tables it
# would pass: `attnlab inspect … --faithfulness --prompt-set …` and `attnlab inspect RUN
# --plausibility` print them.
#
# **Next:** [notebook 20](20_what_each_layer_predicts.ipynb): what each layer predicts — the logit
# lens and a tuned lens on SmolLM2, layer by layer.
