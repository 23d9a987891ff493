#!/usr/bin/env bash
# make fuzz: every fuzzer (fuzz/fuzz_*.cpp: libFuzzer, ASan, UBSan; built with clang into BUILD=build-fuzz) for
# FUZZ_SECONDS each (default 60), from its seed corpus (fuzz/seeds/<input>: the project's own files) and
# dictionary (fuzz/dicts). Fails on any crash, leak, hang (> 5 s on one input) or out-of-memory (> 2 GiB); the
# input that did it is kept in BUILD/fuzz-artifacts, to be checked in as a regression (fuzz/regressions/, run by
# `ctest -R fuzz_regressions` in that build). Ends with a table and BUILD/fuzz-report.json: executions, corpus
# size and coverage per fuzzer (docs/robustness.md).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-fuzz}
SECS=${FUZZ_SECONDS:-60}
JOBS=${JOBS:-$(nproc)}
ONLY=${FUZZERS:-}  # a space-separated subset (fuzz_batch_json ...), default all

command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (scripts/install-deps.sh installs clang)" >&2; exit 1; }
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DLT_FUZZ=ON -DLT_CUDA=OFF -DLT_BUILD_TESTS=OFF -DLT_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target fuzzers

# The real files some fuzzers load beside the fuzzed one: examples/arith's byte-level tokenizer.
data="$BUILD/fuzz-data"
if [ ! -f "$data/model/tokenizer.json" ]; then
  python3 examples/arith/make_data.py "$data" --train 8 --test 2 >/dev/null
fi

dict_of() {
  case $1 in
    safetensors) echo fuzz/dicts/safetensors.dict ;;
    train_config) echo fuzz/dicts/yaml.dict ;;
    *) echo fuzz/dicts/json.dict ;;
  esac
}

mkdir -p "$BUILD/fuzz-artifacts" "$BUILD/fuzz-logs"
status=0
report="["
for exe in "$BUILD"/fuzz/fuzz_*; do
  name=$(basename "$exe")
  input=${name#fuzz_}
  if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then continue; fi
  corpus="$BUILD/fuzz-corpus/$input"
  mkdir -p "$corpus"
  log="$BUILD/fuzz-logs/$name.log"
  rc=0
  # -timeout: a hang is > 5 s on one input; -rss_limit_mb: out-of-memory above 2 GiB; leaks are on (ASan's).
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$exe" -max_total_time="$SECS" -timeout=5 -rss_limit_mb=2048 -max_len=65536 -dict="$(dict_of "$input")" \
    -artifact_prefix="$BUILD/fuzz-artifacts/$name-" -print_final_stats=1 "$corpus" "fuzz/seeds/$input" \
    >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  rss=$(grep -o 'stat::peak_rss_mb: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo 0)
  files=$(find "$corpus" -type f | wc -l)
  verdict=ok
  if [ "$rc" != 0 ]; then
    verdict="FAILED (exit $rc): $(grep -m1 -E 'ERROR: |==ERROR|runtime error|fuzz: ' "$log" || tail -1 "$log")"
    status=1
  fi
  printf '%-28s %10s execs %6s edges %6s corpus %5s MiB  %s\n' "$name" "$execs" "$cov" "$files" "$rss" "$verdict"
  report+="{\"fuzzer\": \"$name\", \"seconds\": $SECS, \"executions\": ${execs:-0}, \"edges\": ${cov:-0}, \"corpus\": $files, \"peak_rss_mb\": ${rss:-0}, \"ok\": $([ "$rc" = 0 ] && echo true || echo false)},"
done
echo "${report%,}]" >"$BUILD/fuzz-report.json"
[ $status = 0 ] || echo "fuzz: failures above; inputs in $BUILD/fuzz-artifacts, logs in $BUILD/fuzz-logs" >&2
exit $status
