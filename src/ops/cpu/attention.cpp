// ops/cpu/attention.cpp — causal grouped-query attention on the CPU, FlashAttention-2 style.
//
// Legend: B batch rows, T tokens per row, Hq query heads, Hkv key/value heads, D head dimension,
//   G = Hq / Hkv query heads per kv head, nt = ceil(T / kTile) tiles per row.
//
// Forward: one task per (b, query head, query tile). It walks the key tiles up to the diagonal in order,
// keeping per query row a running max m, sum l and unnormalised output O (online softmax): memory is
// O(kTile * (kTile + D)) per task and the T×T scores never exist. Tiles wholly above the diagonal are never
// visited, and tiles whose query and key document ranges are disjoint are skipped.
//
// Backward: P = exp(S - lse) is recomputed from q, k and the saved lse; Di = rowsum(dO ∘ O).
//   pass 1, one task per (b, kv head, key tile): dK, dV of that tile, summing over the G query heads of the
//           group and their query tiles in a fixed order (S, dP, dV += Pᵀ dO, dK += dSᵀ Qs: 4 tile GEMMs).
//   pass 2, one task per (b, query head, query tile): dQ of that tile, summing key tiles in order
//           (S, dP again, dQ += dS K: 3 tile GEMMs).
// No atomics and no per-thread partials, so the bits never depend on the thread count. The price: pass 2
// recomputes S and dP, 7 tile GEMMs where FlashAttention-2 with atomic dQ needs 5 — 1.4x the minimal
// backward FLOPs (3.5x the forward's instead of 2.5x).
//
// Kernels: one small GEMM shape serves all seven products — C[M,N] (+)= A·B with A read through (row,
// column) strides, so Pᵀ and dSᵀ are used in place, and B row-major with contiguous N. The AVX-512 version
// keeps an R x 64 block of C in registers (R = 4; 6 or 8 for narrower N), broadcasting A and loading B;
// partial tiles use masked loads. K and V are repacked once per call into tile-contiguous blocks ([D, kTile]
// for the score products, [kTile, D] for the value products; transient memory 2-3x that of k) so the B
// operand of every tile GEMM is one contiguous block (5% faster than reading k, v in place). Measured at
// 64x64x64 on one core (best of 7x3000): this kernel 2.0 µs (267 GFLOP/s), gemm_f32 (oneDNN, per-call
// set-up included) 3.9 µs, OpenBLAS cblas_sgemm 5.0 µs. exp is Cody-Waite + a degree-7 polynomial in
// AVX-512, 0.11 ns/element against std::exp's 1.44 (which would cost as much as the GEMMs), within 1 ulp
// of it (tested).
//
// The AVX2 path (AVX2 + FMA without AVX-512: the EPYC Rome/Milan hosts) computes the AVX-512 path's bits,
// so a run's results do not depend on which of the two a host has (tested bitwise): its GEMM keeps 6 x 16
// blocks of C in ymm registers but sums each element's K products in the same order with one FMA each;
// its exp performs the same operations, scalef's single rounding reproduced by multiplying with a 2^n
// built from exponent bits (2^n stays a normal float after the clamp); and the softmax's row max and sum
// hold each 16-lane AVX-512 vector as two 8-lane halves reduced by the tree of GCC's _mm512_reduce_*_ps.
// The plain path (std::exp, plain loops; ~15 GFLOP/s) is the specification both vector paths are tested
// against, and runs where neither is available.
//
// Measured on AMD EPYC (Zen 5, 2 cores, KVM), B=1 T=1024 Hq=16 Hkv=4 D=64, kTile = 64, counting causal
// FLOPs (forward 2 GEMMs, backward the nominal 5, each 2·D·T(T+1)/2 per head):
//   1 thread:  forward ~150 GFLOP/s (14 ms), backward ~125 GFLOP/s (42 ms; ~175 counting the 7 GEMMs run);
//   2 threads: forward ~300 GFLOP/s (7.1 ms), backward ~250 GFLOP/s (21.5 ms; ~350 counting 7 GEMMs),
//   i.e. 0.64 and 0.53 of the same run's gemm_f32 1024x2048x1024 (~470 GFLOP/s).
// Tiles of 32 and 128, and R = 6, measured within 4% of kTile = 64, R = 4.
// AVX2 against AVX-512, same shape, 1 thread, best of 7 forward + backward per path (a throwaway driver
// calling attention_forward/backward, run with LT_MAX_ISA=avx512|avx2|plain, paths alternating), measured
// while other jobs held the 2 cores (load average 2-6, so every time is 2-4x the figures above and only
// ratios within one run mean anything): AVX2 took 1.0-1.25x the AVX-512 time, e.g. forward 30.3 ms against
// 28.5 and backward 98.1 against 93.0 in the least loaded run; the plain path 7-8x.
#include "ops/attention.h"
#include "ops/override.h"

// GCC 12's AVX-512 intrinsics fill "undefined" vectors by self-initialisation, which -Wmaybe-uninitialized
// reports once they are inlined; the diagnostic state is kept per source location, so silence it for the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/parallel.h"
#include "ops/cpu/avx2_lanes.h"
#include "ops/gemm.h"

