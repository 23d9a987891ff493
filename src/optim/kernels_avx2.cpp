// optim/kernels_avx2.cpp — the AVX2 (+ FMA) kernels: 8 lanes, the operations of the plain kernels lane by lane, so
// the bits equal the plain path's. Tails go through small zero-padded buffers (AVX2 has no byte masks).
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <type_traits>

#include "optim/kernels.h"

#pragma GCC optimize("fp-contract=off")

#define LT_AVX2 __attribute__((target("avx2,fma")))

namespace lt {
namespace {

struct Consts {
  __m256 clip, decay, b1, omb1, b2, omb2, bc2s, eps, nss;
};

LT_AVX2 inline Consts make_consts(const AdamWScalars& s) {
  return {_mm256_set1_ps(s.clip),         _mm256_set1_ps(s.decay), _mm256_set1_ps(s.beta1),
          _mm256_set1_ps(s.one_minus_beta1), _mm256_set1_ps(s.beta2), _mm256_set1_ps(s.one_minus_beta2),
          _mm256_set1_ps(s.bc2_sqrt),  _mm256_set1_ps(s.eps),   _mm256_set1_ps(s.neg_step_size)};
}

// adamw_element of kernels_plain.cpp, 8 lanes.
LT_AVX2 inline __m256 update(__m256 p, __m256 grad, __m256& m, __m256& v, const Consts& c) {
  const __m256 g = _mm256_mul_ps(grad, c.clip);
  const __m256 p1 = _mm256_mul_ps(p, c.decay);
  m = _mm256_fmadd_ps(g, c.omb1, _mm256_mul_ps(m, c.b1));
  v = _mm256_fmadd_ps(_mm256_mul_ps(g, c.omb2), g, _mm256_mul_ps(v, c.b2));
  const __m256 d = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), c.bc2s), c.eps);
  return _mm256_add_ps(p1, _mm256_div_ps(_mm256_mul_ps(c.nss, m), d));
}

// f32_to_bf16 (core/dtype.h) lane by lane, the 8 results in the low 128 bits.
LT_AVX2 inline __m128i to_bf16(__m256 x) {
  const __m256i b = _mm256_castps_si256(x);
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(b, _mm256_set1_epi32(0x400000)), nan);
  r = _mm256_srli_epi32(r, 16);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

// quant_lookup (quant_map.h) lane by lane; the code in the low byte of each lane, upper bytes zero.
LT_AVX2 inline __m256i lookup(const uint32_t* entry, __m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  __m256i key = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x7fff));
  key = _mm256_min_epi32(_mm256_max_epi32(key, _mm256_set1_epi32(int(QuantTable::kKeyLo))),
                         _mm256_set1_epi32(int(QuantTable::kKeyHi)));
  const __m256i sign = _mm256_and_si256(_mm256_srai_epi32(bits, 31), _mm256_set1_epi32(QuantTable::kBucketsPerSign));
  const __m256i index = _mm256_add_epi32(_mm256_sub_epi32(key, _mm256_set1_epi32(int(QuantTable::kKeyLo))), sign);
  const __m256i e = _mm256_i32gather_epi32(reinterpret_cast<const int*>(entry), index, 4);
  // low16 >= T, both in [0, 65535]: a signed compare is exact.
  const __m256i lower = _mm256_cmpgt_epi32(_mm256_srli_epi32(e, 16), _mm256_and_si256(bits, _mm256_set1_epi32(0xffff)));
  const __m256i code = _mm256_blendv_epi8(_mm256_srli_epi32(e, 8), e, lower);
  return _mm256_and_si256(code, _mm256_set1_epi32(0xff));
}

// The low bytes of 8 lanes (each in [0, 255]) as 8 consecutive bytes.
LT_AVX2 inline uint64_t pack_bytes(__m256i c) {
  const __m256i p16 = _mm256_packus_epi32(c, c);
  const __m256i p8 = _mm256_packus_epi16(p16, p16);
  const __m128i both = _mm_unpacklo_epi32(_mm256_castsi256_si128(p8), _mm256_extracti128_si256(p8, 1));
  return uint64_t(_mm_cvtsi128_si64(both));
}

LT_AVX2 inline __m256i lane_mask(int64_t remaining) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::min<int64_t>(remaining, 8))), idx);
}

LT_AVX2 inline __m256 dequant(const float* map, const uint8_t* codes) {
  int64_t c8;
  std::memcpy(&c8, codes, 8);
  return _mm256_i32gather_ps(map, _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(c8)), 4);
}

