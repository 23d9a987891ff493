// optim/kernels_avx2.cpp — the AVX2 (+ FMA) kernels: 8 lanes, the operations of the plain kernels lane by lane, so
// the bits equal the plain path's. Tails go through small zero-padded buffers (AVX2 has no byte masks).
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/error.h"
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

LT_AVX2 inline __m256i lane_mask(int64_t remaining) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::min<int64_t>(remaining, 8))), idx);
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

namespace {

// ---- 8-bit states: requantisation by arithmetic (QuantArith, quant_map.h) with 8-entry permutes ------------
//
// Gathers cost ~12 cycles per 8 lanes on the Zen 5 dev box (measured; Zen 2/3 are no faster), and the kernel
// used four per 8 parameters. The code is computed instead, as the AVX-512 kernels do, within AVX2's limits:
//   * the permutes index 8 entries, and QuantArith has 9 regions (0: the zero code, 1..7: the decades, 8: 1.0).
//     Regions 0..7 are looked up; region 8 is one more compare, x > T[7] takes code 255. A negative x there
//     keeps region 7, whose code clamps at 254 and mirrors to 0: the code region 8 gives it too (every |x|
//     above the decade's last inner midpoint has s >= 2^16 · 254: s is monotone and quant_arith() proves the
//     f32 above that midpoint is within the flagged window over 254 · 2^16).
//   * region_lo by pairs of binades (|x|'s bits >> 24, as the VBMI loop does): pairs 48..63 are 16 entries,
//     one byte shuffle; the pairs below 48 (|x| < 2^-29) saturate to entry 0, region 0.
//   * the signed map decides its region for both signs by one compare on key = x's bits rotated left by one
//     (see SignedKey in kernels_avx512.cpp: W = 2U, or 2U - 1 where the negative threshold is the f32 below);
//     AVX2 compares signed, and key < 2^31 for |x| < 2. The mirror 254 - c is a blend on x's sign bit.
// Codes live in byte 2 of each 32-bit lane (s = 2^16 (c0 + t) + 8); a lane with s mod 2^16 < 16 is looked up
// in the bucket table instead (about 1 lane in 10000).
struct Arith8 {
  alignas(32) float A[8], B[8];
  alignas(32) float thr[8];         // unsigned map: T[0..6], then +inf (region 7 is the last looked up)
  alignas(32) int32_t key_thr[8];   // signed map: W - 1 (key > W - 1 iff key >= W), INT32_MAX for region 7
  alignas(32) int32_t hi[8];        // code_top of the region's last code (region 7: 254)
  alignas(32) uint8_t pairs[32];    // region_lo of binade pairs 48..63, in both 128-bit lanes
  float top;                        // T[7]: x > top takes code 255
  const QuantTable* table;
};

constexpr int kCodeShift = QuantArith::kFracBits;
static_assert(kCodeShift == 16, "the kernel takes the code as byte 2 of s");
constexpr int32_t code_top(int32_t c) { return c << kCodeShift | ((1 << kCodeShift) - 1); }
constexpr int kFirstPair = 48;  // binades 2^-31 and 2^-30; pair 63 holds [0.5, 2)

Arith8 make_arith8(QuantMapKind kind) {
  const QuantArith& qa = quant_arith(kind);
  LT_CHECK(qa.hi[7] == 254 && qa.hi[8] == 255 && qa.T[7] < INFINITY && !(qa.T[8] < INFINITY),
           "avx2 requantisation: region 8 must be the code 255 alone, above T[7]");
  Arith8 a{};
  a.table = &quant_table(kind);
  a.top = qa.T[7];
  for (int r = 0; r < 8; ++r) {
    a.A[r] = qa.A[r];
    a.B[r] = qa.B[r];
    a.hi[r] = code_top(qa.hi[r]);
    a.thr[r] = r < 7 ? qa.T[r] : INFINITY;
    a.key_thr[r] = std::numeric_limits<int32_t>::max();
    if (r == 7) continue;
    uint32_t tp, tn;
    std::memcpy(&tp, &qa.T[r], 4);
    std::memcpy(&tn, &qa.T[16 + r], 4);
    LT_CHECK(tn == tp || tn + 1 == tp, "avx2 requantisation: threshold {} differs by more than one f32 between signs",
             r);
    const uint32_t W = tn == tp ? 2 * (tp + 1) : 2 * (tp + 1) - 1;
    LT_CHECK(W < 0x80000000u, "avx2 requantisation: key threshold {} is not below 2^31", r);
    a.key_thr[r] = int32_t(W - 1);
  }
  // Pair p holds the binades 2p - 127 and 2p - 126 (as exponents of 2); entry p - 48 counts the thresholds below
  // it, and no pair may hold two of them (either sign's). Entry 0 also serves every pair below 48.
  for (int p = kFirstPair; p < 64; ++p) {
    const double lo = p == kFirstPair ? 0.0 : std::ldexp(1.0, 2 * p - 127), hi = std::ldexp(1.0, 2 * p - 125);
    int below = 0, inside = 0;
    for (int t = 0; t < 7; ++t) {
      const double tp = qa.T[t], tn = qa.T[16 + t];
      LT_CHECK((tp < lo) == (tn < lo), "avx2 requantisation: a midpoint sits on a binade edge");
      below += tp < lo;
      inside += std::max(int(tp >= lo && tp < hi), int(tn >= lo && tn < hi));
    }
    LT_CHECK(inside <= 1, "avx2 requantisation: binade pair {} holds {} region boundaries", p, inside);
    a.pairs[p - kFirstPair] = a.pairs[p - kFirstPair + 16] = uint8_t(below);
  }
  LT_CHECK(a.pairs[0] == 0, "avx2 requantisation: the lowest binade pair must be region 0");
  return a;
}

// region_lo of |x| (its bits: abits) by binade pairs, one byte shuffle (the bytes above byte 0 index entry 0).
LT_AVX2 inline __m256i region_lo(const Arith8& q, __m256i abits) {
  const __m256i pair = _mm256_subs_epu8(_mm256_srli_epi32(abits, 24), _mm256_set1_epi8(kFirstPair));
  return _mm256_shuffle_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(q.pairs)), pair);
}

