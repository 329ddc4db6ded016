# %% [markdown]
# # 8 · A character language model, and English → Japanese translation
#
# Two real models on real data, each built from the same parts that `attnlab train lm` and
# `attnlab train translate` use (`src/attnlab/tasks/lm.py`, `src/attnlab/tasks/translate.py`):
#
# 1. **A character-level GPT on tinyshakespeare** — nanoGPT's `shakespeare_char` recipe
#    (Karpathy, [nanoGPT](https://github.com/karpathy/nanoGPT); the GPT-2 architecture of
#    Radford et al. 2019). We build the tokenizer, the batches, the model, the optimiser and the
#    trainer, watch the loss fall, sample text with `attnlab.generate`, and look at what one head
#    attends to over a line of text.
# 2. **An encoder-decoder on small_parallel_enja** (50 000 English–Japanese pairs of the Tanaka
#    corpus) — the Transformer of Vaswani et al. (2017), as in
#    [The Annotated Transformer](https://nlp.seas.harvard.edu/annotated-transformer/). Its
#    cross-attention, drawn with source and target words on the axes, is a soft *alignment*
#    between the two sentences (Bahdanau et al. 2015, §5.2.2).
#
# `FULL = False` trains each model for under ten seconds: the language model already spells
# words, the translation model has only started. `FULL = True` trains nanoGPT's full CPU recipe
# and a translation model for several minutes, which is what it takes for a real alignment.

# %%
import re
import tempfile
import time
from pathlib import Path

import torch
from IPython.display import display

import attnlab as al
from attnlab import tasks, viz
from attnlab.data import corpora
from attnlab.data.text import LMBatchSource
from attnlab.data.tokenizers import train_word_level
from attnlab.inspect import capture
from attnlab.tasks.figures import capture_inputs
from attnlab.tasks.lm import LMIO, generate_text, lm_loss, load_corpus
from attnlab.tasks.translate import corpus_bleu
from attnlab.viz.alignment import alignment_heatmap

FULL = False  # True: the full-size runs (minutes: nanoGPT's 2000 steps, then 1000 en→ja steps)

# the language model: nanoGPT's CPU recipe at full size, a narrower and shallower GPT otherwise
LM = dict(
    n_layer=4 if FULL else 2,
    n_embd=128 if FULL else 64,
    n_head=4,
    block_size=64,
    batch_size=12,
    steps=2000 if FULL else 600,
    lr=1e-3 if FULL else 5e-3,
    min_lr=1e-4 if FULL else 5e-4,
    warmup=100 if FULL else 50,
    eval_iters=20 if FULL else 10,  # batches per evaluation
)
# the translation model: every training pair and 1000 steps at full size, 10 000 pairs and
# smaller batches otherwise
MT = dict(
    pairs=50_000 if FULL else 10_000,
    d_model=128,
    layers=2,
    heads=4,
    d_ff=512,
    max_tokens=1024 if FULL else 384,
    dropout=0.1 if FULL else 0.0,  # the Transformer's 0.1; a short run has nothing to regularise
    warmup=400 if FULL else 200,
    steps=1000 if FULL else 110,
)
WORK = Path(tempfile.mkdtemp(prefix="attnlab_nb08_"))  # run folders (checkpoints, metrics)
START = time.perf_counter()

# %% [markdown]
# ## Part 1 — a character-level GPT
#
# ### The data and the tokenizer
#
# nanoGPT's `shakespeare_char` reads the 1.1 million characters of tinyshakespeare, makes every
# distinct character a token (65 of them), and keeps the first 90 % for training and the last
# 10 % for validation. `load_corpus` is exactly that (it is what `attnlab train lm --data NAME|FILE`
# calls). tinyshakespeare ships with attnlab: `attnlab.data.corpora` lists the packaged datasets
# and their licences.

# %%
corpus = load_corpus("tinyshakespeare")  # packaged with attnlab (attnlab.data.corpora)
tok = corpus.tokenizer
print(f"vocabulary: {tok.vocab_size} characters: {''.join(tok.chars)!r}")
print(f"train: {len(corpus.train):,} tokens, validation: {len(corpus.val):,} tokens")
line = "O Romeo, Romeo! wherefore art thou Romeo?"
ids = tok.encode(line)
print(ids[:12], "…")
assert tok.decode(ids) == line  # characters in, the same characters out
assert tok.vocab_size == 65

