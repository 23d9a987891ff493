#!/usr/bin/env bash
# Activation storage, f32 against bf16, measured side by side in one run (docs/performance.md):
#   step   `lazytrain bench step` on the ~26M-parameter bench model (examples/bench-25m), B=8 T=256, bf16 GEMMs,
#          no optimizer, best of 3 steps: peak device memory and step time per policy (keep-all, every:1, every:4,
#          host:1), f32 and bf16 storage alternating
#   demo   the demo (examples/arith/config.yaml) with activation_dtype=f32 and =bf16: wall time, tokens/s, exact
#          match on the held-out problems (runs/demo-act-*)
# Usage: bench/run_activations.sh [BUILD_DIR] [SECTIONS...]   (default: step demo)
set -euo pipefail
build=${1:-build}
shift || true
sections=${*:-step demo}
lt="$build/lazytrain"
py=/usr/bin/python3
source "$(dirname "$0")/bench_model.sh"
work=runs/activations
mkdir -p "$work"
echo "machine: $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"

if [[ " $sections " == *" step "* ]]; then
  bench_model_and_batch "$work"
  echo
  echo "== bench step, B=8 T=256, bf16 GEMMs, best of 3 steps"
  printf "%-9s %-5s %12s %10s %10s\n" policy act peak_MiB step_s loss
  for pol in keep-all every:1 every:4 host:1; do
    for act in f32 bf16; do
      "$lt" bench step --model "$model" --batch "$batch" --steps 3 --policy "$pol" --dtype bf16 --activation-dtype "$act" \
        --device-memory 8GiB --optimizer none --json |
        $py -c "
import json, sys
j = json.loads(sys.stdin.read().strip().splitlines()[-1])
print('%-9s %-5s %12.1f %10.4f %10.6f' % ('$pol', '$act', j['peak_device_bytes'] / 2**20, j['step_s'], j['loss']))"
    done
  done
fi

if [[ " $sections " == *" demo "* ]]; then
  if [ ! -f runs/arith/data/arith_train.jsonl ] || [ examples/arith/make_data.py -nt runs/arith/data/arith_train.jsonl ]; then
    $py examples/arith/make_data.py runs/arith
  fi
  echo
  echo "== the demo, activations f32 then bf16"
  for act in f32 bf16; do
    d=runs/demo-act-$act
    rm -rf "$d"
    start=$(date +%s.%N)
    "$lt" train examples/arith/config.yaml "output_dir=$d" "activation_dtype=$act" > "$d.log" 2>&1
    end=$(date +%s.%N)
    grep -E "^compute:" "$d.log" || true
    $py - "$d" "$start" "$end" "$act" <<'PY'
import json, sys
d, start, end, act = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
s = json.load(open(f"{d}/summary.json"))
print(f"{act}: wall {end - start:.0f} s, train+eval {s['seconds']:.0f} s, {s['tokens'] / s['seconds']:.0f} tok/s, "
      f"final loss {s['final_loss']:.4f}, exact match {s.get('eval_exact_match', float('nan')):.1%}")
PY
  done
fi