// s = round(a · A[r] + B[r]) clamped to the region's last code; `ambiguous`: the lanes to look up exactly.
LT_AVX2 inline __m256i decade_code(const Arith8& q, __m256 a, __m256i r, __m256i& ambiguous) {
  const __m256 s = _mm256_fmadd_ps(a, _mm256_permutevar8x32_ps(_mm256_load_ps(q.A), r),
                                   _mm256_permutevar8x32_ps(_mm256_load_ps(q.B), r));
  const __m256i c = _mm256_min_epi32(_mm256_cvtps_epi32(s),
                                     _mm256_permutevar8x32_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(q.hi)), r));
  ambiguous = _mm256_cmpeq_epi32(_mm256_and_si256(c, _mm256_set1_epi32(QuantArith::kExactBits)), _mm256_setzero_si256());
  return c;
}

// Nearest code of x >= 0 in the unsigned map (v / absmax), in byte 2.
LT_AVX2 inline __m256i quantize_u(const Arith8& q, __m256 x, __m256i& ambiguous) {
  const __m256i lo = region_lo(q, _mm256_castps_si256(x));
  const __m256 up = _mm256_cmp_ps(x, _mm256_permutevar8x32_ps(_mm256_load_ps(q.thr), lo), _CMP_GT_OQ);
  const __m256i r = _mm256_sub_epi32(lo, _mm256_castps_si256(up));
  const __m256i c = decade_code(q, x, r, ambiguous);
  const __m256 one = _mm256_cmp_ps(x, _mm256_set1_ps(q.top), _CMP_GT_OQ);
  return _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(c), _mm256_castsi256_ps(_mm256_set1_epi32(code_top(255))), one));
}