# %% [markdown]
# ### Batches: random windows, targets shifted by one
#
# A batch is `B` random windows of `T = block_size` tokens; the target of position `t` is the
# token at `t + 1`. `LMBatchSource.batch(step)` is a pure function of the seed and the step, so a
# resumed run reads the same batches.

# %%
train_batches = LMBatchSource(corpus.train, LM["block_size"], LM["batch_size"], seed=0, stream=0)
val_batches = LMBatchSource(corpus.val, LM["block_size"], LM["batch_size"], seed=0, stream=1)
b = train_batches.batch(0)
print(b.input_ids.shape, repr(tok.decode(b.input_ids[0, :40].tolist())))
assert torch.equal(b.targets[:, :-1], b.input_ids[:, 1:])

# %% [markdown]
# ### The model and its loss
#
# A GPT-2 decoder (`attnlab.GPT`): token and position embeddings, `n_layer` blocks of causal
# self-attention and MLP, and a head tied to the token embedding. It is trained on the mean
# next-token cross-entropy over every position of the batch:
#
# $$\mathcal{L} = -\frac{1}{BT}\sum_{b,t} \log \operatorname{softmax}(\text{logits}_{b,t})[x_{b,t+1}]$$
#
# Before training the model predicts nearly uniformly, so the loss starts at about
# $\ln V = \ln 65 \approx 4.17$.

# %%
torch.manual_seed(0)
lm_config = al.GPTConfig(
    vocab_size=tok.vocab_size,
    n_positions=LM["block_size"],
    n_embd=LM["n_embd"],
    n_layer=LM["n_layer"],
    n_head=LM["n_head"],
    dropout=0.0,
)
gpt = al.GPT(lm_config)
print(f"{sum(p.numel() for p in gpt.parameters()):,} parameters")
with torch.no_grad():
    first = float(lm_loss(gpt, b).loss)
print(f"loss before training: {first:.3f} (ln 65 = {torch.log(torch.tensor(65.0)):.3f})")
assert abs(first - torch.log(torch.tensor(65.0)).item()) < 0.3

# %% [markdown]
# ### Training
#
# AdamW (β₂ = 0.99, weight decay on the matrices only) with nanoGPT's learning rate: a linear
# warm-up for $w$ steps, then a cosine decay to `min_lr` at the last step $N$:
#
# $$\eta(s) = \begin{cases} \eta_{\max}\, s / w & s \le w \\ \eta_{\min} + \tfrac12(\eta_{\max} - \eta_{\min})\left(1 + \cos\pi\frac{s - w}{N - w}\right) & s > w \end{cases}$$
#
# `attnlab.tasks.train` is what `attnlab train lm` runs: the task builds exactly the pieces above
# (the corpus, the batches, the GPT, `lm_loss`, AdamW and the schedule) and the `Trainer` runs
# them: gradient clipping at 1.0, a `metrics.jsonl` line a step, a checkpoint at the end, and an
# evaluation (train and validation loss on 20 fixed batches each, 10 at the small size) four times
# during the run.


# %%
lm_result = tasks.train(
    "lm", data="tinyshakespeare", out=WORK / "shakespeare", steps=LM["steps"],
    eval_every=LM["steps"] // 4, eval_iters=LM["eval_iters"], block_size=LM["block_size"],
    batch_size=LM["batch_size"], n_layer=LM["n_layer"], n_embd=LM["n_embd"],
    n_head=LM["n_head"], lr=LM["lr"], min_lr=LM["min_lr"], warmup=LM["warmup"],
)  # fmt: skip
gpt = lm_result.model  # the task built the same GPT (same seed, same config) and trained it
print(f"{lm_result.step} steps in {lm_result.elapsed:.1f} s")

