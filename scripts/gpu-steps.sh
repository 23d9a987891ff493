#!/usr/bin/env bash
# scripts/gpu-steps.sh LAZYTRAIN DEVICE OUT — the executor on DEVICE (cuda; cuda-sim to rehearse on the CPU), as
# `make gpu-check` runs it. Writes OUT/grad.json and OUT/step/step_{plan,every4}.json; exits 1 on any failure.
#   grad   `lazytrain grad` on examples/tiny-qwen3, tiny-qwen35, tiny-qwen3 at head dim 64 and tiny-qwen35 at 256
#          (tensor-core attention) and a tiny Qwen3-MoE (sparse layers), bf16, random inits no test has seen: keep-all twice (same bytes: determinism), every
#          policy (recompute, host, NVMe) byte-identical to keep-all, the same step under cuda-sim (the GPU
#          block's host run) within bf16 rounding, and the CPU's f32 in-memory path within the bf16 bound
#          model_vs_torch uses (relative L2 5e-2) (scripts/grad_diff.py)
#   step   a streamed step of STEP_CONFIG (default: a Qwen2.5-1.5B shape, random init) at STEP_B x STEP_T (8 x
#          1024): `lazytrain profile` on DEVICE, the plan solved for a budget halfway between the smallest
#          baseline's device need and keep-all's, and `bench step` of it against every:4
#   paper  the paper's setting on this GPU: a Qwen2.5-7B shape (random init), 144 x 1024 tokens a step,
#          profiled here, planned for PAPER_DEVICE_MEMORY (default: the GPU's memory less 4 GiB for the CUDA
#          context and cuBLASLt; 75.6 GiB on an 80 GB H100, 136 GiB on an H200) and 8 GiB of host activations, one
#          timed step after a warm-up, the plan's and every:4's (about 100 GB of host memory): OUT/paper/step_*.json
#   paper27 the same for Qwen3.6-27B's layers (PAPER27_LAYERS of them, default 12) at 72 x 1024
# GPU_STEPS picks the parts (a comma list, default grad,step); PAPER_STEP=1 adds paper.
set -uo pipefail
LT=$1 DEVICE=$2 OUT=$3
B=${STEP_B:-8} T=${STEP_T:-1024} MEM=${STEP_DEVICE_MEMORY:-40GiB}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
status=0
want() { [[ ",${GPU_STEPS:-grad,step}${PAPER_STEP:+,paper}," == *",$1,"* ]]; }  # GPU_STEPS: which parts
run() {  # run LOG COMMAND...: its output into LOG; on failure (or STEP_TIMEOUT seconds) the last line on stderr
  local log=$1
  shift
  timeout "${STEP_TIMEOUT:-300}" "$@" >"$log" 2>&1 || { echo "failed: $* -> $(tail -1 "$log")" >&2; status=1; }
}

# The MLP chunk (tokens) a plan file runs with (0: one chunk): every:4 beside it runs with the same, so the two
# differ only in what they keep (at the paper's 7B batch one chunk's scratch alone is 62 GiB: `lazytrain plan`'s note).
mlp_chunk() {
  python3 -c "import json, sys; print(json.load(open(sys.argv[1])).get('mlp_chunk_tokens', 0))" "$1" 2>/dev/null ||
    echo 0
}

random_batch() {  # random_batch CONFIG OUT B T SEED: B rows of T random token ids (labels = inputs)
  python3 - "$@" <<'PY'
import json, random, sys
vocab = json.load(open(sys.argv[1]))["vocab_size"]
r = random.Random(int(sys.argv[5]))
ids = [[r.randrange(vocab) for _ in range(int(sys.argv[4]))] for _ in range(int(sys.argv[3]))]
json.dump({"input_ids": ids, "labels": ids}, open(sys.argv[2], "w"))
PY
}

