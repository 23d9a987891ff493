#!/usr/bin/env bash
# Tokenizer encode throughput, one core: LazyTrain vs the JavaScript reference encoder on the same
# generated corpus, same run. Both must produce the same number of tokens (a cheap cross-check).
# Usage (from anywhere): bench/run_tokenizer.sh [BUILD_DIR] [MB]
# BUILD_DIR must have been configured with -DLT_BUILD_BENCH=ON (the default) and built.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=$(cd "${1:-$root/build}" && pwd)
mb=${2:-4}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$root"
ours=$(taskset -c 0 "$build/bench/bench_tokenizer" --mb "$mb" --corpus-out "$tmp/corpus.txt")
js=$(taskset -c 0 node "$here/bench_tokenizer.js" "$tmp/corpus.txt" 1)
echo "$ours"
echo "$js"
/usr/bin/python3 - "$ours" "$js" <<'PY'
import json, os, sys
o, j = json.loads(sys.argv[1]), json.loads(sys.argv[2])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"\nmachine: {cpu}, {os.cpu_count()} cores (1 used); corpus {o['bytes'] / 1e6:.1f} MB, "
      f"{o['documents']} documents, {o['tokens']} tokens ({o['bytes_per_token']:.2f} bytes/token)")
print(f"{'':10} {'cold MB/s':>10} {'warm MB/s':>10} {'Mtokens/s':>10}")
for r in (o, j):
    print(f"{r['impl']:10} {r['cold_mb_s']:10.2f} {r['warm_mb_s']:10.2f} {r['tokens_per_s'] / 1e6:10.3f}")
print(f"lazytrain / js (cold): {o['cold_mb_s'] / j['cold_mb_s']:.1f}x")
if o["tokens"] != j["tokens"]:
    sys.exit(f"token counts differ: lazytrain {o['tokens']} vs js {j['tokens']}")
PY
