#!/usr/bin/env bash
# The optimizer step: LazyTrain's fused AdamW (f32 and 8-bit states) vs torch.optim.AdamW(foreach=True) with
# clip_grad_norm_, on the same N parameters and thread count, in the same run, with a STREAM triad as the
# memory-bandwidth limit. Prints both sides' JSON lines, then the ratios and the targets of the issue.
# Usage: bench/run_optimizer.sh [BUILD_DIR] [PARAMS] [THREADS] [REPS]
set -euo pipefail
build=${1:-build}
params=${2:-50000000}
threads=${3:-2}
reps=${4:-5}
here=$(cd "$(dirname "$0")" && pwd)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
ours=$("$build/lazytrain" bench optimizer --params "$params" --threads "$threads" --reps "$reps" --json)
torch=$(/usr/bin/python3 "$here/torch_optimizer.py" "$params" "$threads" "$reps")
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$ours"
echo "$torch"
/usr/bin/python3 - "$ours" "$torch" <<'PY'
import json, os, sys
ours = {j["impl"]: j for j in map(json.loads, sys.argv[1].splitlines())}
torch = json.loads(sys.argv[2])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
t = torch["mparams_per_s"]
triad = ours["adamw8"]["triad_gb_per_s"]
print(f"\nmachine: {cpu}, {os.cpu_count()} cores; {ours['adamw8']['params']} parameters, "
      f"{ours['adamw8']['threads']} threads, {ours['adamw8']['vector_path']} kernels; triad {triad:.1f} GB/s")
print(f"{'impl':22} {'Mparams/s':>10} {'vs torch':>9} {'state B/param':>14} {'GB/s':>7} {'of triad':>9}")
print(f"{'torch AdamW foreach':22} {t:10.1f} {1.0:8.2f}x {torch['state_bytes_per_param']:14.3f} {'':>7} {'':>9}")
for name in ("adamw32", "adamw8", "accumulate"):
    o = ours[name]
    state = f"{o['state_bytes_per_param']:.3f}" if "state_bytes_per_param" in o else "-"
    print(f"{name:22} {o['mparams_per_s']:10.1f} {o['mparams_per_s'] / t:8.2f}x {state:>14} "
          f"{o['gb_per_s']:7.1f} {100 * o['gb_per_s'] / triad:8.0f}%")
a8, a32 = ours["adamw8"], ours["adamw32"]
checks = [("adamw8 >= 4x torch", a8["mparams_per_s"] >= 4 * t),
          ("adamw32 >= 2.5x torch", a32["mparams_per_s"] >= 2.5 * t),
          ("adamw8 >= 70% of triad", a8["gb_per_s"] >= 0.7 * triad),
          ("adamw8 state <= 2.1 B/param", a8["state_bytes_per_param"] <= 2.1)]
print("\n" + "\n".join(f"  {'met' if ok else 'NOT met'}: {what}" for what, ok in checks))
PY