// Nearest code of x in the signed map (m / absmax), in byte 2.
LT_AVX2 inline __m256i quantize_s(const Arith8& q, __m256 x, __m256i& ambiguous) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i abits = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256i key = _mm256_or_si256(_mm256_add_epi32(abits, abits), _mm256_srli_epi32(bits, 31));
  const __m256i lo = region_lo(q, abits);
  const __m256i up =
      _mm256_cmpgt_epi32(key, _mm256_permutevar8x32_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(q.key_thr)), lo));
  const __m256i r = _mm256_sub_epi32(lo, up);
  __m256i c = decade_code(q, _mm256_castsi256_ps(abits), r, ambiguous);
  const __m256 one = _mm256_cmp_ps(x, _mm256_set1_ps(q.top), _CMP_GT_OQ);  // positive lanes only
  c = _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(c), _mm256_castsi256_ps(_mm256_set1_epi32(code_top(255))), one));
  // x < 0 (sign bit set, -0 included: its code 127 is its own mirror): 254 - c, in byte 2.
  const __m256i mirror = _mm256_sub_epi32(_mm256_set1_epi32(code_top(254)), c);
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(c), _mm256_castsi256_ps(mirror), x));
}

// The exact lookup for flagged lanes, out of the hot loop: the code in byte 2, as the arithmetic leaves it.
__attribute__((noinline, cold)) void fix_lanes(const QuantTable& t, const float* xs, int32_t* cs, unsigned lanes) {
  for (; lanes != 0; lanes &= lanes - 1) {
    const int i = __builtin_ctz(lanes);
    cs[i] = int32_t(quant_lookup(t, xs[i])) << kCodeShift;
  }
}

LT_AVX2 inline __m256i fix(const QuantTable& t, __m256 x, __m256i code, __m256i ambiguous) {
  alignas(32) float xs[8];
  alignas(32) int32_t cs[8];
  _mm256_store_ps(xs, x);
  _mm256_store_si256(reinterpret_cast<__m256i*>(cs), code);
  fix_lanes(t, xs, cs, unsigned(_mm256_movemask_ps(_mm256_castsi256_ps(ambiguous))));
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(cs));
}

// A block whose states are updated and whose absmax is known, waiting for its codes.
struct Pending {
  uint8_t* qm;
  uint8_t* qv;
  const float* m;  // [len] the updated states
  const float* v;
  int64_t len;
  __m256 inv_m, inv_v;
  __m256i guard;  // 1 << 16 in every lane when the block's absmax_v > 0 (the zero-point guard applies), else 0
};

// The codes of lanes j..j+7 of a pending block, each in byte 2 of its lane.
LT_AVX2 inline void codes8(const Arith8& qs, const Arith8& qu, const Pending& b, int64_t j, __m256i& cm,
                           __m256i& cv) {
  const __m256 v = _mm256_load_ps(b.v + j);
  const __m256 xm = _mm256_mul_ps(_mm256_load_ps(b.m + j), b.inv_m);
  const __m256 xv = _mm256_mul_ps(v, b.inv_v);
  __m256i amb_m, amb_v;
  cm = quantize_s(qs, xm, amb_m);
  cv = quantize_u(qu, xv, amb_v);
  const __m256i amb = _mm256_or_si256(amb_m, amb_v);
  if (!_mm256_testz_si256(amb, amb)) [[unlikely]] {
    if (!_mm256_testz_si256(amb_m, amb_m)) cm = fix(*qs.table, xm, cm, amb_m);
    if (!_mm256_testz_si256(amb_v, amb_v)) cv = fix(*qu.table, xv, cv, amb_v);
  }
  // The zero-point guard: v > 0 takes at least code 1.
  const __m256i positive = _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ));
  cv = _mm256_max_epi32(cv, _mm256_and_si256(positive, b.guard));
}

