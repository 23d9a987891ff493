#!/usr/bin/env bash
# One decoder layer forward+backward: LazyTrain vs the GEMM library's own rate vs PyTorch, same run.
# Usage: bench/run_layer.sh [BUILD_DIR] [REPS]
set -euo pipefail
build=${1:-build}
reps=${2:-5}
threads=${THREADS:-$(nproc)}
here=$(cd "$(dirname "$0")" && pwd)
ours=$(OMP_NUM_THREADS=$threads "$build/bench/bench_layer" "$reps")
torch=$(/usr/bin/python3 "$here/torch_layer.py" "$reps" "$threads")
echo "$ours"
echo "$torch"
/usr/bin/python3 - "$ours" "$torch" <<'PY'
import json, sys, platform, os
ours = {j["dtype"]: j for j in map(json.loads, sys.argv[1].splitlines())}
torch = {j["dtype"]: j for j in map(json.loads, sys.argv[2].splitlines())}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
first = next(iter(ours.values()))
print(f"\nmachine: {cpu}, {os.cpu_count()} cores, vector path {first['vector_path']}, bf16 GEMM {first['gemm_bf16']}")
print(f"{'dtype':6} {'lazytrain GF/s':>15} {'oneDNN GEMM GF/s':>17} {'(dtype)':>7} {'ratio':>6} {'torch GF/s':>11} {'vs torch':>9}")
for dt in ("f32", "bf16"):
    o, t = ours[dt], torch[dt]
    print(f"{dt:6} {o['layer_gflops']:15.1f} {o['gemm_gflops']:17.1f} {o['gemm_dtype']:>7} {o['ratio']:6.2f} "
          f"{t['layer_gflops']:11.1f} {o['layer_gflops'] / t['layer_gflops']:8.2f}x")
PY
