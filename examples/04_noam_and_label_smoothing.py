"""Step 4 — the Noam learning-rate schedule and label smoothing (Vaswani et al. 2017, §5.3, §5.4).

    lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)
    smoothed target: q'(k) = (1 - ε) q(k) + ε / V

Label smoothing makes the model less sure: the loss of a perfectly confident prediction rises,
and the loss is lowest for a prediction that keeps some mass on the other classes.
"""

import torch
from _common import parse_args

from attnlab import viz as figures
from attnlab.training.losses import label_smoothed_cross_entropy
from attnlab.training.schedules import NoamLR

args = parse_args(__doc__.splitlines()[0])
steps = 2000 if args.small else 20000

# the schedule, through the real scheduler
opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1.0, betas=(0.9, 0.98), eps=1e-9)
sched = NoamLR(opt, d_model=512, warmup_steps=400 if args.small else 4000)
rates = []
for _ in range(steps):
    rates.append(opt.param_groups[0]["lr"])
    opt.step()
    sched.step()
peak = max(range(steps), key=rates.__getitem__) + 1
print(f"peak learning rate {max(rates):.2e} at step {peak}")
plot = figures.noam_curve(
    ((512, 400 if args.small else 4000), (256, 400 if args.small else 4000)), steps=steps
)
print("wrote", plot.save(args.out / "04_noam.png"))

# label smoothing: loss of increasingly confident predictions of class 0 among V = 5
target = torch.tensor([0])
for eps in (0.0, 0.1):
    losses = []
    for confidence in (0.2, 0.6, 0.9, 0.99, 0.999):
        p = torch.full((1, 5), (1 - confidence) / 4)
        p[0, 0] = confidence
        losses.append(float(label_smoothed_cross_entropy(p.log(), target, smoothing=eps)))
    print(f"ε = {eps}: loss at confidence 0.2 … 0.999 =", [round(v, 3) for v in losses])