# %% [markdown]
# The training loss falls from $\ln 65$ towards the validation loss of each evaluation (the run's
# `metrics.jsonl`, drawn by `viz.training_curves`; nanoGPT's full recipe, `FULL = True`, reaches a
# validation loss of about 1.88, and `benchmarks/shakespeare.py` measures 1.89 for attnlab).

# %%
display(viz.training_curves(WORK / "shakespeare", title="character LM on tinyshakespeare"))
losses = torch.tensor(lm_result.losses)
window = LM["steps"] // 8
print(f"step      1       loss      {losses[0]:.3f}")
for start in range(0, LM["steps"], window):
    chunk = losses[start : start + window]
    print(f"steps {start + 1:>5}–{start + len(chunk):<5} mean loss {chunk.mean():.3f}")
final = lm_result.eval_metrics
print(f"final: train {final['train_loss']:.3f}, validation {final['val_loss']:.3f}")
assert losses[-window:].mean() < losses[0] - 1.5  # from ≈ ln 65 = 4.17
assert final["val_loss"] < (1.95 if FULL else 2.25)

# %% [markdown]
# ### Generating text
#
# `attnlab.generate` decodes with a KV cache: each new character is sampled from the softmax of
# the last position's logits at temperature $\tau$, among the `top_k` most likely ones:
#
# $$p(x_{t+1} = v \mid x_{\le t}) \propto \exp(\text{logit}_v / \tau), \quad v \in \text{top-}k$$
#
# The context holds 64 characters, so one call writes up to $64 - |\text{prompt}|$ of them.
# `generate_text` (what `attnlab generate` uses) writes longer texts by sliding the window, as
# nanoGPT's `sample.py` does.

# %%
prompt = tok.encode("ROMEO:\n")
g = torch.Generator().manual_seed(1)
out = al.generate(
    gpt,
    torch.tensor([prompt]),
    max_new_tokens=LM["block_size"] - len(prompt),
    strategy="sample",
    temperature=0.8,
    top_k=20,
    generator=g,
)
print(tok.decode(out[0].tolist()))
print("-" * 60)
sample = tok.decode(
    generate_text(
        gpt, prompt, max_new_tokens=400, strategy="sample", temperature=0.8, top_k=20,
        generator=torch.Generator().manual_seed(2),
    )
)  # fmt: skip
print(sample)

# %% [markdown]
# How much of that is English? The share of the sample's words that occur in the training text,
# against the same share for 400 characters drawn independently from the characters' frequencies
# (a model that knows which letters are common, but no words).

# %%
known = set(re.findall(r"[A-Za-z]+", tok.decode(corpus.train.tolist())))


def english_share(text):
    words = re.findall(r"[A-Za-z]+", text)
    return sum(w in known for w in words) / len(words)


counts = torch.bincount(corpus.train, minlength=tok.vocab_size).float()
unigram = tok.decode(torch.multinomial(counts, 400, True, generator=g.manual_seed(3)).tolist())
share, baseline = english_share(sample), english_share(unigram)
print(f"words of the sample found in the training text: {share:.0%} "
      f"(letters drawn by frequency alone: {baseline:.0%})")  # fmt: skip
assert share > baseline + (0.4 if FULL else 0.15)

# %% [markdown]
# ### What one head looks at over a line of text
#
# `attnlab.inspect.capture` records the attention weights $\operatorname{softmax}(QK^\top /
# \sqrt{d})$ of every layer while the model reads a line. The first layer's four heads, queries
# (the character being read) down and keys (the characters it may see) across — the causal mask
# keeps every query on the diagonal or to its left:

# %%
io = LMIO(tok, LM["block_size"])
line_inputs = io.probe_inputs(line)  # exactly the tokens the model reads
labels = [c.replace(" ", "␣") for c in line_inputs.tokens]
with capture(gpt) as cache:
    gpt.eval()
    gpt(*line_inputs.tensors())
layer = "transformer.h.0.attn"
weights = cache.attentions[layer][0]  # (H, T, T)
viz.head_grid(weights, query_tokens=labels, key_tokens=labels, title=f"{layer}: {line!r}")

