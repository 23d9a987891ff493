// cuda-sim's cuBLASLt (cuda/gemm.h): emulate_matmul against OpenBLAS's sgemm making the same column-major
// call (every transpose pair, odd sizes, padded leading dimensions, alpha and beta, bf16 operands widened),
// the row-major linear mapping against the CPU linear op, and the checks cuBLASLt would refuse a call by.
#include <gtest/gtest.h>

#include <cblas.h>

#include <cmath>

#include "core/error.h"
#include "cuda/gemm.h"
#include "cuda/kernel_testing.h"
#include "ops/linear.h"

namespace lt::cuda {
namespace {

using testing::random_floats;
using testing::to_bf16;
using testing::to_f32;

// |got - want| within f32 summation error: k terms, each product rounded, in another order than BLAS's.
void expect_close_sums(const std::vector<float>& got, const std::vector<float>& want, double scale, int64_t k) {
  ASSERT_EQ(got.size(), want.size());
  const double tol = 4.0 * double(k) * 1.2e-7 * scale;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol) << "element " << i;
}

TEST(CudaSimGemm, EmulationIsTheBlasCallForEveryTransposePair) {
  const int64_t m = 7, n = 5, k = 9, pad = 3;
  for (const MatOp op_a : {MatOp::N, MatOp::T})
    for (const MatOp op_b : {MatOp::N, MatOp::T})
      for (const MatType in : {MatType::f32, MatType::bf16}) {
        SCOPED_TRACE(std::string("op_a ") + (op_a == MatOp::N ? "N" : "T") + " op_b " +
                     (op_b == MatOp::N ? "N" : "T") + (in == MatType::bf16 ? " bf16" : " f32"));
        const int64_t a_rows = op_a == MatOp::N ? m : k, a_cols = op_a == MatOp::N ? k : m;
        const int64_t b_rows = op_b == MatOp::N ? k : n, b_cols = op_b == MatOp::N ? n : k;
        const int64_t lda = a_rows + pad, ldb = b_rows + pad, ldd = m + pad;
        // Padding rows hold NaN: an emulation that reads them shows it.
        auto a = random_floats(size_t(lda * a_cols), 1), b = random_floats(size_t(ldb * b_cols), 2);
        for (int64_t c = 0; c < a_cols; ++c)
          for (int64_t r = a_rows; r < lda; ++r) a[size_t(r + c * lda)] = NAN;
        for (int64_t c = 0; c < b_cols; ++c)
          for (int64_t r = b_rows; r < ldb; ++r) b[size_t(r + c * ldb)] = NAN;
        const auto a_b = to_bf16(a), b_b = to_bf16(b);
        const std::vector<float> a_used = in == MatType::bf16 ? to_f32(a_b) : a;
        const std::vector<float> b_used = in == MatType::bf16 ? to_f32(b_b) : b;
        const auto d0 = random_floats(size_t(ldd * n), 3);
        std::vector<float> want = d0;
        cblas_sgemm(CblasColMajor, op_a == MatOp::N ? CblasNoTrans : CblasTrans,
                    op_b == MatOp::N ? CblasNoTrans : CblasTrans, int(m), int(n), int(k), 0.75f, a_used.data(),
                    int(lda), b_used.data(), int(ldb), 0.5f, want.data(), int(ldd));
        std::vector<float> got = d0;
        Matmul mm;
        mm.op_a = op_a, mm.op_b = op_b, mm.m = m, mm.n = n, mm.k = k;
        mm.A = in == MatType::bf16 ? static_cast<const void*>(a_b.data()) : a.data(), mm.a_type = in, mm.lda = lda;
        mm.B = in == MatType::bf16 ? static_cast<const void*>(b_b.data()) : b.data(), mm.b_type = in, mm.ldb = ldb;
        mm.D = got.data(), mm.d_type = MatType::f32, mm.ldd = ldd;
        mm.alpha = 0.75f, mm.beta = 0.5f;
        emulate_matmul(mm);
        for (int64_t j = 0; j < n; ++j)  // D's padding rows are not written
          for (int64_t r = m; r < ldd; ++r) EXPECT_EQ(got[size_t(r + j * ldd)], d0[size_t(r + j * ldd)]);
        expect_close_sums(got, want, 4.0, k);
      }
}

TEST(CudaSimGemm, LinearMappingMatchesTheCpuLinearOp) {
  // M above kTokenSlice, so dW is accumulated in two slices.
  const int64_t M = kTokenSlice + 37, K = 5, N = 3;
  const auto x = random_floats(size_t(M * K), 11), w = random_floats(size_t(N * K), 12);
  const auto bias = random_floats(size_t(N), 13), dy = random_floats(size_t(M * N), 14);
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 operands" : "f32 operands");
    const auto x_b = to_bf16(x), w_b = to_bf16(w), dy_b = to_bf16(dy);
    const MatType in = bf16 ? MatType::bf16 : MatType::f32;
    const void* X = bf16 ? static_cast<const void*>(x_b.data()) : x.data();
    const void* W = bf16 ? static_cast<const void*>(w_b.data()) : w.data();
    const void* dY = bf16 ? static_cast<const void*>(dy_b.data()) : dy.data();
    const WeightRef wref{W, bf16 ? DType::bf16 : DType::f32};

    std::vector<float> want_y(size_t(M * N)), got_y(size_t(M * N));
    linear_forward(want_y.data(), x.data(), wref, bias.data(), M, K, N);  // rounds x to bf16 itself
    emulate_matmul(linear_forward_matmul(got_y.data(), MatType::f32, X, W, in, bias.data(), M, N, K));
    expect_close_sums(got_y, want_y, 4.0 * double(K), K);

    std::vector<float> want_dx(size_t(M * K)), got_dx(size_t(M * K));
    std::vector<float> want_dw = random_floats(size_t(N * K), 15), got_dw = want_dw;
    linear_backward(want_dx.data(), want_dw.data(), nullptr, dy.data(), x.data(), wref, M, K, N);
    emulate_matmul(linear_dinput_matmul(got_dx.data(), dY, W, in, M, N, K));
    for (const Matmul& mm : linear_dweight_matmuls(got_dw.data(), dY, X, in, M, N, K)) emulate_matmul(mm);
    expect_close_sums(got_dx, want_dx, 4.0 * double(N), N);
    expect_close_sums(got_dw, want_dw, 4.0 * double(M), M);
  }
}

