#!/usr/bin/env bash
# scripts/gpu-steps.sh LAZYTRAIN DEVICE OUT — the executor on DEVICE (cuda; cuda-sim to rehearse on the CPU), as
# `make gpu-check` runs it. Writes OUT/grad.json and OUT/step/step_{plan,every4}.json; exits 1 on any failure.
#   grad   `lazytrain grad` on examples/tiny-qwen3 (bf16; a random init no test has seen): keep-all twice (same
#          bytes: determinism), every policy (recompute, host, NVMe) byte-identical to keep-all, the same step
#          under cuda-sim (the GPU block's host run) within bf16 rounding, and the CPU's f32 in-memory path within
#          the bf16 bound model_vs_torch uses (relative L2 5e-2) (scripts/grad_diff.py)
#   step   a streamed step of STEP_CONFIG (default: a Qwen2.5-1.5B shape, random init) at STEP_B x STEP_T (8 x
#          1024): `lazytrain profile` on DEVICE, the plan solved for a budget halfway between the smallest
#          baseline's device need and keep-all's, and `bench step` of it against every:4
set -uo pipefail
LT=$1 DEVICE=$2 OUT=$3
B=${STEP_B:-8} T=${STEP_T:-1024} MEM=${STEP_DEVICE_MEMORY:-40GiB}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
status=0

tiny="$OUT/tiny"
mkdir -p "$tiny/nvme"
"$LT" init --config examples/tiny-qwen3/config.json --out "$tiny/model" --seed 3 >/dev/null || status=1
grad() {  # grad NAME DEVICE POLICY
  "$LT" grad --model "$tiny/model" --batch examples/tiny-qwen3/batch.json --dtype bf16 --device "$2" --policy "$3" \
    --nvme-dir "$tiny/nvme" --device-memory 1GiB --out "$tiny/$1.safetensors" >"$tiny/$1.json" 2>>"$tiny/err.log" ||
    { echo "grad $1 on $2 failed: $(tail -1 "$tiny/err.log")" >&2; status=1; }
}
grad keep-all "$DEVICE" keep-all
grad keep-all-again "$DEVICE" keep-all
for p in every:1 every:2 host:1 nvme:2; do grad "${p/:/_}" "$DEVICE" "$p"; done
grad cuda-sim cuda-sim keep-all
"$LT" grad --model "$tiny/model" --batch examples/tiny-qwen3/batch.json --dtype f32 --device cpu \
  --out "$tiny/cpu-f32.safetensors" >"$tiny/cpu-f32.json" 2>>"$tiny/err.log" || { echo "grad on the cpu failed" >&2; status=1; }
python3 - "$tiny" "$OUT/grad.json" <<'PY' || status=1
import json, subprocess, sys
tiny, out = sys.argv[1], sys.argv[2]
def diff(a, b):
    r = subprocess.run([sys.executable, "scripts/grad_diff.py", f"{tiny}/{a}.safetensors", f"{tiny}/{b}.safetensors"],
                       capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr.strip()[-300:]}
g = {"determinism": diff("keep-all", "keep-all-again")}
for p in ["every_1", "every_2", "host_1", "nvme_2"]:
    g[p] = diff("keep-all", p)
g["vs_cuda_sim"] = diff("cuda-sim", "keep-all")
g["vs_cpu_f32"] = diff("keep-all", "cpu-f32")
g["loss"] = {}
for n in ["keep-all", "cuda-sim", "cpu-f32"]:
    try:
        g["loss"][n] = json.loads(open(f"{tiny}/{n}.json").read().strip().splitlines()[-1])["loss"]
    except Exception as e:
        g["loss"][n] = f"error: {e}"
json.dump(g, open(out, "w"))
bad = [k for k in ["determinism", "every_1", "every_2", "host_1", "nvme_2"] if not g[k].get("identical")]
if bad or not g["vs_cuda_sim"].get("relative_l2", 1) <= 1e-2 or not g["vs_cpu_f32"].get("relative_l2", 1) <= 5e-2:
    sys.exit(f"grad: not bitwise for {bad}, or {g['vs_cuda_sim']} from cuda-sim, or {g['vs_cpu_f32']} from the CPU f32 path")
print(f"grad: every policy bitwise equal to keep-all, run twice the same; {g['vs_cuda_sim']['relative_l2']:.3g} from "
      f"cuda-sim, {g['vs_cpu_f32']['relative_l2']:.3g} from the CPU's f32 path")
PY

step="$OUT/step"
mkdir -p "$step"
if [ -n "${STEP_CONFIG:-}" ]; then
  cp "$STEP_CONFIG" "$step/config.json"
else
  cat >"$step/config.json" <<'JSON'
{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536,
 "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
 "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": true,
 "torch_dtype": "bfloat16"}
JSON
fi
python3 - "$step/config.json" "$step/batch.json" "$B" "$T" <<'PY'
import json, random, sys
vocab = json.load(open(sys.argv[1]))["vocab_size"]
r = random.Random(5)
ids = [[r.randrange(vocab) for _ in range(int(sys.argv[4]))] for _ in range(int(sys.argv[3]))]
json.dump({"input_ids": ids, "labels": ids}, open(sys.argv[2], "w"))
PY
run() {  # run LOG COMMAND...: its output into LOG; on failure the last line on stderr
  local log=$1
  shift
  "$@" >"$log" 2>&1 || { echo "failed: $* -> $(tail -1 "$log")" >&2; status=1; }
}
run "$step/init.log" "$LT" init --config "$step/config.json" --out "$step/model" --dtype bf16 --seed 1
run "$step/profile.log" "$LT" profile --model "$step/model" --batch "$B" --seq "$T" --device "$DEVICE" \
  --device-memory "$MEM" --dtype bf16 --out "$step/profile.json"
run "$step/plan-keep-all.json" "$LT" plan --model "$step/model" --hardware "$step/profile.json" --batch "$B" --seq "$T" \
  --device-memory "$MEM" --host-act-memory 8GiB --json
budget=$(python3 -c "
import json, sys
need = {r['name']: int(r['executor_device_bytes']) for r in json.load(open(sys.argv[1]))['plans']}
print((min(need.values()) + need['keep-all']) // 2)" "$step/plan-keep-all.json" 2>/dev/null || echo 0)
run "$step/plan.log" "$LT" plan --model "$step/model" --hardware "$step/profile.json" --batch "$B" --seq "$T" \
  --device-memory "$budget" --host-act-memory 8GiB --out "$step/plan.json"
for p in plan every4; do
  policy=$([ $p = plan ] && echo "$step/plan.json" || echo every:4)
  run "$step/step_$p.json" "$LT" bench step --model "$step/model" --batch "$step/batch.json" --dtype bf16 \
    --device "$DEVICE" --device-memory "$MEM" --policy "$policy" --steps 2 --json
done
python3 - "$step" "$budget" <<'PY' || status=1
import json, sys
step, budget = sys.argv[1], int(sys.argv[2])
def last(name):
    return json.loads(open(f"{step}/{name}").read().strip().splitlines()[-1])
plan, every4 = last("step_plan.json"), last("step_every4.json")
print(f"step: solved plan {plan['tokens_per_s']:.0f} tok/s, peak {plan['peak_device_bytes'] / 2**20:.0f} MiB "
      f"(budget {budget / 2**20:.0f} MiB); every:4 {every4['tokens_per_s']:.0f} tok/s; "
      f"ratio {plan['tokens_per_s'] / every4['tokens_per_s']:.2f}")
if plan["peak_device_bytes"] > budget:
    sys.exit("the solved plan's measured peak is above its budget")
PY
exit $status
