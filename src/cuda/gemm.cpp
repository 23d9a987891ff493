// cuda/gemm.cpp — Matmul's description, checks, the row-major linear mapping, and cuda-sim's emulation of
// the cuBLASLt call (cuda/gemm.h).
#include "cuda/gemm.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/linear.h"

namespace lt::cuda {
namespace {

const char* type_name(MatType t) { return t == MatType::f32 ? "f32" : "bf16"; }
const char* op_name(MatOp op) { return op == MatOp::N ? "N" : "T"; }

float load(const void* p, MatType t, int64_t i) {
  return t == MatType::f32 ? static_cast<const float*>(p)[i] : bf16_to_f32(static_cast<const bf16_t*>(p)[i]);
}

// Element (r, c) of op(X) for a column-major X with leading dimension ld.
float op_element(const void* X, MatType t, MatOp op, int64_t ld, int64_t r, int64_t c) {
  return op == MatOp::N ? load(X, t, r + c * ld) : load(X, t, c + r * ld);
}

}  // namespace

std::string describe(const Matmul& mm) {
  return fmt::format("{}: D[m={} x n={}] {} = A[{}, lda={}] {} · B[{}, ldb={}] {}, k={}, ldd={}, alpha {}, beta {}{}",
                     mm.name, mm.m, mm.n, type_name(mm.d_type), op_name(mm.op_a), mm.lda, type_name(mm.a_type),
                     op_name(mm.op_b), mm.ldb, type_name(mm.b_type), mm.k, mm.ldd, mm.alpha, mm.beta,
                     mm.bias ? ", bias" : "");
}

void check(const Matmul& mm) {
  const int64_t a_rows = mm.op_a == MatOp::N ? mm.m : mm.k;  // rows of A as stored
  const int64_t b_rows = mm.op_b == MatOp::N ? mm.k : mm.n;
  LT_CHECK(mm.m > 0 && mm.n > 0 && mm.k > 0, "{}: sizes must be positive", describe(mm));
  LT_CHECK(mm.lda >= a_rows && mm.ldb >= b_rows && mm.ldd >= mm.m,
           "{}: a leading dimension is below its matrix's rows (A {} rows, B {} rows, D {} rows)", describe(mm),
           a_rows, b_rows, mm.m);
  LT_CHECK(mm.A && mm.B && mm.D, "{}: a matrix pointer is null", describe(mm));
  LT_CHECK(!mm.bias || mm.d_type == MatType::f32,
           "{}: a bias epilogue needs an f32 D (cuBLASLt's bias has D's type; ours is f32)", describe(mm));
}

void emulate_matmul(const Matmul& mm) {
  check(mm);
  // Each element's sum runs over k in order in f32, then alpha, beta · D, the bias, and one rounding to D's
  // type — the order of operations cuBLASLt documents for D = alpha·AB + beta·C. op(A) is widened into a
  // row-major [m, k] copy and op(B) into [k, n], so the loop below runs kColumns elements of a row of D side by
  // side: each keeps its own sequential sum (vectorised across elements, never reassociated within one).
  constexpr int64_t kColumns = 16;
  const int64_t m = mm.m, n = mm.n, k = mm.k;
  std::vector<float> a(static_cast<size_t>(m * k)), bt(static_cast<size_t>(k * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < k; ++l) a[size_t(i * k + l)] = op_element(mm.A, mm.a_type, mm.op_a, mm.lda, i, l);
  for (int64_t l = 0; l < k; ++l)
    for (int64_t j = 0; j < n; ++j) bt[size_t(l * n + j)] = op_element(mm.B, mm.b_type, mm.op_b, mm.ldb, l, j);
  parallel_chunks(m, 8, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j0 = 0; j0 < n; j0 += kColumns) {
        const int64_t w = std::min(kColumns, n - j0);
        float acc[kColumns] = {};
        const float* ai = a.data() + i * k;
        for (int64_t l = 0; l < k; ++l) {
          const float* bl = bt.data() + l * n + j0;
          if (w == kColumns)
            for (int64_t jj = 0; jj < kColumns; ++jj) acc[jj] += ai[l] * bl[jj];
          else
            for (int64_t jj = 0; jj < w; ++jj) acc[jj] += ai[l] * bl[jj];
        }
        for (int64_t jj = 0; jj < w; ++jj) {
          const int64_t at = i + (j0 + jj) * mm.ldd;
          float d = mm.alpha * acc[jj];
          if (mm.beta != 0.0f) d += mm.beta * load(mm.D, mm.d_type, at);
          if (mm.bias) d += mm.bias[i];
          if (mm.d_type == MatType::f32)
            static_cast<float*>(mm.D)[at] = d;
          else
            static_cast<bf16_t*>(mm.D)[at] = f32_to_bf16(d);
        }
      }
  });
}

Matmul linear_forward_matmul(void* Y, MatType y_type, const void* X, const void* W, MatType in_type,
                             const float* bias, int64_t M, int64_t N, int64_t K) {
  // Row-major Y[M, N] is column-major Yᵀ (N × M, ld N) = W (N × K: row-major W[N, K] read as its transpose)
  // · Xᵀ (K × M: row-major X[M, K] as stored).
  Matmul mm;
  mm.name = "linear forward";
  mm.op_a = MatOp::T, mm.op_b = MatOp::N;
  mm.m = N, mm.n = M, mm.k = K;
  mm.A = W, mm.a_type = in_type, mm.lda = K;
  mm.B = X, mm.b_type = in_type, mm.ldb = K;
  mm.D = Y, mm.d_type = y_type, mm.ldd = N;
  mm.bias = bias;
  return mm;
}

Matmul linear_dinput_matmul(float* dX, const void* dY, const void* W, MatType in_type, int64_t M, int64_t N,
                            int64_t K) {
  // dXᵀ (K × M, ld K) = Wᵀ (K × N: W[N, K] as stored) · dYᵀ (N × M: dY[M, N] as stored).
  Matmul mm;
  mm.name = "linear backward (input)";
  mm.op_a = MatOp::N, mm.op_b = MatOp::N;
  mm.m = K, mm.n = M, mm.k = N;
  mm.A = W, mm.a_type = in_type, mm.lda = K;
  mm.B = dY, mm.b_type = in_type, mm.ldb = N;
  mm.D = dX, mm.d_type = MatType::f32, mm.ldd = K;
  return mm;
}

std::vector<Matmul> linear_dweight_matmuls(float* dW, const void* dY, const void* X, MatType in_type, int64_t M,
                                           int64_t N, int64_t K) {
  // dWᵀ (K × N, ld K) += Xᵀ (K × rows: X as stored) · dY (rows × N: dY[rows, N] read as its transpose).
  const size_t elem = in_type == MatType::f32 ? 4 : 2;
  std::vector<Matmul> calls;
  for (int64_t t0 = 0; t0 < M; t0 += kTokenSlice) {
    const int64_t rows = std::min(kTokenSlice, M - t0);
    Matmul mm;
    mm.name = "linear backward (weight)";
    mm.op_a = MatOp::N, mm.op_b = MatOp::T;
    mm.m = K, mm.n = N, mm.k = rows;
    mm.A = static_cast<const char*>(X) + size_t(t0 * K) * elem, mm.a_type = in_type, mm.lda = K;
    mm.B = static_cast<const char*>(dY) + size_t(t0 * N) * elem, mm.b_type = in_type, mm.ldb = N;
    mm.D = dW, mm.d_type = MatType::f32, mm.ldd = K;
    mm.beta = 1.0f;
    calls.push_back(mm);
  }
  return calls;
}

}  // namespace lt::cuda
