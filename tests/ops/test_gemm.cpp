// GEMM: oneDNN fast path against the double-accumulation reference; determinism across thread counts.
#include <omp.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/parallel.h"
#include "ops/gemm.h"
#include "testing/grad_check.h"

namespace lt {
namespace {

struct Case {
  Trans ta, tb;
  int64_t M, N, K;
  Accumulate acc;
};

// Stores op(X)[rows, cols] with the given transpose and a padded leading dimension (odd on purpose).
std::vector<float> make_operand(Trans t, int64_t rows, int64_t cols, int64_t* ld, uint64_t seed) {
  int64_t stored_rows = t == Trans::no ? rows : cols, stored_cols = t == Trans::no ? cols : rows;
  *ld = stored_cols + 3;
  return testing::random_vector(size_t(stored_rows * *ld), seed);
}

class Gemm : public ::testing::TestWithParam<Case> {};

TEST_P(Gemm, F32MatchesReference) {
  Case c = GetParam();
  int64_t lda, ldb, ldc = c.N + 5;
  auto A = make_operand(c.ta, c.M, c.K, &lda, 1), B = make_operand(c.tb, c.K, c.N, &ldb, 2);
  auto C0 = testing::random_vector(size_t(c.M * ldc), 3);
  auto C = C0, R = C0;
  gemm_f32(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, C.data(), ldc, c.acc);
  gemm_reference(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, R.data(), ldc, c.acc);
  // f32 accumulation of K products of O(1) terms: error ~ sqrt(K) * 6e-8 * |terms|; 1e-5 relative L2
  // leaves a wide margin for K <= 1000.
  EXPECT_LT(testing::rel_l2(C.data(), R.data(), C.size()), 1e-5);
  // Padding columns between rows are never written.
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = c.N; j < ldc; ++j) ASSERT_EQ(C[i * ldc + j], C0[i * ldc + j]);
}

TEST_P(Gemm, BitsIndependentOfThreadCount) {
  Case c = GetParam();
  int64_t lda, ldb, ldc = c.N;
  auto A = make_operand(c.ta, c.M, c.K, &lda, 7), B = make_operand(c.tb, c.K, c.N, &ldb, 8);
  std::vector<float> C1(size_t(c.M * ldc), 0.5f), C2 = C1;
  int saved = num_threads();
  set_num_threads(1);
  gemm_f32(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, C1.data(), ldc, c.acc);
  set_num_threads(2);
  gemm_f32(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, C2.data(), ldc, c.acc);
  set_num_threads(saved);
  EXPECT_EQ(0, std::memcmp(C1.data(), C2.data(), C1.size() * 4));
}

// The bf16 routes this host can take: widened always, native where oneDNN has a bf16 matmul. Every route
// against the double reference on bf16-rounded operands (products of bf16 values are exact in f32).
std::vector<Bf16Route> bf16_routes() {
  std::vector<Bf16Route> routes = {Bf16Route::widened};
  if (gemm_bf16_route() == Bf16Route::native) routes.push_back(Bf16Route::native);
  return routes;
}

struct RouteGuard {
  explicit RouteGuard(Bf16Route r) { detail::gemm_bf16_route_override(r); }
  ~RouteGuard() { detail::gemm_bf16_route_override(std::nullopt); }
};

TEST_P(Gemm, Bf16EveryRouteMatchesReferenceAndIsThreadCountIndependent) {
  Case c = GetParam();
  int64_t lda, ldb, ldc = c.N + 5;
  auto A = make_operand(c.ta, c.M, c.K, &lda, 9), B = make_operand(c.tb, c.K, c.N, &ldb, 10);
  std::vector<bf16_t> Ab(A.size()), Bb(B.size());
  convert_f32_to_bf16(Ab.data(), A.data(), A.size());
  convert_f32_to_bf16(Bb.data(), B.data(), B.size());
  convert_bf16_to_f32(A.data(), Ab.data(), A.size());
  convert_bf16_to_f32(B.data(), Bb.data(), B.size());
  const auto C0 = testing::random_vector(size_t(c.M * ldc), 11);
  auto R = C0;
  gemm_reference(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, R.data(), ldc, c.acc);
  const int saved = num_threads();
  for (Bf16Route route : bf16_routes()) {
    RouteGuard guard(route);
    SCOPED_TRACE(bf16_route_name(route));
    auto C1 = C0, C2 = C0;
    set_num_threads(1);
    gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, Ab.data(), lda, Bb.data(), ldb, C1.data(), ldc, c.acc);
    set_num_threads(2);
    gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, Ab.data(), lda, Bb.data(), ldb, C2.data(), ldc, c.acc);
    set_num_threads(saved);
    // bf16 products are exact in f32; only the f32 accumulation order differs from the reference.
    EXPECT_LT(testing::rel_l2(C1.data(), R.data(), R.size()), 1e-5);
    EXPECT_EQ(0, std::memcmp(C1.data(), C2.data(), C1.size() * 4));
    for (int64_t i = 0; i < c.M; ++i)  // padding between rows of C is never written
      for (int64_t j = c.N; j < ldc; ++j) ASSERT_EQ(C1[i * ldc + j], C0[i * ldc + j]);
    if (route == Bf16Route::widened) {
      // The widened route is the f32 GEMM on the exactly widened operands, with the same blocking.
      auto F = C0;
      gemm_f32(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, F.data(), ldc, c.acc);
      EXPECT_EQ(0, std::memcmp(C1.data(), F.data(), F.size() * 4));
    }
  }
}

