// ops/cpu/avx2_lanes.h — the AVX2 pieces that let a kernel keep an AVX-512 kernel's bits: a 16-lane
// AVX-512 vector held as a pair of 8-lane halves (lo = lanes 0-7, hi = lanes 8-15), reduced in the same
// tree, and the lane masks that stand in for AVX-512's __mmask16 tails. Shared by attention and the head.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstdint>

namespace lt::avx2 {

#define LT_AVX2_INLINE __attribute__((target("avx2,fma"))) inline

// Lanes [0, n) of 8 set (n may be <= 0 or >= 8): the mask of maskload/maskstore/blendv.
LT_AVX2_INLINE __m256i lanes_below(int64_t n) {
  const int32_t c = int32_t(std::clamp<int64_t>(n, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// GCC 12's _mm512_reduce_max_ps / _mm512_reduce_add_ps tree on the 16 lanes (lo, hi): hi op lo, then the
// upper 128 bits op the lower, then lanes {2,3,0,1}, then {1,0,...}. max's operand order decides NaN and
// ±0, so it is kept too.
LT_AVX2_INLINE float reduce_max16(__m256 lo, __m256 hi) {
  const __m256 t3 = _mm256_max_ps(hi, lo);
  const __m128 t6 = _mm_max_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_max_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m128 t10 = _mm_max_ps(t8, _mm_shuffle_ps(t8, t8, _MM_SHUFFLE(0, 1, 0, 1)));
  return _mm_cvtss_f32(t10);
}

LT_AVX2_INLINE float reduce_add16(__m256 lo, __m256 hi) {
  const __m256 t3 = _mm256_add_ps(hi, lo);
  const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, _MM_SHUFFLE(1, 1, 1, 1)));
}

#undef LT_AVX2_INLINE

}  // namespace lt::avx2
