// ops/cpu/head.cpp — the fused, chunked LM head: final RMSNorm, lm_head GEMM and cross-entropy, with
// their backward in the same pass over token chunks.
//
// Legend: N tokens, C hidden size, V vocabulary size, n rows of the current chunk (n <= chunk_tokens).
//
// Per chunk of tokens [n0, n0 + n), in order:
//   xn[n, C]     = (x · rstd) · norm_w, rstd = 1/sqrt(mean(x²) + eps), Σx² in 16 f32 lanes
//                  (bf16 mode: xb[n, C] = bf16(xn) is the GEMM operand)
//   logits[n, V] = xn · lm_wᵀ
//   per row      : m = max z; s = Σ exp(z − m), exp in f32, summed in 16 double lanes;
//                  loss = m + log s − z[target] in double; the chunk's losses join the total in token order
//   backward     : dlogits = grad_scale · (softmax − onehot(target)), formed in place (0 for ignored rows)
//                  dxn[n, C]     = dlogits · lm_w
//                  dlm_w[V, C]  += dlogitsᵀ · xn            (Accumulate::yes, chunk after chunk)
//                  dx[n, C]      = rstd · (g − x̂ · mean(g ⊙ x̂)), g = dxn ⊙ norm_w, x̂ = x · rstd
//                  dnorm_w[C]   += Σ_tokens dxn ⊙ x̂, summed in double over all chunks, added once at the end
//   bf16 mode rounds the GEMM operands xn and dlogits to bf16 (lm_w arrives as bf16); norms and softmax stay f32.
//
// Scratch, allocated once per call, never per chunk (n_c = min(chunk_tokens, N); bytes):
//   head_forward:           4·n_c·V + 4·n_c·C + 12·n_c           (+ 2·n_c·C in bf16 mode)
//   head_forward_backward:  4·n_c·V + 8·n_c·C + 12·n_c + 8·C     (+ 2·n_c·C in bf16 mode)
// The logits term dominates (V = 151936, n_c = 256: 156 MB). In bf16 mode the bf16 dlogits overwrite the
// front half of each f32 logits row (row stride 2V bf16 elements), so they need no buffer of their own.
// oneDNN's own per-thread scratchpad (ops/gemm.h) comes on top.
//
// Vector paths: the softmax row passes (max, Σ exp, scale) run in AVX-512, or AVX2 + FMA where AVX-512 is
// absent, or scalar; all three give the same bits (tested), because each performs the scalar pass's
// operations lane for lane: element i joins lane i mod 16 (AVX2 holds the 16 lanes as two 8-lane halves)
// and the lanes are summed in order; the max, exact in any order for numbers, takes the AVX-512 path's
// reduction tree in AVX2 too, so even NaN and ±0 cases match it. Not timed separately: by count the passes
// are small next to the GEMMs (3 passes over a row of V elements against 6·C·V GEMM FLOPs per token).
//
// Determinism: rows are independent in the norm and softmax passes (one task per row), the dnorm_w sum
// runs over fixed column blocks in token order, and the GEMMs are deterministic, so the bits never depend
// on the thread count. Loss, dx and dnorm_w do not depend on chunk_tokens either as long as oneDNN
// computes a row of a product the same way whatever the number of rows M; ops/gemm.h does not promise
// that, and in practice its kernels differ for small M (measured with N = 74: chunks of 37 and 74 agree
// bitwise, chunks of 1, 8 and 16 differ in the last bits), so across chunk sizes they agree to f32
// rounding only. dlm_w sums its per-chunk products in f32 and so depends on chunk_tokens at that level too.

// GCC 12.0-12.2's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_*() placeholders
// (a known false positive, fixed in later GCC); the warnings are attributed to the header lines.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/aligned.h"
#include "core/cpu_features.h"
#include "ops/cpu/avx2_lanes.h"
#include "core/error.h"
#include "core/parallel.h"
#include "ops/gemm.h"
#include "ops/head.h"
#include "ops/override.h"

