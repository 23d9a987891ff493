// cuda/kernels/pack.cuh — eight elements a load and a store: 16-byte accesses where a launch's pointers allow.
//
// Memory-bound kernels (elementwise.cuh, cross_entropy.cuh, rmsnorm.cuh, rope.cuh) move eight bf16 in one 16-byte
// load instead of eight 2-byte ones (eight f32 in two). The widening and rounding are the scalar load()/store()'s,
// element by element, so a kernel's bits do not depend on whether it took the packed path.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "cuda/kernels/common.cuh"

namespace lt::cuda::LT_KERNELS_NS {

// Eight elements at a time where every pointer of a launch is 16-byte aligned (the executor's buffers are; an
// offset view may not be): one 16-byte load or store per eight bf16, two per eight f32, instead of eight 2- or
// 4-byte ones. Each element is the scalar path's formula on the same values, so the bits do not depend on which
// path ran. The packs come first (thread i takes packs i, i + grid, ...), then the n % 8 tail.
constexpr int kPack = 8;

__device__ __forceinline__ void load_pack(float (&x)[kPack], const float* p) {
#ifdef __CUDACC__
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
#else
  std::memcpy(x, p, sizeof(x));
#endif
}
__device__ __forceinline__ void load_pack(float (&x)[kPack], const bf16* p) {
  uint32_t w[kPack / 2];
#ifdef __CUDACC__
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#else
  std::memcpy(w, p, sizeof(w));
#endif
  for (int i = 0; i < kPack / 2; ++i)
    x[2 * i] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(w[i] & 0xffffu))),
    x[2 * i + 1] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(w[i] >> 16)));
}
__device__ __forceinline__ void store_pack(float* p, const float (&x)[kPack]) {
#ifdef __CUDACC__
  reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
#else
  std::memcpy(p, x, sizeof(x));
#endif
}
__device__ __forceinline__ void store_pack(bf16* p, const float (&x)[kPack]) {
  uint32_t w[kPack / 2];
  for (int i = 0; i < kPack / 2; ++i)
    w[i] = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(x[2 * i]))) |
           (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(x[2 * i + 1]))) << 16);
#ifdef __CUDACC__
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
#else
  std::memcpy(p, w, sizeof(w));
#endif
}

// Widened loads and rounded stores of W = 1 or kPack consecutive elements.
template <int W, class T>
__device__ __forceinline__ void load_n(float (&x)[W], const T* p) {
  if constexpr (W == kPack) load_pack(x, p);
  else x[0] = load(p);
}
template <int W, class T>
__device__ __forceinline__ void store_n(T* p, const float (&x)[W]) {
  if constexpr (W == kPack) store_pack(p, x);
  else store(p, x[0]);
}

// W consecutive elements' bits copied, no widening: 16-byte loads and stores where W = kPack (8 bf16 in one, 8 f32
// in two), one element where W = 1.
template <int W, class T>
__device__ __forceinline__ void copy_n(T* dst, const T* src) {
  if constexpr (W == 1) {
    *dst = *src;
  } else {
    static_assert(W * sizeof(T) % 16 == 0, "copy_n packs whole 16-byte words");
#ifdef __CUDACC__
    for (size_t k = 0; k < W * sizeof(T) / 16; ++k) reinterpret_cast<uint4*>(dst)[k] = reinterpret_cast<const uint4*>(src)[k];
#else
    std::memcpy(dst, src, W * sizeof(T));
#endif
  }
}

// Whether every pointer is 16-byte aligned: the launcher's test for the packed path.
inline bool all_aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// The test for a kernel over rows: each row's `n` elements in packs of 8 from 16-byte aligned starts — n and every
// row stride (`strides`, in elements) multiples of 8, every pointer 16-byte aligned.
inline bool rows_packed(int64_t n, std::initializer_list<const void*> pointers,
                        std::initializer_list<int64_t> strides = {}) {
  if (n % kPack != 0) return false;
  for (const int64_t s : strides)
    if (s % kPack != 0) return false;
  return all_aligned16(pointers);
}

}  // namespace lt::cuda::LT_KERNELS_NS
