"""attnlab on one GPU: attention kernels, a GPT-2 training step and greedy decoding, ratios measured
in the same run (issue 25).

Four sections (``--sections``, all by default), each a table of ratios:

* **attention** — forward + backward, bf16, causal, ``B = 1``, ``H · d = 1024``, d = 64 and 128:
  attnlab's ``sdpa`` backend against raw ``F.scaled_dot_product_attention`` (goal <= 1.02x) at
  every ``--lengths``; the ``flex`` backend with a sliding window of 256 (goal <= 0.1x of dense
  causal flash at 32k) and with a causal BigBird layout (blocks of 128, 3-block band, 1 global,
  2 random) against the same dense kernel, at ``--flex-lengths`` (each compiles its kernels);
  the kernels of one length are timed in turn (``_common.median_times``);
* **host** — the host work of one attention call (issue 33: <= 50 µs), ``torch.profiler``:
  CPU time per forward call against the device time of its kernels, for raw SDPA, the ``sdpa``
  backend and ``auto`` at a decoding step (``T_q = 1``) and at ``T = 1024``, and for the
  ``flex`` window and BigBird rows at ``--host-flex-length``;
* **train** — GPT-2 small (124M), ``B`` x 1024 at the largest batch of ``--train-batches``
  that fits, bf16 autocast, AdamW: attnlab's ``GPT`` under ``torch.compile`` against Hugging
  Face's ``GPT2LMHeadModel`` (SDPA) eager and compiled, same weights, same batches: tokens/s,
  model FLOPs utilisation (``attnlab.inspect.flops`` of a training step / step time / the GPU's
  dense bf16 peak), the first step's loss of each, and attnlab's ratio to each HF run;
* **decode** — greedy decoding, 32-token prompt, 128 new tokens, batch 1, fp32 (``--decode-dtype``):
  GPT-2 small and the bundled SmolLM2-135M (``attnlab.load_pretrained("smollm2-135m")``; where
  it cannot load, the row says why and its architecture runs on random weights) against
  ``transformers``' ``generate``: the same tokens, tokens/s, eager and with ``compile=True``
  (:mod:`attnlab.decoding.compiled`: ``decode_step`` compiled over a static cache, replayed as
  a CUDA graph), against HF's default ``generate`` and its fastest path (a static cache, which
  ``generate`` compiles with CUDA graphs by itself); and SmolLM2-135M's shape in bf16 on random
  weights the same way.

Results go to ``--out`` as ``gpu.json`` and ``gpu.md`` (the tables). ``--quick`` (``--smoke``)
runs tiny sizes in seconds on any device — on the CPU it is what CI runs (no ``torch.compile``
there, and ``flex`` runs its exact fallback as its CPU backward does).

    python benchmarks/gpu.py --out build/gpu          # on one H100: 2.5 minutes (measured)
    python benchmarks/gpu.py --quick --out build/gpu  # tiny sizes, seconds, CPU or GPU
    attnlab bench gpu --args "--out build/gpu"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _common import as_step, median_times  # benchmarks/_common.py (the script's folder)

import attnlab as al
from attnlab.inspect import flops
from attnlab.nn.backends.flex import allow_recompiles
from attnlab.nn.block_layout import bigbird_layout

# dense bf16 tensor-core peaks, FLOP/s (NVIDIA's data sheets, without sparsity)
PEAKS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12}

Row = dict[str, Any]
# a section appends its rows to a list and calls ``save()`` after each, so that a run stopped by
# a time limit, or a row that fails, keeps every row measured before it
Section = Callable[[argparse.Namespace, torch.device, list[Row], Callable[[], None]], None]


def failed(err: BaseException) -> str:
    """One line for a row or section that raised (an out-of-memory, a compile error)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:200]


