#!/usr/bin/env bash
# The one prepared command for a GPU machine (issue 25), from the repository root:
#
#     OUT=build/gpu bash benchmarks/gpu_run.sh
#
# 1. the CUDA half of the device suite, `pytest -m cuda` (tests/test_devices.py holds the cuda
#    cases), four workers (the flex cases compile kernels: CPU-bound, so they overlap), at most 180 s;
# 2. benchmarks/gpu.py (attention kernels, GPT-2 training step, greedy decoding), at most 380 s
#    (it writes its tables after each section, so a stopped run keeps what it measured).
# Everything lands in $OUT: nvidia-smi's line, both logs, gpu.json and gpu.md. Under 9 minutes.
set -u
OUT=${OUT:-build/gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"
timeout 180 "$PY" -m pytest -m cuda -p no:cacheprovider -o addopts="" -rfE -n 4 -v \
    --durations=12 tests/test_devices.py 2>&1 | tee "$OUT/pytest_cuda.log"
tests=${PIPESTATUS[0]}
timeout 380 "$PY" benchmarks/gpu.py --out "$OUT" 2>&1 | tee "$OUT/bench.log"
bench=${PIPESTATUS[0]}
echo "pytest -m cuda exit $tests, benchmarks/gpu.py exit $bench" | tee -a "$OUT/gpu.txt"
[ "$tests" = 0 ] && [ "$bench" = 0 ]