// Byte 2 of 2 x 8 lanes of m codes and of v codes: 16 m codes in the low half, 16 v codes in the high half.
LT_AVX2 inline __m256i pack_codes16(__m256i cm0, __m256i cm1, __m256i cv0, __m256i cv1) {
  // packus per 128-bit lane: [m0 0-3 | m1 0-3 | v0 0-3 | v1 0-3] [m0 4-7 | m1 4-7 | v0 4-7 | v1 4-7]
  const __m256i pm = _mm256_packus_epi32(_mm256_srli_epi32(cm0, kCodeShift), _mm256_srli_epi32(cm1, kCodeShift));
  const __m256i pv = _mm256_packus_epi32(_mm256_srli_epi32(cv0, kCodeShift), _mm256_srli_epi32(cv1, kCodeShift));
  return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(pm, pv), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Requantises lanes j..j+15 of a pending block (16 lanes inside it).
LT_AVX2 inline void requant16(const Arith8& qs, const Arith8& qu, const Pending& b, int64_t j) {
  __m256i cm0, cv0, cm1, cv1;
  codes8(qs, qu, b, j, cm0, cv0);
  codes8(qs, qu, b, j + 8, cm1, cv1);
  const __m256i both = pack_codes16(cm0, cm1, cv0, cv1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(b.qm + j), _mm256_castsi256_si128(both));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(b.qv + j), _mm256_extracti128_si256(both, 1));
}

// Every lane of a pending block requantised on its own (the first block, a short one, the last one).
LT_AVX2 inline void requant_block(const Arith8& qs, const Arith8& qu, const Pending& b) {
  int64_t j = 0;
  for (; j + 16 <= b.len; j += 16) requant16(qs, qu, b, j);
  for (; j < b.len; j += 8) {  // the buffers hold whole vectors past len; only len codes are stored
    __m256i cm, cv;
    codes8(qs, qu, b, j, cm, cv);
    alignas(32) uint8_t bytes[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(bytes), pack_codes16(cm, cm, cv, cv));
    const size_t r = size_t(std::min<int64_t>(b.len - j, 8));
    std::memcpy(b.qm + j, bytes, r);
    std::memcpy(b.qv + j, bytes + 16, r);
  }
}

// ---- 8-bit states: dequantisation and the update ------------------------------------------------------------

// The unscaled map values of len codes (a whole block), one scalar load each. Two loads and a store per code
// run on the load/store ports beside the vector work; a gather of 8 costs ~12 cycles here. Not vectorised (a
// baseline function, never inlined into the AVX2 code, where GCC would turn the loop into gathers).
__attribute__((noinline)) void dequant_block(const float* qs, const float* qu, const uint8_t* cm, const uint8_t* cv,
                                             int64_t len, float* mb, float* vb) {
  for (int64_t j = 0; j < len; ++j) {
    mb[j] = qs[cm[j]];
    vb[j] = qu[cv[j]];
  }
}

// Lanes i..i+7 (k: those inside the tensor, all 8 when full): the AdamW update from the block's unscaled map
// values in mb, vb (overwritten with the updated states), p and its copy written, the block maxima updated.
template <bool kCopy, bool kFull>
LT_AVX2 inline void update8(const AdamW8Args& a, const Consts& c, int64_t i, __m256i k, __m256 am, __m256 av,
                            float* mb, float* vb, __m256& max_m, __m256& max_v) {
  __m256 m = _mm256_mul_ps(_mm256_load_ps(mb), am);
  __m256 v = _mm256_mul_ps(_mm256_load_ps(vb), av);
  if constexpr (kFull) {
    const __m256 p = update(_mm256_loadu_ps(a.p + i), _mm256_loadu_ps(a.g + i), m, v, c);
    _mm256_storeu_ps(a.p + i, p);
    if constexpr (kCopy) _mm_storeu_si128(reinterpret_cast<__m128i*>(a.copy + i), to_bf16(p));
    max_m = _mm256_max_ps(max_m, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), m));
    max_v = _mm256_max_ps(max_v, v);
  } else {
    const __m256 p = update(_mm256_maskload_ps(a.p + i, k), _mm256_maskload_ps(a.g + i, k), m, v, c);
    _mm256_maskstore_ps(a.p + i, k, p);
    if constexpr (kCopy) {
      alignas(16) bf16_t tmp[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(tmp), to_bf16(p));
      const int live = _mm256_movemask_ps(_mm256_castsi256_ps(k));
      std::memcpy(a.copy + i, tmp, size_t(__builtin_popcount(unsigned(live))) * sizeof(bf16_t));
    }
    const __m256 keep = _mm256_castsi256_ps(k);
    max_m = _mm256_max_ps(max_m, _mm256_and_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), m), keep));
    max_v = _mm256_max_ps(max_v, _mm256_and_ps(v, keep));
  }
  _mm256_store_ps(mb, m);
  _mm256_store_ps(vb, v);
}