LT_AVX2 inline float hmax(__m256 x) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

}  // namespace

LT_AVX2 void adamw32_avx2(const AdamW32Args& a, const AdamWScalars& s) {
  const Consts c = make_consts(s);
  int64_t i = 0;
  for (; i + 8 <= a.n; i += 8) {
    __m256 m = _mm256_loadu_ps(a.m + i);
    __m256 v = _mm256_loadu_ps(a.v + i);
    const __m256 p = update(_mm256_loadu_ps(a.p + i), _mm256_loadu_ps(a.g + i), m, v, c);
    _mm256_storeu_ps(a.p + i, p);
    _mm256_storeu_ps(a.m + i, m);
    _mm256_storeu_ps(a.v + i, v);
    if (a.copy) _mm_storeu_si128(reinterpret_cast<__m128i*>(a.copy + i), to_bf16(p));
  }
  if (i < a.n) {
    const __m256i k = lane_mask(a.n - i);
    __m256 m = _mm256_maskload_ps(a.m + i, k);
    __m256 v = _mm256_maskload_ps(a.v + i, k);
    const __m256 p = update(_mm256_maskload_ps(a.p + i, k), _mm256_maskload_ps(a.g + i, k), m, v, c);
    _mm256_maskstore_ps(a.p + i, k, p);
    _mm256_maskstore_ps(a.m + i, k, m);
    _mm256_maskstore_ps(a.v + i, k, v);
    if (a.copy) {
      alignas(16) bf16_t tmp[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(tmp), to_bf16(p));
      std::memcpy(a.copy + i, tmp, size_t(a.n - i) * sizeof(bf16_t));
    }
  }
}

LT_AVX2 void adamw8_avx2(const AdamW8Args& a, const AdamWScalars& s) {
  const QuantTable& ts = quant_table(QuantMapKind::signed_dynamic);
  const QuantTable& tu = quant_table(QuantMapKind::unsigned_dynamic);
  const Consts c = make_consts(s);
  alignas(32) float mbuf[kMaxBlock], vbuf[kMaxBlock];
  for (int64_t b0 = 0, blk = 0; b0 < a.n; b0 += a.block, ++blk) {
    const int64_t len = std::min(a.block, a.n - b0);
    const __m256 am = _mm256_set1_ps(a.absmax_m[blk]), av = _mm256_set1_ps(a.absmax_v[blk]);
    __m256 max_m = _mm256_setzero_ps(), max_v = _mm256_setzero_ps();
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    for (int64_t j = 0; j < len; j += 8) {
      const int64_t i = b0 + j, r = std::min<int64_t>(len - j, 8);
      const __m256i k = lane_mask(r);
      const uint8_t* pm = a.qm + i;
      const uint8_t* pv = a.qv + i;
      uint8_t qm8[8] = {}, qv8[8] = {};  // a tail reads through zero-padded copies
      if (r < 8) {
        std::memcpy(qm8, pm, size_t(r));
        std::memcpy(qv8, pv, size_t(r));
        pm = qm8;
        pv = qv8;
      }
      __m256 m = _mm256_mul_ps(dequant(ts.values.data(), pm), am);
      __m256 v = _mm256_mul_ps(dequant(tu.values.data(), pv), av);
      if (r == 8) {
        const __m256 p = update(_mm256_loadu_ps(a.p + i), _mm256_loadu_ps(a.g + i), m, v, c);
        _mm256_storeu_ps(a.p + i, p);
        if (a.copy) _mm_storeu_si128(reinterpret_cast<__m128i*>(a.copy + i), to_bf16(p));
      } else {
        const __m256 p = update(_mm256_maskload_ps(a.p + i, k), _mm256_maskload_ps(a.g + i, k), m, v, c);
        _mm256_maskstore_ps(a.p + i, k, p);
        if (a.copy) {
          alignas(16) bf16_t tmp[8];
          _mm_store_si128(reinterpret_cast<__m128i*>(tmp), to_bf16(p));
          std::memcpy(a.copy + i, tmp, size_t(r) * sizeof(bf16_t));
        }
      }
      _mm256_store_ps(mbuf + j, m);
      _mm256_store_ps(vbuf + j, v);
      const __m256 live = _mm256_castsi256_ps(k);
      max_m = _mm256_max_ps(max_m, _mm256_and_ps(_mm256_andnot_ps(sign_bit, m), live));
      max_v = _mm256_max_ps(max_v, _mm256_and_ps(v, live));
    }
    float mm = hmax(max_m), mv = hmax(max_v);
    if (mm < FLT_MIN) mm = 0.0f;
    if (mv < FLT_MIN) mv = 0.0f;
    a.absmax_m[blk] = mm;
    a.absmax_v[blk] = mv;
    const __m256 inv_m = _mm256_set1_ps(mm > 0.0f ? 1.0f / mm : 0.0f);
    const __m256 inv_v = _mm256_set1_ps(mv > 0.0f ? 1.0f / mv : 0.0f);
    const __m256i guard = _mm256_set1_epi32(mv > 0.0f ? 1 : 0);
    for (int64_t j = 0; j < len; j += 8) {
      const int64_t r = std::min<int64_t>(len - j, 8);
      const __m256 m = _mm256_load_ps(mbuf + j), v = _mm256_load_ps(vbuf + j);
      const __m256i cm = lookup(ts.entry, _mm256_mul_ps(m, inv_m));
      __m256i cv = lookup(tu.entry, _mm256_mul_ps(v, inv_v));
      const __m256i positive = _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ));
      cv = _mm256_max_epi32(cv, _mm256_and_si256(positive, guard));
      const uint64_t bm = pack_bytes(cm), bv = pack_bytes(cv);
      if (r == 8) {
        std::memcpy(a.qm + b0 + j, &bm, 8);
        std::memcpy(a.qv + b0 + j, &bv, 8);
      } else {
        std::memcpy(a.qm + b0 + j, &bm, size_t(r));
        std::memcpy(a.qv + b0 + j, &bv, size_t(r));
      }
    }
  }
}