namespace lt {
namespace {

constexpr int kLanes = 16;           // f32 / double accumulation lanes (one AVX-512 register of f32)
constexpr int64_t kColBlock = 64;    // columns per dnorm_w task
constexpr int64_t kBf16Block = 256;  // elements per step when turning a row of dlogits into bf16

enum class Pass : uint8_t { forward, forward_backward };

// ---- exp -------------------------------------------------------------------------------------------------
// Cephes' expf: x = k·ln2 + r with |r| <= ln2/2 (ln2 split in two so k·ln2_hi is exact), e^r by a degree-7
// polynomial (about 1 ulp), 2^k from exponent bits. The argument is z − max <= 0; below kExpMin the result
// flushes to 0 (e^-87 = 1.6e-38 cannot change a sum that holds e^0 = 1). NaN stays NaN. The scalar, AVX2
// and AVX-512 versions perform the same f32 operations with explicit FMAs, so their bits agree.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f;
constexpr float kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
constexpr float kExpMin = -87.0f;

float exp_scalar(float x) {
  if (!(x >= kExpMin)) return x < kExpMin ? 0.f : x;  // flush, or NaN
  float k = std::nearbyint(x * kLog2e);
  float r = std::fma(k, -kLn2Hi, x);
  r = std::fma(k, -kLn2Lo, r);
  float r2 = r * r;
  float p = kP0;
  p = std::fma(p, r, kP1);
  p = std::fma(p, r, kP2);
  p = std::fma(p, r, kP3);
  p = std::fma(p, r, kP4);
  p = std::fma(p, r, kP5);
  p = std::fma(p, r2, r);
  p = p + 1.f;
  uint32_t bits = uint32_t(int32_t(k) + 127) << 23;  // k in [-126, 0]: a normal power of two
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

__attribute__((target("avx512f"))) inline __m512 exp_avx512(__m512 x) {
  __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(k, _mm512_set1_ps(-kLn2Hi), x);
  r = _mm512_fmadd_ps(k, _mm512_set1_ps(-kLn2Lo), r);
  __m512 r2 = _mm512_mul_ps(r, r);
  __m512 p = _mm512_set1_ps(kP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
  p = _mm512_fmadd_ps(p, r2, r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.f));
  __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
  __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
  __mmask16 flush = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpMin), _CMP_LT_OQ);
  return _mm512_mask_mov_ps(y, flush, _mm512_setzero_ps());
}

// ---- the three row passes of the softmax, scalar (the specification), AVX-512 and AVX2 ------------------

float row_max_scalar(const float* z, int64_t V) {
  float m = -INFINITY;
  for (int64_t i = 0; i < V; ++i) m = z[i] > m ? z[i] : m;
  return m;
}

// Σ exp(z − m): element i joins double lane i mod 16, lanes are added in order 0..15. With e non-null the
// exps are stored there (e may be z).
double row_expsum_scalar(float* e, const float* z, int64_t V, float m) {
  double lane[kLanes] = {};
  for (int64_t i = 0; i < V; ++i) {
    float v = exp_scalar(z[i] - m);
    if (e) e[i] = v;
    lane[i % kLanes] += double(v);
  }
  double s = 0;
  for (double l : lane) s += l;
  return s;
}

void row_scale_scalar(float* out, const float* in, int64_t n, float c) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] * c;
}

__mmask16 tail_mask(int64_t left) { return __mmask16((1u << left) - 1u); }

__attribute__((target("avx512f"))) float row_max_avx512(const float* z, int64_t V) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + kLanes <= V; i += kLanes) m = _mm512_max_ps(m, _mm512_loadu_ps(z + i));
  if (i < V) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask(V - i), z + i));
  return _mm512_reduce_max_ps(m);
}