def attention_rows(
    args: argparse.Namespace, device: torch.device, rows: list[Row], save: Callable[[], None]
) -> None:
    dtype = torch.bfloat16 if device.type == "cuda" or args.quick else torch.float32
    for d in args.head_dims:
        h = max(1, 1024 // d) if not args.quick else 2
        for t in args.lengths:
            q = torch.randn(1, h, t, d, device=device, dtype=dtype, requires_grad=True)
            kv = torch.randn(1, h, t, d, device=device, dtype=dtype, requires_grad=True)

            def ours(backend: str, **kw: Any) -> Callable[..., torch.Tensor]:
                return lambda a, b, c: al.scaled_dot_product_attention(
                    a, b, c, backend=backend, **kw
                )

            kernels = {
                "raw": lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
                "sdpa backend, causal": ours("sdpa", is_causal=True),
            }
            if t in args.flex_lengths:
                block = 128 if t >= 1024 else 16
                layout = bigbird_layout(t, block_size=block, num_random_blocks=2, causal=True)
                kernels["flex, window 256"] = ours("flex", is_causal=True, window=256)
                kernels[f"flex, BigBird b={block}"] = ours("flex", block_mask=layout)
            steps = {
                name: as_step(lambda fn=fn, q=q, kv=kv: fn(q, kv, kv), True, (q, kv))
                for name, fn in kernels.items()
            }
            measured: dict[str, float | BaseException] = {}
            for name, step in list(steps.items()):  # the warm-up run; one that fails is a row
                try:
                    step()
                except Exception as err:  # e.g. out of memory at 32k: the row says so
                    measured[name] = err
                    del steps[name]
                    q.grad = kv.grad = None
            measured.update(median_times(steps, args.repeats, warm_up=False, device=device))
            raw = measured.pop("raw")
            for name, seconds in measured.items():
                row: Row = {"d": d, "T": t, "what": name}
                if isinstance(raw, BaseException):
                    row["error"] = "raw SDPA: " + failed(raw)
                elif isinstance(seconds, BaseException):
                    row.update(ms_raw=1e3 * raw, error=failed(seconds))
                else:
                    row.update(ms_raw=1e3 * raw, ms=1e3 * seconds, ratio=seconds / raw)
                rows.append(row)
            save()
            del q, kv, steps
            if device.type == "cuda":
                torch.cuda.empty_cache()


def _device_us(event: Any) -> float:
    """An event's total device time, µs (``device_time_total`` since torch 2.4, ``cuda_`` before)."""
    return float(getattr(event, "device_time_total", getattr(event, "cuda_time_total", 0.0)))


def host_rows(
    args: argparse.Namespace, device: torch.device, rows: list[Row], save: Callable[[], None]
) -> None:
    """Per-call host work of an attention call (issue 33: <= 50 µs): ``torch.profiler`` over
    ``--host-calls`` forward calls of each kernel, each call in a ``record_function`` range; the
    range's CPU time per call is the host work (the checks, the mask normalisation, the backend's
    choice and the kernel launches; on the CPU it includes the kernel itself), and the device
    time of the kernels it launched per call is the device work. A decoding step's shape
    (``T_q = 1``) and ``T = 1024`` for raw SDPA, the ``sdpa`` backend and ``auto``; the ``flex``
    backend's window of 256 and BigBird layout at ``--host-flex-length``. The host work of
    attnlab over raw SDPA is the column that counts."""
    from torch.profiler import ProfilerActivity, profile, record_function

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    d, h = (64, 16) if not args.quick else (16, 2)
    t_long = 1024 if not args.quick else 128
    t_flex = args.host_flex_length if not args.quick else 256
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)

    def attn(**kw: Any) -> Callable[..., torch.Tensor]:
        return lambda a, b, c: al.scaled_dot_product_attention(a, b, c, **kw)

    cases: list[tuple[str, int, int, Callable[..., torch.Tensor]]] = []
    for t_q, t_k in ((1, t_long), (t_long, t_long)):
        causal = t_q == t_k
        cases += [
            (
                "raw SDPA",
                t_q,
                t_k,
                lambda a, b, c, c_=causal: F.scaled_dot_product_attention(a, b, c, is_causal=c_),
            ),
            ("sdpa backend", t_q, t_k, attn(backend="sdpa", is_causal=True)),
            ("auto", t_q, t_k, attn(is_causal=True)),
        ]
    block = 128 if t_flex >= 1024 else 16
    layout = bigbird_layout(t_flex, block_size=block, num_random_blocks=2, causal=True)
    if device.type != "cuda":
        # on the CPU a no-grad flex call compiles its kernel (minutes here): GPU rows only
        rows.append({"what": "flex", "T_q": t_flex, "T_k": t_flex, "error": "GPU only"})
    else:
        cases += [
            (
                "raw SDPA",
                t_flex,
                t_flex,
                lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
            ),
            ("flex, window 256", t_flex, t_flex, attn(backend="flex", is_causal=True, window=256)),
            (f"flex, BigBird b={block}", t_flex, t_flex, attn(backend="flex", block_mask=layout)),
        ]
    n = args.host_calls if args.host_calls is not None else (20 if args.quick else 200)
    for name, t_q, t_k, fn in cases:
        q = torch.randn(1, h, t_q, d, device=device, dtype=dtype)
        kv = torch.randn(1, h, t_k, d, device=device, dtype=dtype)
        row: Row = {"what": name, "T_q": t_q, "T_k": t_k, "d": d}
        try:
            with torch.no_grad():
                for _ in range(3):  # warm-up: compiles, caches of block masks
                    fn(q, kv, kv)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                with profile(activities=activities) as prof:
                    for _ in range(n):
                        with record_function("attention call"):
                            fn(q, kv, kv)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
        except Exception as err:  # e.g. a flex compile failure: the row says so
            row["error"] = failed(err)
        else:
            events = prof.key_averages()
            call = next(e for e in events if e.key == "attention call")
            # the kernels' own time (a range's total would count its children twice)
            kernels = sum(float(getattr(e, "self_device_time_total", 0.0)) for e in events)
            row.update(
                host_us=call.cpu_time_total / n,
                device_us=(_device_us(call) or kernels) / n if device.type == "cuda" else None,
            )
        rows.append(row)
        save()


