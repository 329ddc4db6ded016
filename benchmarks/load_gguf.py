"""Loading a GGUF file: attnlab.load_pretrained against transformers' GGUF reader, same file.

SmolLM2-135M-Instruct (the bundled GGUF). Each load runs in a fresh Python process (so neither
reader starts with the other's imports, caches or freed memory), which reports the seconds of the
load call alone (imports done before the clock starts) and the peak resident memory of the
process (``ru_maxrss``, the RSS high-water mark: imports included, the same for both). The
readers alternate run by run; medians of ``--repeats`` runs (at least 3), and their ratio.

    python benchmarks/load_gguf.py
    python benchmarks/load_gguf.py --quick      # 3 runs each
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
import torch
which = sys.argv[1]
if which == "attnlab":
    import attnlab as al
    start = time.perf_counter()
    model = al.load_pretrained("smollm2-135m").model
else:
    import transformers
    from transformers import AutoModelForCausalLM
    from attnlab.models.gguf import bundled_model_path
    transformers.logging.disable_progress_bar()
    path = bundled_model_path("smollm2-135m")
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
seconds = time.perf_counter() - start
params = sum(p.numel() for p in model.parameters())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
print(json.dumps({"seconds": seconds, "peak": peak, "params": params}))
"""


def load_once(which: str) -> dict[str, float]:
    """One load in a fresh process: seconds, peak RSS bytes, parameter count."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, which], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 runs each")
    parser.add_argument("--repeats", type=int, default=None, help="runs per reader (median, >= 3)")
    args = parser.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    repeats = max(3, args.repeats or (3 if args.quick else 5))
    runs: dict[str, list[dict[str, float]]] = {"attnlab": [], "transformers": []}
    for _ in range(repeats):
        for which in runs:
            runs[which].append(load_once(which))
    med = {
        w: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "peak", "params")}
        for w, rs in runs.items()
    }
    time_ratio = statistics.median(
        t["seconds"] / a["seconds"] for a, t in zip(runs["attnlab"], runs["transformers"])
    )
    console = Console(width=160)
    table = Table(
        title=f"loading smollm2-135m (GGUF), a fresh process per load, median of {repeats}; "
        "ratio = transformers / attnlab (median of paired runs for the time)"
    )
    for col in ("reader", "load s", "peak RSS MB", "parameters"):
        table.add_column(col, justify="right")
    for w, m in med.items():
        table.add_row(w, f"{m['seconds']:.2f}", f"{m['peak'] / 1e6:.0f}", f"{m['params']:,.0f}")
    table.add_row(
        "ratio",
        f"{time_ratio:.2f}x",
        f"{med['transformers']['peak'] / med['attnlab']['peak']:.2f}x",
        "",
    )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