namespace lt {
namespace {

constexpr int64_t kTile = 64;  // queries and keys per tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The per-tile operations, plain or AVX-512, chosen once per call from cpu_features().
struct TileKernels {
  // C[M,N] (= or +=) A·B; A(r, k) = A[r*a_rs + k*a_cs]; B row-major [K, N] with row stride ldb.
  void (*matmul)(float* C, int64_t ldc, const float* A, int64_t a_rs, int64_t a_cs, const float* B, int64_t ldb,
                 int64_t M, int64_t N, int64_t K, Accumulate acc);
  // One online-softmax step over scores S[M, N]: updates the row max m[M] and sum l[M], overwrites S with
  // exp(S - m_new) and rescales the output rows O[M, D] by exp(m_old - m_new).
  void (*softmax_step)(float* S, int64_t lds, int64_t M, int64_t N, float* m, float* l, float* O, int64_t ldo,
                       int64_t D);
  // P = exp(S - lse[i]) into S; dS = P ∘ (dP - Di[i]) into dP. Both [M, N] with row stride ld.
  void (*probs_dscores)(float* S, float* dP, int64_t ld, int64_t M, int64_t N, const float* lse, const float* Di);
};

// ---- plain kernels: the specification ----------------------------------------------------------------

void matmul_plain(float* C, int64_t ldc, const float* A, int64_t a_rs, int64_t a_cs, const float* B, int64_t ldb,
                  int64_t M, int64_t N, int64_t K, Accumulate acc) {
  for (int64_t i = 0; i < M; ++i) {
    float* c = C + i * ldc;
    if (acc == Accumulate::no) std::fill(c, c + N, 0.f);
    for (int64_t k = 0; k < K; ++k) {
      const float a = A[i * a_rs + k * a_cs];
      const float* b = B + k * ldb;
      for (int64_t j = 0; j < N; ++j) c[j] += a * b[j];
    }
  }
}

void softmax_step_plain(float* S, int64_t lds, int64_t M, int64_t N, float* m, float* l, float* O, int64_t ldo,
                        int64_t D) {
  for (int64_t i = 0; i < M; ++i) {
    float* s = S + i * lds;
    float m_new = m[i];
    for (int64_t j = 0; j < N; ++j) m_new = std::max(m_new, s[j]);
    // A row with every key masked so far keeps m = -inf; subtracting 0 instead avoids -inf - -inf.
    const float m_use = m_new == kNegInf ? 0.f : m_new;
    float sum = 0.f;
    for (int64_t j = 0; j < N; ++j) {
      s[j] = std::exp(s[j] - m_use);
      sum += s[j];
    }
    const float alpha = std::exp(m[i] - m_use);
    l[i] = l[i] * alpha + sum;
    m[i] = m_new;
    for (int64_t d = 0; d < D; ++d) O[i * ldo + d] *= alpha;
  }
}

void probs_dscores_plain(float* S, float* dP, int64_t ld, int64_t M, int64_t N, const float* lse, const float* Di) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const float p = std::exp(S[i * ld + j] - lse[i]);
      S[i * ld + j] = p;
      dP[i * ld + j] = p * (dP[i * ld + j] - Di[i]);
    }
}

// ---- AVX-512 kernels ---------------------------------------------------------------------------------

#define LT_AVX512 __attribute__((target("avx512f")))

constexpr __mmask16 kAll = 0xFFFF;

LT_AVX512 inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? kAll : __mmask16((1u << n) - 1); }

// exp(x) for float lanes: x = n·ln2 + r with |r| <= ln2/2 (Cody-Waite, ln2 split so n·ln2_hi is exact),
// exp(r) by its degree-7 Taylor polynomial (truncation 0.347^8/8! = 5e-9 relative), scaled by 2^n.
// Below ln(FLT_MIN) the result is flushed to 0 (so -inf gives 0); NaN propagates.
LT_AVX512 inline __m512 exp_avx512(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.37626f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_min_ps(hi, _mm512_max_ps(lo, x));  // operand order keeps NaN (max/min return the second on NaN)
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);  // r + r²/2 + ...: adding 1 last keeps r's low bits
  p = _mm512_add_ps(p, _mm512_set1_ps(1.f));
  return _mm512_maskz_mov_ps(__mmask16(~underflow), _mm512_scalef_ps(p, n));
}

