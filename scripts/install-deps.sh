#!/usr/bin/env bash
# Installs every system package LazyTrain's build, tests and references need; skips what is present.
# Called by `make test` and `make demo`, so a fresh Debian 12 machine needs nothing else.
set -euo pipefail

# Debian packages: build tools, libraries (GEMM, JSON, CLI, logging), test frameworks, and the
# PyTorch reference used only by tests and benchmarks (never a runtime dependency).
packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev libdnnl-dev
  nlohmann-json3-dev libfmt-dev libcli11-dev
  libpcre2-dev libutf8proc-dev liburing-dev
  nodejs npm
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-numpy python3-torch
)

missing=()
for p in "${packages[@]}"; do
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
