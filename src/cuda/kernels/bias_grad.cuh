// cuda/kernels/bias_grad.cuh — the linear layer's bias gradient, dbias[N] += Σ_rows dout[M, N], in the CPU op's
// order (ops/cpu/linear.cpp): per column, per token slice of kTokenSlice rows, an f64 sum over the slice's rows
// in order, added to dbias in f32 once per slice. One thread per column (consecutive threads read consecutive
// columns of a row: coalesced); no atomics. cuBLASLt's BGRAD epilogue is not used: its reduction order is
// not specified.
#pragma once

#include "cuda/kernels/common.cuh"
#include "ops/linear.h"

namespace lt::cuda::LT_KERNELS_NS {

constexpr int kBiasGradThreads = 128;

__global__ void __launch_bounds__(kBiasGradThreads)
    bias_grad_kernel(float* dbias, const float* dout, int64_t M, int64_t N) {
  const int64_t c = int64_t(blockIdx.x) * kBiasGradThreads + threadIdx.x;
  if (c >= N) return;
  for (int64_t t0 = 0; t0 < M; t0 += kTokenSlice) {
    const int64_t t1 = t0 + kTokenSlice < M ? t0 + kTokenSlice : M;
    double acc = 0.0;
    for (int64_t r = t0; r < t1; ++r) acc += double(dout[r * N + c]);
    dbias[c] += float(acc);
  }
}

void bias_grad(Stream s, float* dbias, const float* dout, int64_t M, int64_t N) {
  if (M == 0 || N == 0) return;
  LT_LAUNCH(bias_grad_kernel, dim3(unsigned((N + kBiasGradThreads - 1) / kBiasGradThreads)),
            dim3(kBiasGradThreads), 0, native_stream(s), dbias, dout, M, N);
}

}  // namespace lt::cuda::LT_KERNELS_NS