// Adds the 16 f32 lanes of v, widened to double, to the lanes 0..7 (lo) and 8..15 (hi).
__attribute__((target("avx512f"))) inline void add_lanes(__m512d& lo, __m512d& hi, __m512 v) {
  lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
  hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

__attribute__((target("avx512f"))) double row_expsum_avx512(float* e, const float* z, int64_t V, float m) {
  const __m512 vm = _mm512_set1_ps(m);
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + kLanes <= V; i += kLanes) {
    __m512 v = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(z + i), vm));
    if (e) _mm512_storeu_ps(e + i, v);
    add_lanes(lo, hi, v);
  }
  if (i < V) {
    __mmask16 k = tail_mask(V - i);
    __m512 v = _mm512_maskz_mov_ps(k, exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, z + i), vm)));
    if (e) _mm512_mask_storeu_ps(e + i, k, v);
    add_lanes(lo, hi, v);  // +0.0 in the unused lanes leaves them as the scalar version has them
  }
  alignas(64) double lane[kLanes];
  _mm512_store_pd(lane, lo);
  _mm512_store_pd(lane + 8, hi);
  double s = 0;
  for (double l : lane) s += l;
  return s;
}

__attribute__((target("avx512f"))) void row_scale_avx512(float* out, const float* in, int64_t n, float c) {
  const __m512 vc = _mm512_set1_ps(c);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(in + i), vc));
  if (i < n) {
    __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, in + i), vc));
  }
}

// ---- the same three passes in AVX2 (with FMA), lane for lane the AVX-512 ones ----------------------------
// A 16-lane AVX-512 vector is a pair of 8-lane halves (lo = lanes 0-7, hi = lanes 8-15), so element i still
// joins lane i mod 16 and every sum and max is taken in the same order: the bits equal both other paths.

#define LT_AVX2 __attribute__((target("avx2,fma")))

using avx2::lanes_below;
using avx2::reduce_max16;

LT_AVX2 inline __m256 exp_avx2(__m256 x) {
  __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(k, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(k, _mm256_set1_ps(-kLn2Lo), r);
  __m256 r2 = _mm256_mul_ps(r, r);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  p = _mm256_fmadd_ps(p, r2, r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.f));
  __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  __m256 flush = _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_LT_OQ);
  return _mm256_andnot_ps(flush, y);
}

LT_AVX2 float row_max_avx2(const float* z, int64_t V) {
  __m256 lo = _mm256_set1_ps(-INFINITY), hi = lo;
  int64_t i = 0;
  for (; i + kLanes <= V; i += kLanes) {
    lo = _mm256_max_ps(lo, _mm256_loadu_ps(z + i));
    hi = _mm256_max_ps(hi, _mm256_loadu_ps(z + i + 8));
  }
  if (i < V) {  // the tail's unused lanes are -inf, as row_max_avx512 loads them
    const __m256i k_lo = lanes_below(V - i), k_hi = lanes_below(V - i - 8);
    const __m256 fill = _mm256_set1_ps(-INFINITY);
    lo = _mm256_max_ps(lo, _mm256_blendv_ps(fill, _mm256_maskload_ps(z + i, k_lo), _mm256_castsi256_ps(k_lo)));
    hi = _mm256_max_ps(hi, _mm256_blendv_ps(fill, _mm256_maskload_ps(z + i + 8, k_hi), _mm256_castsi256_ps(k_hi)));
  }
  return reduce_max16(lo, hi);
}

// add_lanes for a pair of halves: lanes 0-3, 4-7, 8-11, 12-15 of the 16 double lanes.
LT_AVX2 inline void add_lanes_avx2(__m256d (&acc)[4], __m256 lo, __m256 hi) {
  acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(lo)));
  acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1)));
  acc[2] = _mm256_add_pd(acc[2], _mm256_cvtps_pd(_mm256_castps256_ps128(hi)));
  acc[3] = _mm256_add_pd(acc[3], _mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1)));
}

