#!/usr/bin/env bash
# Full, freeze and LoRA steps of the same model side by side in one run (docs/finetune.md): `lazytrain bench step` on
# the ~26M-parameter bench model (examples/bench-25m), B=8 T=256, bf16 GEMMs and storage, plan every:2, the Hybrid
# 8-bit AdamW pipelined into the next step, an emulated link of 8 GB/s each way, best of 3 steps. Per method: the
# step, the bytes moved each way, the optimizer's host seconds, tokens/s, and the trained state on the host (f32
# masters, gradients, optimizer states); each as a ratio to the full step of the same run.
# Usage: bench/run_finetune.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
lt="$build/lazytrain"
py=/usr/bin/python3
source "$(dirname "$0")/bench_model.sh"
work=runs/finetune
mkdir -p "$work"
echo "machine: $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
bench_model_and_batch "$work"
run() {
  "$lt" bench step --model "$model" --batch "$batch" --steps 3 --policy every:2 --dtype bf16 --activation-dtype bf16 \
    --device-memory 8GiB --link-gbps 8 --json "$@" | tail -1
}
{
  echo "full $(run)"
  echo "freeze:2 $(run --freeze-layers 2)"
  echo "lora:r16 $(run --lora-rank 16)"
  echo "lora:r64 $(run --lora-rank 64)"
} > "$work/steps.txt"
$py - "$work/steps.txt" <<'PY'
import json, sys
rows = [(l.split(" ", 1)[0], json.loads(l.split(" ", 1)[1])) for l in open(sys.argv[1]) if l.strip()]
full = rows[0][1]
print("%-9s %9s %7s %10s %10s %11s %9s %12s %7s" % ("method", "step_s", "x full", "h2d MB", "d2h MB", "optimizer_s",
                                                     "tok/s", "state MiB", "x full"))
for name, j in rows:
    print("%-9s %9.4f %7.2f %10.1f %10.1f %11.4f %9.0f %12.1f %7.3f" % (
        name, j["step_s"], j["step_s"] / full["step_s"], j["h2d_bytes"] / 1e6, j["d2h_bytes"] / 1e6, j["optimizer_s"],
        j["tokens_per_s"], j["trained_state_bytes"] / 2**20, j["trained_state_bytes"] / full["trained_state_bytes"]))
PY
