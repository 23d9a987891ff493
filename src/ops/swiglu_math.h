// ops/swiglu_math.h — SwiGLU's per-element arithmetic, the one definition the CPU op (ops/cpu/swiglu.cpp,
// in its plain, AVX2 and AVX-512 builds) and the CUDA kernel (cuda/kernels/elementwise.cuh) compile, so all give
// the same bits. Every product and sum is rounded on its own: the CPU builds turn FMA contraction off and
// nvcc compiles the kernels with -fmad=false.
//
// sigmoid is computed stably from e = exp(-|g|) ∈ (0, 1]: σ = 1/(1+e) for g ≥ 0, e/(1+e) for g < 0, so
// nothing overflows for any finite g. exp is our own f32 routine (Cody-Waite reduction and Cephes' degree-6
// polynomial) in plain arithmetic, so the CPU loops vectorise (glibc's expf is a call per element and does
// not vectorise without fast-math) and a GPU computes it identically (its expf is within 2 ulp, not exact).
// silu(g) measured within 3.7 ulp of double over every 64th f32 in [-87.3, 87.3].
//
// Backward (σ' = σ(1-σ)):  d silu/dg = σ + g σ (1-σ) = σ (1 + g (1-σ))
//   dgate = dout · up · σ · (1 + g (1 - σ)),  dup = dout · silu(g)
// with 1 - σ computed as σ(-g), not by subtraction.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace lt::swiglu_math {

// e^(-|g|) ∈ (0, 1]; 0 where |g| > 87.3 (f32 would go denormal) and for NaN. The range test and the
// clamp work on |g|'s bit pattern as integers: float `? :` forms get turned into branches that GCC does
// not if-convert under -ftrapping-math, and then the loop does not vectorise.
LT_HD_INLINE float exp_neg_abs(float g) {
  constexpr uint32_t kMaxBits = 0x42ae999au;  // the bits of 87.3f
  const uint32_t a = lt_float_bits(g) & 0x7fffffffu;  // |g|, ordered like its value
  const float t = -lt_bits_float(a < kMaxBits ? a : kMaxBits);
  // n = round(t / ln2) by the 1.5·2^23 trick (exact for |n| < 2^22); r = t - n·ln2 in two parts.
  const float magic = 12582912.0f;
  const float n = (t * 1.44269504088896341f + magic) - magic;
  const float r = (t - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = (p * (r * r) + r) + 1.0f;                          // e^r, |r| ≤ ln2/2
  const float scale = lt_bits_float(uint32_t(int32_t(n) + 127) << 23);  // 2^n, n ∈ [-126, 0]
  const uint32_t keep = 0u - uint32_t(a <= kMaxBits);
  return lt_bits_float(lt_float_bits(er * scale) & keep);
}

LT_HD_INLINE float sigmoid(float g) {
  const float e = exp_neg_abs(g);
  return (g >= 0.0f ? 1.0f : e) / (1.0f + e);
}

// σ(g) and 1 - σ(g) = σ(-g), each from e without cancellation (1 - σ in f32 loses all digits for g ≳ 17).
LT_HD_INLINE void sigmoid_pair(float g, float* s, float* one_minus_s) {
  const float e = exp_neg_abs(g);
  const float big = g >= 0.0f ? 1.0f : e, small = g >= 0.0f ? e : 1.0f;
  *s = big / (1.0f + e);
  *one_minus_s = small / (1.0f + e);
}

// h = silu(g) · u
LT_HD_INLINE float forward(float g, float u) { return (g * sigmoid(g)) * u; }

// dgate, dup of one element.
LT_HD_INLINE void backward(float d, float g, float u, float* dgate, float* dup) {
  float s, sm;
  sigmoid_pair(g, &s, &sm);
  *dgate = (d * u) * (s * (1.0f + g * sm));
  *dup = d * (g * s);
}

// GPT-OSS's clamped SwiGLU (ops/swiglu.h): g = min(gate, limit), u = clamp(up, −limit, limit),
// h = (u + 1) · g · σ(α·g); the backward passes nothing through a clamped input.
LT_HD_INLINE float clamped_forward(float gate, float up, float alpha, float limit) {
  const float g = limit < gate ? limit : gate, u = up < -limit ? -limit : (limit < up ? limit : up);
  return (u + 1.0f) * (g * sigmoid(alpha * g));
}
LT_HD_INLINE void clamped_backward(float d, float gate, float up, float alpha, float limit, float* dgate, float* dup) {
  const float g = limit < gate ? limit : gate, u = up < -limit ? -limit : (limit < up ? limit : up), a = alpha * g;
  float s, sm;
  sigmoid_pair(a, &s, &sm);
  *dgate = gate <= limit ? (d * (u + 1.0f)) * (s * (1.0f + a * sm)) : 0.0f;
  *dup = up >= -limit && up <= limit ? d * (g * s) : 0.0f;
}

}  // namespace lt::swiglu_math