// Below AVX-512 a transposed A reaches oneDNN as rows (ops/cpu/gemm.cpp): copied whole up to 64 MiB, per row block
// above. Either way the product is bit for bit the one of the untransposed copy, and a row's bits do not depend
// on how many rows the call has (split at a multiple of kGemmRowBlock).
TEST(Gemm, TransposedAIsItsRowsProductWholeOrPerBlock) {
  struct Shape {
    int64_t M, N, K;
  };
  // The second A is 68.9 MB: above the whole-copy limit, so it is copied per block.
  for (const Shape sh : {Shape{600, 45, 77}, Shape{4200, 24, 4100}}) {
    SCOPED_TRACE("M=" + std::to_string(sh.M) + " K=" + std::to_string(sh.K));
    const int64_t lda = sh.M + 3;
    const auto A = testing::random_vector(size_t(sh.K * lda), 21);  // stored [K, M]
    const auto B = testing::random_vector(size_t(sh.K * sh.N), 22);
    std::vector<float> rows(size_t(sh.M * sh.K));  // op(A) = Aᵀ as rows [M, K]
    for (int64_t i = 0; i < sh.M; ++i)
      for (int64_t k = 0; k < sh.K; ++k) rows[size_t(i * sh.K + k)] = A[size_t(k * lda + i)];
    std::vector<float> C(size_t(sh.M * sh.N)), R(C.size()), tail(size_t((sh.M - 256) * sh.N));
    gemm_f32(Trans::yes, Trans::no, sh.M, sh.N, sh.K, A.data(), lda, B.data(), sh.N, C.data(), sh.N, Accumulate::no);
    gemm_f32(Trans::yes, Trans::no, sh.M - 256, sh.N, sh.K, A.data() + 256, lda, B.data(), sh.N, tail.data(), sh.N,
             Accumulate::no);
    EXPECT_EQ(0, std::memcmp(tail.data(), C.data() + 256 * sh.N, tail.size() * 4)) << "rows depend on M";
    if (isa_level(cpu_features()) >= IsaLevel::avx512) continue;  // AVX-512 takes the transpose as it is
    gemm_f32(Trans::no, Trans::no, sh.M, sh.N, sh.K, rows.data(), sh.K, B.data(), sh.N, R.data(), sh.N,
             Accumulate::no);
    EXPECT_EQ(0, std::memcmp(C.data(), R.data(), C.size() * 4));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Gemm,
                         ::testing::Values(Case{Trans::no, Trans::yes, 37, 53, 29, Accumulate::no},
                                           Case{Trans::no, Trans::no, 37, 53, 29, Accumulate::yes},
                                           Case{Trans::yes, Trans::no, 101, 17, 37, Accumulate::yes},
                                           Case{Trans::yes, Trans::yes, 7, 300, 41, Accumulate::no},
                                           Case{Trans::no, Trans::yes, 611, 96, 130, Accumulate::no},
                                           Case{Trans::no, Trans::no, 1, 1, 1, Accumulate::no}));

}  // namespace
}  // namespace lt
