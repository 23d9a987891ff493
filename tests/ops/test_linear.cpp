// Linear: forward against a double-accumulation reference, every gradient by finite differences, the
// accumulate/overwrite contract, bf16 mode against the reference on bf16-rounded operands, determinism.
//
// Legend: N tokens, K = in_f, M = out_f.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/parallel.h"
#include "ops/linear.h"
#include "testing/grad_check.h"

namespace lt {
namespace {

using testing::bits_equal;
using testing::random_vector;
using testing::rel_l2;
using Vec = std::vector<float>;

// out[N, M] = in[N, K] · W[M, K]ᵀ + bias[M], accumulated in double.
Vec reference_forward(const Vec& in, const Vec& W, const float* bias, int64_t N, int64_t K, int64_t M) {
  Vec out(size_t(N * M));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      double s = bias ? double(bias[m]) : 0.0;
      for (int64_t k = 0; k < K; ++k) s += double(in[size_t(n * K + k)]) * double(W[size_t(m * K + k)]);
      out[size_t(n * M + m)] = float(s);
    }
  return out;
}

Vec rounded_to_bf16(const Vec& v) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_to_bf16(v[i]);
  return r;
}

std::vector<bf16_t> as_bf16(const Vec& v) {
  std::vector<bf16_t> r(v.size());
  convert_f32_to_bf16(r.data(), v.data(), v.size());
  return r;
}

struct Shape {
  int64_t N, K, M;
};

class Linear : public ::testing::TestWithParam<Shape> {};

TEST_P(Linear, ForwardMatchesReference) {
  auto [N, K, M] = GetParam();
  Vec in = random_vector(size_t(N * K), 11), W = random_vector(size_t(M * K), 12), b = random_vector(size_t(M), 13);
  for (const float* bias : {static_cast<const float*>(nullptr), static_cast<const float*>(b.data())}) {
    Vec out(size_t(N * M), NAN);
    linear_forward(out.data(), in.data(), WeightRef{W.data(), DType::f32}, bias, N, K, M);
    Vec ref = reference_forward(in, W, bias, N, K, M);
    // f32 sums of K <= 67 products of O(1) terms: error ~ sqrt(K)·6e-8·|terms| ≈ 1e-7 relative; 1e-5 is
    // far below what a wrong index or a missing bias (O(1) relative) gives.
    EXPECT_LT(rel_l2(out.data(), ref.data(), out.size()), 1e-5) << (bias ? "with bias" : "no bias");
  }
}

TEST_P(Linear, GradientsMatchFiniteDifferences) {
  auto [N, K, M] = GetParam();
  Vec in = random_vector(size_t(N * K), 21), W = random_vector(size_t(M * K), 22), b = random_vector(size_t(M), 23);
  Vec proj = random_vector(size_t(N * M), 24);  // loss = Σ out · proj, so dout = proj
  Vec out(size_t(N * M));
  auto loss = [&] {
    linear_forward(out.data(), in.data(), WeightRef{W.data(), DType::f32}, b.data(), N, K, M);
    return testing::dot(out, proj);
  };
  Vec din(size_t(N * K)), dW(size_t(M * K), 0.f), db(size_t(M), 0.f);
  linear_backward(din.data(), dW.data(), db.data(), proj.data(), in.data(), WeightRef{W.data(), DType::f32}, N, K,
                  M);
  // The loss is linear in each of in, W, b, so the central difference has no truncation error: what is
  // left is the f32 rounding of the <= 101 outputs one element touches (|out| <~ 3, |proj| < 1):
  // <~ sqrt(101)·u·3/(2h) ≈ 5e-5 absolute, so up to ~5e-3 relative on elements at grad_check's 1e-2 floor.
  // Measured max 5.5e-4 over these shapes; bound 3e-3. A wrong gradient is off by O(1).
  EXPECT_GRAD_OK(testing::grad_check(in, din, loss, 1), 3e-3, "din");
  EXPECT_GRAD_OK(testing::grad_check(W, dW, loss, 2), 3e-3, "dW");
  EXPECT_GRAD_OK(testing::grad_check(b, db, loss, 3), 3e-3, "dbias");
}

TEST_P(Linear, ParameterGradsAccumulateActivationGradsOverwrite) {
  auto [N, K, M] = GetParam();
  for (DType dt : {DType::f32, DType::bf16}) {
    Vec in = random_vector(size_t(N * K), 31), W = random_vector(size_t(M * K), 32);
    Vec dout = random_vector(size_t(N * M), 33);
    std::vector<bf16_t> Wb = as_bf16(W);
    WeightRef ref{dt == DType::f32 ? static_cast<const void*>(W.data()) : Wb.data(), dt};
    Vec din(size_t(N * K), NAN), dW(size_t(M * K), 0.f), db(size_t(M), 0.f);
    linear_backward(din.data(), dW.data(), db.data(), dout.data(), in.data(), ref, N, K, M);
    Vec din1 = din, dW1 = dW, db1 = db;
    for (float v : din1) ASSERT_FALSE(std::isnan(v)) << "din not fully written";
    // Second call onto the first: parameter grads become exactly 2x (each call adds the same f32 value
    // once: x + x is exact), din is overwritten with the same bits (garbage refilled in between).
    std::fill(din.begin(), din.end(), NAN);
    linear_backward(din.data(), dW.data(), db.data(), dout.data(), in.data(), ref, N, K, M);
    Vec dW2 = dW1, db2 = db1;
    for (auto& v : dW2) v += v;
    for (auto& v : db2) v += v;
    EXPECT_TRUE(bits_equal(dW, dW2)) << dtype_name(dt) << " dW did not accumulate exactly";
    EXPECT_TRUE(bits_equal(db, db2)) << dtype_name(dt) << " dbias did not accumulate exactly";
    EXPECT_TRUE(bits_equal(din, din1)) << dtype_name(dt) << " din was not overwritten";
    // Null din and dbias are skipped; dW still accumulates onto a non-zero start.
    Vec dW3 = random_vector(size_t(M * K), 34), start = dW3;
    linear_backward(nullptr, dW3.data(), nullptr, dout.data(), in.data(), ref, N, K, M);
    for (size_t i = 0; i < dW3.size(); ++i) ASSERT_EQ(dW3[i], start[i] + dW1[i]) << dtype_name(dt) << " at " << i;
  }
}