def _peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAKS.items() if k in name), None)


def _largest_batch(
    model: torch.nn.Module, batches: list[int], seq: int, vocab: int, device: torch.device
) -> int:
    """The largest of ``batches`` whose bf16-autocast training step (forward, backward, AdamW)
    fits in the device's memory, tried eagerly (a compiled step needs no more memory)."""
    for batch in sorted(batches, reverse=True):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        try:
            ids = torch.randint(0, vocab, (batch, seq), device=device)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(ids, labels=ids).loss
            loss.backward()
            opt.step()
            return batch
        except torch.OutOfMemoryError:
            pass
        finally:
            opt.zero_grad(set_to_none=True)
            del opt
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return min(batches)


def train_rows(
    args: argparse.Namespace, device: torch.device, rows: list[Row], save: Callable[[], None]
) -> None:
    """GPT-2 small training steps: Hugging Face eager, Hugging Face compiled and attnlab
    compiled, same weights, same batches, at the largest batch of ``--train-batches`` that fits
    (``--train-batch`` fixes it): tokens/s, MFU and each one's ratio to both HF runs."""
    import copy

    from train_step import FULL, Shape, build_models  # benchmarks/train_step.py

    shape = Shape(512, 128, 64, 2, 2, batch=2, seq_len=64) if args.quick else FULL
    seq = 64 if args.quick else 1024
    hf, ours = build_models(shape)
    hf, ours = hf.to(device), ours.to(device)
    compile_all = device.type == "cuda" and not args.no_compile
    if args.train_batch:
        batch = args.train_batch
    elif args.quick:
        batch = 2
    else:
        probe = copy.deepcopy(ours)  # a step changes the weights: the runs start from the same
        batch = _largest_batch(probe, args.train_batches, seq, shape.vocab_size, device)
        del probe
    runners: dict[str, Callable[[], torch.nn.Module]] = {
        "HF GPT2LMHeadModel (sdpa), eager": lambda: hf,
    }
    if compile_all:
        # a copy made now: the same starting weights as the other runs
        hf_copy = copy.deepcopy(hf)
        runners["HF GPT2LMHeadModel (sdpa), compiled"] = lambda: torch.compile(hf_copy)
    runners["attnlab GPT" + (", compiled" if compile_all else "")] = lambda: (
        torch.compile(ours) if compile_all else ours
    )
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, shape.vocab_size, (batch, seq), generator=gen).to(device)
    step_flops = flops(ours.config, seq, batch).train_total
    peak = _peak(device)
    for name, build in runners.items():
        row: Row = {"model": name, "batch": batch, "seq": seq}
        try:
            model = build()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
            losses: list[torch.Tensor] = []

            def step(
                model: torch.nn.Module = model, opt: Any = opt, losses: list[Any] = losses
            ) -> None:
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    loss = model(ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.detach())

            first_start = time.perf_counter()
            step()  # the first step (compiles); its loss is the one compared
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            first = time.perf_counter() - first_start
            seconds = median_times({name: step}, args.train_steps, device=device)[name]
        except Exception as err:  # an out-of-memory at this batch, a compile error
            row["error"] = failed(err)
        else:
            row.update(
                tokens_per_s=batch * seq / seconds,
                mfu=None if peak is None else step_flops / seconds / peak,
                first_loss=float(losses[0]),
                first_step_s=first,
            )
        finally:
            opt = None  # the optimizer state of one run at a time
            if device.type == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
        save()