// C[R rows, NV*16 columns (last vector masked by `last`)] (+)= A·B, the C block held in registers.
template <int R, int NV>
LT_AVX512 void mm_block_avx512(float* C, int64_t ldc, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                               int64_t ldb, int64_t K, __mmask16 last, Accumulate acc) {
  __m512 c[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      c[r][v] = acc == Accumulate::yes ? _mm512_maskz_loadu_ps(v == NV - 1 ? last : kAll, C + r * ldc + 16 * v)
                                       : _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(last, b + 16 * v) : _mm512_loadu_ps(b + 16 * v);
    const float* a = A + k * a_cs;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * a_rs]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_fmadd_ps(ar, bv[v], c[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(C + r * ldc + 16 * v, v == NV - 1 ? last : kAll, c[r][v]);
}

// Rows of C in blocks of R, the remaining rows < R in one smaller block.
template <int NV, int R>
LT_AVX512 void mm_rows_avx512(float* C, int64_t ldc, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                              int64_t ldb, int64_t M, int64_t K, __mmask16 last, Accumulate acc) {
  int64_t i = 0;
  for (; i + R <= M; i += R) mm_block_avx512<R, NV>(C + i * ldc, ldc, A + i * a_rs, a_rs, a_cs, B, ldb, K, last, acc);
  if constexpr (R > 1) {
    if (i < M) mm_rows_avx512<NV, R - 1>(C + i * ldc, ldc, A + i * a_rs, a_rs, a_cs, B, ldb, M - i, K, last, acc);
  }
}

LT_AVX512 void matmul_avx512(float* C, int64_t ldc, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                             int64_t ldb, int64_t M, int64_t N, int64_t K, Accumulate acc) {
  for (int64_t j0 = 0; j0 < N; j0 += 64) {
    const int64_t n = std::min<int64_t>(64, N - j0);
    const int nv = int((n + 15) / 16);
    const __mmask16 last = tail_mask(n - 16 * (nv - 1));
    // About 16-24 accumulators: enough independent FMA chains to hide the latency, B and A still fit.
    switch (nv) {
      case 1: mm_rows_avx512<1, 8>(C + j0, ldc, A, a_rs, a_cs, B + j0, ldb, M, K, last, acc); break;
      case 2: mm_rows_avx512<2, 8>(C + j0, ldc, A, a_rs, a_cs, B + j0, ldb, M, K, last, acc); break;
      case 3: mm_rows_avx512<3, 6>(C + j0, ldc, A, a_rs, a_cs, B + j0, ldb, M, K, last, acc); break;
      default: mm_rows_avx512<4, 4>(C + j0, ldc, A, a_rs, a_cs, B + j0, ldb, M, K, last, acc); break;
    }
  }
}

LT_AVX512 void softmax_step_avx512(float* S, int64_t lds, int64_t M, int64_t N, float* m, float* l, float* O,
                                   int64_t ldo, int64_t D) {
  for (int64_t i = 0; i < M; ++i) {
    float* s = S + i * lds;
    __m512 vmax = _mm512_set1_ps(kNegInf);
    for (int64_t j = 0; j < N; j += 16) {
      const __mmask16 mk = tail_mask(N - j);
      vmax = _mm512_mask_max_ps(vmax, mk, vmax, _mm512_maskz_loadu_ps(mk, s + j));
    }
    const float m_new = std::max(m[i], _mm512_reduce_max_ps(vmax));
    const float m_use = m_new == kNegInf ? 0.f : m_new;  // see softmax_step_plain
    const __m512 vm = _mm512_set1_ps(m_use);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t j = 0; j < N; j += 16) {
      const __mmask16 mk = tail_mask(N - j);
      const __m512 p = exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), vm));
      _mm512_mask_storeu_ps(s + j, mk, p);
      vsum = _mm512_mask_add_ps(vsum, mk, vsum, p);
    }
    const float alpha = _mm512_cvtss_f32(exp_avx512(_mm512_set1_ps(m[i] - m_use)));
    // An explicit fma (what GCC contracted the product and sum to here), so the AVX2 path can match it.
    l[i] = std::fma(l[i], alpha, _mm512_reduce_add_ps(vsum));
    m[i] = m_new;
    const __m512 va = _mm512_set1_ps(alpha);
    float* o = O + i * ldo;
    for (int64_t d = 0; d < D; d += 16) {
      const __mmask16 mk = tail_mask(D - d);
      _mm512_mask_storeu_ps(o + d, mk, _mm512_mul_ps(va, _mm512_maskz_loadu_ps(mk, o + d)));
    }
  }
}

LT_AVX512 void probs_dscores_avx512(float* S, float* dP, int64_t ld, int64_t M, int64_t N, const float* lse,
                                    const float* Di) {
  for (int64_t i = 0; i < M; ++i) {
    const __m512 vl = _mm512_set1_ps(lse[i]), vd = _mm512_set1_ps(Di[i]);
    float* s = S + i * ld;
    float* dp = dP + i * ld;
    for (int64_t j = 0; j < N; j += 16) {
      const __mmask16 mk = tail_mask(N - j);
      const __m512 p = exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), vl));
      _mm512_mask_storeu_ps(s + j, mk, p);
      _mm512_mask_storeu_ps(dp + j, mk, _mm512_mul_ps(p, _mm512_sub_ps(_mm512_maskz_loadu_ps(mk, dp + j), vd)));
    }
  }
}

LT_AVX512 void exp_array_avx512(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mk = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, mk, exp_avx512(_mm512_maskz_loadu_ps(mk, x + i)));
  }
}

#undef LT_AVX512

// ---- AVX2 kernels ------------------------------------------------------------------------------------
// The same bits as the AVX-512 kernels, so a host's result does not depend on which of the two it has:
// every output element of the tile GEMM sums its K products in the same order with one fma each; exp
// performs the same f32 operations; and where the AVX-512 kernels reduce a 16-lane vector, a pair of
// 8-lane halves (lo = lanes 0-7, hi = lanes 8-15) takes the same lanes and reduces them in the same tree.

#define LT_AVX2 __attribute__((target("avx2,fma")))

using avx2::lanes_below;
using avx2::reduce_add16;
using avx2::reduce_max16;

// exp_avx512, operation for operation. Its _mm512_scalef_ps(p, n) is p·2^n rounded once; here 2^n is
// built from exponent bits and multiplied in, which is the same single rounding as long as 2^n is a normal
// float: after the clamp n = round(x·log2e) lies in [-126, 127] (checked below at compile time: the f32
// products at the clamp ends are -125.999992 and 127.499992), so it is.
static_assert(-87.33654f * 1.44269504f > -126.5f && 88.37626f * 1.44269504f < 127.5f,
              "exp's clamp must keep 2^n a normal float for the AVX2 scalef");
LT_AVX2 inline __m256 exp_avx2(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.37626f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(hi, _mm256_max_ps(lo, x));  // NaN kept, as in exp_avx512
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.f));
  // NaN n converts to INT_MIN, whose shifted bits give 2^0; p is that NaN already and stays it, as scalef
  // returns its NaN first operand.
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

// The last vector of a row block: full, or partial through maskload/maskstore (which AMD cores run far
// slower than plain loads and stores, so full blocks avoid them).
enum class Tail : uint8_t { full, masked };

template <Tail tail>
LT_AVX2 inline __m256 load_last(const float* p, __m256i mask) {
  if constexpr (tail == Tail::masked) return _mm256_maskload_ps(p, mask);
  return _mm256_loadu_ps(p);
}

