#!/usr/bin/env bash
# `make test` after the build: the whole suite on this host's widest instruction set; then, capped, the tests whose
# results depend on the instruction set — again at AVX2 (the host CPU of many GPU servers: EPYC Rome/Milan) when
# this host has AVX-512, and at the plain loops every vector path is specified by. LT_MAX_ISA caps LazyTrain's own
# dispatch and oneDNN's (core/cpu_features.h), so one machine proves the other hosts.
#
# What depends on the instruction set: the kernels (labels core, ops, optim), the block and model on them (model),
# the executor's exactness on them (exec, but the CUDA block's tests: cuda-sim's kernels are not dispatched), and
# the whole model against PyTorch at each GEMM dtype (model_vs_torch.CASE.f32 / .bf16). Not the parsers, the planner,
# the tokenizer, the file formats, cuda-sim (the op table's CUDA rows among them) or the CLI's plumbing: their
# results are the same on every host, and the native pass has run them. Nor the finite-difference checks: they test
# the formulas, which the native pass checks on its kernels, and the op table holds each capped kernel to the plain
# reference (and model_vs_torch the capped model to PyTorch's gradients).
set -euo pipefail
build=${1:-build}
jobs=${2:-$(nproc)}
cd "$build"

has_avx512=$(grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo && echo 1 || echo 0)
has_avx2=$(grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && echo 1 || echo 0)

run() {  # run LABEL [ctest args...]
  local label=$1; shift
  echo "== run-tests: $label"
  local start=$SECONDS
  "$@"
  echo "== run-tests: $label passed in $((SECONDS - start)) s"
}

run "native ($( ((has_avx512)) && echo avx512 || { ((has_avx2)) && echo avx2 || echo plain; }))" \
  ctest --output-on-failure -j "$jobs"
if ((has_avx512)); then
  run "capped at avx2 (LT_MAX_ISA=avx2): kernels, model, executor" env LT_MAX_ISA=avx2 \
    ctest --output-on-failure -j "$jobs" -L '^(core|ops|optim|model|exec)$' \
    -E 'CudaExecutor|TheCudaBlock|OpTable.*_cuda|FiniteDifferences'
  run "capped at avx2 (LT_MAX_ISA=avx2): the model against PyTorch" env LT_MAX_ISA=avx2 \
    ctest --output-on-failure -j "$jobs" -R '^model_vs_torch\.[a-z0-9_]+\.(f32|bf16)$' -E '_fused_'
else
  echo "== run-tests: this host has no AVX-512; the native run above is the AVX2 run"
fi
run "kernels capped at plain (LT_MAX_ISA=plain, labels core|ops|optim)" \
  env LT_MAX_ISA=plain ctest --output-on-failure -j "$jobs" -L '^(core|ops|optim)$' -E 'OpTable.*_cuda|FiniteDifferences'
