#!/usr/bin/env bash
# The planner's measured numbers (docs/planner.md), all in one run:
#   solve     solve time (and wall time of the command), status and gap at 28, 36, 48 and 64 layers (Qwen2.5-7B,
#             3B, 14B, a dense 27B-size model and Qwen3.6-27B itself at the paper's batches, seq 1024, bf16 activations, on the
#             built-in h800 capped at 70 GiB) with three activation budgets: the paper's (host 15 GiB, NVMe
#             32 GiB), roomy (host 2 TiB, NVMe 2 TB) and the device tier only; then --time-limit 1 on the
#             64-layer instance (the limit is a wall-clock promise: limit + 1 s)
#   batch     the largest batch that fits (--search-batch) for Qwen2.5-7B and the 64-layer model, beside the
#             paper's 144 and 72
#   ratios    predicted LazyTrain / every:4 throughput for Qwen2.5-3B/7B/14B at batch 192/144/96 on h800,
#             next to the paper's measured 1.24; with the paper's bf16 activations (--activation-dtype bf16)
#             and with this executor's f32 ones (at the largest batch, down from the paper's in steps of 8,
#             where every:4 fits)
#   simexec   the simulator against the executor on the emulated CPU device: keep-all, every:1, every:4 and a
#             solved plan at two emulated link bandwidths; step time and peak device memory, error in %
# Usage: bench/run_planner.sh [BUILD_DIR] [SECTIONS...]   (default: solve batch ratios simexec)
set -euo pipefail
build=${1:-build}
shift || true
sections=${*:-solve batch ratios simexec}
lt="$build/lazytrain"
work=runs/planner
mkdir -p "$work/configs"
py=/usr/bin/python3
source "$(dirname "$0")/bench_model.sh"

# Model shapes (config.json only: the planner needs no weights). Qwen2.5 from their published configs; the
# 27B-size model is a dense Qwen3-style model of Qwen3.6-27B's size (64 layers, hidden 5120), beside the real one.
$py - "$work/configs" <<'PY'
import json, sys, os
d = sys.argv[1]
base = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16"}
def save(name, **kw):
    json.dump(dict(base, **kw), open(os.path.join(d, name), "w"), indent=1)
q2 = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
save("qwen2.5-3b.json", **q2, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
     num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
save("qwen2.5-7b.json", **q2, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
     num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)
save("qwen2.5-14b.json", **q2, hidden_size=5120, intermediate_size=13824, num_hidden_layers=48, num_attention_heads=40,
     num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False)
save("dense-27b.json", architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=5120,
     intermediate_size=21504, num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
     vocab_size=151936, tie_word_embeddings=False, attention_bias=False)
PY
# The paper's primary model itself (Qwen3.6-27B: 48 Gated DeltaNet + 16 gated attention layers), its released config.
cp "$(dirname "$0")/../examples/qwen3.6-27b/config.json" "$work/configs/qwen3.6-27b.json"

cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
echo "machine: $cpu, $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"

if [[ " $sections " == *" solve "* ]]; then
  echo
  echo "== solve time on h800 at 70 GiB (seq 1024, bf16 activations, 2 solver threads, limit 5 s)"
  printf "%-12s %6s %6s %-9s %-11s %-9s %8s %8s %8s %6s\n" model layers batch budgets status proof solve_s wall_s gap chunk
  for spec in qwen2.5-7b:144 qwen2.5-3b:192 qwen2.5-14b:96 dense-27b:72 qwen3.6-27b:72; do
    IFS=: read -r m b <<<"$spec"
    for budgets in paper roomy device; do
      case $budgets in
        paper) mem="--host-act-memory 15GiB --nvme 32GiB" ;;
        roomy) mem="--host-act-memory 2TiB --nvme 2TB" ;;
        device) mem="--host-act-memory 0 --nvme 0" ;;
      esac
      t0=$(date +%s.%N)
      out=$("$lt" plan --model "$work/configs/$m.json" --hardware h800 --device-memory 70GiB --batch "$b" --seq 1024 $mem \
            --activation-dtype bf16 --threads 2 --time-limit 5 --json)
      t1=$(date +%s.%N)
      echo "$out" | $py -c "
import json, sys
j = json.load(sys.stdin)
print('%-12s %6d %6d %-9s %-11s %-9s %8.2f %8.2f %8.4f %6d' % ('$m', j['layers'], j['batch'], '$budgets', j['status'],
      j['proof'] or '-', j['solve_s'], $t1 - $t0, j['gap'], j['mlp_chunk_tokens']))"
    done
  done
  t0=$(date +%s.%N)
  out=$("$lt" plan --model "$work/configs/dense-27b.json" --hardware h800 --device-memory 70GiB --batch 72 --seq 1024 \
        --host-act-memory 15GiB --nvme 32GiB --activation-dtype bf16 --threads 2 --time-limit 1 --json)
  t1=$(date +%s.%N)
  echo "$out" | $py -c "
import json, sys
j = json.load(sys.stdin)
print('--time-limit 1, 64 layers, paper budgets: wall %.2f s, status %s, gap %.4f' % ($t1 - $t0, j['status'], j['gap']))"
fi