template <Tail tail>
LT_AVX2 inline void store_last(float* p, __m256i mask, __m256 v) {
  if constexpr (tail == Tail::masked) return _mm256_maskstore_ps(p, mask, v);
  _mm256_storeu_ps(p, v);
}

// C[R rows, NV*8 columns (last vector masked by `last`)] (+)= A·B, the C block held in registers.
template <int R, int NV, Tail tail>
LT_AVX2 void mm_block_avx2(float* C, int64_t ldc, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                           int64_t ldb, int64_t K, __m256i last, Accumulate acc) {
  __m256 c[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const float* src = C + r * ldc + 8 * v;
      c[r][v] = acc == Accumulate::no ? _mm256_setzero_ps()
                : v == NV - 1         ? load_last<tail>(src, last)
                                      : _mm256_loadu_ps(src);
    }
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    __m256 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = v == NV - 1 ? load_last<tail>(b + 8 * v, last) : _mm256_loadu_ps(b + 8 * v);
    const float* a = A + k * a_cs;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + r * a_rs);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = _mm256_fmadd_ps(ar, bv[v], c[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* dst = C + r * ldc + 8 * v;
      if (v == NV - 1) {
        store_last<tail>(dst, last, c[r][v]);
      } else {
        _mm256_storeu_ps(dst, c[r][v]);
      }
    }
}

template <int NV, int R, Tail tail>
LT_AVX2 void mm_rows_avx2(float* C, int64_t ldc, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                          int64_t ldb, int64_t M, int64_t K, __m256i last, Accumulate acc) {
  int64_t i = 0;
  for (; i + R <= M; i += R)
    mm_block_avx2<R, NV, tail>(C + i * ldc, ldc, A + i * a_rs, a_rs, a_cs, B, ldb, K, last, acc);
  if constexpr (R > 1) {
    if (i < M) mm_rows_avx2<NV, R - 1, tail>(C + i * ldc, ldc, A + i * a_rs, a_rs, a_cs, B, ldb, M - i, K, last, acc);
  }
}

LT_AVX2 void matmul_avx2(float* C, int64_t ldc, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                         int64_t ldb, int64_t M, int64_t N, int64_t K, Accumulate acc) {
  // Blocks of 6 rows x 16 columns: 12 accumulators, 2 B vectors and the broadcast A fill 15 of the 16
  // ymm registers (more columns would leave no room for B).
  for (int64_t j0 = 0; j0 < N; j0 += 16) {
    const int64_t n = std::min<int64_t>(16, N - j0);
    float* c = C + j0;
    const float* b = B + j0;
    if (n == 16) {
      mm_rows_avx2<2, 6, Tail::full>(c, ldc, A, a_rs, a_cs, b, ldb, M, K, lanes_below(8), acc);
    } else if (n > 8) {
      mm_rows_avx2<2, 6, Tail::masked>(c, ldc, A, a_rs, a_cs, b, ldb, M, K, lanes_below(n - 8), acc);
    } else if (n == 8) {
      mm_rows_avx2<1, 8, Tail::full>(c, ldc, A, a_rs, a_cs, b, ldb, M, K, lanes_below(8), acc);
    } else {
      mm_rows_avx2<1, 8, Tail::masked>(c, ldc, A, a_rs, a_cs, b, ldb, M, K, lanes_below(n), acc);
    }
  }
}

LT_AVX2 void softmax_step_avx2(float* S, int64_t lds, int64_t M, int64_t N, float* m, float* l, float* O,
                               int64_t ldo, int64_t D) {
  for (int64_t i = 0; i < M; ++i) {
    float* s = S + i * lds;
    // 16-lane steps as in softmax_step_avx512: element j + e goes to lane e of (lo, hi).
    __m256 max_lo = _mm256_set1_ps(kNegInf), max_hi = max_lo;
    int64_t j = 0;
    for (; j + 16 <= N; j += 16) {
      max_lo = _mm256_max_ps(max_lo, _mm256_loadu_ps(s + j));
      max_hi = _mm256_max_ps(max_hi, _mm256_loadu_ps(s + j + 8));
    }
    const __m256i mk_lo = lanes_below(N - j), mk_hi = lanes_below(N - j - 8);  // the partial step, if any
    if (j < N) {
      // Masked lanes keep their running max (the AVX-512 masked max), whatever the NaN rules.
      max_lo = _mm256_blendv_ps(max_lo, _mm256_max_ps(max_lo, _mm256_maskload_ps(s + j, mk_lo)),
                                _mm256_castsi256_ps(mk_lo));
      max_hi = _mm256_blendv_ps(max_hi, _mm256_max_ps(max_hi, _mm256_maskload_ps(s + j + 8, mk_hi)),
                                _mm256_castsi256_ps(mk_hi));
    }
    const float m_new = std::max(m[i], reduce_max16(max_lo, max_hi));
    const float m_use = m_new == kNegInf ? 0.f : m_new;  // see softmax_step_plain
    const __m256 vm = _mm256_set1_ps(m_use);
    __m256 sum_lo = _mm256_setzero_ps(), sum_hi = sum_lo;
    for (j = 0; j + 16 <= N; j += 16) {
      const __m256 p_lo = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
      const __m256 p_hi = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), vm));
      _mm256_storeu_ps(s + j, p_lo);
      _mm256_storeu_ps(s + j + 8, p_hi);
      sum_lo = _mm256_add_ps(sum_lo, p_lo);
      sum_hi = _mm256_add_ps(sum_hi, p_hi);
    }
    if (j < N) {
      const __m256 p_lo = exp_avx2(_mm256_sub_ps(_mm256_maskload_ps(s + j, mk_lo), vm));
      const __m256 p_hi = exp_avx2(_mm256_sub_ps(_mm256_maskload_ps(s + j + 8, mk_hi), vm));
      _mm256_maskstore_ps(s + j, mk_lo, p_lo);
      _mm256_maskstore_ps(s + j + 8, mk_hi, p_hi);
      sum_lo = _mm256_blendv_ps(sum_lo, _mm256_add_ps(sum_lo, p_lo), _mm256_castsi256_ps(mk_lo));
      sum_hi = _mm256_blendv_ps(sum_hi, _mm256_add_ps(sum_hi, p_hi), _mm256_castsi256_ps(mk_hi));
    }
    const float alpha = _mm256_cvtss_f32(exp_avx2(_mm256_set1_ps(m[i] - m_use)));
    l[i] = std::fma(l[i], alpha, reduce_add16(sum_lo, sum_hi));
    m[i] = m_new;
    const __m256 va = _mm256_set1_ps(alpha);
    float* o = O + i * ldo;
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(va, _mm256_loadu_ps(o + d)));
    if (d < D) {
      const __m256i mk = lanes_below(D - d);
      _mm256_maskstore_ps(o + d, mk, _mm256_mul_ps(va, _mm256_maskload_ps(o + d, mk)));
    }
  }
}

