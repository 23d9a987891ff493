// ops/cpu/gemm.cpp — row-major GEMM on oneDNN matmul primitives, cut into fixed blocks of C.
//
// bf16 has two routes, chosen once per process from what oneDNN offers on this host:
//   native  — oneDNN's bf16 matmul (AVX-512 hosts: AVX512-BF16, or emulated on avx512_core);
//   widened — oneDNN 2.6 has no bf16 matmul below avx512_core (AVX2-only hosts: EPYC Rome/Milan), so
//             the operands are widened to f32 (exact: every bf16 is an f32) and the f32 GEMM runs with
//             the same blocking. Same products, f32 accumulation either way; the bits are deterministic
//             and thread-count independent on each route, but the two routes need not agree bitwise.
//
// Accumulation (C += A·B) is ours, not oneDNN's sum post-op: a block's product goes to a scratch block and is
// then added to C, so C_new = C + round(A·B) exactly on every host. oneDNN's post-op does not promise that: on
// AMX hosts (Sapphire Rapids) its bf16 GEMM folds C into the K loop, so two accumulations of the same product
// were not exactly 2× one (seen there; gradients accumulated over micro-batches rely on it).
#include "ops/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <dnnl.hpp>
#include <immintrin.h>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"

namespace lt {
namespace {

using dnnl::memory;

// Everything that determines a primitive. Leading dimensions are part of it because oneDNN bakes
// strides into the primitive.
struct GemmKey {
  memory::data_type dt;
  Trans ta, tb;
  int64_t M, N, K, lda, ldb, ldc;
  auto tie() const { return std::tie(dt, ta, tb, M, N, K, lda, ldb, ldc); }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

struct GemmPrimitive {
  dnnl::matmul prim;
  memory::desc a, b, c;
  size_t scratch_bytes;
};

// oneDNN dispatches on its own probe of the CPU; cap it to LT_MAX_ISA so a capped run takes the GEMM
// kernels the capped host would (DNNL_MAX_CPU_ISA, when the user set it, wins). Must run before the
// first primitive is created, hence inside the engine's one-time initialisation.
void cap_onednn_isa() {
  if (const char* user = std::getenv("DNNL_MAX_CPU_ISA"); user && *user) return;
  switch (isa_level(cpu_features())) {
    case IsaLevel::avx512: return;
    case IsaLevel::avx2: dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx2); return;
    case IsaLevel::plain: dnnl::set_max_cpu_isa(dnnl::cpu_isa::sse41); return;
  }
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine = [] {
    cap_onednn_isa();
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return engine;
}

const char* dtype_label(memory::data_type dt) { return dt == memory::data_type::bf16 ? "bf16" : "f32"; }

// "avx2 (oneDNN capped at AVX2)": what a user needs to see next to a library failure.
std::string isa_description() {
  std::string s(isa_name(isa_level(cpu_features())));
  if (const char* user = std::getenv("DNNL_MAX_CPU_ISA"); user && *user) s += fmt::format(" (DNNL_MAX_CPU_ISA={})", user);
  return s;
}

[[noreturn]] void fail_gemm(const GemmKey& key, const char* stage, const dnnl::error& e) {
  LT_FAIL("gemm {} {}{} M={} N={} K={} (lda={} ldb={} ldc={}): oneDNN could not {} it on this CPU "
          "(instruction set {}): {}",
          dtype_label(key.dt), key.ta == Trans::yes ? "T" : "N", key.tb == Trans::yes ? "T" : "N", key.M, key.N,
          key.K, key.lda, key.ldb, key.ldc, stage, isa_description(), e.what());
}

// Primitives are created once per shape and shared; creation is serialised, execution is concurrent
// (user-managed scratchpad, one stream per thread).
const GemmPrimitive& get_primitive(const GemmKey& key) {
  static std::mutex mutex;
  static std::map<GemmKey, std::unique_ptr<GemmPrimitive>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;

  // A is [M,K] with row stride lda, or stored [K,M] (transposed view: strides {1, lda}).
  memory::dims a_strides = key.ta == Trans::no ? memory::dims{key.lda, 1} : memory::dims{1, key.lda};
  memory::dims b_strides = key.tb == Trans::no ? memory::dims{key.ldb, 1} : memory::dims{1, key.ldb};
  memory::desc a({key.M, key.K}, key.dt, a_strides);
  memory::desc b({key.K, key.N}, key.dt, b_strides);
  memory::desc c({key.M, key.N}, memory::data_type::f32, memory::dims{key.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
    auto p = std::make_unique<GemmPrimitive>(
        GemmPrimitive{dnnl::matmul(pd), a, b, c, pd.scratchpad_desc().get_size()});
    return *cache.emplace(key, std::move(p)).first->second;
  } catch (const dnnl::error& e) {
    fail_gemm(key, "create", e);
  }
}

void run_block(const GemmKey& key, const void* A, const void* B, float* C) {
  const GemmPrimitive& p = get_primitive(key);
  thread_local dnnl::stream stream(cpu_engine());
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < p.scratch_bytes) scratch.resize(p.scratch_bytes);
  dnnl::engine& eng = cpu_engine();
  memory a(p.a, eng, const_cast<void*>(A)), b(p.b, eng, const_cast<void*>(B)), c(p.c, eng, C);
  memory s(dnnl::memory::desc({int64_t(p.scratch_bytes)}, memory::data_type::u8, memory::format_tag::a), eng,
           scratch.data());
  try {
    p.prim.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, s}});
    stream.wait();
  } catch (const dnnl::error& e) {
    fail_gemm(key, "run", e);
  }
}

