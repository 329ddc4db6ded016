"""Eager greedy decoding of SmolLM2-135M: attnlab (one or more source trees) against Hugging
Face's default ``generate`` and its best CPU configuration, runs interleaved.

Each contender runs in its own worker process (so that two source trees of attnlab, e.g. main
and a branch, can be compared in one run); the driver asks the workers for one generation each
in turn, ``--repeats`` rounds, so that a load change on the shared machine slows all alike.
tokens/s come from the median run; each ratio is the median of the per-round ratios.

Contenders: ``attnlab`` (``attnlab.generate``, eager) for each ``--trees`` entry;
``hf`` (``generate``, dynamic cache, SDPA); ``hf-static`` (``cache_implementation="static"``);
with ``--hf-compile`` also ``hf-static-compiled`` (static cache and ``torch.compile`` of the
forward, forced on the CPU through ``CompileConfig._compile_all_devices``).

    python benchmarks/eager_decoding.py --trees /tmp/old/src src --precisions fp32 bf16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = 32


def worker(
    kind: str, precision: str, random_weights: bool, threads: int | None, new_tokens: int
) -> None:
    """Load the model, warm up, then answer each ``run`` line on stdin with one timed run."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    import generate as bench

    import attnlab as al

    if threads:
        torch.set_num_threads(threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    hf, gpt = bench.build_smollm2_random() if random_weights else bench.build_smollm2()
    hf, gpt = hf.to(dtype), gpt.to(dtype)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 49152, (1, PROMPT), generator=gen)
    mask = torch.ones_like(ids)
    hf_kwargs: dict[str, object] = {}
    if kind.startswith("hf-static"):
        hf_kwargs["cache_implementation"] = "static"
    if kind == "hf-static-compiled":
        from transformers import CompileConfig

        config = CompileConfig()
        config._compile_all_devices = True
        hf_kwargs["compile_config"] = config

    def run() -> torch.Tensor:
        if kind == "attnlab":
            return al.generate(gpt, ids, max_new_tokens=new_tokens)
        return hf.generate(  # type: ignore[operator]
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            num_beams=1,
            pad_token_id=0,
            **hf_kwargs,
        )

    with torch.inference_mode():
        for _ in range(1 if kind != "hf-static-compiled" else 2):  # warm-up (and the compile)
            run()
        print("ready", al.__file__, flush=True)
        for line in sys.stdin:
            if line.strip() != "run":
                break
            start = time.perf_counter()
            out = run()
            seconds = time.perf_counter() - start
            tokens = out[0, PROMPT:].tolist()
            print(json.dumps({"s": seconds, "tokens": tokens}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", default=["src"], help="attnlab source trees")
    parser.add_argument("--precisions", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--hf-compile", action="store_true", help="also HF static + compile")
    parser.add_argument("--random-weights", action="store_true", help="no GGUF file needed")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.precision, args.random_weights, args.threads, args.new_tokens)
        return 0
    kinds = [("hf", "src"), ("hf-static", "src")]
    if args.hf_compile:
        kinds.append(("hf-static-compiled", "src"))
    kinds += [("attnlab", tree) for tree in args.trees]
    print(f"load: {os.getloadavg()}", flush=True)
    for precision in args.precisions:
        procs: dict[str, subprocess.Popen[str]] = {}
        for kind, tree in kinds:
            name = kind if kind != "attnlab" else f"attnlab[{tree}]"
            env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
            cmd = [sys.executable, __file__, "--worker", kind, "--precision", precision]
            cmd += ["--new-tokens", str(args.new_tokens)]
            cmd += ["--random-weights"] if args.random_weights else []
            cmd += ["--threads", str(args.threads)] if args.threads else []
            procs[name] = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
            )
            ready = procs[name].stdout.readline()  # type: ignore[union-attr]
            if not ready.startswith("ready"):
                raise RuntimeError(f"{name} did not start: {ready!r}")
            print(f"  {name}: {ready.split()[1]}", flush=True)
        times: dict[str, list[float]] = {name: [] for name in procs}
        tokens: dict[str, list[int]] = {}
        for _ in range(args.repeats):
            for name, proc in procs.items():
                proc.stdin.write("run\n")  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
                answer = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
                times[name].append(answer["s"])
                tokens[name] = answer["tokens"]
        for proc in procs.values():
            proc.stdin.close()  # type: ignore[union-attr]
            proc.wait()
        print(
            f"SmolLM2-135M {precision}, batch 1, prompt {PROMPT}, {args.new_tokens} new tokens, greedy, "
            f"median of {args.repeats} interleaved rounds; load after: {os.getloadavg()}"
        )
        base = {b: times[b] for b in ("hf", "hf-static", "hf-static-compiled") if b in times}
        for name, ts in times.items():
            rate = args.new_tokens / statistics.median(ts)
            ratios = ", ".join(
                f"{statistics.median(b / t for b, t in zip(bts, ts)):.2f}x {b}"
                for b, bts in base.items()
            )
            same = sum(a == b for a, b in zip(tokens[name], tokens["hf"])) / args.new_tokens
            print(f"  {name:>32}: {rate:7.1f} tok/s  ({ratios}); tokens = HF's: {same:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
