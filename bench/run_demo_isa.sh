#!/usr/bin/env bash
# The demo (examples/arith/config.yaml) natively and capped at AVX2 (LT_MAX_ISA=avx2), one after the
# other on the same machine: wall time, tokens/s, the compute dtype `compute_dtype: auto` chose, and exact
# match on the held-out problems. Each run writes runs/demo-ISA/; the data is generated as make demo does.
# Usage: bench/run_demo_isa.sh [BUILD_DIR] [ISA ...]   (default: avx512 avx2)
set -euo pipefail
build=${1:-build}
shift || true
isas=("$@")
((${#isas[@]})) || isas=(avx512 avx2)
if [ ! -f runs/arith/data/arith_train.jsonl ] || [ examples/arith/make_data.py -nt runs/arith/data/arith_train.jsonl ]; then
  /usr/bin/python3 examples/arith/make_data.py runs/arith
fi
for isa in "${isas[@]}"; do
  rm -rf "runs/demo-$isa"
  echo "== $isa (load $(cut -d' ' -f1-3 /proc/loadavg))"
  start=$(date +%s.%N)
  LT_MAX_ISA=$isa "$build/lazytrain" train examples/arith/config.yaml "output_dir=runs/demo-$isa" > "runs/demo-$isa.log" 2>&1
  end=$(date +%s.%N)
  grep -E "^compute:" "runs/demo-$isa.log" || true
  /usr/bin/python3 - "runs/demo-$isa" "$start" "$end" "$isa" <<'PY'
import json, sys
d, start, end, isa = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
s = json.load(open(f"{d}/summary.json"))
print(f"{isa}: wall {end - start:.0f} s, train+eval {s['seconds']:.0f} s, {s['tokens'] / s['seconds']:.0f} tok/s, "
      f"final loss {s['final_loss']:.4f}, exact match {s.get('eval_exact_match', float('nan')):.1%}")
PY
done