namespace {

// 8 source values (fewer when remaining < 8, the rest zero) as f32.
template <typename Src>
LT_AVX2 inline __m256 load_src(const Src* src, int64_t remaining, __m256i k) {
  if constexpr (std::is_same_v<Src, float>) {
    return remaining >= 8 ? _mm256_loadu_ps(src) : _mm256_maskload_ps(src, k);
  } else {
    __m128i h16;
    if (remaining >= 8) {
      h16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    } else {
      alignas(16) bf16_t tmp[8] = {};
      std::memcpy(tmp, src, size_t(remaining) * sizeof(bf16_t));
      h16 = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h16), 16));
  }
}

// Elements i .. i+7 of a group of 16 go to lanes 0..7 of the sum (acc_a: lanes 0-3, acc_b: lanes 4-7).
template <typename Src>
LT_AVX2 inline void accumulate_8(float* dst, const Src* src, int64_t remaining, bool overwrite, __m256d& acc_a,
                                 __m256d& acc_b) {
  const __m256i k = lane_mask(remaining);
  const __m256 s = load_src(src, remaining, k);
  __m256 x;
  if (remaining >= 8) {
    x = overwrite ? s : _mm256_add_ps(_mm256_loadu_ps(dst), s);
    if (dst) _mm256_storeu_ps(dst, x);
  } else {
    x = overwrite ? s : _mm256_add_ps(_mm256_maskload_ps(dst, k), s);
    if (dst) _mm256_maskstore_ps(dst, k, x);
  }
  const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  acc_a = _mm256_add_pd(acc_a, _mm256_mul_pd(lo, lo));
  acc_b = _mm256_add_pd(acc_b, _mm256_mul_pd(hi, hi));
}

template <typename Src>
LT_AVX2 inline double accumulate_16(float* dst, const Src* src, int64_t n, bool overwrite) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  for (int64_t i = 0; i < n; i += 16) {
    float* d = dst ? dst + i : nullptr;  // null: Σ src² only (no offset on a null pointer)
    accumulate_8(d, src + i, n - i, overwrite, acc[0], acc[1]);
    if (n - i > 8) accumulate_8(d ? d + 8 : nullptr, src + i + 8, n - i - 8, overwrite, acc[2], acc[3]);
  }
  alignas(32) double lane[16];
  for (int q = 0; q < 4; ++q) _mm256_store_pd(lane + 4 * q, acc[q]);
  return combine_lanes(lane);
}

}  // namespace

LT_AVX2 double accumulate_chunk_avx2(float* dst, const float* src, int64_t n, bool overwrite) {
  return accumulate_16(dst, src, n, overwrite);
}

LT_AVX2 double accumulate_chunk_avx2(float* dst, const bf16_t* src, int64_t n, bool overwrite) {
  return accumulate_16(dst, src, n, overwrite);
}

}  // namespace lt