LT_AVX2 void probs_dscores_avx2(float* S, float* dP, int64_t ld, int64_t M, int64_t N, const float* lse,
                                const float* Di) {
  for (int64_t i = 0; i < M; ++i) {
    const __m256 vl = _mm256_set1_ps(lse[i]), vd = _mm256_set1_ps(Di[i]);
    float* s = S + i * ld;
    float* dp = dP + i * ld;
    int64_t j = 0;
    for (; j + 8 <= N; j += 8) {
      const __m256 p = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), vl));
      _mm256_storeu_ps(s + j, p);
      _mm256_storeu_ps(dp + j, _mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dp + j), vd)));
    }
    if (j < N) {
      const __m256i mk = lanes_below(N - j);
      const __m256 p = exp_avx2(_mm256_sub_ps(_mm256_maskload_ps(s + j, mk), vl));
      _mm256_maskstore_ps(s + j, mk, p);
      _mm256_maskstore_ps(dp + j, mk, _mm256_mul_ps(p, _mm256_sub_ps(_mm256_maskload_ps(dp + j, mk), vd)));
    }
  }
}

LT_AVX2 void exp_array_avx2(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp_avx2(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i mk = lanes_below(n - i);
    _mm256_maskstore_ps(y + i, mk, exp_avx2(_mm256_maskload_ps(x + i, mk)));
  }
}

#undef LT_AVX2

// The widest path the CPU offers: AVX-512, else AVX2 with FMA, else the plain loops.
TileKernels select_kernels() {
  switch (isa_level(cpu_features())) {
    case IsaLevel::avx512: return {matmul_avx512, softmax_step_avx512, probs_dscores_avx512};
    case IsaLevel::avx2: return {matmul_avx2, softmax_step_avx2, probs_dscores_avx2};
    case IsaLevel::plain: break;
  }
  return {matmul_plain, softmax_step_plain, probs_dscores_plain};
}

// ---- tiling ------------------------------------------------------------------------------------------

enum class TileMask : uint8_t { skip, none, partial };

// Which keys [k0, k0+nk) the queries [q0, q0+nq) of one row may see. doc: that row's doc_ids or nullptr; W the
// sliding window (0: none): key j is visible to query i only if j > i − W.
TileMask classify_tile(const int32_t* doc, int64_t q0, int64_t nq, int64_t k0, int64_t nk, int64_t W) {
  if (k0 > q0 + nq - 1) return TileMask::skip;
  if (W > 0 && k0 + nk - 1 <= q0 - W) return TileMask::skip;  // every key left every query's window
  const bool below_diagonal = k0 + nk - 1 <= q0 && (W == 0 || k0 > q0 + nq - 1 - W);
  if (!doc) return below_diagonal ? TileMask::none : TileMask::partial;
  // Disjoint id ranges mean no (query, key) pair shares a document.
  const auto [q_lo, q_hi] = std::minmax_element(doc + q0, doc + q0 + nq);
  const auto [k_lo, k_hi] = std::minmax_element(doc + k0, doc + k0 + nk);
  if (*q_hi < *k_lo || *k_hi < *q_lo) return TileMask::skip;
  const bool one_doc = *q_lo == *q_hi && *k_lo == *k_hi && *q_lo == *k_lo;
  return below_diagonal && one_doc ? TileMask::none : TileMask::partial;
}

// Sets masked scores S[nq, nk] to -inf: key after query, outside the window, or (with doc) another document.
void mask_tile(float* S, int64_t lds, const int32_t* doc, int64_t q0, int64_t nq, int64_t k0, int64_t nk, int64_t W) {
  for (int64_t i = 0; i < nq; ++i) {
    float* s = S + i * lds;
    const int64_t first_future = std::clamp<int64_t>(q0 + i - k0 + 1, 0, nk);  // keys j >= this are after i
    std::fill(s + first_future, s + nk, kNegInf);
    if (W > 0) std::fill(s, s + std::clamp<int64_t>(q0 + i - W - k0 + 1, 0, nk), kNegInf);  // j <= i − W
    if (doc)
      for (int64_t j = 0; j < first_future; ++j)
        if (doc[k0 + j] != doc[q0 + i]) s[j] = kNegInf;
  }
}

// dst[r, c] = alpha * src[r*ld + c] for r < rows, c < cols (dst contiguous, row stride cols).
void pack_rows(float* dst, const float* src, int64_t ld, int64_t rows, int64_t cols, float alpha) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = alpha * src[r * ld + c];
}

