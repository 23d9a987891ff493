#!/usr/bin/env bash
# `make test` after the build: the whole suite on this host's widest instruction set, again capped at
# AVX2 (the host CPU of many GPU servers: EPYC Rome/Milan) when this host has AVX-512, and the kernel
# tests (core, ops, optim) capped at the plain loops every vector path is specified by. LT_MAX_ISA caps
# LazyTrain's own dispatch and oneDNN's (core/cpu_features.h), so one machine proves the other hosts.
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
  run "capped at avx2 (LT_MAX_ISA=avx2)" env LT_MAX_ISA=avx2 ctest --output-on-failure -j "$jobs"
else
  echo "== run-tests: this host has no AVX-512; the native run above is the AVX2 run"
fi
run "kernels capped at plain (LT_MAX_ISA=plain, labels core|ops|optim)" \
  env LT_MAX_ISA=plain ctest --output-on-failure -j "$jobs" -L '^(core|ops|optim)$'