if want grad; then
# The grad checks on two unseen tiny models: a Qwen3 (attention layers) and a Qwen3.5 hybrid (Gated DeltaNet
# layers and gated attention), the same batch (its ids fit both vocabularies).
grad_suite() {  # grad_suite NAME CONFIG: OUT/NAME/*.safetensors
  local tiny="$OUT/$1" config=$2
  mkdir -p "$tiny/nvme"
  "$LT" init --config "$config" --out "$tiny/model" --seed 3 >/dev/null || status=1
  grad() {  # grad NAME DEVICE POLICY
    "$LT" grad --model "$tiny/model" --batch examples/tiny-qwen3/batch.json --dtype bf16 --device "$2" --policy "$3" \
      --nvme-dir "$tiny/nvme" --device-memory 1GiB --out "$tiny/$1.safetensors" >"$tiny/$1.json" 2>>"$tiny/err.log" ||
      { echo "grad $1 of $(basename "$tiny") on $2 failed: $(tail -1 "$tiny/err.log")" >&2; status=1; }
  }
  grad keep-all "$DEVICE" keep-all
  grad keep-all-again "$DEVICE" keep-all
  for p in every:1 every:2 host:1 nvme:2; do grad "${p/:/_}" "$DEVICE" "$p"; done
  grad cuda-sim cuda-sim keep-all
  "$LT" grad --model "$tiny/model" --batch examples/tiny-qwen3/batch.json --dtype f32 --device cpu \
    --out "$tiny/cpu-f32.safetensors" >"$tiny/cpu-f32.json" 2>>"$tiny/err.log" ||
    { echo "grad of $(basename "$tiny") on the cpu failed" >&2; status=1; }
}
grad_suite tiny-qwen3 examples/tiny-qwen3/config.json
grad_suite tiny-qwen35 examples/tiny-qwen35/config.json
variant_suite() {  # variant_suite NAME BASE_CONFIG 'KEY=VALUE, ...': grad_suite on BASE_CONFIG with those keys changed
  mkdir -p "$OUT/$1"
  python3 -c "
import json, sys
c = json.load(open(sys.argv[1]))
c.update(dict($3))
json.dump(c, open(sys.argv[2], 'w'))" "$2" "$OUT/$1/config.json"
  grad_suite "$1" "$OUT/$1/config.json"
}
# Head dim 64: attention on tensor cores (cuda/kernels/attention_mma.cuh) in the bf16 runs.
variant_suite tiny-qwen3-d64 examples/tiny-qwen3/config.json 'head_dim=64, num_attention_heads=4, num_key_value_heads=2'
# Head dim 256: Qwen3.5's gated attention at its real head dim, on the wide tensor-core kernels
# (cuda/kernels/attention_mma_wide.cuh).
variant_suite tiny-qwen35-d256 examples/tiny-qwen35/config.json \
  'head_dim=256, num_attention_heads=2, num_key_value_heads=1'
# Qwen3-MoE: sparse layers after a dense one (cuda/layers/moe.inl: the router, permutation and combine kernels,
# one cuBLASLt call per expert, each slice's offsets read back to the host).
variant_suite tiny-qwen3-moe examples/tiny-qwen3/config.json "model_type='qwen3_moe', \
  architectures=['Qwen3MoeForCausalLM'], num_experts=8, num_experts_per_tok=2, moe_intermediate_size=96, \
  decoder_sparse_step=1, mlp_only_layers=[0], norm_topk_prob=True, router_aux_loss_coef=0.001"
python3 - "$OUT" "$OUT/grad.json" tiny-qwen3 tiny-qwen35 tiny-qwen3-d64 tiny-qwen35-d256 tiny-qwen3-moe <<'PY' || status=1
import json, subprocess, sys
out, report, models = sys.argv[1], sys.argv[2], sys.argv[3:]
def diff(tiny, a, b):
    r = subprocess.run([sys.executable, "scripts/grad_diff.py", f"{tiny}/{a}.safetensors", f"{tiny}/{b}.safetensors"],
                       capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr.strip()[-300:]}
