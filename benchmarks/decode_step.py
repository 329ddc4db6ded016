"""One eager decoding step of SmolLM2-135M's architecture: attnlab against Hugging Face, CPU time.

The step is timed in process CPU time (``time.process_time``, one thread), which a shared,
loaded machine disturbs less than wall time; the two models alternate, ``--repeats`` rounds of
``--steps`` steps each, and the ratio is the median of the per-round ratios. Random weights
(``benchmarks/generate.py``'s ``build_smollm2_random``: the same weights in both models).

``--tiny`` keeps the 30 layers and the heads (9 query, 3 key/value) but makes every width tiny
(``d_model = 36``, ``d_ff = 96``, vocabulary 512): the matrix products cost next to nothing,
and what is left is the host work of a step — the calls into PyTorch and the Python around them.

    python benchmarks/decode_step.py --precision fp32
    python benchmarks/decode_step.py --tiny            # the host work per step
    PYTHONPATH=/tmp/main/src python benchmarks/decode_step.py   # another tree, for an A/B
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

import attnlab as al
from attnlab.decoding.layout import lay_out_for_decoding
from attnlab.decoding.steppers import CausalStepper


def tiny_models() -> tuple[Any, al.GPT]:
    """SmolLM2's depth and heads at tiny widths: HF's LlamaForCausalLM and attnlab's copy."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=36,
        intermediate_size=96,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=512,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    hf = LlamaForCausalLM(cfg).eval()
    return hf, al.GPT.from_hf(hf).eval()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--tiny", action="store_true", help="tiny widths: the host work")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.tiny:
        hf, gpt = tiny_models()
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        from generate import build_smollm2_random  # benchmarks/generate.py

        hf, gpt = build_smollm2_random()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.precision]
    hf, gpt = hf.to(dtype), lay_out_for_decoding(gpt.to(dtype))
    vocab = gpt.config.vocab_size
    ids = torch.randint(0, vocab, (1, 32))
    n = args.steps

    def ours() -> float:
        stepper = CausalStepper(gpt, ids, None, 32 + n + 1)
        token = stepper.prefill().argmax(-1)
        start = time.process_time()
        for _ in range(n):
            token = stepper.step(token).argmax(-1)
        return (time.process_time() - start) / n

    def theirs() -> float:
        out = hf(ids, use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        start = time.process_time()
        for _ in range(n):
            out = hf(token, past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return (time.process_time() - start) / n

    with torch.inference_mode():
        ours(), theirs()  # warm-up
        a, b = [], []
        for _ in range(args.repeats):
            a.append(ours())
            b.append(theirs())
    ratio = statistics.median(y / x for x, y in zip(a, b))
    what = "tiny widths (host work)" if args.tiny else "SmolLM2-135M sizes"
    print(
        f"{args.precision} {what}, attnlab from {Path(al.__file__).parent}: attnlab "
        f"{1e3 * statistics.median(a):.1f} ms/step, HF {1e3 * statistics.median(b):.1f} ms/step "
        f"(CPU time, median of {args.repeats}); attnlab speed / HF = {ratio:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