// dst[c, r] = src[r*ld + c]: the transpose, dst row stride kTile.
void pack_cols(float* dst, const float* src, int64_t ld, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * kTile + r] = src[r * ld + c];
}

// Sizes, strides and the per-call repacked K and V.
struct Problem {
  AttentionShape s;
  int64_t G, nt;
  float scale;
  const int32_t* doc_ids;
  // Tile-contiguous copies, each [B, Hkv, nt, kTile*D]: kt holds every key tile transposed ([D, kTile]),
  // vt the same for v, kr and vr the tiles as rows ([kTile, D]). Empty when a pass does not need them.
  std::vector<float> kt, vt, kr, vr;

  Problem(AttentionShape shape, const int32_t* doc) : s(shape), doc_ids(doc) {
    LT_CHECK(s.B > 0 && s.T > 0 && s.Hq > 0 && s.Hkv > 0 && s.D > 0,
             "attention sizes must be positive (B={}, T={}, Hq={}, Hkv={}, D={})", s.B, s.T, s.Hq, s.Hkv, s.D);
    LT_CHECK(s.Hq % s.Hkv == 0, "query heads {} must be a multiple of kv heads {}", s.Hq, s.Hkv);
    LT_CHECK(s.window >= 0, "attention window must be 0 (none) or positive, got {}", s.window);
    G = s.Hq / s.Hkv;
    nt = (s.T + kTile - 1) / kTile;
    scale = float(1.0 / std::sqrt(double(s.D)));
  }
  int64_t q_ld() const { return s.Hq * s.D; }    // token stride of q, out, dq, dout
  int64_t kv_ld() const { return s.Hkv * s.D; }  // token stride of k, v, dk, dv
  int64_t q_off(int64_t b, int64_t t, int64_t h) const { return ((b * s.T + t) * s.Hq + h) * s.D; }
  int64_t kv_off(int64_t b, int64_t t, int64_t g) const { return ((b * s.T + t) * s.Hkv + g) * s.D; }
  int64_t row_off(int64_t b, int64_t h, int64_t t) const { return (b * s.Hq + h) * s.T + t; }  // lse, Di
  int64_t tile_off(int64_t b, int64_t g, int64_t tile) const { return ((b * s.Hkv + g) * nt + tile) * kTile * s.D; }
  const int32_t* doc_row(int64_t b) const { return doc_ids ? doc_ids + b * s.T : nullptr; }
  int64_t tile_len(int64_t tile) const { return std::min(kTile, s.T - tile * kTile); }

  // Fills the requested tile-contiguous copies of k and v; one task per (b, kv head, tile).
  void pack_kv(const float* k, const float* v, bool want_kt, bool want_vt, bool want_kr, bool want_vr) {
    const size_t n = size_t(s.B * s.Hkv * nt * kTile * s.D);
    if (want_kt) kt.assign(n, 0.f);
    if (want_vt) vt.assign(n, 0.f);
    if (want_kr) kr.assign(n, 0.f);
    if (want_vr) vr.assign(n, 0.f);
    parallel_for(s.B * s.Hkv * nt, [&](int64_t task) {
      const int64_t tile = task % nt, g = task / nt % s.Hkv, b = task / nt / s.Hkv;
      const int64_t t0 = tile * kTile, len = tile_len(tile), off = tile_off(b, g, tile);
      const float* ks = k + kv_off(b, t0, g);
      const float* vs = v + kv_off(b, t0, g);
      if (want_kt) pack_cols(kt.data() + off, ks, kv_ld(), len, s.D);
      if (want_vt) pack_cols(vt.data() + off, vs, kv_ld(), len, s.D);
      if (want_kr) pack_rows(kr.data() + off, ks, kv_ld(), len, s.D, 1.f);
      if (want_vr) pack_rows(vr.data() + off, vs, kv_ld(), len, s.D, 1.f);
    });
  }
};

// One query tile of one head: out rows and lse.
void forward_task(const TileKernels& kn, const Problem& p, float* out, float* lse, const float* q, int64_t b,
                  int64_t h, int64_t qt) {
  const int64_t D = p.s.D, g = h / p.G, q0 = qt * kTile, nq = p.tile_len(qt);
  const int32_t* doc = p.doc_row(b);
  std::vector<float> qs(size_t(nq * D));        // [nq, D] scale * q
  std::vector<float> S(size_t(nq * kTile));     // [nq, kTile] scores, then probabilities
  std::vector<float> o(size_t(nq * D), 0.f);    // [nq, D] unnormalised output
  std::vector<float> m(size_t(nq), kNegInf), l(size_t(nq), 0.f);
  pack_rows(qs.data(), q + p.q_off(b, q0, h), p.q_ld(), nq, D, p.scale);
  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile, nk = p.tile_len(kt);
    const TileMask tm = classify_tile(doc, q0, nq, k0, nk, p.s.window);
    if (tm == TileMask::skip) continue;
    kn.matmul(S.data(), kTile, qs.data(), D, 1, p.kt.data() + p.tile_off(b, g, kt), kTile, nq, nk, D,
              Accumulate::no);
    if (tm == TileMask::partial) mask_tile(S.data(), kTile, doc, q0, nq, k0, nk, p.s.window);
    kn.softmax_step(S.data(), kTile, nq, nk, m.data(), l.data(), o.data(), D, D);
    kn.matmul(o.data(), D, S.data(), kTile, 1, p.vr.data() + p.tile_off(b, g, kt), D, nq, D, nk, Accumulate::yes);
  }
  for (int64_t i = 0; i < nq; ++i) {
    const float inv = 1.f / l[i];
    float* dst = out + p.q_off(b, q0 + i, h);
    for (int64_t d = 0; d < D; ++d) dst[d] = o[i * D + d] * inv;
    lse[p.row_off(b, h, q0 + i)] = m[i] + std::log(l[i]);
  }
}