LT_AVX2 double row_expsum_avx2(float* e, const float* z, int64_t V, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  int64_t i = 0;
  for (; i + kLanes <= V; i += kLanes) {
    const __m256 lo = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(z + i), vm));
    const __m256 hi = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(z + i + 8), vm));
    if (e) {
      _mm256_storeu_ps(e + i, lo);
      _mm256_storeu_ps(e + i + 8, hi);
    }
    add_lanes_avx2(acc, lo, hi);
  }
  if (i < V) {
    const __m256i k_lo = lanes_below(V - i), k_hi = lanes_below(V - i - 8);
    const __m256 lo =
        _mm256_and_ps(_mm256_castsi256_ps(k_lo), exp_avx2(_mm256_sub_ps(_mm256_maskload_ps(z + i, k_lo), vm)));
    const __m256 hi =
        _mm256_and_ps(_mm256_castsi256_ps(k_hi), exp_avx2(_mm256_sub_ps(_mm256_maskload_ps(z + i + 8, k_hi), vm)));
    if (e) {
      _mm256_maskstore_ps(e + i, k_lo, lo);
      _mm256_maskstore_ps(e + i + 8, k_hi, hi);
    }
    add_lanes_avx2(acc, lo, hi);  // +0.0 in the unused lanes, as in row_expsum_avx512
  }
  alignas(32) double lane[kLanes];
  for (int q = 0; q < 4; ++q) _mm256_store_pd(lane + 4 * q, acc[q]);
  double s = 0;
  for (double l : lane) s += l;
  return s;
}

LT_AVX2 void row_scale_avx2(float* out, const float* in, int64_t n, float c) {
  const __m256 vc = _mm256_set1_ps(c);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(in + i), vc));
  if (i < n) {
    const __m256i k = lanes_below(n - i);
    _mm256_maskstore_ps(out + i, k, _mm256_mul_ps(_mm256_maskload_ps(in + i, k), vc));
  }
}

#undef LT_AVX2

struct RowKernels {
  float (*max)(const float* z, int64_t V);
  double (*expsum)(float* e, const float* z, int64_t V, float m);
  void (*scale)(float* out, const float* in, int64_t n, float c);
};

// The widest path the CPU offers: AVX-512, else AVX2 with FMA, else scalar; all three give the same bits.
RowKernels row_kernels() {
  switch (isa_level(cpu_features())) {
    case IsaLevel::avx512: return {row_max_avx512, row_expsum_avx512, row_scale_avx512};
    case IsaLevel::avx2: return {row_max_avx2, row_expsum_avx2, row_scale_avx2};
    case IsaLevel::plain: break;
  }
  return {row_max_scalar, row_expsum_scalar, row_scale_scalar};
}

// Cross-entropy of one counted row z[V] (target t). With Pass::forward_backward the row is replaced by
// dlogits = gs · (softmax − onehot(t)): as f32 in place, or (bf16 mode) as bf16 in the row's first 2V bytes.
double row_cross_entropy(float* z, int64_t V, int32_t t, float gs, Pass pass, bool bf16, const RowKernels& k) {
  const float zt = z[t];
  const float m = k.max(z, V);
  const bool grad = pass == Pass::forward_backward;
  const double s = k.expsum(grad ? z : nullptr, z, V, m);
  const double loss = double(m) + std::log(s) - double(zt);
  if (!grad) return loss;
  const float c = float(double(gs) / s);  // dlogits_i = e_i · (gs / s), and gs less at the target
  if (!bf16) {
    k.scale(z, z, V, c);
    z[t] -= gs;
    return loss;
  }
  // Block by block through local buffers: block [i0, i0 + len) writes bytes [2·i0, 2·(i0 + len)), which lie
  // in f32 elements already read, never in ones still to come.
  alignas(64) float d[kBf16Block];
  alignas(64) bf16_t b[kBf16Block];
  for (int64_t i0 = 0; i0 < V; i0 += kBf16Block) {
    int64_t len = std::min(kBf16Block, V - i0);
    k.scale(d, z + i0, len, c);
    if (t >= i0 && t < i0 + len) d[t - i0] -= gs;
    convert_f32_to_bf16(b, d, size_t(len));
    std::memcpy(reinterpret_cast<char*>(z) + 2 * i0, b, size_t(len) * 2);
  }
  return loss;
}

// ---- RMSNorm rows ---------------------------------------------------------------------------------------

