#!/usr/bin/env bash
# The AVX2-only host beside the AVX-512 one, measured side by side in one run on one machine: the layer
# benchmark (LazyTrain vs oneDNN's GEMM rate on the layer's shapes vs PyTorch) and the optimizer benchmark
# (adamw8 and adamw32 vs the STREAM triad), natively and with LT_MAX_ISA=avx2 (which caps our kernels,
# oneDNN inside LazyTrain, and — in run_layer.sh — PyTorch's oneDNN and ATen kernels too), alternating.
# A capped AVX-512 core is not an AVX2 core (Zen 4/5 run 512-bit FMAs at the 256-bit rate, and this VM's
# memory is faster than a GPU server's host), so the capped figures show the code paths, not another chip.
# Usage: bench/run_isa.sh [BUILD_DIR] [REPS] [PARAMS]
set -euo pipefail
build=${1:-build}
reps=${2:-3}
params=${3:-50000000}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for isa in avx512 avx2; do
  LT_MAX_ISA=$isa bash "$here/run_layer.sh" "$build" "$reps" > "$out/layer-$isa.txt"
  LT_MAX_ISA=$isa "$build/lazytrain" bench optimizer --params "$params" --threads 2 --reps "$reps" --json \
    > "$out/optim-$isa.json"
done
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"machine: {cpu}, {os.cpu_count()} cores")
print(f"\n{'layer':14} {'dtype':5} {'GF/s':>7} {'GEMM GF/s':>10} {'(dtype)':>7} {'ratio':>6} {'torch GF/s':>11} {'vs torch':>9}")
for isa in ("avx512", "avx2"):
    lines = [json.loads(l) for l in open(f"{out}/layer-{isa}.txt") if l.startswith("{")]
    ours = {j["dtype"]: j for j in lines if j.get("impl") != "torch"}
    torch = {j["dtype"]: j for j in lines if j.get("impl") == "torch"}
    for dt in ("f32", "bf16"):
        o = ours[dt]
        t = torch[dt] if torch[dt]["layer_gflops"] else torch["f32"]
        note = "" if torch[dt]["layer_gflops"] else " (torch f32: no torch bf16 under the cap)"
        print(f"{o['vector_path']:14} {dt:5} {o['layer_gflops']:7.1f} {o['gemm_gflops']:10.1f} {o['gemm_dtype']:>7} "
              f"{o['ratio']:6.2f} {t['layer_gflops']:11.1f} {o['layer_gflops'] / t['layer_gflops']:8.2f}x{note}")
print(f"\n{'optimizer':14} {'impl':8} {'Mparams/s':>10} {'GB/s':>7} {'triad GB/s':>11} {'of triad':>9}")
for isa in ("avx512", "avx2"):
    rows = {j["impl"]: j for j in map(json.loads, open(f"{out}/optim-{isa}.json"))}
    for name in ("adamw8", "adamw32"):
        o = rows[name]
        print(f"{o['vector_path']:14} {name:8} {o['mparams_per_s']:10.1f} {o['gb_per_s']:7.1f} "
              f"{o['triad_gb_per_s']:11.1f} {100 * o['gb_per_s'] / o['triad_gb_per_s']:8.0f}%")
    print(f"{'':14} adamw8 / adamw32 = {rows['adamw8']['mparams_per_s'] / rows['adamw32']['mparams_per_s']:.2f}")
PY
