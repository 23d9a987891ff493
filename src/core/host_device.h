// core/host_device.h — marks a function that both the CPU ops and the CUDA kernels (native and cuda-sim)
// compile, so one formula gives the same bits on both: LT_HD_INLINE is `__host__ __device__ __forceinline__`
// under nvcc and an always-inlined function elsewhere. lt_float_bits / lt_bits_float are the bit casts
// both worlds have (std::bit_cast is not device code).
#pragma once

#include <bit>
#include <cstdint>

#if defined(__CUDACC__)
#define LT_HD_INLINE __host__ __device__ __forceinline__
#else
#define LT_HD_INLINE [[gnu::always_inline]] inline
#endif

LT_HD_INLINE uint32_t lt_float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return std::bit_cast<uint32_t>(f);
#endif
}

LT_HD_INLINE float lt_bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}