TEST_P(Linear, Bf16MatchesReferenceOnRoundedOperands) {
  auto [N, K, M] = GetParam();
  Vec in = random_vector(size_t(N * K), 41), W = random_vector(size_t(M * K), 42), b = random_vector(size_t(M), 43);
  Vec dout = random_vector(size_t(N * M), 44);
  std::vector<bf16_t> Wb = as_bf16(W);
  WeightRef ref{Wb.data(), DType::bf16};
  Vec in_r = rounded_to_bf16(in), W_r = rounded_to_bf16(W), dout_r = rounded_to_bf16(dout);

  Vec out(size_t(N * M));
  linear_forward(out.data(), in.data(), ref, b.data(), N, K, M);
  // Products of bf16 values are exact in f32, so against the reference on the rounded operands only the
  // f32 accumulation differs: the f32 bound (1e-5). Not rounding `in` would show as ~2^-9 relative.
  EXPECT_LT(rel_l2(out.data(), reference_forward(in_r, W_r, b.data(), N, K, M).data(), out.size()), 1e-5);
  // Against the unrounded f32 product: each operand is off by <= 2^-9 relative, a product by <= 2^-8;
  // with random signs the sums keep that relative size on average, so rel_l2 < 2^-8 ≈ 3.9e-3.
  EXPECT_LT(rel_l2(out.data(), reference_forward(in, W, b.data(), N, K, M).data(), out.size()), 3.9e-3);

  Vec din(size_t(N * K)), dW(size_t(M * K), 0.f), db(size_t(M), 0.f);
  linear_backward(din.data(), dW.data(), db.data(), dout.data(), in.data(), ref, N, K, M);
  // din[N, K] = dout_r · W_r: the reference is a linear forward with weight W_rᵀ [K, M], no bias.
  Vec WrT(size_t(K * M)), doutT(size_t(M * N)), inT(size_t(K * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) WrT[size_t(k * M + m)] = W_r[size_t(m * K + k)];
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t m = 0; m < M; ++m) doutT[size_t(m * N + n)] = dout_r[size_t(n * M + m)];
    for (int64_t k = 0; k < K; ++k) inT[size_t(k * N + n)] = in_r[size_t(n * K + k)];
  }
  EXPECT_LT(rel_l2(din.data(), reference_forward(dout_r, WrT, nullptr, N, M, K).data(), din.size()), 1e-5);
  // dW[M, K] = dout_rᵀ · in_r (sums over N tokens).
  EXPECT_LT(rel_l2(dW.data(), reference_forward(doutT, inT, nullptr, M, N, K).data(), dW.size()), 1e-5);
  // The bias gradient is not a GEMM: it sums the unrounded f32 dout (in double, rounded once).
  for (int64_t m = 0; m < M; ++m) {
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += double(dout[size_t(n * M + m)]);
    EXPECT_EQ(db[size_t(m)], float(s)) << "dbias column " << m;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Linear,
                         ::testing::Values(Shape{37, 48, 67}, Shape{74, 67, 48}, Shape{1, 67, 101}));

TEST(Linear, BitsIndependentOfThreadCount) {
  const int64_t N = 300, K = 130, M = 700;  // several GEMM blocks and bias-grad column blocks
  Vec in = random_vector(size_t(N * K), 51), W = random_vector(size_t(M * K), 52), b = random_vector(size_t(M), 53);
  Vec dout = random_vector(size_t(N * M), 54);
  std::vector<bf16_t> Wb = as_bf16(W);
  const int saved = num_threads();
  for (DType dt : {DType::f32, DType::bf16}) {
    WeightRef ref{dt == DType::f32 ? static_cast<const void*>(W.data()) : Wb.data(), dt};
    Vec results[2][4];
    for (int t = 0; t < 2; ++t) {
      set_num_threads(t + 1);
      Vec out(size_t(N * M)), din(size_t(N * K)), dW(size_t(M * K), 0.25f), db(size_t(M), 0.5f);
      linear_forward(out.data(), in.data(), ref, b.data(), N, K, M);
      linear_backward(din.data(), dW.data(), db.data(), dout.data(), in.data(), ref, N, K, M);
      results[t][0] = out, results[t][1] = din, results[t][2] = dW, results[t][3] = db;
    }
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(bits_equal(results[0][i], results[1][i])) << dtype_name(dt) << " " << i;
  }
  set_num_threads(saved);
}

TEST(Linear, WeightRefChecksDtype) {
  float w = 1.f;
  WeightRef f{&w, DType::f32}, b{&w, DType::bf16};
  EXPECT_EQ(f.f32(), &w);
  EXPECT_EQ(static_cast<const void*>(b.bf16()), static_cast<const void*>(&w));
  EXPECT_THROW(f.bf16(), Error);
  EXPECT_THROW(b.f32(), Error);
  WeightRef h{&w, DType::f16};
  float out = 0, in = 1;
  EXPECT_THROW(linear_forward(&out, &in, h, nullptr, 1, 1, 1), Error);
}

}  // namespace
}  // namespace lt