// Fixed blocking: rows in blocks of kGemmRowBlock whatever M is, columns in blocks chosen from N alone (a
// quarter of N, 16-aligned, within [64, 1024]: at least 4 for N >= 256, so two threads stay busy on a narrow
// product). Every oneDNN call therefore sees the same shapes for the same rows whether a caller passes all
// the rows at once or splits them at multiples of kGemmRowBlock: row results never depend on M (ops/gemm.h).
//
// Below AVX-512 (oneDNN's AVX2 "gemm:jit", which packs both operands on every call) the blocks are wider — half
// of N, within [64, 2048] — and a transposed A is handed over as rows: measured per call on a Zen 3 EPYC
// (DNNL_VERBOSE, the layer benchmark's shapes), 256 x 256 blocks ran at ~33 GFLOP/s a thread against ~62 for
// 256 x 704, and a transposed A at half the rate of the same block untransposed; the layer in f32 went from
// 75-78 to 87-97 GFLOP/s with both (docs/performance.md).
struct Blocking {
  int64_t row_block, row_count, col_block, col_count;
  bool rows_of_a;  // a transposed A is copied into rows (per block) before the call
  int64_t count() const { return row_count * col_count; }
};

Blocking choose_blocking(int64_t M, int64_t N) {
  const bool avx2_gemm = isa_level(cpu_features()) < IsaLevel::avx512;
  Blocking b;
  b.row_block = kGemmRowBlock;
  b.row_count = (M + b.row_block - 1) / b.row_block;
  b.col_block = avx2_gemm ? std::clamp<int64_t>(((N + 1) / 2 + 15) / 16 * 16, 64, 2048)
                          : std::clamp<int64_t>(((N + 3) / 4 + 15) / 16 * 16, 64, 1024);
  b.col_count = (N + b.col_block - 1) / b.col_block;
  b.rows_of_a = avx2_gemm;
  return b;
}

// Rows [r0, r0 + rows) of op(A) for a transposed A (stored [K, M], row stride lda) into dst as a row-major
// [rows, K] matrix, 16 of A's rows at a time so that reads and writes both stay in a few cache lines.
template <typename T>
void transpose_rows_plain(T* dst, const T* A, int64_t lda, int64_t r0, int64_t rows, int64_t K) {
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    const int64_t k1 = std::min(K, k0 + 16);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t k = k0; k < k1; ++k) dst[i * K + k] = A[k * lda + r0 + i];
  }
}