TEST(CudaSimGemm, Bf16OutputIsTheF32ResultRoundedOnce) {
  const int64_t M = 9, K = 17, N = 6;
  const auto x = to_bf16(random_floats(size_t(M * K), 21)), w = to_bf16(random_floats(size_t(N * K), 22));
  std::vector<float> y(size_t(M * N));
  std::vector<bf16_t> y_b(size_t(M * N));
  emulate_matmul(linear_forward_matmul(y.data(), MatType::f32, x.data(), w.data(), MatType::bf16, nullptr, M, N, K));
  emulate_matmul(linear_forward_matmul(y_b.data(), MatType::bf16, x.data(), w.data(), MatType::bf16, nullptr, M, N, K));
  EXPECT_BITWISE_EQ(y_b, to_bf16(y));
}

TEST(CudaSimGemm, RowsDoNotDependOnHowManyThereAre) {
  // The executor may run a layer's tokens in chunks: a row's bits must not depend on the call's M.
  const int64_t M = 23, K = 31, N = 7;
  const auto x = to_bf16(random_floats(size_t(M * K), 31)), w = to_bf16(random_floats(size_t(N * K), 32));
  std::vector<float> all(size_t(M * N)), part(size_t(10 * N));
  emulate_matmul(linear_forward_matmul(all.data(), MatType::f32, x.data(), w.data(), MatType::bf16, nullptr, M, N, K));
  emulate_matmul(linear_forward_matmul(part.data(), MatType::f32, x.data() + 5 * K, w.data(), MatType::bf16, nullptr,
                                       10, N, K));
  EXPECT_BITWISE_EQ(part, std::vector<float>(all.begin() + 5 * N, all.begin() + 15 * N));
}

TEST(CudaSimGemm, RefusesWhatCublasLtWouldWithTheCallNamed) {
  std::vector<float> a(64, 1.0f), d(64);
  std::vector<bf16_t> d_b(64);
  Matmul mm = linear_forward_matmul(d.data(), MatType::f32, a.data(), a.data(), MatType::f32, nullptr, 4, 4, 4);
  mm.lda = 3;  // below A's 4 stored rows
  try {
    emulate_matmul(mm);
    ADD_FAILURE() << "a too small leading dimension was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear forward"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("lda=3"), std::string::npos) << e.what();
  }
  Matmul biased = linear_forward_matmul(d_b.data(), MatType::bf16, a.data(), a.data(), MatType::f32, a.data(), 4, 4, 4);
  EXPECT_THROW(emulate_matmul(biased), Error);
}

}  // namespace
}  // namespace lt::cuda