float rms_rstd(const float* x, int64_t C, float eps) {
  float lane[kLanes] = {};
  for (int64_t c = 0; c < C; ++c) lane[c % kLanes] += x[c] * x[c];
  float ss = 0;
  for (float l : lane) ss += l;
  return 1.f / std::sqrt(ss / float(C) + eps);
}

// dx = rstd · (g − x̂ · mean(g ⊙ x̂)), g = dxn ⊙ w, x̂ = x · rstd (recomputed with the forward's rounding).
void rms_backward_row(float* dx, const float* dxn, const float* x, const float* w, float rstd, int64_t C) {
  float lane[kLanes] = {};
  for (int64_t c = 0; c < C; ++c) lane[c % kLanes] += (dxn[c] * w[c]) * (x[c] * rstd);
  float dot = 0;
  for (float l : lane) dot += l;
  const float mean = dot / float(C);
  for (int64_t c = 0; c < C; ++c) dx[c] = rstd * (dxn[c] * w[c] - (x[c] * rstd) * mean);
}

void check_inputs(const float* x, const int32_t* targets, const float* norm_w, WeightRef lm_w, const HeadShape& s) {
  LT_CHECK(s.N >= 0 && s.C > 0 && s.V > 0, "head: bad shape N={}, C={}, V={}", s.N, s.C, s.V);
  LT_CHECK(s.chunk_tokens > 0, "head: chunk_tokens must be positive, got {}", s.chunk_tokens);
  LT_CHECK(lm_w.dtype == DType::f32 || lm_w.dtype == DType::bf16, "head: lm_head weight must be f32 or bf16, got {}",
           dtype_name(lm_w.dtype));
  if (s.N == 0) return;
  LT_CHECK(x && targets && norm_w && lm_w.data, "head: null input pointer");
  // All targets first, so a bad one throws before any gradient has been accumulated.
  for (int64_t n = 0; n < s.N; ++n) {
    int32_t t = targets[n];
    LT_CHECK(t == kIgnoreIndex || (t >= 0 && t < s.V),
             "head: target {} at token {} is outside [0, V={}) and is not the ignore index {}", t, n, s.V,
             kIgnoreIndex);
  }
}