def decode_rows(
    args: argparse.Namespace, device: torch.device, rows: list[Row], save: Callable[[], None]
) -> None:
    from generate import (  # benchmarks/generate.py
        FULL,
        Shape,
        build_models,
        build_smollm2,
        build_smollm2_random,
    )

    tiny = Shape(512, 128, 64, 2, 2, prompt=8, new_tokens=8, far=0)
    shape = tiny if args.quick else FULL
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.decode_dtype]
    compiled = device.type == "cuda" and not args.no_compile
    cases: list[tuple[str, Callable[[], tuple[torch.nn.Module, al.GPT]], torch.dtype]] = [
        ("GPT-2 small" if not args.quick else "GPT-2 (tiny)", lambda: build_models(shape), dtype),
        ("SmolLM2-135M", build_smollm2, dtype),
        # the CUDA-graphs row of a Llama-shaped model in bf16 (random weights: speed, not text)
        ("SmolLM2-135M architecture, random weights, bf16", build_smollm2_random, torch.bfloat16),
    ]
    for label, build, case_dtype in cases:
        if args.quick and label.startswith("SmolLM2"):
            rows.append({"model": label, "skipped": "--quick (a 135M model is no smoke test)"})
            continue
        try:
            hf, ours = build()
        except Exception as err:  # a missing gguf reader or model file: the row says why
            rows.append({"model": label, "skipped": f"{type(err).__name__}: {err}"[:160]})
            if label != "SmolLM2-135M":
                continue
            # its architecture on random weights instead: the speed is measured, not the text
            label = "SmolLM2-135M architecture, random weights"
            hf, ours = build_smollm2_random()
        hf, ours = hf.to(device, case_dtype).eval(), ours.to(device, case_dtype).eval()
        if case_dtype != torch.float32:
            label += "" if label.endswith("bf16") else f" ({args.decode_dtype})"
        n = shape.new_tokens
        vocab = ours.config.vocab_size  # GPT-2's or SmolLM2's (an id past it is a device assert)
        ids = torch.randint(0, vocab - 1, (1, shape.prompt), device=device)

        def run_hf(hf: Any = hf, n: int = n, ids: torch.Tensor = ids, **kw: Any) -> torch.Tensor:
            return hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                num_beams=1,
                pad_token_id=0,
                **kw,
            )

        # HF's fastest path: a static cache, which generate() compiles by itself on CUDA
        # (torch.compile, mode "reduce-overhead": CUDA graphs); off CUDA it runs uncompiled
        hf_static = "HF generate, static cache" + (" + torch.compile" if compiled else "")
        runs = {
            "HF generate": run_hf,
            hf_static: lambda run_hf=run_hf: run_hf(
                cache_implementation="static", disable_compile=not compiled
            ),
            "attnlab": lambda o=ours, n=n, ids=ids: al.generate(o, ids, max_new_tokens=n),
        }
        if compiled:  # decode_step compiled over a static cache, replayed as a CUDA graph
            runs["attnlab compile=True (CUDA graphs)"] = lambda o=ours, n=n, ids=ids: al.generate(
                o, ids, max_new_tokens=n, compile=True
            )
        with torch.inference_mode():
            want = run_hf()
            for name, fn in runs.items():
                try:
                    got = fn()  # also the warm-up (and the compile)
                    seconds = median_times({name: fn}, args.decode_repeats, device=device)[name]
                except Exception as err:  # a compile failure: the row says so, the rest runs
                    rows.append({"model": label, "run": name, "error": failed(err)})
                else:
                    rows.append(
                        {
                            "model": label,
                            "run": name,
                            "tokens_per_s": n / seconds,
                            "same_tokens": bool(torch.equal(got, want)),
                        }
                    )
                save()