every, failed = {}, []
for m in models:
    tiny = f"{out}/{m}"
    g = {"determinism": diff(tiny, "keep-all", "keep-all-again")}
    for p in ["every_1", "every_2", "host_1", "nvme_2"]:
        g[p] = diff(tiny, "keep-all", p)
    g["vs_cuda_sim"] = diff(tiny, "cuda-sim", "keep-all")
    g["vs_cpu_f32"] = diff(tiny, "keep-all", "cpu-f32")
    g["loss"] = {}
    for n in ["keep-all", "cuda-sim", "cpu-f32"]:
        try:
            g["loss"][n] = json.loads(open(f"{tiny}/{n}.json").read().strip().splitlines()[-1])["loss"]
        except Exception as e:
            g["loss"][n] = f"error: {e}"
    every[m] = g
    bad = [k for k in ["determinism", "every_1", "every_2", "host_1", "nvme_2"] if not g[k].get("identical")]
    if bad or not g["vs_cuda_sim"].get("relative_l2", 1) <= 1e-2 or not g["vs_cpu_f32"].get("relative_l2", 1) <= 5e-2:
        failed.append(f"{m}: not bitwise for {bad}, or {g['vs_cuda_sim']} from cuda-sim, or {g['vs_cpu_f32']} from "
                      "the CPU f32 path")
    else:
        print(f"grad {m}: every policy bitwise equal to keep-all, run twice the same; "
              f"{g['vs_cuda_sim']['relative_l2']:.3g} from cuda-sim, {g['vs_cpu_f32']['relative_l2']:.3g} from the "
              "CPU's f32 path")
json.dump(every, open(report, "w"))
if failed:
    sys.exit("grad: " + "; ".join(failed))
PY
fi

if want step; then
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
random_batch "$step/config.json" "$step/batch.json" "$B" "$T" 5
run "$step/init.log" "$LT" init --config "$step/config.json" --out "$step/model" --dtype bf16 --seed 1
run "$step/profile.log" "$LT" profile --model "$step/model" --batch "$B" --seq "$T" --device "$DEVICE" \
  --device-memory "$MEM" --dtype bf16 --out "$step/profile.json"
run "$step/plan-keep-all.json" "$LT" plan --model "$step/model" --hardware "$step/profile.json" --batch "$B" \
  --seq "$T" --device-memory "$MEM" --host-act-memory 8GiB --json
