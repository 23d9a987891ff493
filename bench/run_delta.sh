#!/usr/bin/env bash
# The chunked gated delta rule forward + backward: LazyTrain vs PyTorch (transformers' chunked torch path) vs the
# GEMM library's rate on the chunk's products, in one run. Usage: bench/run_delta.sh [BUILD_DIR] [T] [Hk] [REPS]
set -euo pipefail
build=${1:-build}
T=${2:-512}
Hk=${3:-4}
reps=${4:-3}
threads=${THREADS:-$(nproc)}
here=$(cd "$(dirname "$0")" && pwd)
ours=$(OMP_NUM_THREADS=$threads "$build/bench/bench_delta" "$T" "$Hk" "$reps")
torch=$(/usr/bin/python3 "$here/torch_delta.py" "$T" "$Hk" "$reps" "$threads")
echo "$ours"
echo "$torch"
/usr/bin/python3 - "$ours" "$torch" <<'PY'
import json, sys
o, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"\nT {o['T']}, {o['Hk']} key / {o['Hv']} value heads of 128, {o['threads']} threads, vector path {o['vector_path']}")
print(f"{'':10} {'fwd ms':>8} {'bwd ms':>8} {'fwd GF/s':>9} {'step GF/s':>10}")
for name, j in (("lazytrain", o), ("torch", t)):
    print(f"{name:10} {j['fwd_ms']:8.1f} {j['bwd_ms']:8.1f} {j['fwd_gflops']:9.1f} {j['step_gflops']:10.1f}")
print(f"step: {o['step_gflops'] / t['step_gflops']:.2f}x torch; {o['step_gflops'] / o['gemm_gflops']:.2f} of oneDNN's "
      f"{o['gemm_gflops']:.1f} GF/s on the chunk's [64,128]x[128,128] products")
PY