// The same copy in 8 x 8 tiles transposed in ymm registers (8 loads, 24 shuffles, 8 stores per 64 floats
// against 64 scalar strided loads): the weight gradients' copies took ~3% of the demo's step on a Zen 3
// (perf) done one element at a time. A copy, so the same bits; the edges go through the plain loop.
__attribute__((target("avx2,fma"))) void transpose_rows_avx2(float* dst, const float* A, int64_t lda, int64_t r0,
                                                             int64_t rows, int64_t K) {
  const int64_t rows8 = rows / 8 * 8, K8 = K / 8 * 8;
  for (int64_t i = 0; i < rows8; i += 8)
    for (int64_t k = 0; k < K8; k += 8) {
      const float* a = A + k * lda + r0 + i;  // 8 rows of stored A (k .. k+7), 8 columns (i .. i+7) each
      __m256 r[8], t[8];
      for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(a + j * lda);
      for (int j = 0; j < 8; j += 2) {
        t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
      }
      for (int j = 0; j < 8; j += 4) {
        r[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
        r[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
        r[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
        r[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
      }
      // r[0..3]: columns i+0, i+1, i+2, i+3 of k-rows 0..3 (low lane) and 4..7 are in r[4..7]; lanes hold
      // i and i+4.
      float* d = dst + i * K + k;
      for (int j = 0; j < 4; ++j) {
        _mm256_storeu_ps(d + j * K, _mm256_permute2f128_ps(r[j], r[j + 4], 0x20));
        _mm256_storeu_ps(d + (j + 4) * K, _mm256_permute2f128_ps(r[j], r[j + 4], 0x31));
      }
    }
  for (int64_t i = 0; i < rows; ++i)  // the last K % 8 columns of every row, then the last rows % 8 rows
    for (int64_t k = i < rows8 ? K8 : 0; k < K; ++k) dst[i * K + k] = A[k * lda + r0 + i];
}

template <typename T>
void transpose_rows(T* dst, const T* A, int64_t lda, int64_t r0, int64_t rows, int64_t K) {
  if constexpr (std::is_same_v<T, float>) {
    if (isa_level(cpu_features()) >= IsaLevel::avx2) return transpose_rows_avx2(dst, A, lda, r0, rows, K);
  }
  transpose_rows_plain(dst, A, lda, r0, rows, K);
}

// Up to this size a transposed A is copied into rows once per call (by row blocks, in parallel), above it
// per block (every column block of a row block copies it again, but the memory stays one block's).
constexpr size_t kWholeTransposeBytes = size_t(64) << 20;

template <typename T>
void gemm_blocked(memory::data_type dt, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const T* A,
                  int64_t lda, const T* B, int64_t ldb, float* C, int64_t ldc, Accumulate acc) {
  LT_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm sizes must be non-negative (M={}, N={}, K={})", M, N, K);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (acc == Accumulate::no)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = 0.f;
    return;
  }
  const Blocking bl = choose_blocking(M, N);
  // A transposed A as rows: all of it now when small enough (then A is that copy, untransposed), else per block.
  thread_local std::vector<T> a_whole;  // [M, K], this caller's
  const bool whole = ta == Trans::yes && bl.rows_of_a && size_t(M * K) * sizeof(T) <= kWholeTransposeBytes;
  if (whole) {
    a_whole.resize(size_t(M * K));
    T* dst = a_whole.data();
    auto block = [&](int64_t r) {
      const int64_t r0 = r * bl.row_block;
      transpose_rows(dst + r0 * K, A, lda, r0, std::min(bl.row_block, M - r0), K);
    };
    if (omp_in_parallel()) {
      for (int64_t r = 0; r < bl.row_count; ++r) block(r);
    } else {
#pragma omp parallel for schedule(dynamic, 1)
      for (int64_t r = 0; r < bl.row_count; ++r) block(r);
    }
    A = dst, ta = Trans::no, lda = K;
  }
  auto run = [&](int64_t t) {
    const int64_t r0 = (t / bl.col_count) * bl.row_block, c0 = (t % bl.col_count) * bl.col_block;
    const int64_t rows = std::min(bl.row_block, M - r0), cols = std::min(bl.col_block, N - c0);
    const T* a = A + (ta == Trans::no ? r0 * lda : r0);
    Trans a_trans = ta;
    int64_t a_ld = lda;
    thread_local std::vector<T> a_rows;  // [rows, K]: at most kGemmRowBlock x K
    if (ta == Trans::yes && bl.rows_of_a) {
      a_rows.resize(size_t(rows * K));
      transpose_rows(a_rows.data(), A, lda, r0, rows, K);
      a = a_rows.data(), a_trans = Trans::no, a_ld = K;
    }
    const T* b = B + (tb == Trans::no ? c0 : c0 * ldb);
    float* c = C + r0 * ldc + c0;
    if (acc == Accumulate::no) {
      run_block(GemmKey{dt, a_trans, tb, rows, cols, K, a_ld, ldb, ldc}, a, b, c);
      return;
    }
    thread_local std::vector<float> product;  // [rows, cols]
    product.resize(size_t(rows * cols));
    run_block(GemmKey{dt, a_trans, tb, rows, cols, K, a_ld, ldb, cols}, a, b, product.data());
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) c[i * ldc + j] += product[size_t(i * cols + j)];
  };
  // Always inside a parallel region (even for one block) so oneDNN never threads internally: its own
  // threading could split K and make the bits depend on the thread count.
  if (omp_in_parallel()) {
    for (int64_t t = 0; t < bl.count(); ++t) run(t);
    return;
  }
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < bl.count(); ++t) {
    try {
      run(t);
    } catch (...) {
#pragma omp critical
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// Does oneDNN have a real bf16 matmul here? Asked once with a small probe shape: creation fails outright
// below avx512_core in oneDNN 2.6, and a "ref" implementation (a plain loop, ~100x slower than f32) would
// be no better than widening.
bool onednn_has_bf16_matmul() {
  static const bool has = [] {
    try {
      const memory::dims shape{64, 64};
      memory::desc a(shape, memory::data_type::bf16, memory::format_tag::ab);
      memory::desc c(shape, memory::data_type::f32, memory::format_tag::ab);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), cpu_engine());
      return std::string(pd.impl_info_str()).rfind("ref", 0) != 0;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return has;
}

// The stored matrix rows x cols (row stride ld) widened into dst, contiguous (row stride cols).
void widen_rows(std::vector<float>& dst, const bf16_t* src, int64_t rows, int64_t cols, int64_t ld) {
  dst.resize(size_t(rows * cols));
  auto convert = [&](int64_t r) { convert_bf16_to_f32(dst.data() + r * cols, src + r * ld, size_t(cols)); };
  if (omp_in_parallel() || rows * cols < (1 << 16)) {
    for (int64_t r = 0; r < rows; ++r) convert(r);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) convert(r);
}

// Each calling thread keeps its widened operands for the next call; buffers above 64 MiB are released
// after use so a large head matrix does not stay resident per thread.
void release_if_large(std::vector<float>& v) {
  if (v.capacity() * sizeof(float) > (size_t(64) << 20)) std::vector<float>().swap(v);
}

void gemm_bf16_widened(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const bf16_t* A, int64_t lda,
                       const bf16_t* B, int64_t ldb, float* C, int64_t ldc, Accumulate acc) {
  thread_local std::vector<float> a32, b32;
  // A is stored [M,K] (ta no) or [K,M]; B [K,N] (tb no) or [N,K]. Widen as stored, keep the transposes.
  const int64_t a_rows = ta == Trans::no ? M : K, a_cols = ta == Trans::no ? K : M;
  const int64_t b_rows = tb == Trans::no ? K : N, b_cols = tb == Trans::no ? N : K;
  widen_rows(a32, A, a_rows, a_cols, lda);
  widen_rows(b32, B, b_rows, b_cols, ldb);
  gemm_blocked(memory::data_type::f32, ta, tb, M, N, K, a32.data(), a_cols, b32.data(), b_cols, C, ldc, acc);
  release_if_large(a32);
  release_if_large(b32);
}

std::optional<Bf16Route> route_override;

}  // namespace

Bf16Route gemm_bf16_route() {
  if (route_override) return *route_override;
  return onednn_has_bf16_matmul() ? Bf16Route::native : Bf16Route::widened;
}

const char* bf16_route_name(Bf16Route route) { return route == Bf16Route::native ? "native" : "widened to f32"; }

namespace detail {
void gemm_bf16_route_override(std::optional<Bf16Route> forced) { route_override = forced; }
}  // namespace detail

void gemm_f32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
              int64_t ldb, float* C, int64_t ldc, Accumulate acc) {
  gemm_blocked(memory::data_type::f32, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, acc);
}

void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const bf16_t* A, int64_t lda, const bf16_t* B,
               int64_t ldb, float* C, int64_t ldc, Accumulate acc) {
  if (M == 0 || N == 0 || K == 0 || gemm_bf16_route() == Bf16Route::native)
    return gemm_blocked(memory::data_type::bf16, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, acc);
  gemm_bf16_widened(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, acc);
}

void gemm_reference(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                    const float* B, int64_t ldb, float* C, int64_t ldc, Accumulate acc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = acc == Accumulate::yes ? C[i * ldc + j] : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        double a = ta == Trans::no ? A[i * lda + k] : A[k * lda + i];
        double b = tb == Trans::no ? B[k * ldb + j] : B[j * ldb + k];
        s += a * b;
      }
      C[i * ldc + j] = float(s);
    }
}

}  // namespace lt