// Backward pass 1: dK, dV of one key tile of one kv head.
void backward_kv_task(const TileKernels& kn, const Problem& p, float* dk, float* dv, const float* dout,
                      const float* lse, const float* Di, const float* q, int64_t b, int64_t g, int64_t kt) {
  const int64_t D = p.s.D, k0 = kt * kTile, nk = p.tile_len(kt);
  const int32_t* doc = p.doc_row(b);
  std::vector<float> qs(size_t(kTile * D)), dos(size_t(kTile * D));  // [nq, D] scale * q and dout
  std::vector<float> S(size_t(kTile * kTile)), dP(S.size());          // [nq, kTile] P and dS after probs_dscores
  std::vector<float> dk_acc(size_t(nk * D), 0.f), dv_acc(size_t(nk * D), 0.f);  // [nk, D]
  const float* ktile = p.kt.data() + p.tile_off(b, g, kt);
  const float* vtile = p.vt.data() + p.tile_off(b, g, kt);
  for (int64_t h = g * p.G; h < (g + 1) * p.G; ++h)
    for (int64_t qt = kt; qt < p.nt; ++qt) {
      const int64_t q0 = qt * kTile, nq = p.tile_len(qt);
      const TileMask tm = classify_tile(doc, q0, nq, k0, nk, p.s.window);
      if (tm == TileMask::skip) continue;
      pack_rows(qs.data(), q + p.q_off(b, q0, h), p.q_ld(), nq, D, p.scale);
      pack_rows(dos.data(), dout + p.q_off(b, q0, h), p.q_ld(), nq, D, 1.f);
      kn.matmul(S.data(), kTile, qs.data(), D, 1, ktile, kTile, nq, nk, D, Accumulate::no);
      kn.matmul(dP.data(), kTile, dos.data(), D, 1, vtile, kTile, nq, nk, D, Accumulate::no);
      if (tm == TileMask::partial) mask_tile(S.data(), kTile, doc, q0, nq, k0, nk, p.s.window);
      kn.probs_dscores(S.data(), dP.data(), kTile, nq, nk, lse + p.row_off(b, h, q0), Di + p.row_off(b, h, q0));
      // dV += Pᵀ dO and dK += dSᵀ (scale q): Pᵀ and dSᵀ read in place through swapped strides.
      kn.matmul(dv_acc.data(), D, S.data(), 1, kTile, dos.data(), D, nk, D, nq, Accumulate::yes);
      kn.matmul(dk_acc.data(), D, dP.data(), 1, kTile, qs.data(), D, nk, D, nq, Accumulate::yes);
    }
  for (int64_t j = 0; j < nk; ++j) {
    std::copy_n(dk_acc.data() + j * D, D, dk + p.kv_off(b, k0 + j, g));
    std::copy_n(dv_acc.data() + j * D, D, dv + p.kv_off(b, k0 + j, g));
  }
}

