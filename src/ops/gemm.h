// ops/gemm.h — the one matrix-multiply entry point every op uses, on oneDNN.
//
//   C[M,N] = op(A)[M,K] · op(B)[K,N]  (+ C when accumulate == Accumulate::yes)
//
// Row-major throughout; lda/ldb/ldc are row strides in elements of the stored matrices (A is stored
// [M,K] when ta == Trans::no and [K,M] when ta == Trans::yes; likewise B). Transposes are explicit —
// nothing is transposed behind the caller's back.
//
// Why oneDNN: measured on this machine (AVX-512, AVX512-BF16), its f32 matmul runs ~2x OpenBLAS 0.3.21's
// sgemm and its bf16 matmul ~2x its own f32 (docs/performance.md), and Debian's OpenBLAS has no bf16.
//
// Determinism: the product is cut into fixed blocks of C — rows in blocks of kGemmRowBlock, columns in
// blocks chosen from N alone; each block is one single-threaded oneDNN call inside our parallel_for. So the
// bits never depend on the thread count, and a row's result never depends on M: splitting the rows of a
// product at multiples of kGemmRowBlock (the token chunks of the MLP, model/block.h) gives the same bits.
#pragma once

#include <cstdint>
#include <optional>

#include "core/dtype.h"

namespace lt {

enum class Trans : uint8_t { no, yes };

constexpr int64_t kGemmRowBlock = 256;
enum class Accumulate : uint8_t { no, yes };

// f32 operands, f32 accumulation and output.
void gemm_f32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K,
              const float* A, int64_t lda, const float* B, int64_t ldb,
              float* C, int64_t ldc, Accumulate acc);

// bf16 operands (raw bits), f32 accumulation and f32 output. Where oneDNN has no bf16 matmul for the
// host (AVX2-only CPUs), the operands are widened to f32 and the f32 GEMM runs instead (exact widening).
void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K,
               const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb,
               float* C, int64_t ldc, Accumulate acc);

// The route gemm_bf16 takes on this host, and its name for logs and benchmark JSON ("native",
// "widened to f32").
enum class Bf16Route : uint8_t { native, widened };
Bf16Route gemm_bf16_route();
const char* bf16_route_name(Bf16Route route);
namespace detail {
// Forces gemm_bf16's route in-process (tests: the widened route runs on an AVX-512 host too). nullopt
// restores the probe. Forcing native where oneDNN has no bf16 matmul makes gemm_bf16 fail (clearly).
void gemm_bf16_route_override(std::optional<Bf16Route> forced);
}  // namespace detail

// Plain triple loop in double accumulation: the specification the fast path is tested against.
void gemm_reference(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K,
                    const float* A, int64_t lda, const float* B, int64_t ldb,
                    float* C, int64_t ldc, Accumulate acc);

}  // namespace lt