// A block's update alone (not fused with a requantisation).
template <bool kCopy>
LT_AVX2 inline void update_block(const AdamW8Args& a, const Consts& c, int64_t b0, int64_t len, __m256 am, __m256 av,
                                 float* mb, float* vb, __m256& max_m, __m256& max_v) {
  int64_t j = 0;
  for (; j + 8 <= len; j += 8)
    update8<kCopy, true>(a, c, b0 + j, _mm256_set1_epi32(-1), am, av, mb + j, vb + j, max_m, max_v);
  if (j < len) update8<kCopy, false>(a, c, b0 + j, lane_mask(len - j), am, av, mb + j, vb + j, max_m, max_v);
}

// After a block's update: its absmax (stored) and its requantisation parameters.
LT_AVX2 inline Pending finish_block(const AdamW8Args& a, int64_t b0, int64_t blk, int64_t len, const float* mb,
                                    const float* vb, __m256 max_m, __m256 max_v) {
  float mm = hmax(max_m), mv = hmax(max_v);
  if (mm < FLT_MIN) mm = 0.0f;
  if (mv < FLT_MIN) mv = 0.0f;
  a.absmax_m[blk] = mm;
  a.absmax_v[blk] = mv;
  return {a.qm + b0,
          a.qv + b0,
          mb,
          vb,
          len,
          _mm256_set1_ps(mm > 0.0f ? 1.0f / mm : 0.0f),
          _mm256_set1_ps(mv > 0.0f ? 1.0f / mv : 0.0f),
          _mm256_set1_epi32(mv > 0.0f ? 1 << kCodeShift : 0)};
}

// Software prefetch of p, g (one line each per 16 lanes) and, every 64 lanes, the code lines, kPrefetchAhead
// lanes ahead (the address may lie past the end: prefetches do not fault; it is formed as an integer).
constexpr int64_t kPrefetchAhead = 1024;

LT_AVX2 inline void prefetch_line(const void* base, int64_t bytes) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(base) + uintptr_t(bytes)), _MM_HINT_T0);
}

// 16 codes of each map -> their unscaled map values, by integer loads and stores: they run on the load and store
// ports beside the loop's vector work (a gather of 8 takes ~12 cycles here, and GCC would make this loop one:
// the empty asm keeps each value in a general register).
LT_AVX2 inline void dequant16(const QuantMap& map_m, const QuantMap& map_v, const uint8_t* cm, const uint8_t* cv,
                              float* mb, float* vb) {
#pragma GCC unroll 16
  for (int k = 0; k < 16; ++k) {
    uint32_t x, y;
    std::memcpy(&x, &map_m[cm[k]], 4);
    std::memcpy(&y, &map_v[cv[k]], 4);
    asm("" : "+r"(x), "+r"(y));
    std::memcpy(mb + k, &x, 4);
    std::memcpy(vb + k, &y, 4);
  }
}

// The fused loop over a whole block: the update of block b (lanes i = b0 + j; sqrt and two divisions per lane, on
// the divider) with the requantisation of block b - 1 (integer and permute work) and, when kAhead, the
// dequantisation of block b + 1 into `next` (loads and stores), so that the out-of-order core overlaps all three.
template <bool kCopy, bool kAhead>
LT_AVX2 inline void fused_block(const AdamW8Args& a, const Consts& c, const Arith8& qs, const Arith8& qu,
                                const Pending& prev, int64_t b0, int64_t len, __m256 am, __m256 av, float* mb,
                                float* vb, float* next_m, float* next_v, __m256& max_m, __m256& max_v) {
  const QuantMap& map_m = quant_table(QuantMapKind::signed_dynamic).values;
  const QuantMap& map_v = quant_table(QuantMapKind::unsigned_dynamic).values;
  const __m256i all = _mm256_set1_epi32(-1);
  for (int64_t j = 0; j < len; j += 16) {
    const int64_t i = b0 + j;
    prefetch_line(a.p, 4 * (i + kPrefetchAhead));
    prefetch_line(a.g, 4 * (i + kPrefetchAhead));
    if (j % 64 == 0) {
      prefetch_line(a.qm, i + kPrefetchAhead);
      prefetch_line(a.qv, i + kPrefetchAhead);
    }
    if constexpr (kAhead) dequant16(map_m, map_v, a.qm + i + len, a.qv + i + len, next_m + j, next_v + j);
    // The loop's ~40 constant vectors do not fit in AVX2's 16 registers: read them as memory operands (the
    // pointers hidden from the optimiser each iteration) rather than let GCC spill and reload them (5% in L1).
    const Consts* cc = &c;
    const Arith8* ps = &qs;
    const Arith8* pu = &qu;
    const Pending* pp = &prev;
    asm("" : "+r"(cc), "+r"(ps), "+r"(pu), "+r"(pp));
    update8<kCopy, true>(a, *cc, i, all, am, av, mb + j, vb + j, max_m, max_v);
    update8<kCopy, true>(a, *cc, i + 8, all, am, av, mb + j + 8, vb + j + 8, max_m, max_v);
    requant16(*ps, *pu, *pp, j);
  }
}