# %% [markdown]
# A character model must first see the characters just read: some first-layer heads put most
# of their weight on the last three characters $i-2, i-1, i$, a band along the diagonal. For
# each head, that weight averaged over the line, against what a head attending uniformly to
# everything it may see would give; the most local head, drawn alone:

# %%
T = weights.shape[-1]
band = torch.tril(torch.ones(T, T)) - torch.tril(torch.ones(T, T), diagonal=-3)  # keys i-2..i
causal = al.masks.causal_mask(T)
uniform = causal.float() / causal.sum(-1, keepdim=True)
local = (weights * band).sum(-1).mean(-1)  # (H,)
uniform_local = float((uniform * band).sum(-1).mean())
print("weight on the last 3 characters, per head:", [f"{v:.2f}" for v in local],
      f"(uniform attention: {uniform_local:.2f})")  # fmt: skip
head = int(local.argmax())
assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:2]), atol=1e-5)
assert float(weights.triu(1).abs().max()) == 0.0  # causal: nothing to the right
assert local[head] > 2 * uniform_local
viz.attention_heatmap(
    weights[head], query_tokens=labels, key_tokens=labels, mask=causal,
    title=f"{layer}, head {head}",
)  # fmt: skip

# %% [markdown]
# ## Part 2 — English → Japanese
#
# ### The corpus and its vocabularies
#
# small_parallel_enja holds 50 000 training pairs (500 dev, 500 test) of 4–16 words, English
# tokenised and lower-cased, Japanese segmented into words by KyTea. Because the text is already
# split into words, we use word-level vocabularies (`attnlab train translate --tokenizer word`;
# the task's default is BPE), so that the figure's labels are whole words. The tokenizers are
# trained on the training split only and reserve `<pad> <bos> <eos> <unk>`.

# %%
train_pairs = corpora.load_parallel("small_parallel_enja", "train")  # packaged with attnlab
dev = corpora.load_parallel("small_parallel_enja", "dev")
src_lines, tgt_lines = train_pairs.src[: MT["pairs"]], train_pairs.tgt[: MT["pairs"]]
src_tok = train_word_level(src_lines, 8000, min_frequency=2)
tgt_tok = train_word_level(tgt_lines, 8000, min_frequency=2)
print(f"{len(src_lines):,} pairs; vocabularies: en {src_tok.vocab_size}, ja {tgt_tok.vocab_size}")
for s, t in list(zip(src_lines, tgt_lines))[:3]:
    print(f"  {s}\n    {t}")

# %% [markdown]
# ### The encoder-decoder, the Noam schedule, and training
#
# `attnlab.Transformer` (post-norm, sinusoidal positions, dropout 0.1 — none in the short run
# of `FULL = False`) is trained with
# label-smoothed cross-entropy ($\epsilon = 0.1$) over the non-padding target tokens, and Adam
# (β = 0.9, 0.98) with the rate of Vaswani et al. (2017, §5.3):
#
# $$\eta(s) = d_{\text{model}}^{-0.5} \cdot \min\left(s^{-0.5},\; s \cdot w^{-1.5}\right)$$
#
# Batches hold sentences of similar length, up to `max_tokens` padded tokens each
# (`BucketedBatchSource`). `attnlab.tasks.train("translate", ...)` — what `attnlab train
# translate` runs — builds all of it from the training files, with word-level vocabularies of the
# sizes above (the most frequent words), and trains; `setup.io` is the task's one path from a text
# to the model's input and back.

