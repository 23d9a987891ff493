#!/usr/bin/env bash
# scripts/gpu-bundle.sh [DIR] — build what `make gpu-check` runs for one GPU architecture here, and pack it with
# the shared libraries it needs into DIR (default .gpu/, ignored by git), for a GPU host that cannot build the
# project: no package registry to install the build's dependencies from, or no time to compile there.
# There: `LT_PREBUILT=DIR bash scripts/gpu-check.sh` runs the checks on these binaries (docs/cuda.md).
#   DIR/bundle.tar.xz   bin/ (a wrapper per program setting LD_LIBRARY_PATH), libexec/ (the programs, stripped),
#                       lib/ (every shared library they load except the C library's own, the NVIDIA driver's and
#                       cuBLAS/cuBLASLt, which the GPU host's CUDA install provides: they are hundreds of MiB)
# CUDA_ARCHS (default 90: Hopper) picks the architecture; BUILD (default build-gpu) the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpu}
BUILD=${BUILD:-build-gpu}
ARCHS=${CUDA_ARCHS:-90}
PROGRAMS=(lazytrain test_kernels_native test_cuda_device test_op_harness bench/bench_cuda_layer)

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target lazytrain test_kernels_native test_cuda_device test_op_harness \
  bench_cuda_layer

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/libexec" "$stage/lib"
for p in "${PROGRAMS[@]}"; do
  name=$(basename "$p")
  cp "$BUILD/$p" "$stage/libexec/$name"
  strip "$stage/libexec/$name"
  cat >"$stage/bin/$name" <<'SH'
#!/usr/bin/env bash
# The bundled program of the same name, with the bundle's libraries first and the host's cuBLAS found.
here=$(cd "$(dirname "$0")/.." && pwd)
export LD_LIBRARY_PATH="$here/lib${LT_CUBLAS_DIR:+:$LT_CUBLAS_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$here/libexec/$(basename "$0")" "$@"
SH
  chmod +x "$stage/bin/$name"
  # Every resolved library but the C library's (the host's must be used), the driver's and cuBLAS's.
  ldd "$BUILD/$p" | awk '/=> \// {print $1, $3}' | while read -r soname path; do
    case "$soname" in
      libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libcuda.so* | libcublas*.so* | \
        libnvidia-*) ;;
      *) [ -e "$stage/lib/$soname" ] || cp -L "$path" "$stage/lib/$soname" ;;
    esac
  done
done
mkdir -p "$DIR"
tar -C "$stage" -cJf "$DIR/bundle.tar.xz" bin libexec lib
echo "gpu-bundle: $DIR/bundle.tar.xz ($(du -h "$DIR/bundle.tar.xz" | cut -f1)) for sm_$ARCHS:" \
  "$(ls "$stage/libexec" | tr '\n' ' ')+ $(ls "$stage/lib" | wc -l) libraries"
