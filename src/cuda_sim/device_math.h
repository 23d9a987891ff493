// cuda_sim/device_math.h — what cuda_bf16.h and CUDA's device math give a kernel, for the host emulation.
// Included by cuda_sim.h on the host only; under nvcc cuda_sim.h includes <cuda_bf16.h> instead.
//
//   __nv_bfloat16            2 bytes, the bit pattern of a bf16 (as CUDA's, trivially copyable)
//   __float2bfloat16(_rn)    f32 -> bf16, round to nearest even (CUDA's rounding; NaN -> canonical 0x7fff)
//   __bfloat162float         bf16 -> f32, exact
//   __bfloat16_as_ushort, __ushort_as_bfloat16   the raw bits, both ways
//   rsqrtf __expf __logf __fdividef __saturatef __ldg __popc
//
// The fast intrinsics (__expf, __logf, __fdividef, rsqrtf) are approximations on a GPU (a few ulp; see the
// CUDA programming guide's tables); here they are the correctly rounded host functions. A kernel whose bits
// must match the CPU ops uses the IEEE forms (expf, sqrtf, a / b), which nvcc keeps IEEE without
// --use_fast_math; expf itself is within 2 ulp on a GPU, so results that go through it match to tolerance.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  unsigned short __x;  // CUDA's field name: the raw bits
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{0x7fff};  // CUDA's canonical NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);                                // round to nearest, ties to even
  return __nv_bfloat16{static_cast<unsigned short>(bits >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return __nv_bfloat16{bits}; }

inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t bits = uint32_t(h.__x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }  // NaN -> 0 as CUDA
inline int __popc(unsigned x) { return std::popcount(x); }  // the set bits (a ballot's count)

// Read-only cache loads are plain loads here.
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