# %%
for name, lines in (("train.en", src_lines), ("train.ja", tgt_lines)):  # the task reads files
    (WORK / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
mt_result = tasks.train(
    "translate", src=WORK / "train.en", tgt=WORK / "train.ja", out=WORK / "enja",
    steps=MT["steps"], tokenizer="word", src_vocab=src_tok.vocab_size,
    tgt_vocab=tgt_tok.vocab_size, d_model=MT["d_model"], layers=MT["layers"],
    heads=MT["heads"], d_ff=MT["d_ff"], max_tokens=MT["max_tokens"], warmup=MT["warmup"],
    dropout=MT["dropout"], beams=1,
)  # fmt: skip
translator, mt_io = mt_result.model, mt_result.setup.io
print(f"{sum(p.numel() for p in translator.parameters()):,} parameters")
mt_losses = torch.tensor(mt_result.losses)
k = max(1, MT["steps"] // 10)
print(f"{mt_result.step} steps in {mt_result.elapsed:.1f} s; "
      f"loss {mt_losses[:k].mean():.2f} (first {k}) → {mt_losses[-k:].mean():.2f} (last {k})")  # fmt: skip
assert mt_losses[-k:].mean() < mt_losses[:k].mean() - 2.0

# %% [markdown]
# ### Translations and BLEU
#
# Greedy decoding of held-out dev sentences, and corpus BLEU (sacrebleu) on the first 200. After
# a few seconds on 10 000 pairs the model has learnt the frame of a Japanese sentence (a subject
# with は, a verb ending, 。) and little else. `python benchmarks/translate_enja.py` trains the
# task's default model (BPE, 3 layers) for 25 minutes and reaches a test BLEU of 28.4.

# %%
examples = [
    "i study english every day .",
    "i like french food very much .",
    "he lived a hard life .",
]
for s, t in zip(examples, mt_io.translate(translator, examples)):
    print(f"{s}\n  → {t}")
n_bleu = 200
hyps = mt_io.translate(translator, dev.src[:n_bleu], lenient=True)
bleu = corpus_bleu(hyps, dev.tgt[:n_bleu])
print(f"dev BLEU (greedy, {n_bleu} sentences): {bleu:.1f}")
assert bleu > (10.0 if FULL else 1.0)

# %% [markdown]
# ### Cross-attention as an alignment
#
# The decoder reads the reference translation (teacher forcing, `target=`), and we capture its
# cross-attention: row $i$ is where the decoder looked in the English sentence to write the
# $i$-th Japanese word, $\operatorname{softmax}_j(q_i \cdot k_j / \sqrt{d})$, averaged over the
# layer's heads. The ring marks each row's largest weight. Japanese puts the verb last
# (私 は 毎日 英語 の 勉強 を する = I · every day · English · study · do), so a learnt alignment
# is not a diagonal: 英語 should look at *english*, 勉強 at *study*, 毎日 at *every day*.
# `alignment_heatmap` draws the labels in an installed font that holds Japanese glyphs (Debian's
# `fonts-ipafont-gothic` or `fonts-noto-cjk`); without one it draws them as □ and says so.

# %%
sentence, reference = "i study english every day .", "私 は 毎日 英語 の 勉強 を する 。"
pair = mt_io.inputs(translator, sentence, target=reference)
cross_cache = capture_inputs(translator, pair)
cross_layer = cross_cache.names("cross")[-1]
cross = cross_cache.attentions[cross_layer][0]  # (H, T, S)
alignment = alignment_heatmap(
    cross,
    source_tokens=list(pair.source_tokens),
    target_tokens=list(pair.target_tokens),
    title=f"{cross_layer}, mean over {cross.shape[0]} heads",
)
for ja, j in zip(pair.target_tokens, alignment.data["alignment"]):
    print(f"{ja:>6} ← {pair.source_tokens[j]}")
assert torch.allclose(cross.sum(-1), torch.ones(cross.shape[:2]), atol=1e-5)
display(alignment)

# %% [markdown]
# At the small size the rows are still broad: the model has learnt which English words start and
# end a sentence (私 ← *i*, 。 ← *.*) more than which words translate which. With `FULL = True`
# (every training pair, 1 000 steps) the content words find their English counterparts, checked
# here:

# %%
content = {"私": {"i"}, "毎日": {"every", "day"}, "英語": {"english"}, "勉強": {"study"},
           "する": {"study"}}  # fmt: skip
hits = {
    ja: pair.source_tokens[int(j)] in content[ja]
    for ja, j in zip(pair.target_tokens, alignment.data["alignment"])
    if ja in content
}
print("content words aligned to their translation:", hits)
if FULL:
    assert sum(hits.values()) >= 3, hits
print(f"whole notebook: {time.perf_counter() - START:.0f} s")

# %% [markdown]
# **Next:** [notebook 9](09_induction_heads.ipynb): induction heads in a real pretrained model.