// Backward pass 2: dQ of one query tile of one head.
void backward_q_task(const TileKernels& kn, const Problem& p, float* dq, const float* dout, const float* lse,
                     const float* Di, const float* q, int64_t b, int64_t h, int64_t qt) {
  const int64_t D = p.s.D, g = h / p.G, q0 = qt * kTile, nq = p.tile_len(qt);
  const int32_t* doc = p.doc_row(b);
  std::vector<float> qs(size_t(nq * D)), dos(size_t(nq * D));  // [nq, D]
  std::vector<float> S(size_t(nq * kTile)), dP(S.size());      // [nq, kTile]
  std::vector<float> dq_acc(size_t(nq * D), 0.f);              // [nq, D] dS·K, scaled at the end
  pack_rows(qs.data(), q + p.q_off(b, q0, h), p.q_ld(), nq, D, p.scale);
  pack_rows(dos.data(), dout + p.q_off(b, q0, h), p.q_ld(), nq, D, 1.f);
  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile, nk = p.tile_len(kt);
    const TileMask tm = classify_tile(doc, q0, nq, k0, nk, p.s.window);
    if (tm == TileMask::skip) continue;
    const int64_t off = p.tile_off(b, g, kt);
    kn.matmul(S.data(), kTile, qs.data(), D, 1, p.kt.data() + off, kTile, nq, nk, D, Accumulate::no);
    kn.matmul(dP.data(), kTile, dos.data(), D, 1, p.vt.data() + off, kTile, nq, nk, D, Accumulate::no);
    if (tm == TileMask::partial) mask_tile(S.data(), kTile, doc, q0, nq, k0, nk, p.s.window);
    kn.probs_dscores(S.data(), dP.data(), kTile, nq, nk, lse + p.row_off(b, h, q0), Di + p.row_off(b, h, q0));
    kn.matmul(dq_acc.data(), D, dP.data(), kTile, 1, p.kr.data() + off, D, nq, D, nk, Accumulate::yes);
  }
  for (int64_t i = 0; i < nq; ++i) {
    float* dst = dq + p.q_off(b, q0 + i, h);
    for (int64_t d = 0; d < D; ++d) dst[d] = p.scale * dq_acc[i * D + d];
  }
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* doc_ids, AttentionShape s) {
  LT_OPS_OVERRIDE(attention_forward, out, lse, q, k, v, doc_ids, s);
  Problem p(s, doc_ids);
  const TileKernels kn = select_kernels();
  p.pack_kv(k, v, /*want_kt=*/true, /*want_vt=*/false, /*want_kr=*/false, /*want_vr=*/true);
  // Task order puts the longest rows of tiles (last query tiles) first, so the tail of the loop is short.
  const int64_t heads = s.B * s.Hq;
  parallel_for(heads * p.nt, [&](int64_t task) {
    const int64_t qt = p.nt - 1 - task / heads, bh = task % heads;
    forward_task(kn, p, out, lse, q, bh / s.Hq, bh % s.Hq, qt);
  });
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                        const float* q, const float* k, const float* v, const int32_t* doc_ids, AttentionShape s) {
  LT_OPS_OVERRIDE(attention_backward, dq, dk, dv, dout, out, lse, q, k, v, doc_ids, s);
  Problem p(s, doc_ids);
  const TileKernels kn = select_kernels();
  p.pack_kv(k, v, /*want_kt=*/true, /*want_vt=*/true, /*want_kr=*/true, /*want_vr=*/false);
  // Di[B, Hq, T] = rowsum(dO ∘ O), accumulated in double over 8 interleaved partial sums (which the
  // compiler vectorises; a single running sum would serialise).
  std::vector<float> Di(size_t(s.B * s.Hq * s.T));
  parallel_for(s.B * s.Hq, [&](int64_t bh) {
    const int64_t b = bh / s.Hq, h = bh % s.Hq;
    for (int64_t t = 0; t < s.T; ++t) {
      const float* o = out + p.q_off(b, t, h);
      const float* g = dout + p.q_off(b, t, h);
      double part[8] = {};
      int64_t d = 0;
      for (; d + 8 <= s.D; d += 8)
        for (int e = 0; e < 8; ++e) part[e] += double(o[d + e]) * double(g[d + e]);
      for (; d < s.D; ++d) part[0] += double(o[d]) * double(g[d]);
      double acc = 0;
      for (double x : part) acc += x;
      Di[size_t(p.row_off(b, h, t))] = float(acc);
    }
  });
  // Pass 1 puts the first key tiles (most query tiles to visit) first; pass 2 the last query tiles.
  const int64_t kv_heads = s.B * s.Hkv, heads = s.B * s.Hq;
  parallel_for(kv_heads * p.nt, [&](int64_t task) {
    const int64_t kt = task / kv_heads, bg = task % kv_heads;
    backward_kv_task(kn, p, dk, dv, dout, lse, Di.data(), q, bg / s.Hkv, bg % s.Hkv, kt);
  });
  parallel_for(heads * p.nt, [&](int64_t task) {
    const int64_t qt = p.nt - 1 - task / heads, bh = task % heads;
    backward_q_task(kn, p, dq, dout, lse, Di.data(), q, bh / s.Hq, bh % s.Hq, qt);
  });
}

namespace {

void check_sinks(const char* op, const float* sinks, const AttentionShape& s) {
  LT_CHECK(s.B > 0 && s.T > 0 && s.Hq > 0 && s.D > 0, "{}: sizes must be positive (B={}, T={}, Hq={}, D={})", op, s.B,
           s.T, s.Hq, s.D);
  for (int64_t h = 0; h < s.Hq; ++h)
    LT_CHECK(std::isfinite(sinks[h]), "{}: the sink of head {} is {} (not finite)", op, h, sinks[h]);
}

// rowsum(dout ∘ out) of row (b, t, h) in double.
double row_dot(const float* dout, const float* out, int64_t at, int64_t D) {
  double acc = 0;
  for (int64_t d = 0; d < D; ++d) acc += double(dout[at + d]) * double(out[at + d]);
  return acc;
}

}  // namespace

void attention_sinks_forward(float* out, float* lse, const float* sinks, AttentionShape s) {
  check_sinks("attention_sinks_forward", sinks, s);
  LT_OPS_OVERRIDE(attention_sinks_forward, out, lse, sinks, s);
  parallel_for(s.B * s.Hq, [&](int64_t bh) {
    const int64_t b = bh / s.Hq, h = bh % s.Hq;
    const double sink = sinks[h];
    for (int64_t t = 0; t < s.T; ++t) {
      float& l = lse[(b * s.Hq + h) * s.T + t];
      const double old = l, m = std::max(old, sink);
      const double now = m + std::log(std::exp(old - m) + std::exp(sink - m));
      const float keep = float(std::exp(old - now));  // the share of the row's mass the keys keep
      float* o = out + ((b * s.T + t) * s.Hq + h) * s.D;
      for (int64_t d = 0; d < s.D; ++d) o[d] *= keep;
      l = float(now);
    }
  });
}

void attention_sinks_backward(float* dsinks, const float* dout, const float* out, const float* lse,
                              const float* sinks, AttentionShape s) {
  check_sinks("attention_sinks_backward", sinks, s);
  LT_OPS_OVERRIDE(attention_sinks_backward, dsinks, dout, out, lse, sinks, s);
  parallel_for(s.Hq, [&](int64_t h) {
    double acc = 0;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t t = 0; t < s.T; ++t) {
        const double p_sink = std::exp(double(sinks[h]) - double(lse[(b * s.Hq + h) * s.T + t]));
        acc += p_sink * row_dot(dout, out, ((b * s.T + t) * s.Hq + h) * s.D, s.D);
      }
    dsinks[h] = float(-acc);
  });
}

namespace detail {
// The exp of the path cpu_features() selects (std::exp on the plain path), exposed for its tests.
void attention_exp_for_test(float* y, const float* x, int64_t n) {
  switch (isa_level(cpu_features())) {
    case IsaLevel::avx512: return exp_array_avx512(y, x, n);
    case IsaLevel::avx2: return exp_array_avx2(y, x, n);
    case IsaLevel::plain: break;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}
}  // namespace detail

}  // namespace lt