double head_run(float* dx, float* dnorm_w, float* dlm_w, const float* x, const int32_t* targets,
                const float* norm_w, WeightRef lm_w, float gs, const HeadShape& s, Pass pass) {
  check_inputs(x, targets, norm_w, lm_w, s);
  const bool grad = pass == Pass::forward_backward;
  if (grad) LT_CHECK(dx, "head: null input gradient pointer");  // dnorm_w, dlm_w null: frozen
  if (s.N == 0) return 0.0;
  if (grad) LT_OPS_OVERRIDE(head_forward_backward, dx, dnorm_w, dlm_w, x, targets, norm_w, lm_w, gs, s);
  else LT_OPS_OVERRIDE(head_forward, x, targets, norm_w, lm_w, s);
  const int64_t N = s.N, C = s.C, V = s.V, nc = std::min(s.chunk_tokens, s.N);
  const bool bf16 = lm_w.dtype == DType::bf16;
  const float* W = bf16 ? nullptr : static_cast<const float*>(lm_w.data);      // [V, C]
  const bf16_t* Wb = bf16 ? static_cast<const bf16_t*>(lm_w.data) : nullptr;  // [V, C]
  const RowKernels kernels = row_kernels();

  AlignedBuffer<float> logits{size_t(nc * V), kPageAlign, Fill::none};          // [nc, V]; dlogits in place
  AlignedBuffer<float> xn{size_t(nc * C), kPageAlign, Fill::none};              // [nc, C]
  AlignedBuffer<bf16_t> xb{bf16 ? size_t(nc * C) : 0};  // [nc, C]
  AlignedBuffer<float> rstd{size_t(nc)};                // [nc]
  AlignedBuffer<double> row_loss{size_t(nc)};           // [nc]
  AlignedBuffer<float> dxn{grad ? size_t(nc * C) : 0};  // [nc, C]
  AlignedBuffer<double> dw{grad ? size_t(C) : 0};       // [C]
  const bf16_t* dlogits_b = reinterpret_cast<const bf16_t*>(logits.data());  // [nc, 2V] in bf16 mode

  double total = 0;
  for (int64_t n0 = 0; n0 < N; n0 += nc) {
    const int64_t n = std::min(nc, N - n0);
    const float* xc = x + n0 * C;  // [n, C]
    const int32_t* tc = targets + n0;
    if (std::all_of(tc, tc + n, [](int32_t t) { return t == kIgnoreIndex; })) {
      if (grad) std::memset(dx + n0 * C, 0, size_t(n * C) * sizeof(float));
      continue;
    }

    parallel_for(n, [&](int64_t r) {
      const float* xr = xc + r * C;
      float* y = xn.data() + r * C;
      const float rs = rms_rstd(xr, C, s.eps);
      rstd[r] = rs;
      for (int64_t c = 0; c < C; ++c) y[c] = (xr[c] * rs) * norm_w[c];
      if (bf16) convert_f32_to_bf16(xb.data() + r * C, y, size_t(C));
    });

    // logits[n, V] = xn[n, C] · lm_w[V, C]ᵀ
    if (bf16)
      gemm_bf16(Trans::no, Trans::yes, n, V, C, xb.data(), C, Wb, C, logits.data(), V, Accumulate::no);
    else
      gemm_f32(Trans::no, Trans::yes, n, V, C, xn.data(), C, W, C, logits.data(), V, Accumulate::no);

    parallel_for(n, [&](int64_t r) {
      float* z = logits.data() + r * V;
      if (tc[r] != kIgnoreIndex) {
        row_loss[r] = row_cross_entropy(z, V, tc[r], gs, pass, bf16, kernels);
      } else if (grad) {
        std::memset(z, 0, size_t(V) * (bf16 ? 2 : 4));
      }
    });
    for (int64_t r = 0; r < n; ++r)
      if (tc[r] != kIgnoreIndex) total += row_loss[r];
    if (!grad) continue;

    // dxn[n, C] = dlogits[n, V] · lm_w[V, C];  dlm_w[V, C] += dlogits[n, V]ᵀ · xn[n, C]
    if (bf16) {
      gemm_bf16(Trans::no, Trans::no, n, C, V, dlogits_b, 2 * V, Wb, C, dxn.data(), C, Accumulate::no);
      if (dlm_w) gemm_bf16(Trans::yes, Trans::no, V, C, n, dlogits_b, 2 * V, xb.data(), C, dlm_w, C, Accumulate::yes);
    } else {
      gemm_f32(Trans::no, Trans::no, n, C, V, logits.data(), V, W, C, dxn.data(), C, Accumulate::no);
      if (dlm_w) gemm_f32(Trans::yes, Trans::no, V, C, n, logits.data(), V, xn.data(), C, dlm_w, C, Accumulate::yes);
    }

    parallel_for(n, [&](int64_t r) {
      rms_backward_row(dx + (n0 + r) * C, dxn.data() + r * C, xc + r * C, norm_w, rstd[r], C);
    });
    if (dnorm_w) parallel_chunks(C, kColBlock, [&](int64_t c0, int64_t c1) {
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = c0; c < c1; ++c) dw[c] += double(dxn[r * C + c]) * double(xc[r * C + c] * rstd[r]);
    });
  }
  if (grad && dnorm_w)
    for (int64_t c = 0; c < C; ++c) dnorm_w[c] = float(double(dnorm_w[c]) + dw[c]);
  return total;
}

}  // namespace

double head_forward(const float* x, const int32_t* targets, const float* norm_w, WeightRef lm_w, HeadShape s) {
  return head_run(nullptr, nullptr, nullptr, x, targets, norm_w, lm_w, 0.f, s, Pass::forward);
}

double head_forward_backward(float* dx, float* dnorm_w, float* dlm_w, const float* x, const int32_t* targets,
                             const float* norm_w, WeightRef lm_w, float grad_scale, HeadShape s) {
  return head_run(dx, dnorm_w, dlm_w, x, targets, norm_w, lm_w, grad_scale, s, Pass::forward_backward);
}

}  // namespace lt
