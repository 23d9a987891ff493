// cuda/kernels/common.cuh — what every kernel source shares: the storage types, loads and stores that widen
// to f32 and round back, and launch geometry. Kernel sources are compiled twice (cuda/kernels_sim.cpp by the
// host compiler against cuda-sim, cuda/native/kernels.cu by nvcc), each time inside its own namespace
// lt::cuda::LT_KERNELS_NS (sim or native), so one binary can hold both.
//
// Arithmetic rule: nvcc compiles these with -fmad=false and IEEE division and square root, so a kernel that
// performs the CPU op's operations in the CPU op's order gives the CPU op's bits.
#pragma once

#ifndef LT_KERNELS_NS
#error "define LT_KERNELS_NS (sim or native) before including a kernel source"
#endif

#include <cstdint>

#include "core/host_device.h"
#include "cuda/kernels.h"
#include "cuda_sim/cuda_sim.h"

// Unrolls the loop that follows under nvcc. A loop whose counter indexes a register array must be unrolled, or the
// array goes to local memory; nvcc leaves some such loops rolled when their bodies are large (a warp's m-tiles in
// the attention forward: an 816-byte stack frame). The host compiler needs no such hint.
#ifdef __CUDACC__
#define LT_UNROLL _Pragma("unroll")
#else
#define LT_UNROLL
#endif

namespace lt::cuda::LT_KERNELS_NS {

using bf16 = __nv_bfloat16;

// The API's bf16_t (raw bits) and the kernels' __nv_bfloat16 are the same two bytes.
static_assert(sizeof(bf16) == sizeof(bf16_t));
inline bf16* dev(bf16_t* p) { return reinterpret_cast<bf16*>(p); }
inline const bf16* dev(const bf16_t* p) { return reinterpret_cast<const bf16*>(p); }
inline float* dev(float* p) { return p; }
inline const float* dev(const float* p) { return p; }

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const bf16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

#ifdef __CUDACC__
inline cudaStream_t native_stream(Stream s) { return static_cast<cudaStream_t>(s); }
#else
inline Stream native_stream(Stream s) { return s; }
#endif

constexpr int kElementwiseThreads = 256;
// Grid-stride launches for elementwise kernels: enough blocks to fill any GPU, never more than the data.
inline unsigned elementwise_blocks(int64_t n) {
  const int64_t blocks = (n + kElementwiseThreads - 1) / kElementwiseThreads;
  return unsigned(blocks < 1 ? 1 : (blocks > 8192 ? 8192 : blocks));
}

__device__ __forceinline__ int64_t global_thread() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_threads() { return int64_t(gridDim.x) * blockDim.x; }

// In a launcher with a Stream `s`: kernel<<<elementwise_blocks(n), 256, 0, s>>>(args...) unless n is 0.
#define LT_ELEMENTWISE(kernel, n, ...)                                                                     \
  do {                                                                                                     \
    if ((n) > 0)                                                                                           \
      LT_LAUNCH(kernel, dim3(elementwise_blocks(n)), dim3(kElementwiseThreads), 0, native_stream(s),      \
                __VA_ARGS__);                                                                              \
  } while (0)

}  // namespace lt::cuda::LT_KERNELS_NS
