// cuda/gemm.h — every GEMM of the CUDA backend is one cuBLASLt matmul described by a Matmul:
//
//   D = epilogue(alpha · op(A) · op(B) + beta · D)     column-major, as cuBLASLt (C and D are one buffer)
//
// op(A) is m × k, op(B) is k × n, D is m × n; A, B in f32 or bf16, D in f32 or bf16, accumulation and
// alpha/beta in f32 (CUBLAS_COMPUTE_32F: no TF32). The epilogue is nothing or a bias (f32, length m, added to
// every column; only with an f32 D, since cuBLASLt's bias has D's type and ours is f32 as in the CPU op).
//
// The row-major linear layer maps onto column-major calls by reading each row-major matrix as its transpose
// (linear_*_matmul below), the standard "TN" mapping. Two runners take the same Matmul:
//   emulate_matmul        cuda-sim: a plain CPU implementation of exactly that call (transposes, leading
//                         dimensions, types, alpha, beta, bias, rounding of D), so the call sites are tested
//   native::CublasLt      the real cuBLASLt call (cuda/native/cublaslt.cpp), an algorithm chosen once per
//                         shape and cached, split-K only with a deterministic (workspace) reduction
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda/kernels.h"

namespace lt::cuda {

enum class MatType : uint8_t { f32, bf16 };
enum class MatOp : uint8_t { N, T };  // op(X) = X or Xᵀ

struct Matmul {
  const char* name = "matmul";  // the op, for errors ("linear forward")
  MatOp op_a = MatOp::N, op_b = MatOp::N;
  int64_t m = 0, n = 0, k = 0;
  const void* A = nullptr;
  MatType a_type = MatType::f32;
  int64_t lda = 0;
  const void* B = nullptr;
  MatType b_type = MatType::f32;
  int64_t ldb = 0;
  void* D = nullptr;
  MatType d_type = MatType::f32;
  int64_t ldd = 0;
  float alpha = 1.0f, beta = 0.0f;
  const float* bias = nullptr;  // epilogue: D[i, j] += bias[i]
};

// "linear forward: D[m=6 x n=5] f32 = A[T, lda=7] bf16 · B[N, ldb=7] bf16, k=7, beta 0, bias" (for errors).
std::string describe(const Matmul& mm);
// lt::Error naming the call unless its sizes, leading dimensions, types and pointers are what cuBLASLt
// accepts (lda ≥ rows of A as stored, ...; a bias only with an f32 D).
void check(const Matmul& mm);

// cuda-sim's cuBLASLt: D as the call defines it, each element accumulated in f32 over k in order.
void emulate_matmul(const Matmul& mm);

// The row-major linear layer (ops/linear.h) as column-major calls; X, Y, dY row-major, W [N, K] as HF.
// Y[M, N] = X[M, K] · W[N, K]ᵀ (+ bias[N]; bias needs an f32 Y)
Matmul linear_forward_matmul(void* Y, MatType y_type, const void* X, const void* W, MatType in_type,
                             const float* bias, int64_t M, int64_t N, int64_t K);
// dX[M, K] (f32) = dY[M, N] · W[N, K]
Matmul linear_dinput_matmul(float* dX, const void* dY, const void* W, MatType in_type, int64_t M, int64_t N,
                            int64_t K);
// dW[N, K] (f32) += dY[M, N]ᵀ · X[M, K], one call per kTokenSlice rows in order (ops/linear.h: the CPU op's
// slices, so a caller may split the tokens at slice boundaries and get the same bits).
std::vector<Matmul> linear_dweight_matmuls(float* dW, const void* dY, const void* X, MatType in_type, int64_t M,
                                           int64_t N, int64_t K);

// The GEMM workspace of the compute stream (cuBLASLt's split-K reductions): a fixed size, so the algorithm a
// shape gets does not depend on what else is allocated; part of the step's working set on the GPU.
inline constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;

}  // namespace lt::cuda

#if LT_WITH_CUDA
namespace lt::cuda::native {

// One cuBLASLt handle and the algorithm cache. The algorithm of a shape (ops, m, n, k, types, leading
// dimensions, epilogue) is asked of cuBLASLt's heuristic once — restricted to reductions that are not
// atomic (no split-K, or split-K reduced in the workspace) and to `workspace_bytes` — and reused, so a shape
// computes the same bits every time. Not thread-safe: one per compute stream.
class CublasLt {
 public:
  explicit CublasLt(size_t workspace_bytes = kGemmWorkspaceBytes);
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;
  // Enqueues mm on `stream` with `workspace` (workspace_bytes() of device memory, owned by the caller and
  // used by this stream alone). lt::Error naming the call on any cuBLASLt error or when no algorithm fits.
  void run(const Matmul& mm, Stream stream, void* workspace);
  size_t workspace_bytes() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lt::cuda::native
#endif
