// cuda/kernels/attention_common.cuh — what the CUDA-core (attention.cuh) and tensor-core (attention_mma.cuh)
// attention kernels share: where a token's head lives, the causal/document mask, the scale, and the opt-in to
// large shared memory.
#pragma once

#include <cmath>

#include "cuda/kernels/common.cuh"
#include "ops/attention.h"

namespace lt::cuda::LT_KERNELS_NS {

// Where token t of batch row b, head h lives in a [B, T, H, D] tensor.
__device__ __forceinline__ int64_t head_row(int64_t b, int64_t t, int64_t h, int64_t T, int64_t H, int64_t D) {
  return ((b * T + t) * H + h) * D;
}

// Query i may attend key j: causal, within the sliding window (window > 0: the last `window` keys, i − window < j,
// ops/attention.h), and within one document when doc_ids is given.
__device__ __forceinline__ bool attends(const int32_t* doc_ids, int64_t b, int64_t T, int64_t i, int64_t j,
                                        int64_t window) {
  return j <= i && (window <= 0 || j > i - window) && (doc_ids == nullptr || doc_ids[b * T + i] == doc_ids[b * T + j]);
}

// GPT-OSS's attention sinks where a row is stored (ops/attention.h's attention_sinks_forward, its arithmetic): from
// the row's lse as stored without them (f32), lse' = log(exp(lse) + exp(sink)) in double, and the factor
// exp(lse − lse') its output keeps (f32). The kernels multiply the f32 output by it before the one store, so a bf16
// output is rounded once, where the CPU block rounds it.
struct SinkRow {
  float keep, lse;
};
__device__ __forceinline__ SinkRow with_sink(float lse, float sink) {
  const double old = lse, m = old < double(sink) ? double(sink) : old;
  const double now = m + ::log(::exp(old - m) + ::exp(double(sink) - m));
  return {float(::exp(old - now)), float(now)};
}

namespace detail {

// Above 48 KiB a kernel needs the opt-in attribute on a GPU; set before every launch (a host call of about a
// microsecond, and per kernel and device, which a once-only static would get wrong: kernels of one signature
// share a template instance). An error surfaces at the launch. cuda-sim takes up to 227 KiB.
template <class Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
#ifdef __CUDACC__
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
#else
  (void)kernel, (void)bytes;
#endif
}

// The most dynamic shared memory a block may opt into on the current GPU (cuda-sim: the GPU it emulates), for the
// launchers whose tiles would exceed it on sm_86 / sm_89.
inline size_t max_block_shared_bytes() {
#ifdef __CUDACC__
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return 0;  // the launch that follows reports the error
  return size_t(bytes);
#else
  return cuda_sim::max_dynamic_shared_bytes();
#endif
}

inline float attention_scale(int64_t D) { return float(1.0 / std::sqrt(double(D))); }  // the CPU op's

}  // namespace detail
}  // namespace lt::cuda::LT_KERNELS_NS
