"""Step 5 — train an encoder-decoder Transformer to reverse strings, then decode greedily.

The whole loop: batches of the reverse task, Adam with the Noam schedule, label-smoothed loss,
then greedy decoding of held-out strings. ``--small`` trains for a handful of steps only (to
check it runs); the default learns the task in a few minutes on a CPU.
"""

import torch
from _common import parse_args

import attnlab as al
from attnlab.data.tasks import SequenceTask, SequenceTaskConfig
from attnlab.training.losses import label_smoothed_cross_entropy
from attnlab.training.schedules import NoamLR

args = parse_args(__doc__.splitlines()[0])
torch.manual_seed(0)
task = SequenceTask(
    SequenceTaskConfig(
        "reverse",
        num_symbols=8,
        max_len=6 if args.small else 10,
        num_heldout=32 if args.small else 200,
    ),
    seed=0,
)
tok = task.tokenizer
d_model = 32 if args.small else 128
cfg = al.TransformerConfig(
    src_vocab_size=tok.vocab_size,
    tgt_vocab_size=tok.vocab_size,
    d_model=d_model,
    num_heads=4,
    num_encoder_layers=1 if args.small else 2,
    num_decoder_layers=1 if args.small else 2,
    d_ff=2 * d_model if args.small else 4 * d_model,
    max_len=32,
    pad_id=tok.pad_id,
    bos_id=tok.bos_id,
    eos_id=tok.eos_id,
)
model = al.Transformer(cfg)
opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
sched = NoamLR(opt, d_model=d_model, warmup_steps=200, factor=0.5)
steps = 20 if args.small else 1500
for step in range(steps):
    batch = task.batch(step, 16 if args.small else 64)
    logits = model(batch.src, batch.tgt_in).logits
    loss = label_smoothed_cross_entropy(
        logits, batch.targets, smoothing=0.1, ignore_index=tok.pad_id
    )
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    if step % max(1, steps // 5) == 0 or step == steps - 1:
        print(f"step {step:5d}  loss {loss.item():.3f}  lr {sched.get_last_lr()[0]:.2e}")

model.eval()
held = task.heldout()[: 8 if args.small else 200]
right = 0
for s in held:
    src = torch.tensor([task.model_input(s)])
    out = al.generate(model, src, max_new_tokens=len(s) + 1, eos_token_id=tok.eos_id)[0].tolist()
    right += tok.decode(out) == tok.decode(task.target(s))
print(f"held-out exact match: {right}/{len(held)}")
print(
    "example:",
    tok.decode(held[0]),
    "→",
    tok.decode(
        al.generate(
            model,
            torch.tensor([task.model_input(held[0])]),
            max_new_tokens=len(held[0]) + 1,
            eos_token_id=tok.eos_id,
        )[0].tolist()
    ),
)