// One pass over the tensor, block by block, three blocks in flight: block b is updated while block b - 1 is
// requantised and block b + 1 dequantised (fused_block). The first block, a short last one and the block before
// a short one take the steps one at a time.
template <bool kCopy>
LT_AVX2 void adamw8_avx2_impl(const AdamW8Args& args, const AdamWScalars& s, const Arith8& qs, const Arith8& qu) {
  const AdamW8Args a = args;  // a local copy: the stores through its pointers cannot alias it
  const Consts c = make_consts(s);
  const float* map_m = quant_table(QuantMapKind::signed_dynamic).values.data();
  const float* map_v = quant_table(QuantMapKind::unsigned_dynamic).values.data();
  // [block mod 3][m, v]: the unscaled map values, then the updated states; whole vectors past a short block's end.
  alignas(32) float buf[3][2][kMaxBlock + 8];
  Pending prev{};
  bool have_prev = false;
  int64_t dequantised = -1;  // the block whose codes the previous block's loop dequantised
  for (int64_t b0 = 0, blk = 0; b0 < a.n; b0 += a.block, ++blk) {
    const int64_t len = std::min(a.block, a.n - b0);
    float* mb = buf[blk % 3][0];
    float* vb = buf[blk % 3][1];
    if (dequantised != blk) dequant_block(map_m, map_v, a.qm + b0, a.qv + b0, len, mb, vb);
    const __m256 am = _mm256_set1_ps(a.absmax_m[blk]), av = _mm256_set1_ps(a.absmax_v[blk]);
    __m256 max_m = _mm256_setzero_ps(), max_v = _mm256_setzero_ps();
    if (have_prev && prev.len == len) {  // len is then the block size, a multiple of 16
      float* next_m = buf[(blk + 1) % 3][0];
      float* next_v = buf[(blk + 1) % 3][1];
      if (b0 + 2 * len <= a.n) {
        fused_block<kCopy, true>(a, c, qs, qu, prev, b0, len, am, av, mb, vb, next_m, next_v, max_m, max_v);
        dequantised = blk + 1;
      } else {
        fused_block<kCopy, false>(a, c, qs, qu, prev, b0, len, am, av, mb, vb, next_m, next_v, max_m, max_v);
      }
    } else {
      if (have_prev) requant_block(qs, qu, prev);
      update_block<kCopy>(a, c, b0, len, am, av, mb, vb, max_m, max_v);
    }
    prev = finish_block(a, b0, blk, len, mb, vb, max_m, max_v);
    have_prev = true;
  }
  if (have_prev) requant_block(qs, qu, prev);
}

}  // namespace

void adamw8_avx2(const AdamW8Args& a, const AdamWScalars& s) {
  static const Arith8 qs = make_arith8(QuantMapKind::signed_dynamic);
  static const Arith8 qu = make_arith8(QuantMapKind::unsigned_dynamic);
  if (a.copy) adamw8_avx2_impl<true>(a, s, qs, qu);
  else adamw8_avx2_impl<false>(a, s, qs, qu);
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