def markdown(results: dict[str, Any]) -> str:
    """The three tables, in markdown."""
    lines = [f"# attnlab GPU benchmark — {results['device']}, torch {results['torch']}", ""]
    lines += [f"{name} failed: {err}" for name, err in results.get("errors", {}).items()]
    if results.get("attention"):
        lines += [
            "## Attention, forward + backward, causal",
            "",
            "| d | T | kernel | ms | raw SDPA ms | ratio |",
            "|---|---|---|---|---|---|",
        ]
        for r in results["attention"]:
            if "error" in r:
                lines.append(f"| {r['d']} | {r['T']} | {r['what']} | failed: {r['error']} | | |")
                continue
            lines.append(
                f"| {r['d']} | {r['T']} | {r['what']} | {r['ms']:.3f} | "
                f"{r['ms_raw']:.3f} | {r['ratio']:.3f}x |"
            )
        lines.append("")
    if results.get("host"):
        lines += [
            "## Host work per attention call (forward, torch.profiler)",
            "",
            "| kernel | T_q | T_k | host µs | device µs |",
            "|---|---|---|---|---|",
        ]
        for r in results["host"]:
            if "error" in r:
                lines.append(f"| {r['what']} | {r['T_q']} | {r['T_k']} | failed: {r['error']} | |")
                continue
            dev = "n/a" if r["device_us"] is None else f"{r['device_us']:.1f}"
            lines.append(f"| {r['what']} | {r['T_q']} | {r['T_k']} | {r['host_us']:.1f} | {dev} |")
        lines.append("")
    if results.get("train"):
        lines += [
            "## Training step, bf16 autocast, AdamW",
            "",
            "| model | batch × seq | tokens/s | MFU | first loss |",
            "|---|---|---|---|---|",
        ]
        done = [r for r in results["train"] if "error" not in r]
        for r in results["train"]:
            if "error" in r:
                lines.append(
                    f"| {r['model']} | {r['batch']} × {r['seq']} | failed: {r['error']} | | |"
                )
                continue
            mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
            lines.append(
                f"| {r['model']} | {r['batch']} × {r['seq']} | {r['tokens_per_s']:.0f} | {mfu} | "
                f"{r['first_loss']:.4f} |"
            )
        ours = [r for r in done if r["model"].startswith("attnlab")]
        for base in (r for r in done if r["model"].startswith("HF")):
            for r in ours:
                ratio = r["tokens_per_s"] / base["tokens_per_s"]
                lines.append(f"\n{r['model']} / {base['model']}: {ratio:.2f}x tokens/s")
        lines.append("")
    if results.get("decode"):
        lines += [
            "## Greedy decoding",
            "",
            "| model | run | tokens/s | same tokens as HF |",
            "|---|---|---|---|",
        ]
        for r in results["decode"]:
            if "skipped" in r:
                lines.append(f"| {r['model']} | skipped: {r['skipped']} | | |")
            elif "error" in r:
                lines.append(f"| {r['model']} | {r['run']} failed: {r['error']} | | |")
            else:
                lines.append(
                    f"| {r['model']} | {r['run']} | {r['tokens_per_s']:.1f} | {r['same_tokens']} |"
                )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", "--smoke", action="store_true", help="tiny sizes (seconds)")
    parser.add_argument(
        "--out", type=Path, default=Path("build/gpu"), help="folder for the results"
    )
    parser.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    parser.add_argument(
        "--sections",
        nargs="+",
        default=["attention", "host", "train", "decode"],
        choices=["attention", "host", "train", "decode"],
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--flex-lengths", type=int, nargs="+", default=None)
    parser.add_argument("--head-dims", type=int, nargs="+", default=None)
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per kernel (median)")
    parser.add_argument("--decode-repeats", type=int, default=3, help="timed generate calls")
    parser.add_argument("--train-steps", type=int, default=None, help="timed training steps")
    parser.add_argument(
        "--decode-dtype",
        default="fp32",
        choices=["fp32", "bf16"],
        help="decoding dtype (fp32: the tokens must be identical; bf16 may round apart)",
    )
    parser.add_argument(
        "--compile-hf", action="store_true", help="(the default now: HF runs eager and compiled)"
    )
    parser.add_argument("--train-batch", type=int, default=None, help="fix the training batch")
    parser.add_argument(
        "--train-batches",
        type=int,
        nargs="+",
        default=[8, 16, 24, 32],
        help="training batches tried, the largest that fits is run",
    )
    parser.add_argument(
        "--host-calls",
        type=int,
        default=None,
        help="profiled calls per kernel (default 200; 20 with --quick: the profiler's own "
        "summary of 200 calls takes longer than the smoke run's every other section)",
    )
    parser.add_argument("--host-flex-length", type=int, default=4096, help="T of the flex rows")
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile anywhere")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    q = args.quick
    if device.type != "cuda" and not q:
        print("benchmarks/gpu.py measures a GPU: without CUDA only --quick runs (tiny sizes)")
        return 0
    args.lengths = args.lengths or ([128, 256] if q else [1024, 4096, 8192, 16384, 32768])
    args.flex_lengths = args.flex_lengths or ([256] if q else [4096, 32768])
    args.head_dims = args.head_dims or ([16] if q else [64, 128])
    args.repeats = args.repeats or (2 if q else 10)
    args.train_steps = args.train_steps or (2 if q else 10)
    # one flex kernel per shape and mask: more than dynamo's default 8 recompiles
    allow_recompiles(64)
    torch.manual_seed(0)
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "quick": q,
        "command": " ".join(
            ["python", "benchmarks/gpu.py", *(argv if argv is not None else sys.argv[1:])]
        ),
    }
    sections: dict[str, Section] = {
        "attention": attention_rows,
        "host": host_rows,
        "train": train_rows,
        "decode": decode_rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        (args.out / "gpu.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "gpu.md").write_text(markdown(results) + "\n")

    errors: dict[str, str] = {}
    for name in args.sections:
        start = time.perf_counter()
        results[name] = []
        try:
            sections[name](args, device, results[name], save)
        except Exception as err:  # the next section still runs; the exit status says it failed
            traceback.print_exc()
            errors[name] = failed(err)
            results["errors"] = errors
        results[f"{name}_seconds"] = time.perf_counter() - start
        print(f"{name}: {results[f'{name}_seconds']:.1f} s", flush=True)
        save()
    print(markdown(results))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
