"""Per-head attention statistics of a long input in ``O(T)`` memory: ``attnlab inspect``'s
streamed path on a SmolLM2-sized decoder.

The model is a random :class:`attnlab.GPT` of SmolLM2-135M's shape — ``vocab_size = 49152``,
``n_embd = 576``, 30 layers, 9 query heads over 3 key/value heads (grouped-query), rotary
positions, context 8192, no biases. For each length ``T`` it runs, in a fresh subprocess, what
``attnlab inspect --long`` runs: one forward under
:func:`attnlab.inspect.capture_attention` with ``weights=False, stats=True`` (every layer's
entropy, max weight and first-token weight per query row, from the rotated queries and keys by
:func:`attnlab.inspect.attention_stats`; the forward stops after the last attention layer, so no
``T × vocab`` logits), then :func:`attnlab.inspect.diagnose` of the statistics. It reports

* **peak memory above the weights**: the growth of the process's peak resident set over its
  resident size just before the call, after the model exists and a short warm-up call has loaded
  the kernels (:func:`attnlab.inspect.peak_memory`; Linux only);
* that peak divided by ``T`` (flat in ``T`` for memory linear in ``T``), and what one layer's
  ``(H, T, T)`` fp32 weights alone would take;
* the seconds of the call.

Usage::

    python benchmarks/head_stats.py                    # T = 8192, 30 layers (a few minutes)
    python benchmarks/head_stats.py --quick            # T = 1024, 2048, 4 layers; seconds
    python benchmarks/head_stats.py --lengths 2048 8192 --layers 30

The issue's target is checked at the end: at ``T = 8192`` the peak stays under 1 GiB above the
model's weights.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

GIB = 2**30


def _child(t: int, layers: int) -> dict:
    import torch

    import attnlab as al
    from attnlab.inspect import capture_attention, diagnose, peak_memory
    from attnlab.inspect.memory import stabilize_allocator

    stabilize_allocator()
    torch.manual_seed(0)
    cfg = al.GPTConfig(vocab_size=49152, n_positions=8192, n_embd=576, n_layer=layers, n_head=9,
                       num_kv_heads=3, positions="rope", bias=False)  # fmt: skip
    model = al.GPT(cfg).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    ids = torch.randint(0, cfg.vocab_size, (1, t))

    reports: list = []  # the measured call's report (a small object: its heads' numbers)

    def run() -> object:
        cache = capture_attention(model, lambda: model(ids), weights=False, stats=True)
        reports.append(diagnose(cache))
        return reports[-1]

    capture_attention(model, lambda: model(ids[:, :64]), weights=False, stats=True)  # warm-up
    start = time.perf_counter()
    extra = peak_memory(run)
    seconds = time.perf_counter() - start
    return {"T": t, "layers": layers, "weights_bytes": weights, "peak_extra_bytes": extra,
            "seconds": seconds, "heads": len(reports[-1].heads)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[8192])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--quick", action="store_true", help="T = 1024, 2048 with 4 layers")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        sys.stdout.write(json.dumps(_child(args.child, args.layers)) + "\n")
        return 0
    lengths, layers = ([1024, 2048], 4) if args.quick else (args.lengths, args.layers)
    rows = []
    for t in lengths:
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(t), "--layers", str(layers)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"SmolLM2-shaped GPT, {layers} layers, 9 query heads / 3 KV heads, rotary, fp32, CPU")
    print(f"{'T':>6} {'weights MiB':>12} {'peak above MiB':>15} {'KiB per token':>14} "
          f"{'one layer T×T MiB':>18} {'seconds':>8}")  # fmt: skip
    for r in rows:
        one_layer = 9 * r["T"] ** 2 * 4
        print(f"{r['T']:>6} {r['weights_bytes'] / 2**20:>12.0f} "
              f"{r['peak_extra_bytes'] / 2**20:>15.1f} {r['peak_extra_bytes'] / r['T'] / 1024:>14.1f} "
              f"{one_layer / 2**20:>18.0f} {r['seconds']:>8.1f}")  # fmt: skip
    long = [r for r in rows if r["T"] >= 8192]
    for r in long:
        verdict = "met" if r["peak_extra_bytes"] < GIB else "NOT met"
        print(f"target (T = {r['T']}: under 1 GiB above the weights): {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
