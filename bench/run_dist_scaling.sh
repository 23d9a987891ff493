#!/usr/bin/env bash
# bench/run_dist_scaling.sh — data-parallel scaling on this host: `mpirun -np N lazytrain train` for N = 1, 2, 4 on
# the CPU device (each rank its own executor and a share of the cores), beside the simulator's prediction.
#
#   bash bench/run_dist_scaling.sh [BUILD=build] [STEPS=8] [B=8] [COMPUTE=f32]
#
# Model: examples/bench-25m's architecture (25M parameters, random init written by `lazytrain init` as a bf16 model
# directory, fine-tuned as a user's would be: each rank then loads what it keeps) with the arithmetic demo's
# tokenizer and data; B rows of 96 tokens per micro-batch per rank, one micro-batch per rank and step (weak scaling: the global
# batch grows with N), COMPUTE (f32 or bf16) compute, 8-bit states, plan every:2. Per N: the mean step time over the
# steps after the first (metrics.jsonl), tokens/s of the job, bytes each rank sent per step, rank 0's AdamW states
# and f32 masters (bf16 compute shards those: dist/data_parallel.h), every rank's resident memory at the end (the
# steady state) and rank 0's peak (loading);
# then `lazytrain simulate --ranks N --net-gbps X` on a profile measured at one thread (X: the exchange speed the
# run measured at start). Ranks share this host's cores: with more ranks than cores each rank computes on a part
# of one, which the simulator (a device per rank) does not model — the table gives the threads per core.
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-8}
B=${3:-8}
COMPUTE=${4:-f32}
LT=$(realpath "$BUILD/lazytrain")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CORES=$(nproc)
work=$(mktemp -d /tmp/lt_dist_scaling.XXXX)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

/usr/bin/python3 "$ROOT/examples/arith/make_data.py" "$work" --train 4000 --test 4 >/dev/null
/usr/bin/python3 - "$ROOT/examples/bench-25m/config.json" "$work/model/config.json" <<'PY'
import json, sys
big = json.load(open(sys.argv[1]))
small = json.load(open(sys.argv[2]))
for k in ("bos_token_id", "eos_token_id"):
    big[k] = small[k]
json.dump(big, open(sys.argv[2], "w"), indent=1)
PY
"$LT" init --config "$work/model/config.json" --out "$work/model-dir" --dtype bf16 >/dev/null
cp "$work"/model/tokenizer*.json "$work/model-dir/"
"$LT" profile --model "$work/model/config.json" --batch "$B" --seq 96 --dtype "$COMPUTE" --threads 1 --reps 2 \
  --device-memory 2GiB --out "$work/profile.json" >/dev/null

printf "%-6s %-8s %-11s %10s %12s %12s %11s %11s %22s %11s %10s | %10s %10s\n" ranks threads "threads/core" "step s" \
  "job tok/s" "sent/step" "adam r0" "masters r0" "RSS at end, each rank" "peak RSS r0" "exch GB/s" "sim step" "sim tok/s"
# ranks:threads per rank — one rank on one core (the profile's setting), one on all cores, then N ranks sharing them.
for spec in 1:1 "1:$CORES" 2:$(( CORES / 2 > 0 ? CORES / 2 : 1 )) 4:$(( CORES / 4 > 0 ? CORES / 4 : 1 )); do
  N=${spec%%:*} threads=${spec##*:}
  out="$work/run$N-$threads"
  cmd=("$LT" train "$ROOT/examples/arith/config.yaml" "model_name_or_path=$work/model-dir"
       "dataset_dir=$work/data" "output_dir=$out" "per_device_train_batch_size=$B" gradient_accumulation_steps=1
       "max_steps=$STEPS" logging_steps=1 save_steps=0 eval_dataset= plan=every:2 "compute_dtype=$COMPUTE"
       "activation_dtype=$COMPUTE" device_memory=2GiB "threads=$threads" save_total_limit=1)
  if (( N > 1 )); then mpirun --oversubscribe -np "$N" "${cmd[@]}" > "$out.json" 2> "$out.log"
  else "${cmd[@]}" > "$out.json" 2> "$out.log"; fi
  gbps=$(grep -o 'exchange [0-9.e+]* GB/s' "$out.log" | awk '{print $2}' || true)
  sim_args=()
  (( N > 1 )) && sim_args=(--ranks "$N" --net-gbps "$gbps")
  "$LT" simulate --profile "$work/profile.json" --model "$work/model/config.json" --batch "$B" --seq 96 \
    --policy every:2 --device-memory 2GiB "${sim_args[@]}" --json > "$out.sim.json"
  /usr/bin/python3 - "$out" "$N" "$CORES" "$STEPS" "$out.sim.json" "${gbps:-0}" "$threads" <<'PY'
import json, sys
out, n, cores, steps, sim, gbps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
threads = int(sys.argv[7])
rows = [json.loads(l) for l in open(out + "/metrics.jsonl") if '"loss"' in l]
step_s = sum(r["step_s"] for r in rows[1:]) / len(rows[1:])
summary = json.loads(open(out + ".json").read().strip().splitlines()[-1])
tokens = summary["tokens"] / len(rows)  # per step, the job's
sent = summary.get("exchange_bytes_per_rank", 0) / steps
s = json.load(open(sim))
sim_step = s["iteration_s"]
sim_tps = s.get("job_tokens_per_s", s["tokens_per_s"])
mib = lambda b: f"{b / 2**20:.1f} MiB"
adam = summary["host_adam_state_bytes_per_rank"]
masters = summary["host_master_bytes_per_rank"]
rss = summary.get("host_rss_bytes_per_rank", [])
rss = " ".join(f"{b / 2**20:.0f}" for b in rss) + " MiB" if rss else "-"
print(f"{n:<6} {threads:<8} {n * threads / cores:<11.1f} {step_s:10.3f} {tokens / step_s:12.0f} {mib(sent):>12} "
      f"{mib(adam):>11} {mib(masters):>11} {rss:>22} {mib(summary['peak_host_rss_bytes']):>11} {gbps:>10} | "
      f"{sim_step:10.3f} {sim_tps:10.0f}")
PY
done
