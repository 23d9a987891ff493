#!/usr/bin/env bash
# One decoder layer forward+backward: LazyTrain vs the GEMM library's own rate vs PyTorch, same run.
# Usage: bench/run_layer.sh [BUILD_DIR] [REPS]
set -euo pipefail
build=${1:-build}
reps=${2:-5}
threads=${THREADS:-$(nproc)}
here=$(cd "$(dirname "$0")" && pwd)
ours=$(OMP_NUM_THREADS=$threads "$build/bench/bench_layer" "$reps")
# Under LT_MAX_ISA=avx2 the peer is capped the same way: oneDNN inside torch and torch's own kernels.
torch_env=()
if [ "${LT_MAX_ISA:-}" = avx2 ]; then torch_env=(DNNL_MAX_CPU_ISA="${DNNL_MAX_CPU_ISA:-AVX2}" ATEN_CPU_CAPABILITY=avx2); fi
torch=$(env "${torch_env[@]}" /usr/bin/python3 "$here/torch_layer.py" "$reps" "$threads")
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
    # No torch bf16 (capped host): compare with torch f32, what a user of that host would run.
    peer, note = (t, "") if t["layer_gflops"] else (torch["f32"], " (torch bf16 unavailable: vs torch f32)")
    print(f"{dt:6} {o['layer_gflops']:15.1f} {o['gemm_gflops']:17.1f} {o['gemm_dtype']:>7} {o['ratio']:6.2f} "
          f"{peer['layer_gflops']:11.1f} {o['layer_gflops'] / peer['layer_gflops']:8.2f}x{note}")
PY