budget=$(python3 -c "
import json, sys
need = {r['name']: int(r['executor_device_bytes']) for r in json.load(open(sys.argv[1]))['plans']}
print((min(need.values()) + need['keep-all']) // 2)" "$step/plan-keep-all.json" 2>/dev/null || echo 0)
run "$step/plan.log" "$LT" plan --model "$step/model" --hardware "$step/profile.json" --batch "$B" --seq "$T" \
  --device-memory "$budget" --host-act-memory 8GiB --out "$step/plan.json"
chunk=$(mlp_chunk "$step/plan.json")
for p in plan every4; do
  policy=$([ $p = plan ] && echo "$step/plan.json" || echo every:4)
  run "$step/step_$p.json" "$LT" bench step --model "$step/model" --batch "$step/batch.json" --dtype bf16 \
    --device "$DEVICE" --device-memory "$MEM" --policy "$policy" --mlp-chunk "$chunk" --steps 2 --json
done
python3 - "$step" "$budget" <<'PY' || status=1
import json, sys
step, budget = sys.argv[1], int(sys.argv[2])
def last(name):
    return json.loads(open(f"{step}/{name}").read().strip().splitlines()[-1])
plan, every4 = last("step_plan.json"), last("step_every4.json")
print(f"step: solved plan {plan['tokens_per_s']:.0f} tok/s ({plan.get('tflops_6nd', 0):.1f} TFLOPS 6ND), "
      f"peak {plan['peak_device_bytes'] / 2**20:.0f} MiB "
      f"(budget {budget / 2**20:.0f} MiB); every:4 {every4['tokens_per_s']:.0f} tok/s; "
      f"ratio {plan['tokens_per_s'] / every4['tokens_per_s']:.2f}")
if plan["peak_device_bytes"] > budget:
    sys.exit("the solved plan's measured peak is above its budget")
PY
fi

# paper_step NAME CONFIG B T ANCHOR: init CONFIG (random, bf16), profile it on DEVICE at B x T, plan it for PMEM and 8
# GiB of host activations, then `bench step` of the plan and of every:4 side by side (one timed step each after a
# warm-up): OUT/NAME/step_{plan,every4}.json; the line printed compares with the paper's TFLOPS (ANCHOR).
paper_step() {
  local dir="$OUT/$1" config=$2 b=$3 t=$4 anchor=$5
  mkdir -p "$dir"
  cp "$config" "$dir/config.json"
  random_batch "$dir/config.json" "$dir/batch.json" "$b" "$t" 7
  # init writes 15 GB (its draws run in parallel chunks since the first GPU session, where one sequential
  # generator outlasted 200 s).
  STEP_TIMEOUT=${PAPER_INIT_TIMEOUT:-600} run "$dir/init.log" "$LT" init --config "$dir/config.json" \
    --out "$dir/model" --dtype bf16 --seed 2
  run "$dir/profile.log" "$LT" profile --model "$dir/model" --batch "$b" --seq "$t" --device "$DEVICE" \
    --device-memory "$PMEM" --dtype bf16 --out "$dir/profile.json"
  run "$dir/plan.log" "$LT" plan --model "$dir/model" --hardware "$dir/profile.json" --batch "$b" --seq "$t" \
    --device-memory "$PMEM" --host-act-memory 8GiB --out "$dir/plan.json"
  local chunk
  chunk=$(mlp_chunk "$dir/plan.json")
  for policy in plan every4; do
    local p="$dir/plan.json"
    [ "$policy" = every4 ] && p=every:4
    run "$dir/step_$policy.json" "$LT" bench step --model "$dir/model" --batch "$dir/batch.json" --dtype bf16 \
      --device "$DEVICE" --device-memory "$PMEM" --policy "$p" --mlp-chunk "$chunk" --steps 1 --json
  done
  python3 - "$dir" "$1, $b x $t" "$anchor" <<'PY' || status=1
import json, sys
d, what, anchor = sys.argv[1], sys.argv[2], float(sys.argv[3])
r = {p: json.loads(open(f"{d}/step_{p}.json").read().strip().splitlines()[-1]) for p in ["plan", "every4"]}
p, e = r["plan"], r["every4"]
print(f"{what}: solved plan {p['step_s']:.2f} s, {p['tflops_6nd']:.1f} TFLOPS 6ND ({p['tflops_6nd'] / anchor:.2f}x "
      f"the paper's {anchor}), peak {p['peak_device_bytes'] / 2**30:.1f} GiB; every:4 {e['tflops_6nd']:.1f} TFLOPS "
      f"(the plan {p['tflops_6nd'] / e['tflops_6nd']:.2f}x)")
PY
  rm -rf "$dir/model"
}

# The paper steps' device budget: PAPER_DEVICE_MEMORY, or all of the GPU's memory but 4 GiB (cuda-sim: 120 GiB).
paper_device_memory() {
  local total
  total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -d ' ')
  if [ -n "${PAPER_DEVICE_MEMORY:-}" ]; then echo "$PAPER_DEVICE_MEMORY"
  elif [ "$DEVICE" = cuda ] && [[ "$total" =~ ^[0-9]+$ ]]; then echo "$((total - 4096))MiB"
  else echo 120GiB; fi
}

if want paper; then
  PMEM=$(paper_device_memory)
  # The paper's Qwen2.5-7B setting: 144 x 1024 tokens a step (LazyTrain 199.84 TFLOPS on an H800).
  cat >"$OUT/qwen2.5-7b.json" <<'JSON'
{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
 "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
 "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": false,
 "torch_dtype": "bfloat16"}
JSON
  paper_step paper "$OUT/qwen2.5-7b.json" 144 1024 199.84
fi
if want paper27; then
  PMEM=$(paper_device_memory)
  # Qwen3.6-27B's layers (3 Gated DeltaNet : 1 gated attention of head dim 256) at 72 x 1024 tokens (the paper's
  # 219.95 TFLOPS on an H800), as many layers as 128 GiB of host memory holds with room to spare: PAPER27_LAYERS
  # (default 12: 79.7 GiB of parameter state by `lazytrain plan`, 7.1e9 parameters; 8 layers 62.6 GiB).
  python3 - "$OUT/qwen3.6-27b-shape.json" "${PAPER27_LAYERS:-12}" <<'PY'
import json, sys
c = json.load(open("examples/qwen3.6-27b/config.json"))
t, layers = c["text_config"], int(sys.argv[2])
t["num_hidden_layers"], t["layer_types"] = layers, t["layer_types"][:layers]
json.dump(c, open(sys.argv[1], "w"))
PY
  paper_step paper27 "$OUT/qwen3.6-27b-shape.json" 72 1024 219.95
fi
exit $status
