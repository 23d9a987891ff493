#!/usr/bin/env bash
# make gpu-check: the CUDA backend's checks on a machine with an NVIDIA GPU, within 10 minutes, ending with
# one JSON line of the figures (docs/cuda.md). Steps:
#   1. build with CUDA for this GPU's architecture only (nvidia-smi's compute capability; BUILD=build-gpu)
#   2. lazytrain devices --json
#   3. the kernel tests natively (each native kernel against its cuda-sim run, run twice for determinism;
#      cuBLASLt against its emulation and row-independent), twice over (--gtest_repeat=2), and the CUDA device's
#   4. the cuda-sim suite (ctest -L cuda-sim), so the comparison has its CPU side on this host too
#   5. bench_cuda_layer: a Qwen2.5-7B layer's kernels and GEMMs in TFLOPS against an 8192^3 GEMM measured here;
#      attention alone at head dims 128 and 256 (Qwen3.6-27B's), the gated delta rule at Qwen3.6-27B's shape
#   6. scripts/gpu-steps.sh: `lazytrain grad --device cuda` bitwise across plans and runs, within bf16 rounding
#      of cuda-sim and of the CPU's f32 path; a streamed step of a Qwen2.5-1.5B shape with the plan solved from
#      a profile measured on the GPU, against every:4; with PAPER_STEP=1 also the paper's setting (Qwen2.5-7B
#      shape, 144 x 1024 tokens a step; a few minutes more and about 100 GB of host memory), the solved plan and
#      every:4 side by side; GPU_STEPS=paper27 the same for 12 of Qwen3.6-27B's layers at 72 x 1024
# GPU_CHECKS picks steps 3 to 6 (a comma list of tests, layer, steps; default all): a second call within the
# lease's warm window can then run only `GPU_CHECKS=steps GPU_STEPS=paper` (and another `GPU_STEPS=paper27`: each
# takes a few minutes of the 10 a call may run).
# LT_PREBUILT=DIR runs on the programs scripts/gpu-bundle.sh packed into DIR elsewhere (a GPU host with no package
# registry or no time to build): step 1 becomes unpacking, step 4 is left to the machine that built them, and
# cuBLASLt is taken from this host's CUDA install (LT_CUBLAS_DIR, or found under /usr/local, /opt, /usr/lib).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-$BUILD/gpu-check}
start=$(date +%s)
command -v nvidia-smi >/dev/null || { echo "gpu-check: nvidia-smi not found: this is not a GPU machine" >&2; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
archs=${CUDA_ARCHS:-${cc:-90}}
mkdir -p "$OUT"

if [ -n "${LT_PREBUILT:-}" ]; then
  echo "== gpu-check: the programs packed in $LT_PREBUILT"
  tar -C "$LT_PREBUILT" -xJf "$LT_PREBUILT/bundle.tar.xz"
  if [ -z "${LT_CUBLAS_DIR:-}" ]; then
    lib=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.1[3-9]*' 2>/dev/null | head -1 || true)
    [ -n "$lib" ] || { echo "gpu-check: no libcublasLt.so.13 on this host; set LT_CUBLAS_DIR" >&2; exit 1; }
    export LT_CUBLAS_DIR=$(dirname "$lib")
  fi
  echo "cuBLASLt from $LT_CUBLAS_DIR"
  BIN=$LT_PREBUILT/bin BENCH=$LT_PREBUILT/bin
else
  echo "== gpu-check: build (sm_$archs)"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$archs" >/dev/null
  cmake --build "$BUILD" -j "$(nproc)" --target lazytrain test_kernels_native test_cuda_device test_kernels_layer \
    test_kernels_attention test_kernels_head test_gemm_emulation test_simt test_simt_warp test_simt_errors \
    test_executor_cuda test_op_harness bench_cuda_layer
  BIN=$BUILD BENCH=$BUILD/bench
fi
"$BIN/lazytrain" devices --json | tee "$OUT/devices.json"

status=0
check() { [[ ",${GPU_CHECKS:-tests,layer,steps}," == *",$1,"* ]]; }
if check tests; then
  echo "== gpu-check: native kernel tests (twice)"
  timeout 300 "$BIN/test_kernels_native" --gtest_repeat=2 --gtest_output="json:$OUT/native.json" || status=1
  echo "== gpu-check: the CUDA device"
  timeout 120 "$BIN/test_cuda_device" --gtest_output="json:$OUT/device.json" || status=1
  echo "== gpu-check: the op table's native rows (every op against the plain CPU loops)"
  timeout 300 "$BIN/test_op_harness" --gtest_filter='*_cuda_f32:*_cuda_bf16' --gtest_output="json:$OUT/op_table.json" || status=1
fi
if ! check tests; then
  echo "the cuda-sim suite: not asked for (GPU_CHECKS)" >"$OUT/cuda-sim.log"
elif [ -z "${LT_PREBUILT:-}" ]; then
  echo "== gpu-check: the cuda-sim suite"
  (cd "$BUILD" && ctest -L cuda-sim -j "$(nproc)" --output-on-failure >"$OUT/cuda-sim.log" 2>&1) || status=1
  tail -3 "$OUT/cuda-sim.log"
else
  echo "the cuda-sim suite: run where the bundle was built" >"$OUT/cuda-sim.log"
fi
if check layer; then
  echo "== gpu-check: layer benchmark"
  timeout 180 "$BENCH/bench_cuda_layer" | tee "$OUT/layer.json" || status=1
fi
if check steps; then
  echo "== gpu-check: grad and a streamed step on the GPU"
  scripts/gpu-steps.sh "$BIN/lazytrain" cuda "$OUT" || status=1
fi

/usr/bin/env python3 - "$OUT" "$status" "$start" <<'PY'
import json, os, sys, time
out, status, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(name):  # a JSON file, or the last line of one that prints JSON lines
    try:
        text = open(os.path.join(out, name)).read().strip()
        try:
            return json.loads(text)
        except ValueError:
            return json.loads(text.splitlines()[-1])
    except Exception as e:
        return {"error": f"{name}: {e}"}
def counts(report):
    if "tests" not in report:
        return report
    cases = [t for suite in report.get("testsuites", []) for t in suite.get("testsuite", [])]
    skipped = sum(1 for t in cases if t.get("result") == "SKIPPED")
    return {"tests": report["tests"], "failures": report.get("failures", 0), "skipped": skipped}
sim_log = open(os.path.join(out, "cuda-sim.log")).read().splitlines()  # "...: run where the bundle was built"
summary = {
    "gpu_check": "passed" if status == 0 else "failed",
    "devices": load("devices.json").get("cuda", {}),
    "native_kernel_tests": counts(load("native.json")),
    "cuda_device_tests": counts(load("device.json")),
    "cuda_sim_suite": next((l for l in sim_log if "tests passed" in l), sim_log[0] if sim_log else "see cuda-sim.log"),
    "layer": load("layer.json"),
    "grad_on_gpu": load("grad.json"),
    "streamed_step": {"solved_plan_at_half_keep_all": load("step/step_plan.json"),
                      "every4": load("step/step_every4.json")},
    # The paper's settings (scripts/gpu-steps.sh paper, paper27): the solved plan and every:4 side by side.
    **{name: {p: load(f"{name}/step_{p}.json") for p in ["plan", "every4"]}
       if os.path.exists(os.path.join(out, name, f"step_plan.json")) else "not run"
       for name in ["paper", "paper27"]},
    "seconds": int(time.time()) - start,
}
print(json.dumps(summary))
PY
exit $status