if [[ " $sections " == *" batch "* ]]; then
  echo
  echo "== largest batch that fits on h800 at 70 GiB (seq 1024, bf16 activations, host 15 GiB, NVMe 32 GiB)"
  printf "%-12s %8s %10s %10s %8s\n" model paper max_batch best_batch tok/s
  for spec in qwen2.5-7b:144 dense-27b:72; do
    IFS=: read -r m b <<<"$spec"
    "$lt" plan --model "$work/configs/$m.json" --hardware h800 --device-memory 70GiB --batch "$b" --seq 1024 \
      --host-act-memory 15GiB --nvme 32GiB --activation-dtype bf16 --threads 2 --time-limit 5 --search-batch 1024 --json |
      $py -c "
import json, sys
s = json.load(sys.stdin)['batch_search']
print('%-12s %8d %10d %10d %8.0f' % ('$m', $b, s['max_batch'], s['best_batch'], s['best_tokens_per_s']))"
  done
fi

if [[ " $sections " == *" ratios "* ]]; then
  echo
  echo "== predicted LazyTrain / every:4 throughput on h800 (seq 1024, host 2 TiB, NVMe 2 TB); paper measured 1.24"
  printf "%-12s %5s %-5s %9s %9s %9s %9s %7s %6s\n" model batch act lazy_tps e4_tps lazy_TF e4_TF ratio paper
  for spec in qwen2.5-3b:192:9801:7933 qwen2.5-7b:144:4758:3842 qwen2.5-14b:96:2528:2047; do
    IFS=: read -r m b pl pm <<<"$spec"
    for act in bf16 f32; do
      # This executor's f32 activations: the largest batch (from the paper's, down in steps of 8) at which the
      # every:4 baseline fits, so that both run at the same batch as in the paper's comparison.
      bb=$b
      while :; do
        out=$("$lt" plan --model "$work/configs/$m.json" --hardware h800 --batch "$bb" --seq 1024 --host-act-memory 2TiB \
              --nvme 2TB --activation-dtype "$act" --threads 2 --time-limit 10 --json 2>/dev/null || true)
        ok=$(echo "$out" | $py -c "
import json, sys
try:
    j = json.load(sys.stdin); print(int({p['name']: p for p in j['plans']}['every:4']['feasible']))
except Exception:
    print(0)")
        [ "$ok" = 1 ] && break
        bb=$((bb - 8))
        [ "$bb" -ge 8 ] || break
      done
      echo "$out" | $py -c "
import json, sys
j = json.load(sys.stdin)
d = {p['name']: p for p in j['plans']}
l, e = d['lazytrain'], d['every:4']
r = l['tokens_per_s'] / e['tokens_per_s']
print('%-12s %5d %-5s %9.0f %9.0f %9.1f %9.1f %7.3f %6.3f' % ('$m', $bb, '$act', l['tokens_per_s'], e['tokens_per_s'],
      l['tflops'], e['tflops'], r, $pl / $pm))"
    done
  done
fi

if [[ " $sections " == *" simexec "* ]]; then
  echo
  bench_model_and_batch "$work"
  echo "== simulator vs executor on the emulated CPU device (~26M params, B=8 T=256, f32, no optimizer, best of 3 steps)"
  printf "%-10s %6s %10s %10s %7s %12s %12s %7s\n" policy GB/s measured_s sim_s err meas_peak sim_peak err
  # The machine is shared: each policy is profiled right before it is simulated and measured, so that the
  # profile and the measurement see the same load (compute times on 2 busy cores drift by 2x in minutes).
  for gbps in 2 0.4; do
    prof=$work/prof-$gbps.json
    "$lt" profile --model "$model" --batch 8 --seq 256 --link-gbps "$gbps" --reps 3 --out "$prof" >/dev/null
    "$lt" plan --model "$model" --hardware "$prof" --batch 8 --seq 256 --device-memory 400MiB --host-act-memory 1GiB \
      --no-optimizer --out "$work/plan-$gbps.json" --json >/dev/null
    for pol in keep-all every:1 every:4 "$work/plan-$gbps.json"; do
      "$lt" profile --model "$model" --batch 8 --seq 256 --link-gbps "$gbps" --reps 3 --out "$prof" >/dev/null
      sim=$("$lt" simulate --profile "$prof" --model "$model" --batch 8 --seq 256 --policy "$pol" --no-optimizer --json)
      meas=$("$lt" bench step --model "$model" --batch "$batch" --steps 3 --policy "$pol" --link-gbps "$gbps" \
             --device-memory 8GiB --optimizer none --json)
      $py - "$meas" "$sim" "$pol" "$gbps" <<'PY'
import json, sys
m, s = json.loads(sys.argv[1]), json.loads(sys.argv[2])
name = "lazytrain" if sys.argv[3].endswith(".json") else sys.argv[3]
e1 = s["step_s"] / m["step_s"] - 1
e2 = s["peak_device_bytes"] / m["peak_device_bytes"] - 1
print("%-10s %6s %10.4f %10.4f %+6.1f%% %12d %12d %+6.1f%%   (measured compute %.4f s, simulated %.4f s)" % (
      name, sys.argv[4], m["step_s"], s["step_s"], 100 * e1, m["peak_device_bytes"], s["peak_device_bytes"], 100 * e2,
      m["compute_s"], s["compute_s"]))
PY
    done
  done
fi
